"""A broker process: NATS in, logs on disk, Arrow Flight out.  This module is wiring.

Start-up runs in named steps (:meth:`Broker._start`, watched by
:class:`~broker_node.start_watch.StartWatch`, which names a step that hangs): refuse an insecure
exposure, lock the data directory (:mod:`broker_node.data_dir`), NATS (the
embedded server, :mod:`broker_node.embedded_nats`, or the configured ones),
the NATS connection, the Flight server, the metrics, the coordinator (a
metadata file, or a cluster's ZooKeeper) and the check that metadata and data
agree, the partitions (:class:`~broker_node.replication.manager.ReplicaManager`)
and the NATS subscriptions of the partitions led here, and last the discovery
answer and runtime file that let clients find it.  What the steps make is
kept in a :class:`~broker_node.runtime.Runtime`, which the service the API
calls (:class:`~broker_node.flight_service.BrokerService`) and the metrics
(:class:`~broker_node.counts.BrokerCounts`) read; neither knows the broker.
Shutdown runs the other way, after a controlled shutdown in a cluster
(:mod:`broker_node.handover`: the controller moves this broker's leadership
to other in-sync replicas first).

Threads: the asyncio loop runs NATS ingestion, replication (the listener its
followers connect to, and the fetchers of the partitions it follows) and the
background tasks; the Flight server runs its calls on its own threads; coordinator callbacks come
on the coordinator's threads and are handed to the loop.  Metadata changes
are applied by :meth:`Broker.sync` on the loop (the partitions in a worker
thread, then the subscriptions), one at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import ssl
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from pyarrow import flight

from broker_node.api.server import FlightApi
from broker_node.config import BrokerConfig, SecurityConfig
from broker_node.coordination.base import FEATURES, BrokerInfo, Coordinator, SessionState
from broker_node.coordination.errors import MetadataError
from broker_node.coordination.local import LocalCoordinator
from broker_node.coordination.zookeeper import ZooKeeperCoordinator
from broker_node.counts import BrokerCounts
from broker_node.data_dir import RUNTIME_FILE, SESSION_FILE, DataDirLock, write_runtime_files
from broker_node.embedded_nats import NATS_PID_FILE, EmbeddedNats
from broker_node.flight_service import BrokerService
from broker_node.handover import hand_over_leadership
from broker_node.ingest.ingestor import Ingestor
from broker_node.log import FsyncPolicy, LogConfig
from broker_node.log_terms import LOG_TERMS
from broker_node.metrics import MetricsServer
from broker_node.mirror_service import MirrorService
from broker_node.nats_server import NatsServerError
from broker_node.peer_credentials import (
    flight_arguments,
    load_credentials,
    nats_arguments,
    own_credentials,
    peer_link,
)
from broker_node.ports import refuse_if_taken
from broker_node.reachability import Reachability
from broker_node.replication.cursors import CURSOR_STREAM_CONFIG
from broker_node.replication.manager import ReplicaManager
from broker_node.replication.mirror_set import Mirrors
from broker_node.replication.partition import Partition
from broker_node.replication.replica_server import ReplicaServer
from broker_node.runtime import Runtime
from broker_node.security import AccessControl
from broker_node.start_watch import StartWatch
from broker_node.tail.publishers import LiveTails
from pyspark_jetstream.protocol.errors import UnknownStreamError
from pyspark_jetstream.protocol.mirror_source import MirrorSource
from pyspark_jetstream.protocol.streams import INTERNAL_PREFIX, StreamConfig

__all__ = ["NATS_PID_FILE", "RUNTIME_FILE", "SESSION_FILE", "Broker"]

logger = logging.getLogger(__name__)

SYNC_TIMEOUT = 30.0


class Broker:
    """One broker: its partitions, the NATS ingestion and the Flight server."""

    def __init__(
        self, config: BrokerConfig, coordinator: Coordinator | None = None, *, owner: int | None = None
    ) -> None:
        """``owner``: the pid of the process this broker ends with (``--owner-fd``), if any."""
        self.config = config
        self.owner = owner
        self.broker_id = config.broker_id
        self.data_dir = Path(config.data_dir).resolve()
        if coordinator is None:
            if config.zookeeper.hosts:
                coordinator = ZooKeeperCoordinator(config.zookeeper, internal_streams=self._internal_streams)
            else:
                coordinator = LocalCoordinator(self.data_dir)
        self.coordinator = coordinator
        self.clustered = isinstance(coordinator, ZooKeeperCoordinator)
        """Whether the broker is one of a ZooKeeper-coordinated cluster."""
        lease = getattr(coordinator, "lease_valid", None)
        self.manager = ReplicaManager(
            config.broker_id,
            self.data_dir,
            coordinator,
            config.replication,
            self.log_config,
            lease=lease if callable(lease) else (lambda: True),
        )
        self.access = AccessControl(
            config.security.acl_file,
            on_change=self._security_changed,
            publish=coordinator.store_acl if self.clustered else None,
        )
        self.credentials = own_credentials(config.security)
        """What this broker presents to NATS and to its peers."""
        self.manager.connect_peer = self._connect_peer
        self.runtime = Runtime(config.broker_id)
        self.reachability = (
            Reachability(config.broker_id, coordinator.brokers, self._connect_peer)
            if self.clustered
            else None
        )
        """Probes of every broker's advertised Flight address (in a cluster)."""
        self.service = BrokerService(
            self.runtime,
            self.manager,
            coordinator,
            clustered=self.clustered,
            wait_for_sync=self.wait_for_sync,
            reachability=self.reachability,
        )
        self.mirrors = Mirrors(
            self._source_connector,
            self._copy_cursor,
            follow_schema=self._follow_schema,
            max_bytes=config.replication.fetch_max_bytes,
            max_wait=config.replication.fetch_max_wait,
        )
        """The copiers of the mirrored partitions led here (see :mod:`broker_node.mirror_service`)."""
        self._mirror_service = self.service.mirrors = MirrorService(
            config.broker_id,
            self.manager,
            coordinator,
            self.mirrors,
            self._source_connector,
            create_stream=self.service.create_stream,
            controller=self.service.controller.run,
            describe=self.service.describe_stream,
            write_cursor_here=self._write_cursor_here,
            wait_for_sync=self.wait_for_sync,
        )
        self._metrics: MetricsServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync_lock: asyncio.Lock | None = None
        self._background: list[asyncio.Task[None]] = []
        self._lock: DataDirLock | None = None
        self._started = False

    # ---- start-up ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start everything (see the module docstring); what was started is stopped again on failure."""
        self._loop = asyncio.get_running_loop()
        self.runtime.event_loop = type(self._loop).__module__.split(".")[0]
        self._sync_lock = asyncio.Lock()
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        self.config.refuse_insecure_exposure()
        with StartWatch(self.broker_id) as watch:
            watch.step("locking the data directory")
            self._lock = DataDirLock.acquire(self.data_dir, owner=self.owner)
            watch.step("starting NATS")
            await self._start_nats()
            watch.step("connecting to NATS")
            await self._connect_ingest()
            watch.step("serving Flight, replication and metrics")
            self._serve_flight()
            await self._serve_replication()
            self._serve_metrics()
            watch.step("joining the coordinator")
            await self._join_coordination()
            watch.step("loading the partitions")
            await self._load_partitions()
            self._started = True
            watch.step("opening to clients")
            await self._open_to_clients()

    async def _start_nats(self) -> None:
        """The configured NATS servers, or an embedded nats-server, started and supervised."""
        nats_config = self.config.nats
        if nats_config.servers:
            self.runtime.nats_urls = list(nats_config.servers)
            self.runtime.advertised_nats = list(nats_config.servers)
            return
        nats = EmbeddedNats(
            nats_config, self.config.security, self.access, self.data_dir, self._stream_subjects
        )
        self.runtime.nats = nats
        try:
            await nats.start()
        except NatsServerError:
            refuse_if_taken(nats_config.embedded_host, nats_config.embedded_port, "[nats] embedded_port")
            raise
        self.runtime.nats_urls = [nats.url]
        self.runtime.advertised_nats = [self._advertised_nats_url(nats)]
        self._spawn(nats.supervise())

    def _advertised_nats_url(self, nats: EmbeddedNats) -> str:
        """The embedded server's URL for clients: its host, or -- when it listens on every
        address -- ``[flight] advertised_host`` (the broker connects to it over loopback)."""
        if not _wildcard(self.config.nats.embedded_host):
            return nats.url
        advertised = self.config.flight.advertised_host
        if advertised is None:
            logger.warning(
                "the embedded nats-server listens on every address, but clients are told %s: set "
                "[flight] advertised_host to a name other machines reach this broker at",
                nats.url,
            )
            return nats.url
        return f"nats://{advertised}:{nats.url.rsplit(':', 1)[1]}"

    async def _connect_ingest(self) -> None:
        ingestor = Ingestor(
            self.runtime.nats_urls,
            self.config.nats,
            self.config.ingest,
            self.service.discovery,
            name=f"pyspark-jetstream broker {self.broker_id}",
            terms=LOG_TERMS,
            streams=self._stream_config,
            connect_arguments=nats_arguments(self.credentials),
        )
        await ingestor.start()
        self.runtime.ingestor = ingestor
        if self.config.ingest.live_tail:
            self.runtime.tails = LiveTails(lambda: ingestor.nc)

    def _serve_flight(self) -> None:
        """The Flight server, serving from here on (see :meth:`_open_to_clients`)."""
        flight_config = self.config.flight
        security = self.config.security
        scheme = "grpc+tls" if security.tls else "grpc"
        try:
            server = FlightApi(
                f"{scheme}://{flight_config.host}:{flight_config.port}",
                self.service,
                access=self.access,
                max_streams=security.max_streams,
                max_waiting_readers=flight_config.max_waiting_readers,
                max_open_puts=flight_config.max_open_puts,
                **_flight_tls(security),
            )
        except Exception:  # gRPC says only "Server did not start properly"
            refuse_if_taken(flight_config.host, flight_config.port, "[flight] port")
            raise
        self.runtime.flight = server
        host = flight_config.advertised_host or flight_config.host
        self.runtime.flight_address = f"{scheme}://{host}:{server.port}"
        if flight_config.advertised_host is None and _wildcard(flight_config.host):
            logger.warning(
                "Flight listens on every address, but clients, followers and the controller are told "
                "%s, which only this machine reaches: set [flight] advertised_host",
                self.runtime.flight_address,
            )

    async def _serve_replication(self) -> None:
        """The replication listener its followers connect to, served on this loop, and how this
        broker's own fetchers connect to their leaders' (also on this loop)."""
        flight_config, security = self.config.flight, self.config.security
        server = ReplicaServer(
            self.manager,
            self.access,
            host=flight_config.host,
            port=self.config.replication.port,
            tls=_replication_tls(security),
            advertised_host=flight_config.advertised_host,
        )
        try:
            await server.start()
        except OSError:
            refuse_if_taken(flight_config.host, self.config.replication.port, "[replication] port")
            raise
        self.runtime.replication = server
        self.manager.fetching.loop = self._loop
        self.manager.fetching.link = peer_link(self.credentials)

    def _serve_metrics(self) -> None:
        metrics_config = self.config.metrics
        if metrics_config.port >= 0:
            counts = BrokerCounts(self.runtime, self.manager)
            try:
                self._metrics = MetricsServer(metrics_config.host, metrics_config.port, self.service, counts)
            except OSError:
                refuse_if_taken(metrics_config.host, metrics_config.port, "[metrics] port")
                raise

    async def _join_coordination(self) -> None:
        """Register with the coordinator, check that metadata and data agree, listen for changes."""
        runtime = self.runtime
        assert runtime.replication is not None
        info = BrokerInfo(
            self.broker_id,
            runtime.flight_address,
            tuple(runtime.advertised_nats),
            self.config.rack,
            FEATURES,
            runtime.replication.address,
        )
        await asyncio.to_thread(self.coordinator.start, info)
        if self.clustered and self.access.enabled:
            self.coordinator.watch_acl(self.access.adopt_cluster_text)
        self.manager.check_data()
        self.manager.clean_up()
        self.coordinator.add_listener(self._on_metadata_change)
        self.coordinator.add_session_listener(self._on_session)
        if not self.clustered:
            self.coordinator.create_stream(CURSOR_STREAM_CONFIG)

    async def _load_partitions(self) -> None:
        """Open the partitions the metadata gives this broker, subscribe those led here."""
        await self.sync()
        self.manager.start()

    async def _open_to_clients(self) -> None:
        """Let clients find the broker, once every partition is loaded; start the background work."""
        # (The Flight server has served since it was made; FlightServerBase.serve() is not
        # called because it installs its own SIGTERM handler, which would wait for
        # every open call to end before the broker even hears of the signal.)
        assert self.runtime.ingestor is not None
        await self.runtime.ingestor.answer_discovery()
        interval = self.config.maintenance_interval
        self._spawn(self._every(interval, Partition.maintain, "maintenance"))
        self._spawn(self._every(interval, self.manager.repair_leader, "leader repair"))
        self._spawn(self._now_and_then(interval, self.runtime.free_memory.release, "memory release"))
        if self.reachability is not None:
            self._spawn(self.reachability.run())
        if self.config.log.fsync is FsyncPolicy.INTERVAL:
            # Appends fsync when an interval has passed; this covers the end of a burst.
            self._spawn(self._every(self.config.log.fsync_interval, _sync_if_due, "interval fsync"))
        self._write_runtime_files()
        logger.info(
            "broker %s serving Flight at %s, NATS %s, metadata in %s",
            self.broker_id,
            self.runtime.flight_address,
            self.runtime.advertised_nats,
            self.coordinator.describe(),
        )

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (a coroutine) in the background until the broker closes."""
        self._background.append(asyncio.ensure_future(work))

    def _write_runtime_files(self) -> None:
        runtime: dict[str, object] = {
            "broker_id": self.broker_id,
            "flight": self.runtime.flight_address,
            "nats": self.runtime.advertised_nats,
            "replication": self.runtime.replication.address if self.runtime.replication else None,
            "pid": os.getpid(),
        }
        if self._metrics is not None:
            runtime["metrics"] = self._metrics.address
        session = getattr(self.coordinator, "session", None)
        write_runtime_files(self.data_dir, runtime, session() if callable(session) else None)

    # ---- shutdown ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Hand leadership over (cluster), stop accepting, store what is pending, close everything.

        What cannot be closed (a full disk, say) is logged and raised at the
        end as one ``MetadataError``, after everything else was closed.
        """
        runtime = self.runtime
        (self.data_dir / RUNTIME_FILE).unlink(missing_ok=True)
        if self._started and self.clustered:
            await hand_over_leadership(
                self.coordinator,
                self.manager,
                self.broker_id,
                self.config.zookeeper.controlled_shutdown_timeout,
                self.sync,
            )
        for task in self._background:
            task.cancel()
        if runtime.tails is not None:
            await runtime.tails.close()  # before the connection it publishes on
        if runtime.ingestor is not None:
            await runtime.ingestor.close()
        for partition in self.manager.held():
            partition.wake_readers()
        if runtime.replication is not None:
            await runtime.replication.close()
        if runtime.flight is not None:
            await asyncio.to_thread(runtime.flight.shutdown)
        if self._metrics is not None:
            await asyncio.to_thread(self._metrics.close)
        await asyncio.to_thread(self.mirrors.close)
        failures = await asyncio.to_thread(self.manager.close)
        self.coordinator.close()
        if runtime.nats is not None:
            await asyncio.to_thread(runtime.nats.stop)
        (self.data_dir / SESSION_FILE).unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.release()
        logger.info("broker %s stopped", self.broker_id)
        if failures:
            raise MetadataError("could not close everything cleanly: " + "; ".join(failures))

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
        """Make partitions, subscriptions and the embedded NATS's permissions fit the metadata."""
        assert self._sync_lock is not None
        async with self._sync_lock:
            if self.runtime.nats is not None:
                await asyncio.to_thread(self.runtime.nats.reconfigure)
            await asyncio.to_thread(self.manager.apply)
            if self.runtime.ingestor is not None:
                leading = {
                    key: partition
                    for key, partition in self.manager.leaders().items()
                    if not key[0].startswith(INTERNAL_PREFIX)
                }
                await self.runtime.ingestor.sync(leading)
                if self.runtime.tails is not None:
                    await self.runtime.tails.sync(leading)
            self.mirrors.sync(self.manager.leaders())

    def _stream_subjects(self) -> dict[str, list[str]]:
        """Each user-visible stream's partition subjects, as the coordinator has them."""
        return {
            s.config.name: s.config.partition_subjects()
            for s in self.coordinator.list_streams()
            if not s.config.name.startswith(INTERNAL_PREFIX)
        }

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

    # ---- peers and security ------------------------------------------------------------------

    def _security_changed(self) -> None:
        """The ACL changed (any thread): the embedded NATS's permissions follow."""
        loop = getattr(self, "_loop", None)  # None while the broker is being made
        if loop is not None and self.runtime.nats is not None:
            loop.call_soon_threadsafe(self.request_sync)

    def _source_connector(self, source: MirrorSource) -> Callable[[str], flight.FlightClient]:
        """What opens a Flight client to a mirror's source brokers: with the mirror's credentials
        file (read at each connection, so a fixed file is picked up), else without any."""
        path = source.credentials

        def connect(address: str) -> flight.FlightClient:
            arguments = flight_arguments(load_credentials(path)) if path else {}
            return flight.connect(address, **arguments)

        return connect

    def _copy_cursor(self, consumer: str, stream: str, partition: int, offset: int | None) -> None:
        """A copier's cursor copied from its source, stored in this cluster (a copier's thread)."""
        self._mirror_service.write_cursor(consumer, stream, partition, offset)

    def _follow_schema(self, name: str, source: StreamConfig) -> None:
        """Give mirror ``name`` its source's newer schema versions (a copier's thread)."""
        self._mirror_service.follow_schema(name, source)

    def _write_cursor_here(self, consumer: str, stream: str, partition: int, offset: int | None) -> None:
        """Store a copied cursor through this broker (``NotLeaderError`` when another leads the
        cursor stream: the mirror service asks it then)."""
        if offset is None:
            self.service.delete_cursor(consumer, stream, partition)
        else:
            self.service.set_cursor(consumer, stream, partition, offset)

    def _connect_peer(self, address: str) -> flight.FlightClient:
        """A Flight client to another broker, with this broker's TLS trust and credentials."""
        return flight.connect(address, **flight_arguments(self.credentials))

    async def _every(self, seconds: float, work: Callable[[Partition], object], what: str) -> None:
        """Run ``work`` on every partition every ``seconds``, on a thread of its own: a long
        compaction then holds no thread of the shared pool that appends wait on (which would
        grow that pool for good)."""
        loop = asyncio.get_running_loop()
        with _own_thread(what) as thread:
            while True:
                await asyncio.sleep(seconds)
                for partition in self.manager.held():
                    try:
                        await loop.run_in_executor(thread, work, partition)
                    except Exception:
                        logger.exception("%s of %s/%d failed", what, partition.stream, partition.number)

    @staticmethod
    async def _now_and_then(seconds: float, work: Callable[[], object], what: str) -> None:
        """Run ``work`` every ``seconds`` on a thread of its own."""
        loop = asyncio.get_running_loop()
        with _own_thread(what) as thread:
            while True:
                await asyncio.sleep(seconds)
                try:
                    await loop.run_in_executor(thread, work)
                except Exception:
                    logger.exception("%s failed", what)


@contextlib.contextmanager
def _own_thread(what: str) -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    """One thread for a background task's work, let go when the task ends (a pass in flight
    finishes on it: what it touches is guarded by the partitions' own locks)."""
    thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=what.replace(" ", "-"))
    try:
        yield thread
    finally:
        thread.shutdown(wait=False)


def _log_failure(future: concurrent.futures.Future[None]) -> None:
    with contextlib.suppress(concurrent.futures.CancelledError):
        if future.exception() is not None:
            logger.error("applying a metadata change failed", exc_info=future.exception())


def _sync_if_due(partition: Partition) -> None:
    partition.log.sync_if_due()


def _wildcard(host: str) -> bool:
    """Whether a listener on ``host`` listens on every address."""
    return host in ("0.0.0.0", "::", "")


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


def _replication_tls(security: SecurityConfig) -> ssl.SSLContext | None:
    """The replication listener's TLS, as Flight's: ``[security]``'s certificate, and with
    ``verify_clients`` a client certificate from its CA required."""
    if not security.tls:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(security.tls_cert, security.tls_key)
    if security.verify_clients:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(security.tls_ca)
    return context
