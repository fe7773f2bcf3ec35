"""Brokers on this machine, for notebooks, demos, tests and benchmarks.

``LocalBroker`` runs ``python -m broker_node`` as a child process with its own
data directory, either with an embedded nats-server (the default) or against
given NATS servers, and waits until it serves::

    with LocalBroker() as broker:
        client = SyncClient(nats_urls=broker.nats_url, broker=broker.flight)

``LocalCluster`` runs a whole cluster: a ZooKeeper (Debian's package, no
system service), one nats-server and several brokers, each a child process::

    with LocalCluster(brokers=3) as cluster:
        client = SyncClient(nats_urls=cluster.nats_url, broker=cluster.flight)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark_jetstream.lifecycle import StartStop
from pyspark_jetstream.protocol.errors import UnavailableError

RUNTIME_FILE = "broker.json"
_DEBUG_LINE = re.compile(r"\d{4}-\d\d-\d\d \S+ DEBUG ")
"""A DEBUG record's first line in the broker's text log format."""


@dataclass(frozen=True, slots=True)
class FlightPlace:
    """Where a local broker serves Flight: the ``[flight]`` options ``host``, ``port`` (0: a free
    one) and ``advertised_host`` (``None``: ``host``)."""

    host: str = "127.0.0.1"
    port: int = 0
    advertised_host: str | None = None

    def toml(self) -> str:
        """The options as lines of a ``[flight]`` table."""
        lines = f'host = "{self.host}"\nport = {self.port}\n'
        if self.advertised_host is not None:
            lines += f'advertised_host = "{self.advertised_host}"\n'
        return lines


class LocalBroker:
    """A broker child process; ``start()``/``stop()`` or use it as a context manager."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        nats_url: str | None = None,
        embedded_nats_port: int = -1,
        broker_id: str = "broker-1",
        flight_port: int = 0,
        flight: FlightPlace | None = None,
        extra_config: str = "",
        maintenance_interval: float = 30.0,
        log_level: str = "INFO",
        start_timeout: float = 30.0,
    ) -> None:
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="jetstream-")) / "data"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.broker_id = broker_id
        self.nats_url = nats_url
        self.flight = ""
        self.replication = ""
        """``tcp://host:port`` (or ``tls://``) of its replication listener, once started."""
        self.metrics: str | None = None
        """``http://host:port`` of /metrics and /healthz, when ``[metrics]`` serves them."""
        self.log_level = log_level
        self.start_timeout = start_timeout
        stem = self.data_dir.parent / self.data_dir.name
        self.config_path = stem.with_suffix(".toml")
        self.log_path = stem.with_suffix(".log")
        nats_table = f'servers = ["{nats_url}"]' if nats_url else f"embedded_port = {embedded_nats_port}"
        self.config_path.write_text(
            f'[broker]\nid = "{broker_id}"\ndata_dir = "{self.data_dir}"\n'
            f"maintenance_interval = {maintenance_interval}\n"
            f"[nats]\n{nats_table}\n[flight]\n{(flight or FlightPlace(port=flight_port)).toml()}"
            f"{extra_config}"
        )
        self.process: subprocess.Popen[bytes] | None = None
        self._owner_pipe: int | None = None
        """The write end of the pipe the broker watches (see :meth:`start`)."""

    def start(self) -> LocalBroker:
        """Start the broker and wait until it serves; raise ``UnavailableError`` if it does not."""
        runtime = self.data_dir / RUNTIME_FILE
        runtime.unlink(missing_ok=True)
        # The broker ends when this process does, however it ends: it watches the read end of a
        # pipe whose write end only this process holds (see broker_node/owner.py).
        watched, self._owner_pipe = os.pipe()
        try:
            with open(self.log_path, "ab") as log:  # the child keeps its own copy of the handle
                self.process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "broker_node",
                        "--config",
                        str(self.config_path),
                        "--log-level",
                        self.log_level,
                        "--owner-fd",
                        str(watched),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(watched,),
                )
        finally:
            os.close(watched)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.stop()  # gone: this lets go of its pipe
                raise UnavailableError(f"the broker exited with code {code}: {self.log_tail()}")
            if runtime.exists():
                info = json.loads(runtime.read_text())
                self.flight = info["flight"]
                self.replication = info.get("replication") or ""
                self.nats_url = info["nats"][0]
                self.metrics = info.get("metrics")
                return self
            time.sleep(0.05)
        self.stop(signal.SIGKILL)
        raise UnavailableError(f"the broker did not start within {self.start_timeout:g}s: {self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the broker (SIGTERM: graceful) and wait for it; return its exit code."""
        process, self.process = self.process, None
        if process is None:
            return 0
        if process.poll() is None:
            process.send_signal(sig)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        finally:
            if self._owner_pipe is not None:  # only now: closed, it would stop the broker at once
                os.close(self._owner_pipe)
                self._owner_pipe = None

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self.stop(signal.SIGKILL)

    @property
    def running(self) -> bool:
        """Whether the broker process is alive (a paused one counts)."""
        return self.process is not None and self.process.poll() is None

    def pause(self) -> None:
        """SIGSTOP: the broker freezes, sockets open, as in a long GC pause or a stalled VM."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the broker's log without its DEBUG lines (at ``log_level="DEBUG"`` kazoo's
        alone would fill it), so a warning such as a start-up step's that hangs shows."""
        try:
            text = self.log_path.read_text()
        except OSError:
            return "(no log)"
        return "\n".join(line for line in text.splitlines() if not _DEBUG_LINE.match(line))[-chars:]

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalCluster(StartStop):
    """ZooKeeper, one nats-server and ``brokers`` broker processes, each with its own data directory.

    Broker ids are ``broker-1`` ... ``broker-N``.  ``extra_config`` is TOML
    appended to every broker's configuration (``[replication]``, ``[log]``
    ...); ``session_timeout`` is the brokers' ZooKeeper session timeout;
    ``flight``, one :class:`FlightPlace` per broker, where each serves Flight
    (by default 127.0.0.1 and a free port).
    """

    def __init__(
        self,
        brokers: int = 3,
        *,
        base_dir: str | Path | None = None,
        session_timeout: float = 3.0,
        cursor_replication_factor: int | None = None,
        extra_config: str = "",
        chroot: str = "/pyspark-jetstream",
        log_level: str = "INFO",
        maintenance_interval: float = 30.0,
        nats_config: str = "",
        flight: Sequence[FlightPlace] = (),
    ) -> None:
        from broker_node.nats_server import NatsServer
        from broker_node.zookeeper_server import ZooKeeperServer

        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="jetstream-cluster-"))
        self.zookeeper = ZooKeeperServer(data_dir=self.base_dir / "zookeeper")
        self.nats = NatsServer(config=nats_config)
        self._brokers_wanted = brokers
        self._factor = cursor_replication_factor or min(3, brokers)
        self.session_timeout = session_timeout
        self.extra_config = extra_config
        self.chroot = chroot
        self.log_level = log_level
        self.maintenance_interval = maintenance_interval
        if flight and len(flight) != brokers:
            raise ValueError(f"give one FlightPlace per broker ({brokers}), not {len(flight)}")
        self.places = list(flight) or [FlightPlace()] * brokers
        self.brokers: list[LocalBroker] = []

    @property
    def nats_url(self) -> str:
        """The cluster's NATS server."""
        return self.nats.url

    @property
    def flight(self) -> str:
        """A running broker's Flight address (clients find the rest)."""
        return next(b.flight for b in self.brokers if b.running)

    @property
    def flights(self) -> list[str]:
        """Every running broker's Flight address."""
        return [b.flight for b in self.brokers if b.running]

    def start(self) -> LocalCluster:
        """Start ZooKeeper, NATS and every broker; return once all serve."""
        self.zookeeper.start()
        self.nats.start()
        zookeeper_table = (
            f'[zookeeper]\nhosts = "{self.zookeeper.hosts}"\nchroot = "{self.chroot}"\n'
            f"session_timeout = {self.session_timeout}\ncursor_replication_factor = {self._factor}\n"
        )
        for n in range(1, self._brokers_wanted + 1):
            self.brokers.append(
                LocalBroker(
                    self.base_dir / f"broker-{n}",
                    nats_url=self.nats.url,
                    broker_id=f"broker-{n}",
                    flight=self.places[n - 1],
                    extra_config=zookeeper_table + self.extra_config.replace("{broker_id}", f"broker-{n}"),
                    log_level=self.log_level,
                    maintenance_interval=self.maintenance_interval,
                )
            )
        for broker in self.brokers:
            broker.start()
        return self

    def broker(self, broker_id: str) -> LocalBroker:
        """The broker process with that id."""
        return self.brokers[int(broker_id.rsplit("-", 1)[1]) - 1]

    def stop(self) -> None:
        """Stop every broker (gracefully, then by force), NATS and ZooKeeper."""
        for broker in self.brokers:
            try:
                broker.resume()
                broker.stop(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        self.nats.stop()
        self.zookeeper.kill()
