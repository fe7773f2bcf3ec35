"""Running a ZooKeeper server process: the one a local cluster, the tests and the benchmarks start.

The server is Debian's ``zookeeper`` package (``/usr/share/java/zookeeper.jar``),
run as a standalone server on a chosen or free port with its own data
directory, and no system service.  It is ready once it answers the ``ruok``
four-letter command with ``imok``.  Like :mod:`.nats_server`, it dies with the
thread that started it (``setpriv --pdeathsig``), so a killed test run leaves
no server behind.

With ``tls_cert``, ``tls_key`` and ``tls_ca`` the server speaks only TLS, on
its one client port (ZooKeeper's ``secureClientPort``; no plain port at all),
through Netty, and asks every client for a certificate signed by ``tls_ca``.
ZooKeeper 3.8 reads PEM key and trust stores directly; its PEM reader takes
PKCS#8 keys only (``-----BEGIN PRIVATE KEY-----``).  Debian's
``zookeeper.jar`` lists only part of Netty in its manifest's ``Class-Path``:
without ``netty-codec`` and ``netty-resolver`` a TLS server starts but drops
every connection (``NoClassDefFoundError:
io/netty/handler/codec/ByteToMessageDecoder``), so they are added here.

Fault helpers send real signals: :meth:`ZooKeeperServer.kill` (SIGKILL),
:meth:`ZooKeeperServer.pause` / :meth:`ZooKeeperServer.resume` (SIGSTOP /
SIGCONT); :meth:`ZooKeeperServer.start` again restarts it on the same port and
data directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

from .nats_server import die_with_parent_prefix

logger = logging.getLogger(__name__)

ZOOKEEPER_JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")
"""Debian's ZooKeeper server and a logger binding (without one it logs nothing)."""
NETTY_JARS = (
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/netty-resolver.jar",
    "/usr/share/java/netty-transport-native-unix-common.jar",
)
"""Netty jars a TLS server needs that ``zookeeper.jar``'s manifest does not list."""
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
NETTY_FACTORY = "org.apache.zookeeper.server.NettyServerCnxnFactory"


class ZooKeeperError(RuntimeError):
    """Java or the ZooKeeper package is missing, or the server did not start."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now, for a server that is started (and restarted) on it.

    Chosen below the kernel's ephemeral range when it can be: a port from that
    range (what binding port 0 gives) may be taken in between by any outgoing
    connection's local end, and a server restarted on it then fails with
    "Address already in use".
    """
    low = _ephemeral_low()
    for _ in range(50):
        port = random.randrange(10_000, low) if low > 10_000 else 0
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (0 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``port`` now."""
    with socket.socket() as s:
        # As a server binds: connections of an earlier server in TIME_WAIT do not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class ZooKeeperServer:
    """A standalone ZooKeeper server child process."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        data_dir: str | Path | None = None,
        tick_time: float = 0.5,
        max_session_timeout: float = 60.0,
        heap: str = "256m",
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        tls_ca: str | Path | None = None,
    ) -> None:
        """``port`` 0 picks a free one.  ``tick_time`` (seconds) sets the shortest
        session timeout the server grants: twice the tick.

        ``tls_cert`` (PEM, with any intermediates), ``tls_key`` (PEM, PKCS#8,
        unencrypted) and ``tls_ca`` (PEM: the CAs clients' certificates must
        chain to) make it a TLS-only server; give all three or none.  The
        server's own certificate is also the client certificate of the
        ``ruok`` readiness check, so it must allow client authentication.
        """
        tls = (tls_cert, tls_key, tls_ca)
        if any(tls) and not all(tls):
            raise ZooKeeperError("tls_cert, tls_key and tls_ca go together: give all three or none")
        self.host = host
        self._port_chosen = not port  # another process may take a port we chose before ZooKeeper binds it
        self.port = port or free_port(host)
        self._owned_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="zookeeper-"))
        self.tick_time = tick_time
        self.max_session_timeout = max_session_timeout
        self.heap = heap
        self.tls_cert = Path(tls_cert) if tls_cert else None
        self.tls_key = Path(tls_key) if tls_key else None
        self.tls_ca = Path(tls_ca) if tls_ca else None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def tls(self) -> bool:
        """Whether the server speaks TLS (only)."""
        return self.tls_cert is not None

    @property
    def hosts(self) -> str:
        """The connect string: ``host:port``."""
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server process is alive (paused counts as alive)."""
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path:
        """The server's log file."""
        return self.data_dir / "zookeeper.log"

    def start(self, timeout: float = 30.0) -> ZooKeeperServer:
        """Start (or restart) the server and wait until it answers; raise if it does not."""
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperError(
                "java is not on PATH; ZooKeeper needs Java 17 (apt-get install openjdk-17-jre-headless)"
            )
        if not Path(ZOOKEEPER_JARS[0]).exists():
            raise ZooKeeperError(f"{ZOOKEEPER_JARS[0]} is missing: install Debian's zookeeper package")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        tick_ms = max(int(self.tick_time * 1000), 1)
        config.write_text(
            f"tickTime={tick_ms}\n"
            f"dataDir={self.data_dir / 'data'}\n"
            + (self._tls_config() if self.tls else f"clientPort={self.port}\nclientPortAddress={self.host}\n")
            + f"maxSessionTimeout={int(self.max_session_timeout * 1000)}\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,stat,mntr\n"
            "maxClientCnxns=0\n"
        )
        jars = ZOOKEEPER_JARS + (NETTY_JARS if self.tls else ())
        classpath = ":".join(jar for jar in jars if Path(jar).exists())
        with open(self.log_path, "ab") as log:
            logged = log.tell()  # where this start's output begins (append mode opens at the end)
            self._process = subprocess.Popen(
                [
                    *die_with_parent_prefix(),
                    java,
                    f"-Xmx{self.heap}",
                    "-XX:+UseSerialGC",
                    "-cp",
                    classpath,
                    f"-Dzookeeper.log.dir={self.data_dir}",
                    MAIN_CLASS,
                    str(config),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                if self._port_chosen and "Address already in use" in self._log_since(logged):
                    # Another process took the port we chose before ZooKeeper bound it (tests run
                    # side by side): choose again.  Only at the first start: clients know the port after.
                    logger.info("ZooKeeper port %d was taken before it bound; choosing another", self.port)
                    self.port = free_port(self.host)
                    return self.start(max(deadline - time.monotonic(), 1.0))
                raise ZooKeeperError(
                    f"ZooKeeper exited with code {self._process.returncode}: {self._log_tail()}"
                )
            if self.four_letter("ruok") == "imok":
                logger.info("ZooKeeper running at %s", self.hosts)
                self._port_chosen = False
                return self
            time.sleep(0.05)
        self.kill()
        raise ZooKeeperError(
            f"ZooKeeper did not start within {timeout:g}s at {self.hosts}: {self._log_tail()}"
        )

    def four_letter(self, command: str, timeout: float = 1.0) -> str | None:
        """Send a four-letter command (``ruok``, ``srvr``, ``mntr``); ``None`` if there is no answer."""
        try:
            with contextlib.ExitStack() as stack:
                s = stack.enter_context(socket.create_connection((self.host, self.port), timeout=timeout))
                if self.tls:
                    s = stack.enter_context(self._client_context().wrap_socket(s, server_hostname=self.host))
                s.sendall(command.encode())
                chunks = []
                while chunk := s.recv(65536):
                    chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
        except OSError:  # ssl.SSLError included
            return None

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s); the data directory stays."""
        self._signal_and_wait(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self._signal_and_wait(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: the server stops answering but keeps its sockets."""
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGCONT)

    def close(self) -> None:
        """Stop the server and remove a data directory this object made."""
        self.kill()
        if self._owned_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tls_config(self) -> str:
        """zoo.cfg lines of a TLS-only server; writes the PEM key store (key, then certificates)."""
        assert self.tls_cert is not None and self.tls_key is not None and self.tls_ca is not None
        texts = []
        for path in (self.tls_key, self.tls_cert, self.tls_ca):
            try:
                texts.append(path.read_text(encoding="ascii"))
            except OSError as exc:
                raise ZooKeeperError(f"cannot read ZooKeeper's TLS file {path}: {exc.strerror}") from None
            except UnicodeDecodeError:  # its message would quote a byte of the key
                raise ZooKeeperError(f"ZooKeeper's TLS file {path} is not PEM text") from None
        key, chain, _ = texts
        if "-----BEGIN PRIVATE KEY-----" not in key:
            raise ZooKeeperError(
                f"{self.tls_key} is not an unencrypted PKCS#8 PEM key (-----BEGIN PRIVATE KEY-----), "
                f"the only kind ZooKeeper reads; convert it: openssl pkey -in {self.tls_key} -out key.pem"
            )
        key_store = self.data_dir / "tls-keystore.pem"
        key_store.touch(mode=0o600)
        key_store.chmod(0o600)
        key_store.write_text(key.rstrip("\n") + "\n" + chain)
        return (
            f"secureClientPort={self.port}\n"
            f"secureClientPortAddress={self.host}\n"
            f"serverCnxnFactory={NETTY_FACTORY}\n"
            f"ssl.keyStore.location={key_store}\n"
            "ssl.keyStore.type=PEM\n"
            f"ssl.trustStore.location={self.tls_ca.resolve()}\n"
            "ssl.trustStore.type=PEM\n"
        )

    def _client_context(self) -> ssl.SSLContext:
        """The four-letter commands' TLS: trusts ``tls_ca``, presents the server's own certificate."""
        context = ssl.create_default_context(cafile=str(self.tls_ca))
        context.load_cert_chain(str(self.tls_cert), str(self.tls_key))
        return context

    def _signal_and_wait(self, sig: int) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGCONT)  # a paused server must be able to die
        process.send_signal(sig)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"
