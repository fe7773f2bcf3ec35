"""A cluster that faults can be injected into: real processes, real signals, cuttable links.

Three broker processes, Debian's ZooKeeper and one nats-server, as
``LocalCluster`` runs them, plus a TCP proxy on every broker-to-broker link
(``[replication] peer_addresses`` and ``peer_replication_addresses``): broker
A reaches broker B's Flight server and replication listener only through the
proxies A->B, so the harness can cut the network
between brokers, link by link, while clients and ZooKeeper still reach every
broker.  (A proxy rather than network namespaces: it needs no privileges, so
the suite runs the same on a developer's machine and in CI, and a cut is a
real one -- connections are reset, new ones refused -- on the path the
replication protocol takes.)
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from pyspark_jetstream.local import LocalBroker, LocalCluster


class Proxy:
    """A TCP proxy from a local port to ``target``, that can be cut and healed.

    ``target`` gives the port to connect to, asked at each connection: a broker
    binds a new Flight port each time it starts (port 0), so no port is picked
    ahead and lost to another process in between.
    """

    def __init__(self, target: Callable[[], int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name=f"proxy-{self.port}").start()

    def cut(self) -> None:
        """Reset every connection and refuse new ones."""
        self._cut.set()
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.close()

    def heal(self) -> None:
        """Let connections through again."""
        self._cut.clear()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target()), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if self._cut.is_set():
                    break
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.close()
        with self._lock:
            self._sockets -= {source, sink}


class FaultCluster(LocalCluster):
    """A ``LocalCluster`` with a proxy on every broker-to-broker link (see the module docstring)."""

    def __init__(self, brokers: int = 3, **options: object) -> None:
        super().__init__(brokers, **options)  # type: ignore[arg-type]
        self.ids = [f"broker-{n}" for n in range(1, brokers + 1)]
        self.proxies: dict[tuple[str, str], tuple[Proxy, Proxy]] = {}
        """Each link's proxies: to the target's Flight server, and to its replication listener."""

    def start(self) -> FaultCluster:
        self.zookeeper.start()
        self.nats.start()
        for source in self.ids:
            for target in self.ids:
                if source != target:
                    self.proxies[(source, target)] = (
                        Proxy(self._port_of(target, "flight")),
                        Proxy(self._port_of(target, "replication")),
                    )
        common = (
            f'[zookeeper]\nhosts = "{self.zookeeper.hosts}"\nchroot = "{self.chroot}"\n'
            f"session_timeout = {self.session_timeout}\ncursor_replication_factor = {self._factor}\n"
        )
        for broker_id in self.ids:
            others = [target for target in self.ids if target != broker_id]
            peers = "".join(
                f'{target} = "grpc://127.0.0.1:{self.proxies[(broker_id, target)][0].port}"\n'
                for target in others
            )
            peers += "[replication.peer_replication_addresses]\n" + "".join(
                f'{target} = "tcp://127.0.0.1:{self.proxies[(broker_id, target)][1].port}"\n'
                for target in others
            )
            self.brokers.append(
                LocalBroker(
                    self.base_dir / broker_id,
                    nats_url=self.nats.url,
                    broker_id=broker_id,
                    extra_config=common + self.extra_config + f"[replication.peer_addresses]\n{peers}",
                    log_level=self.log_level,
                    maintenance_interval=self.maintenance_interval,
                )
            )
        for broker in self.brokers:
            broker.start()
        return self

    def _port_of(self, broker_id: str, listener: str) -> Callable[[], int]:
        """The port of ``broker_id``'s ``flight`` or ``replication`` listener as it bound it when
        it last started (0, refused, before that)."""

        def port() -> int:
            address = getattr(self.broker(broker_id), listener)
            return int(address.rsplit(":", 1)[1]) if address else 0

        return port

    def isolate(self, broker_id: str) -> None:
        """Cut every link between ``broker_id`` and the other brokers (both ways)."""
        for (source, target), proxies in self.proxies.items():
            if broker_id in (source, target):
                for proxy in proxies:
                    proxy.cut()

    def heal_network(self) -> None:
        """Restore every link."""
        for proxies in self.proxies.values():
            for proxy in proxies:
                proxy.heal()

    def stop(self) -> None:
        super().stop()
        for proxies in self.proxies.values():
            for proxy in proxies:
                proxy.close()

    # ---- faults on a broker's files and limits ------------------------------------------------

    def limit_file_size(self, broker_id: str, size: int | None) -> None:
        """Make every write past ``size`` bytes of a file fail (EFBIG), as a full disk does; ``None``
        lifts the limit."""
        process = self.broker(broker_id).process
        if process is None:
            return
        limit = "unlimited" if size is None else str(size)
        subprocess.run(["prlimit", f"--pid={process.pid}", f"--fsize={limit}:unlimited"], check=True)

    def session(self, broker_id: str) -> tuple[int, bytes]:
        """A broker's ZooKeeper session id and password."""
        data = json.loads((self.broker(broker_id).data_dir / "zookeeper.session").read_text())
        return data["session_id"], bytes.fromhex(data["password"])


def partition_dirs(broker: LocalBroker, stream: str) -> list[Path]:
    """A stopped broker's partition directories of ``stream``."""
    return sorted(p for p in (broker.data_dir / "streams" / stream).glob("*") if p.is_dir())


def cut_tail(directory: Path, rng: random.Random) -> int:
    """Cut the newest segment's last bytes, as a machine that lost its page cache would; return how many."""
    segments = sorted(directory.glob("*.arrows"))
    if not segments:
        return 0
    newest = segments[-1]
    size = newest.stat().st_size
    header = 512  # keep the schema message
    if size <= header:
        return 0
    cut = rng.randint(1, min(size - header, 64 * 1024))
    with open(newest, "r+b") as f:
        f.truncate(size - cut)
    return cut


def flip_a_bit(directory: Path, rng: random.Random) -> Path | None:
    """Flip one bit in the body of a closed segment (not the newest); return the file."""
    segments = sorted(directory.glob("*.arrows"))[:-1]
    if not segments:
        return None
    target = rng.choice(segments)
    data = bytearray(target.read_bytes())
    if len(data) < 1024:
        return None
    position = rng.randint(600, len(data) - 1)
    data[position] ^= 1 << rng.randint(0, 7)
    target.write_bytes(bytes(data))
    return target
