"""A PostgreSQL server on this machine, for tests, benchmarks and notebooks::

    with LocalPostgres() as pg:
        with psycopg.connect(pg.dsn) as conn:
            conn.execute("select 1")

The server is Debian's (``/usr/lib/postgresql/<newest version>/bin``, from
``apt-get install postgresql``; ``initdb`` and ``postgres`` on ``PATH`` do
too), run as a child process with no system service.  ``start()`` puts a
fresh cluster (trust authentication, user ``postgres``, UTF8, no locale) in
the data directory unless it already holds one, runs ``postgres`` on
127.0.0.1 and a free port with its Unix socket and log in a temporary
directory, waits until it accepts connections and creates the database
(``outbox`` by default).

Durability is PostgreSQL's own: ``fsync`` stays on, so a commit survives a
kill of the server.  Only ``initdb``'s final flush of the fresh, empty cluster
is skipped (``--no-sync``, about a second): a killed process loses nothing
that was not flushed, only a power failure could.

PostgreSQL refuses to run as root: as root, ``initdb`` and ``postgres`` run as
the ``postgres`` system user that Debian's package creates, and the
directories are given to it.  Like :mod:`broker_node.nats_server`, the server
dies with the thread that started it (``setpriv --pdeathsig``), and its
backends follow their postmaster, so a killed test run leaves no server.

Fault helpers send real signals to the postmaster and all its children:
:meth:`LocalPostgres.kill` (SIGKILL, a crash; the data is kept and
:meth:`LocalPostgres.start` restarts the server on the same port),
:meth:`LocalPostgres.pause` / :meth:`LocalPostgres.resume` (SIGSTOP / SIGCONT).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from pyspark_jetstream.lifecycle import StartStop

logger = logging.getLogger(__name__)

DEBIAN_ROOT = Path("/usr/lib/postgresql")
"""Debian's PostgreSQL packages install each major version's binaries under ``<version>/bin``."""
SERVER_USER = "postgres"
"""The system user the server runs as when started by root, and the database superuser."""
INSTALL_HINT = "install PostgreSQL (apt-get install postgresql)"
SETTINGS = {
    "fsync": "on",  # the outbox's durability is the server's
    "shared_buffers": "16MB",
    "max_connections": "100",
    "logging_collector": "off",
}
"""Server settings (``-c``) for a small server that starts fast; ``settings=`` adds to them."""


class LocalPostgresError(RuntimeError):
    """PostgreSQL or psycopg is missing, or the server did not start."""


def postgres_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``postgres``: Debian's newest version, else ``PATH``'s."""
    versions = []
    for bin_dir in DEBIAN_ROOT.glob("*/bin"):
        parts = re.fullmatch(r"(\d+)(?:\.(\d+))?", bin_dir.parent.name)
        if parts and (bin_dir / "postgres").exists() and (bin_dir / "initdb").exists():
            versions.append(((int(parts[1]), int(parts[2] or 0)), bin_dir))
    if versions:
        return max(versions)[1]
    initdb, postgres = shutil.which("initdb"), shutil.which("postgres")
    if initdb and postgres and Path(initdb).parent == Path(postgres).parent:
        return Path(initdb).parent
    raise LocalPostgresError(
        f"PostgreSQL's initdb and postgres were not found in {DEBIAN_ROOT}/<version>/bin "
        f"or on PATH: {INSTALL_HINT}"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _psycopg() -> ModuleType:
    try:
        import psycopg
    except ModuleNotFoundError:
        raise LocalPostgresError(
            "psycopg is not installed; LocalPostgres needs it: pip install 'psycopg[binary]>=3.2'"
        ) from None
    return psycopg


class LocalPostgres(StartStop):
    """A PostgreSQL server child process; ``start()``/``stop()`` or use it as a context manager."""

    host = "127.0.0.1"

    def __init__(
        self,
        port: int = 0,
        data_dir: str | Path | None = None,
        *,
        database: str = "outbox",
        settings: dict[str, str] | None = None,
        start_timeout: float = 30.0,
    ) -> None:
        """``port`` 0 picks a free one.  Without ``data_dir`` the cluster lives in the
        temporary directory and :meth:`stop` removes it; a given ``data_dir`` is kept,
        and a cluster already in it is reused."""
        self.port = port or free_port(self.host)
        self.database = database
        self.settings = {**SETTINGS, **(settings or {})}
        self.start_timeout = start_timeout
        self._given_data_dir = Path(data_dir).absolute() if data_dir else None
        self._run_dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/<database>``."""
        return self.dsn_for(self.database)

    def dsn_for(self, database: str) -> str:
        """The connection string of another database on this server."""
        return f"postgresql://{SERVER_USER}@{self.host}:{self.port}/{database}"

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs (a paused one counts)."""
        return self._process.pid if self.running and self._process is not None else None

    @property
    def running(self) -> bool:
        """Whether the postmaster is alive (a paused one counts)."""
        return self._process is not None and self._process.poll() is None

    @property
    def data_dir(self) -> Path:
        """The cluster's directory (``PGDATA``)."""
        if self._given_data_dir is not None:
            return self._given_data_dir
        return self._require_run_dir() / "data"

    @property
    def socket_dir(self) -> Path:
        """The directory of the server's Unix socket."""
        return self._require_run_dir() / "socket"

    @property
    def log_path(self) -> Path:
        """The server's log (its stderr)."""
        return self._require_run_dir() / "postgres.log"

    def start(self) -> LocalPostgres:
        """Start (or, after :meth:`kill`, restart) the server, wait until it accepts
        connections and create the database; raise ``LocalPostgresError`` if it cannot."""
        if self.running:
            raise LocalPostgresError(f"PostgreSQL is already running on port {self.port}")
        bin_dir = postgres_bin_dir()
        _psycopg()
        prefix, owner = self._run_as()
        first = self._run_dir is None
        try:
            return self._start(bin_dir, prefix, owner)
        except BaseException:
            if first:
                self.stop()  # nothing worth keeping: the error carries the log's tail
            raise

    def _start(self, bin_dir: Path, prefix: list[str], owner: pwd.struct_passwd | None) -> LocalPostgres:
        psycopg = _psycopg()
        if self._run_dir is None:
            # As root the server's user must reach it: not under /root, and not mode 0700.
            self._run_dir = Path(tempfile.mkdtemp(prefix="local-postgres-", dir="/tmp" if owner else None))
            self._run_dir.chmod(0o755)
        for directory in (self.data_dir, self.socket_dir):
            directory.mkdir(parents=True, exist_ok=True)
            if owner is not None:
                os.chown(directory, owner.pw_uid, owner.pw_gid)
        self._check_reachable(owner)
        if not (self.data_dir / "PG_VERSION").exists():
            _initdb(prefix, bin_dir, self.data_dir, self._require_run_dir(), self.start_timeout)
        args = [str(bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        args += ["-h", self.host, "-k", str(self.socket_dir)]
        for name, value in self.settings.items():
            args += ["-c", f"{name}={value}"]
        started = time.monotonic()
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the handle
            self._process = subprocess.Popen(
                [*prefix, *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._run_dir,
                start_new_session=True,  # a Ctrl-C meant for the parent does not stop it first
            )
        deadline = started + self.start_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code, self._process = self._process.returncode, None
                raise LocalPostgresError(
                    f"PostgreSQL exited with code {code} on port {self.port}: {self.log_tail()}"
                )
            try:
                psycopg.connect(self.dsn_for("postgres"), connect_timeout=2).close()
            except psycopg.OperationalError:
                time.sleep(0.02)  # not listening yet, or still starting up / recovering
                continue
            self.create_database(self.database)
            logger.info("PostgreSQL running at %s (%.2fs)", self.dsn, time.monotonic() - started)
            return self
        self.kill()
        raise LocalPostgresError(
            f"PostgreSQL did not accept connections within {self.start_timeout:g}s "
            f"on port {self.port}: {self.log_tail()}"
        )

    def create_database(self, name: str) -> str:
        """Create the database ``name`` unless it exists; return its connection string."""
        psycopg = _psycopg()
        with psycopg.connect(self.dsn_for("postgres"), autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(name)))
        return self.dsn_for(name)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (fast shutdown, then SIGKILL after ``timeout`` seconds), wait
        for it, and remove the temporary directory (with the cluster, unless ``data_dir``
        was given)."""
        process = self._process
        if process is not None and process.poll() is None:
            pids = self._server_pids()
            self._signal_all(pids, signal.SIGCONT)  # a paused server must be able to stop
            # SIGINT is PostgreSQL's fast shutdown: SIGTERM's smart one waits for every client.
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "PostgreSQL on port %d did not stop within %gs: killing it", self.port, timeout
                )
                self.kill()
        self.kill()
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend: a crash.  The data is kept; :meth:`start` recovers it."""
        process = self._process
        if process is None or process.poll() is not None:
            self._process = None  # reaped: its pid may belong to another process by now
            return
        pids = self._server_pids()
        self._process = None
        self._signal_all(pids, signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.01)  # backends are reaped by init, not by us

    def pause(self) -> None:
        """SIGSTOP the postmaster and its backends: connections stay open, nothing answers."""
        if self.running:
            self._signal_all(self._server_pids(), signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.running:
            self._signal_all(self._server_pids(), signal.SIGCONT)

    def log_tail(self) -> str:
        """The end of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except (OSError, LocalPostgresError):
            return "(no log)"

    def _run_as(self) -> tuple[list[str], pwd.struct_passwd | None]:
        """The command prefix that runs the server (as ``postgres`` when we are root, and
        dying with this thread where Linux can), and the user that must own its directories."""
        setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
        if os.geteuid() != 0:
            return ([setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []), None
        try:
            owner = pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise LocalPostgresError(
                f"PostgreSQL refuses to run as root and there is no '{SERVER_USER}' system user "
                f"to run it as: {INSTALL_HINT}, which creates it, or run as another user"
            ) from None
        if setpriv is None:
            raise LocalPostgresError(
                "PostgreSQL refuses to run as root, and setpriv (util-linux) is not on PATH "
                "to run it as the postgres user: apt-get install util-linux, or run as another user"
            )
        prefix = [setpriv, f"--reuid={owner.pw_uid}", f"--regid={owner.pw_gid}", "--init-groups"]
        # setpriv sets the parent-death signal after changing user, which would otherwise clear it.
        return [*prefix, "--pdeathsig", "KILL", "--"], owner

    def _check_reachable(self, owner: pwd.struct_passwd | None) -> None:
        """Fail clearly where the server's user could not enter the data directory (root's own dirs)."""
        if owner is None:
            return
        groups = os.getgrouplist(owner.pw_name, owner.pw_gid)
        for directory in reversed(self.data_dir.parents):
            info = directory.stat()
            mode = info.st_mode
            if info.st_uid == owner.pw_uid:
                enters = mode & 0o100
            elif info.st_gid in groups:
                enters = mode & 0o010
            else:
                enters = mode & 0o001
            if not enters:
                raise LocalPostgresError(
                    f"the data directory {self.data_dir} is out of reach of the {SERVER_USER} user "
                    f"that runs the server for root: {directory} is mode {mode & 0o777:o}; "
                    "choose a directory that user can enter (e.g. under /tmp)"
                )

    def _server_pids(self) -> list[int]:
        """The postmaster first, then its children (backends and background processes)."""
        if self._process is None:
            return []
        root = self._process.pid
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            if int(fields[1]) == root:
                children.append(int(stat.parent.name))
        return [root, *children]

    @staticmethod
    def _signal_all(pids: list[int], sig: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                os.kill(pid, sig)

    def _require_run_dir(self) -> Path:
        if self._run_dir is None:
            raise LocalPostgresError("PostgreSQL has not been started (or was stopped)")
        return self._run_dir


def _initdb(prefix: list[str], bin_dir: Path, data_dir: Path, cwd: Path, timeout: float) -> None:
    """Make a fresh cluster in ``data_dir``; raise with initdb's output if it fails."""
    args = [str(bin_dir / "initdb"), "-D", str(data_dir), "--auth=trust", f"--username={SERVER_USER}"]
    args += ["--encoding=UTF8", "--no-locale", "--no-sync"]
    try:
        result = subprocess.run(
            [*prefix, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            cwd=cwd,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LocalPostgresError(f"initdb -D {data_dir} did not finish within {timeout:g}s") from None
    if result.returncode != 0:
        output = (result.stdout + result.stderr).decode(errors="replace")[-3000:]
        raise LocalPostgresError(f"initdb -D {data_dir} failed with code {result.returncode}: {output}")


def _alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie waiting for init to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
