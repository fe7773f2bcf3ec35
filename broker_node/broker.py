"""A broker process: NATS in, logs on disk, Arrow Flight out.  This module is wiring.

Start-up order: lock the data directory, NATS (the embedded server, or the
configured ones), the Flight server, the coordinator (a metadata file, or a
cluster's ZooKeeper), the check that metadata and data agree, the partitions
(:class:`~broker_node.replication.manager.ReplicaManager`), the NATS
subscriptions of the partitions led here, and last the discovery answer and
runtime file that let clients find it.  Shutdown runs the other way, after a
controlled shutdown in a cluster (the controller moves this broker's
leadership to other in-sync replicas first).

Threads: the asyncio loop runs NATS ingestion and the background tasks; the
Flight server runs its calls on its own threads; coordinator callbacks come
on the coordinator's threads and are handed to the loop.  Metadata changes
are applied by :meth:`Broker.sync` on the loop (the partitions in a worker
thread, then the subscriptions), one at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from pyarrow import flight

from broker_node.api.server import FlightApi
from broker_node.config import BrokerConfig, ConfigError, SecurityConfig
from broker_node.coordination.base import BrokerInfo, Coordinator, SessionState
from broker_node.coordination.errors import MetadataError
from broker_node.coordination.local import LocalCoordinator, rebuild_metadata
from broker_node.coordination.zookeeper import ZooKeeperCoordinator
from broker_node.durable import atomic_write
from broker_node.ingest.ingestor import Ingestor
from broker_node.log import FsyncPolicy, LogConfig, LogError
from broker_node.metrics import MetricsServer
from broker_node.nats_server import NatsServer
from broker_node.replication.cursors import CURSOR_STREAM_CONFIG
from broker_node.replication.manager import ReplicaManager
from broker_node.replication.partition import Partition
from broker_node.replication.records import partition_directories, read_record
from broker_node.security import AccessControl
from broker_node.service import BrokerService
from pyspark_jetstream.client.credentials import Credentials
from pyspark_jetstream.protocol.errors import JetStreamError, UnknownStreamError
from pyspark_jetstream.protocol.streams import INTERNAL_PREFIX, StreamConfig

logger = logging.getLogger(__name__)

RUNTIME_FILE = "broker.json"
"""Written in the data directory once the broker serves: its addresses and pid."""
SESSION_FILE = "zookeeper.session"
"""In a cluster, the broker's ZooKeeper session (id and password, readable by its user only):
whoever holds it can expire the session, fencing the broker (operators, fault tests)."""
LOCK_FILE = "broker.lock"
NATS_PID_FILE = "nats-server.pid"
"""The embedded nats-server's pid, so a next start can stop one that outlived its broker."""
NATS_RESTART_BACKOFF = (0.5, 30.0)
"""First and longest wait (seconds) before restarting an embedded nats-server that died."""
SYNC_TIMEOUT = 30.0


class Broker:
    """One broker: its partitions, the NATS ingestion and the Flight server."""

    def __init__(self, config: BrokerConfig, coordinator: Coordinator | None = None) -> None:
        self.config = config
        self.broker_id = config.broker_id
        self.data_dir = Path(config.data_dir).resolve()
        if coordinator is None:
            if config.zookeeper.hosts:
                coordinator = ZooKeeperCoordinator(config.zookeeper, internal_streams=self._internal_streams)
            else:
                coordinator = LocalCoordinator(self.data_dir)
        self.coordinator = coordinator
        lease = getattr(coordinator, "lease_valid", None)
        self.manager = ReplicaManager(
            config.broker_id,
            self.data_dir,
            coordinator,
            config.replication,
            self.log_config,
            lease=lease if callable(lease) else (lambda: True),
        )
        security = config.security
        self.access = AccessControl(
            security.acl_file,
            on_change=self._security_changed,
            publish=coordinator.store_acl if self.clustered else None,
        )
        self.credentials = _own_credentials(config)
        """What this broker presents to NATS and to its peers."""
        self.manager.connect_peer = self._connect_peer
        self.service = BrokerService(self)
        self.flight_address = ""
        self.nats_urls: list[str] = []
        self.nats_server: NatsServer | None = None
        self.ingestor: Ingestor | None = None
        self._flight: FlightApi | None = None
        self._metrics: MetricsServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync_lock: asyncio.Lock | None = None
        self._background: list[asyncio.Task[None]] = []
        self._lock_file: IO[str] | None = None
        self._started = False

    @property
    def clustered(self) -> bool:
        """Whether the broker is one of a ZooKeeper-coordinated cluster."""
        return isinstance(self.coordinator, ZooKeeperCoordinator)

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def event_loop(self) -> str:
        """Whose event loop the broker runs on: ``uvloop`` or ``asyncio`` (``""`` before start)."""
        return type(self._loop).__module__.split(".")[0] if self._loop is not None else ""

    async def start(self) -> None:
        """Start everything (see the module docstring); what was started is stopped again on failure."""
        self._loop = asyncio.get_running_loop()
        self._sync_lock = asyncio.Lock()
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        exposed = self.config.exposed_insecurely()
        if exposed:
            raise ConfigError(
                f"refusing to listen on {', '.join(exposed)} without TLS and an ACL: anyone who can reach "
                "it could read, write and delete every stream. Set [security] tls_cert, tls_key and "
                "acl_file (see conf/secure/), bind to 127.0.0.1, or set [security] insecure = true"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        nats_config = self.config.nats
        if nats_config.servers:
            self.nats_urls = list(nats_config.servers)
        else:
            self.nats_server = NatsServer(
                host=nats_config.embedded_host,
                port=nats_config.embedded_port,
                pid_file=self.data_dir / NATS_PID_FILE,
                config=self._nats_config(),
            )
            self.nats_server.always_config = self.access.enabled
            # Launched from the loop's thread, which lives as long as the broker:
            # the server is killed when the thread that started it ends.
            self.nats_server.launch()
            await asyncio.to_thread(self.nats_server.wait_ready)
            self.nats_urls = [self.nats_server.url]
            self._background.append(asyncio.ensure_future(self._supervise_nats(self.nats_server)))
        self.ingestor = await Ingestor.connect(
            self.nats_urls,
            nats_config,
            self.config.ingest,
            self.service.discovery,
            name=f"pyspark-jetstream broker {self.broker_id}",
            streams=self._stream_config,
            connect_arguments=self.credentials.nats_arguments(),
        )
        flight_config = self.config.flight
        security = self.config.security
        scheme = "grpc+tls" if security.tls else "grpc"
        self._flight = FlightApi(
            f"{scheme}://{flight_config.host}:{flight_config.port}",
            self.service,
            access=self.access,
            max_streams=security.max_streams,
            max_waiting_readers=flight_config.max_waiting_readers,
            **_flight_tls(security),
        )
        host = flight_config.advertised_host or flight_config.host
        self.flight_address = f"{scheme}://{host}:{self._flight.port}"
        metrics_config = self.config.metrics
        if metrics_config.port >= 0:
            self._metrics = MetricsServer(metrics_config.host, metrics_config.port, self.service, self)
        info = BrokerInfo(self.broker_id, self.flight_address, tuple(self.nats_urls))
        await asyncio.to_thread(self.coordinator.start, info)
        if self.clustered and self.access.enabled:
            self.coordinator.watch_acl(self._acl_stored)
        self.manager.check_data()
        self.manager.clean_up()
        self.coordinator.add_listener(self._on_metadata_change)
        self.coordinator.add_session_listener(self._on_session)
        if not self.clustered:
            self.coordinator.create_stream(CURSOR_STREAM_CONFIG)
        await self.sync()
        self.manager.start()
        self._started = True
        # Let clients find us only once every partition is loaded.  (The Flight
        # server has served since it was made; FlightServerBase.serve() is not
        # called because it installs its own SIGTERM handler, which would wait for
        # every open call to end before the broker even hears of the signal.)
        await self.ingestor.answer_discovery()
        self._background.append(
            asyncio.ensure_future(
                self._every(self.config.maintenance_interval, Partition.maintain, "maintenance")
            )
        )
        self._background.append(
            asyncio.ensure_future(
                self._every(self.config.maintenance_interval, self.manager.repair_leader, "leader repair")
            )
        )
        if self.config.log.fsync is FsyncPolicy.INTERVAL:
            # Appends fsync when an interval has passed; this covers the end of a burst.
            self._background.append(
                asyncio.ensure_future(
                    self._every(self.config.log.fsync_interval, _sync_if_due, "interval fsync")
                )
            )
        self._write_runtime_files()
        logger.info(
            "broker %s serving Flight at %s, NATS %s, metadata in %s",
            self.broker_id,
            self.flight_address,
            self.nats_urls,
            self.coordinator.describe(),
        )

    def _lock_data_dir(self) -> None:
        """Refuse to share the data directory with another running broker."""
        path = self.data_dir / LOCK_FILE
        handle = open(path, "a+")  # noqa: SIM115 - held for the broker's life
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ConfigError(
                f"the data directory {self.data_dir} is in use by another broker (pid {holder}): "
                "two brokers cannot share one data directory; give each its own data_dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock_file = handle

    def _write_runtime_files(self) -> None:
        runtime = {
            "broker_id": self.broker_id,
            "flight": self.flight_address,
            "nats": self.nats_urls,
            "pid": os.getpid(),
        }
        if self._metrics is not None:
            runtime["metrics"] = self._metrics.address
        atomic_write(self.data_dir / RUNTIME_FILE, json.dumps(runtime).encode())
        session = getattr(self.coordinator, "session", None)
        if callable(session) and (value := session()) is not None:
            path = self.data_dir / SESSION_FILE
            atomic_write(path, json.dumps({"session_id": value[0], "password": value[1].hex()}).encode())
            path.chmod(0o600)

    async def _supervise_nats(self, server: NatsServer) -> None:
        """Restart the embedded nats-server on its port whenever it dies; the NATS client reconnects."""
        wait, longest = NATS_RESTART_BACKOFF
        while True:
            await asyncio.sleep(0.2 if server.running else wait)
            if server.running:
                wait = NATS_RESTART_BACKOFF[0]
                continue
            port = server.port or server.requested_port
            logger.error("the embedded nats-server died; restarting it on port %s", port)
            server.stop()  # reap it, remove its files
            server.requested_port = port
            try:
                server.launch()
                await asyncio.to_thread(server.wait_ready)
            except Exception:
                logger.exception("cannot restart the embedded nats-server; retrying in %gs", wait)
                wait = min(wait * 2, longest)

    # ---- counts for the metrics (read at scrape time, from the metrics thread) -------------

    def flight_requests(self) -> dict[tuple[str, str], int]:
        """Flight calls served so far, by kind and outcome code."""
        return dict(self._flight.requests) if self._flight is not None else {}

    def follow_readers(self) -> int:
        """Flight follow reads open now."""
        return self._flight.follow_readers if self._flight is not None else 0

    def waiting_readers(self) -> int:
        """Follow and long-polling reads holding a Flight thread now."""
        return self._flight.waiting_readers if self._flight is not None else 0

    def live_tail_batches(self) -> dict[tuple[str, int], int]:
        """Batches each partition led here has published on its live tail."""
        if self.ingestor is None:
            return {}
        return {key: tail.batches for key, tail in self.ingestor.tails.items()}

    def ack_latency(self) -> dict[str, tuple[list[tuple[float, int]], float]]:
        """Each stream's ack latency: cumulative counts per bucket bound (``inf`` last), and the sum."""
        if self.ingestor is None:
            return {}
        return {stream: h.snapshot() for stream, h in self.ingestor.ack_latency().items()}

    def partition_messages_in(self) -> dict[tuple[str, int], int]:
        """Messages each partition held here has appended as leader since it was opened."""
        return {(p.stream, p.number): p.messages_in for p in self.manager.held()}

    def producer_not_stored(self) -> dict[tuple[str, int, str], int]:
        """Idempotent appends to each partition held here that stored nothing, by verdict."""
        return {
            (p.stream, p.number, verdict.value): count
            for p in self.manager.held()
            for verdict, count in p.producer_not_stored.items()
        }

    def nats_connected(self) -> bool:
        """Whether the NATS connection is up."""
        return self.ingestor is not None and self.ingestor.connected

    def partition_files(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Bytes on disk and segment count of every partition held here."""
        out = {}
        for partition in self.manager.held():
            try:
                out[(partition.stream, partition.number)] = (
                    partition.log.size_bytes,
                    len(partition.log.segment_base_offsets),
                )
            except LogError:  # closed meanwhile
                continue
        return out

    async def close(self) -> None:
        """Hand leadership over (cluster), stop accepting, store what is pending, close everything.

        What cannot be closed (a full disk, say) is logged and raised at the
        end as one ``MetadataError``, after everything else was closed.
        """
        (self.data_dir / RUNTIME_FILE).unlink(missing_ok=True)
        if self._started and self.clustered:
            await self._hand_over_leadership()
        for task in self._background:
            task.cancel()
        if self.ingestor is not None:
            await self.ingestor.close()
        for partition in self.manager.held():
            partition.wake_readers()
        if self._flight is not None:
            await asyncio.to_thread(self._flight.shutdown)
        if self._metrics is not None:
            await asyncio.to_thread(self._metrics.close)
        failures = await asyncio.to_thread(self.manager.close)
        self.coordinator.close()
        if self.nats_server is not None:
            await asyncio.to_thread(self.nats_server.stop)
        (self.data_dir / SESSION_FILE).unlink(missing_ok=True)
        if self._lock_file is not None:
            self._lock_file.close()
        logger.info("broker %s stopped", self.broker_id)
        if failures:
            raise MetadataError("could not close everything cleanly: " + "; ".join(failures))

    async def _hand_over_leadership(self) -> None:
        """Controlled shutdown: ask the controller to move our leadership, wait (bounded) for it."""
        timeout = self.config.zookeeper.controlled_shutdown_timeout
        try:
            await asyncio.to_thread(self.coordinator.request_controlled_shutdown, self.broker_id)
        except JetStreamError as exc:  # the coordinator out of reach: its message says so
            logger.warning("cannot ask for a controlled shutdown (%s); stopping without it", exc)
            return
        except Exception:
            logger.exception("cannot ask for a controlled shutdown; stopping without it")
            return
        deadline = time.monotonic() + timeout
        while True:
            await self.sync()
            movable = [
                f"{p.stream}/{p.number}"
                for p in self.manager.leaders().values()
                if any(r != self.broker_id for r in p.state.isr)
            ]
            if not movable:
                logger.info("controlled shutdown: no partition led here can move to another replica")
                return
            if time.monotonic() > deadline:
                logger.warning("controlled shutdown timed out; still leading %s", ", ".join(movable))
                return
            await asyncio.sleep(0.1)

    # ---- metadata ------------------------------------------------------------------------

    def _internal_streams(self, live: int) -> list[StreamConfig]:
        """Internal streams for the controller to create once ``live`` brokers are up."""
        factor = self.config.zookeeper.cursor_replication_factor
        if live < factor:
            return []
        return [dataclasses.replace(CURSOR_STREAM_CONFIG, replication_factor=factor)]

    def _on_metadata_change(self) -> None:
        self.request_sync()

    def _on_session(self, state: SessionState) -> None:
        """Coordinator thread: fence every partition led here while the session is in doubt."""
        if state is SessionState.CONNECTED:
            self.manager.fence(False)
            self.request_sync()
        else:
            logger.warning("coordinator session %s: this broker stops acting as leader", state.value)
            self.manager.fence(True)

    def request_sync(self) -> concurrent.futures.Future[None]:
        """Apply the coordinator's metadata soon (from any thread)."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self.sync(), self._loop)
        future.add_done_callback(_log_failure)
        return future

    def wait_for_sync(self) -> None:
        """From a Flight thread: apply metadata changes before answering."""
        self.request_sync().result(SYNC_TIMEOUT)

    async def sync(self) -> None:
        """Make partitions and subscriptions fit the coordinator's metadata."""
        assert self._sync_lock is not None
        async with self._sync_lock:
            await asyncio.to_thread(self._reconfigure_nats)
            await asyncio.to_thread(self.manager.apply)
            if self.ingestor is not None:
                leading = {
                    key: partition
                    for key, partition in self.manager.leaders().items()
                    if not key[0].startswith(INTERNAL_PREFIX)
                }
                await self.ingestor.sync(leading)

    # ---- security ---------------------------------------------------------------------------

    def _nats_config(self) -> str:
        """The embedded nats-server's configuration: TLS, and users with the ACL's permissions."""
        security = self.config.security
        tls: dict[str, object] | None = None
        if security.tls:
            tls = {"cert_file": security.tls_cert, "key_file": security.tls_key, "timeout": 5}
            if security.tls_ca:
                tls["ca_file"] = security.tls_ca
            if security.verify_clients:
                tls["verify"] = True
        subjects: dict[str, list[str]] = {}
        with contextlib.suppress(Exception):  # before the coordinator starts: no streams yet
            subjects = {
                s.config.name: s.config.partition_subjects()
                for s in self.coordinator.list_streams()
                if not s.config.name.startswith(INTERNAL_PREFIX)
            }
        return self.access.nats_config(subjects, tls)

    def _reconfigure_nats(self) -> None:
        """Reload the embedded nats-server if its permissions changed (streams, ACL)."""
        server = self.nats_server
        if server is None or not self.access.enabled:
            return
        config = self._nats_config()
        if config != server.config:
            server.reload(config)
            logger.info("reloaded the embedded nats-server's permissions")

    def _acl_stored(self, text: str | None) -> None:
        """The cluster's ACL in ZooKeeper changed (or is first read): every broker enforces it.
        None stored yet: this broker's file becomes the cluster's."""
        if text is None:
            if self.access.text is not None:
                self.coordinator.store_acl(self.access.text)
            return
        self.access.offer_text(text, "the ACL in ZooKeeper")

    def _security_changed(self) -> None:
        """The ACL changed (any thread): the embedded NATS's permissions follow."""
        loop = getattr(self, "_loop", None)  # None while the broker is being made
        if loop is not None and self.nats_server is not None:
            loop.call_soon_threadsafe(self.request_sync)

    def _connect_peer(self, address: str) -> flight.FlightClient:
        """A Flight client to another broker, with this broker's TLS trust and credentials."""
        return flight.connect(address, **self.credentials.flight_arguments())

    def _stream_config(self, name: str) -> StreamConfig | None:
        """A stream's configuration as the coordinator has it (``None``: no such stream)."""
        try:
            return self.coordinator.get_stream(name).config
        except UnknownStreamError:
            return None

    def log_config(self, config: StreamConfig) -> LogConfig:
        """A partition's log settings: the broker's defaults with the stream's own."""
        return dataclasses.replace(
            self.config.log,
            segment_bytes=config.segment_bytes,
            retention_age=config.retention_age,
            retention_bytes=config.retention_bytes,
            retention_messages=config.retention_messages,
            compaction=config.compaction,
            max_message_bytes=config.max_message_bytes,
            compression=config.compression,
        )

    async def _every(self, seconds: float, work: Callable[[Partition], object], what: str) -> None:
        """Run ``work`` on every partition (in a worker thread) every ``seconds``."""
        while True:
            await asyncio.sleep(seconds)
            for partition in self.manager.held():
                try:
                    await asyncio.to_thread(work, partition)
                except Exception:
                    logger.exception("%s of %s/%d failed", what, partition.stream, partition.number)


def rebuild(config: BrokerConfig) -> list[str]:
    """Rebuild the single-broker metadata from the partitions' records; what it found, line by line."""
    if config.zookeeper.hosts:
        raise ConfigError(
            "--rebuild-metadata rebuilds a single broker's metadata.json; in a cluster the metadata "
            f"lives in ZooKeeper ({config.zookeeper.hosts})"
        )
    data_dir = Path(config.data_dir).resolve()
    records = [
        record
        for directory in partition_directories(data_dir / "streams")
        if (record := read_record(directory)) is not None
    ]
    if not records:
        raise MetadataError(f"no partition under {data_dir / 'streams'} has a partition.json to rebuild from")
    return rebuild_metadata(data_dir, records, config.broker_id)


def _log_failure(future: concurrent.futures.Future[None]) -> None:
    with contextlib.suppress(concurrent.futures.CancelledError):
        if future.exception() is not None:
            logger.error("applying a metadata change failed", exc_info=future.exception())


def _sync_if_due(partition: Partition) -> None:
    partition.log.sync_if_due()


def _flight_tls(security: SecurityConfig) -> dict[str, Any]:
    """``FlightServerBase`` keyword arguments for ``[security]``'s TLS."""
    if not security.tls:
        return {}
    pair = flight.CertKeyPair(
        Path(security.tls_cert).read_text(encoding="utf-8"),
        Path(security.tls_key).read_text(encoding="utf-8"),
    )
    arguments: dict[str, Any] = {"tls_certificates": [pair]}
    if security.verify_clients:
        arguments["verify_client"] = True
        arguments["root_certificates"] = Path(security.tls_ca).read_text(encoding="utf-8")
    return arguments


def _own_credentials(config: BrokerConfig) -> Credentials:
    """This broker's credentials file, else [security]'s CA (and certificate, for mutual TLS)."""
    security = config.security
    own = Credentials.load(security.credentials_file) if security.credentials_file else Credentials()
    if own.tls_ca is None and security.tls_ca:
        own = dataclasses.replace(own, tls_ca=security.tls_ca)
    if own.tls_cert is None and security.verify_clients:
        own = dataclasses.replace(own, tls_cert=security.tls_cert, tls_key=security.tls_key)
    return own
