"""A broker process: NATS in, logs on disk, Arrow Flight out.

Threads: the asyncio loop runs NATS ingestion and maintenance; the Flight
server runs its calls on its own threads.  Logs are thread-safe, and metadata
changes made from a Flight call are applied on the loop (subscriptions
included) before the call returns, so a publish right after ``create_stream``
is not missed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_node.api.cursors import CURSOR_STREAM, CURSOR_STREAM_CONFIG, CursorTable, cursor_key
from broker_node.api.server import FlightApi
from broker_node.config import BrokerConfig
from broker_node.coordination.base import BrokerInfo, Coordinator, PartitionState, StreamMetadata
from broker_node.coordination.errors import MetadataError
from broker_node.coordination.local import RECOVERY_HINT, LocalCoordinator, rebuild_metadata
from broker_node.ingest.ingestor import Ingestor
from broker_node.ingest.producers import ProducerTable
from broker_node.log import FsyncPolicy, Log, LogConfig, Record
from broker_node.log.checkpoint import atomic_write
from broker_node.nats_server import NatsServer
from broker_node.replication.partition import Partition
from broker_node.replication.records import (
    partition_directories,
    partition_record,
    read_record,
    write_record,
)
from pyspark_jetstream.protocol.errors import InvalidArgumentError, UnknownStreamError
from pyspark_jetstream.protocol.flight import PartitionInfo, StreamInfo
from pyspark_jetstream.protocol.streams import INTERNAL_PREFIX, StreamConfig, validate_stream_name

logger = logging.getLogger(__name__)

RUNTIME_FILE = "broker.json"
"""Written in the data directory once the broker serves: its addresses and pid."""
NATS_PID_FILE = "nats-server.pid"
"""The embedded nats-server's pid, so a next start can stop one that outlived its broker."""
NATS_RESTART_BACKOFF = (0.5, 30.0)
"""First and longest wait (seconds) before restarting an embedded nats-server that died."""
SYNC_TIMEOUT = 30.0


class Broker:
    """One broker: owns its partitions, the NATS ingestion and the Flight server."""

    def __init__(self, config: BrokerConfig, coordinator: Coordinator | None = None) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir).resolve()
        self.coordinator = coordinator or LocalCoordinator(self.data_dir)
        self.flight_address = ""
        self.nats_urls: list[str] = []
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._producers: dict[tuple[str, int], ProducerTable] = {}
        self._cursors = CursorTable()
        self._nats_server: NatsServer | None = None
        self._ingestor: Ingestor | None = None
        self._flight: FlightApi | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync_lock: asyncio.Lock | None = None
        self._background: list[asyncio.Task[None]] = []
        self._strays: dict[str, str] = {}
        """Partition directories the metadata does not know, and why they are kept."""
        self._offline: dict[tuple[str, int], str] = {}
        """Partitions this broker should hold but cannot, and why."""
        self._partitions_lock = threading.RLock()
        self._cursor_lock = threading.Lock()

    # ---- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Connect to (or start) NATS, open every partition, serve Flight.

        If any step fails, what was already started is stopped again (the
        embedded nats-server included) before the error is raised.
        """
        self._loop = asyncio.get_running_loop()
        self._sync_lock = asyncio.Lock()
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        nats_config = self.config.nats
        if nats_config.servers:
            self.nats_urls = list(nats_config.servers)
        else:
            self._nats_server = NatsServer(
                host=nats_config.embedded_host,
                port=nats_config.embedded_port,
                pid_file=self.data_dir / NATS_PID_FILE,
            )
            # Launched from the loop's thread, which lives as long as the broker:
            # the server is killed when the thread that started it ends.
            self._nats_server.launch()
            await asyncio.to_thread(self._nats_server.wait_ready)
            self.nats_urls = [self._nats_server.url]
            self._background.append(asyncio.ensure_future(self._supervise_nats(self._nats_server)))
        self._ingestor = await Ingestor.connect(
            self.nats_urls,
            nats_config,
            self.config.ingest,
            self._discovery,
            name=f"pyspark-jetstream broker {self.config.broker_id}",
        )
        flight_config = self.config.flight
        self._flight = FlightApi(f"grpc://{flight_config.host}:{flight_config.port}", self)
        host = flight_config.advertised_host or flight_config.host
        self.flight_address = f"grpc://{host}:{self._flight.port}"
        self.coordinator.start(BrokerInfo(self.config.broker_id, self.flight_address))
        self._check_data()
        self._clean_up()
        self.coordinator.add_listener(self._on_metadata_change)
        self.coordinator.create_stream(CURSOR_STREAM_CONFIG)
        await self._sync()
        self._cursors = CursorTable.rebuild(self.partition(CURSOR_STREAM, 0).log)
        # Let clients find us only once every partition and cursor is loaded.  (The
        # Flight server has served since it was made; FlightServerBase.serve() is not
        # called because it installs its own SIGTERM handler, which would wait for
        # every open call to end before the broker even hears of the signal.)
        await self._ingestor.answer_discovery()
        self._background.append(
            asyncio.ensure_future(
                self._every(self.config.maintenance_interval, Partition.maintain, "maintenance")
            )
        )
        if self.config.log.fsync is FsyncPolicy.INTERVAL:
            # Appends fsync when an interval has passed; this covers the end of a burst.
            self._background.append(
                asyncio.ensure_future(
                    self._every(self.config.log.fsync_interval, _sync_if_due, "interval fsync")
                )
            )
        atomic_write(
            self.data_dir / RUNTIME_FILE,
            json.dumps(
                {
                    "broker_id": self.config.broker_id,
                    "flight": self.flight_address,
                    "nats": self.nats_urls,
                    "pid": os.getpid(),
                }
            ).encode(),
        )
        logger.info(
            "broker %s serving Flight at %s, NATS %s",
            self.config.broker_id,
            self.flight_address,
            self.nats_urls,
        )

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

    async def close(self) -> None:
        """Stop accepting, store what is pending, checkpoint and close everything."""
        (self.data_dir / RUNTIME_FILE).unlink(missing_ok=True)
        for task in self._background:
            task.cancel()
        if self._ingestor is not None:
            await self._ingestor.close()
        with self._partitions_lock:
            partitions = list(self._partitions.values())
        for partition in partitions:
            partition.wake_readers()
        if self._flight is not None:
            await asyncio.to_thread(self._flight.shutdown)
        for partition in partitions:
            partition.close()
        self._partitions.clear()
        self.coordinator.close()
        if self._nats_server is not None:
            await asyncio.to_thread(self._nats_server.stop)
        logger.info("broker %s stopped", self.config.broker_id)

    # ---- partitions ----------------------------------------------------------------

    def partition(self, stream: str, number: int) -> Partition:
        """The partition ``stream``/``number`` held here; ``UnknownStreamError`` otherwise."""
        with self._partitions_lock:
            found = self._partitions.get((stream, number))
        if found is None:
            metadata = self.coordinator.get_stream(stream)  # raises for an unknown stream
            raise UnknownStreamError(
                f"stream {stream!r} has partitions 0 to {metadata.config.partitions - 1}, not {number}"
            )
        return found

    def _on_metadata_change(self) -> None:
        self._request_sync()

    def _request_sync(self) -> concurrent.futures.Future[None]:
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self._sync(), self._loop)
        future.add_done_callback(_log_failure)
        return future

    def _check_data(self) -> None:
        """Refuse to start when the metadata knows no stream but the data directory holds some.

        That is lost metadata (a missing file, a wrong ZooKeeper chroot), and
        starting would serve nothing and tempt someone to clean up.
        """
        if self.coordinator.list_streams():
            return
        deleted = self.coordinator.deleted_stream_ids()
        names = set()
        for directory in partition_directories(self.data_dir / "streams"):
            record = read_record(directory)
            if record is None:
                names.add(f"{directory.parent.name!r} (without partition.json)")
            elif record["stream_id"] not in deleted:
                names.add(repr(record["stream"]))
        found = sorted(names)
        if found:
            raise MetadataError(
                f"the metadata ({self.coordinator.describe()}) has no streams, but "
                f"{self.data_dir / 'streams'} holds partitions of {', '.join(found)}. {RECOVERY_HINT}"
            )

    def _clean_up(self) -> None:
        """Remove partition directories of deleted streams; note any the metadata does not know.

        Only a directory whose ``partition.json`` names a deleted stream id
        is removed: absent or unreadable metadata never deletes data.
        """
        deleted = self.coordinator.deleted_stream_ids()
        known = {
            (m.config.name, str(p))
            for m in self.coordinator.list_streams()
            for p in range(m.config.partitions)
        }
        strays = {}
        for directory in partition_directories(self.data_dir / "streams"):
            record = read_record(directory)
            if record is not None and record["stream_id"] in deleted:
                logger.warning("removing %s: its stream was deleted", directory)
                shutil.rmtree(directory)
            elif (directory.parent.name, directory.name) not in known:
                strays[str(directory)] = (
                    "not in the metadata; kept untouched (move it away, or rebuild the metadata)"
                )
        for stream_dir in self.data_dir.joinpath("streams").glob("*"):
            if stream_dir.is_dir() and not any(stream_dir.iterdir()):
                stream_dir.rmdir()
        self._strays = strays

    def _wait_for_sync(self) -> None:
        """From a Flight thread: apply metadata changes before answering."""
        self._request_sync().result(SYNC_TIMEOUT)

    async def _sync(self) -> None:
        """Open partitions this broker replicates, close deleted ones, align subscriptions."""
        assert self._sync_lock is not None and self._ingestor is not None
        async with self._sync_lock:
            me = self.config.broker_id
            wanted = {
                (m.config.name, p): (m, state)
                for m in self.coordinator.list_streams()
                for p, state in enumerate(m.partitions)
                if me in state.replicas
            }
            for key, (metadata, state) in wanted.items():
                if key not in self._partitions:
                    try:
                        opened = await asyncio.to_thread(self._open_partition, metadata, key[1], state)
                    except Exception as exc:
                        # One damaged partition must not keep the others from serving.
                        logger.exception("cannot open partition %s/%d; it stays offline", *key)
                        self._offline[key] = f"cannot be opened: {exc}"
                        continue
                    self._offline.pop(key, None)
                    with self._partitions_lock:
                        self._partitions[key] = opened
            for key in list(self._offline):
                if key not in wanted:
                    del self._offline[key]
            await self._ingestor.sync(
                {
                    key: (self._partitions[key], metadata.config, self._producers[key])
                    for key, (metadata, state) in wanted.items()
                    if key in self._partitions
                    and state.leader == me
                    and not metadata.config.name.startswith(INTERNAL_PREFIX)
                }
            )
            with self._partitions_lock:
                gone = [
                    (key, self._partitions.pop(key)) for key in list(self._partitions) if key not in wanted
                ]
            for key, partition in gone:
                partition.close()
                self._producers.pop(key, None)
                logger.info("closed partition %s/%d", *key)
            if gone:
                await asyncio.to_thread(self._clean_up)

    def _open_partition(self, metadata: StreamMetadata, number: int, state: PartitionState) -> Partition:
        config = metadata.config
        directory = self._partition_dir(config.name, number)
        record = read_record(directory)
        if record is not None and record["stream_id"] != metadata.stream_id:
            if record["stream_id"] not in self.coordinator.deleted_stream_ids():
                raise MetadataError(
                    f"{directory} holds partition {number} of another stream named {config.name!r} "
                    f"(id {record['stream_id']}) that the metadata does not know: move it away "
                    "to reuse the name"
                )
            logger.warning("removing %s: it holds a deleted stream of the same name", directory)
            shutil.rmtree(directory)
        log = Log.open(directory, self._log_config(config))
        try:
            write_record(directory, partition_record(metadata, number))
            self._producers[(config.name, number)] = ProducerTable.rebuild(log)
            return Partition(config.name, number, log, state)
        except BaseException:
            log.close()
            raise

    def _partition_dir(self, stream: str, number: int) -> Path:
        return self.data_dir / "streams" / stream / str(number)

    def _log_config(self, config: StreamConfig) -> LogConfig:
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
            with self._partitions_lock:
                partitions = list(self._partitions.values())
            for partition in partitions:
                try:
                    await asyncio.to_thread(work, partition)
                except Exception:
                    logger.exception("%s of %s/%d failed", what, partition.stream, partition.number)

    # ---- admin ---------------------------------------------------------------------

    def create_stream(self, config: StreamConfig) -> StreamInfo:
        """Create (or confirm) a stream and start serving it before returning.

        A new stream that cannot be served (NATS refuses its subscription, or
        its directory holds another stream's data) is deleted again and the
        reason raised: nothing half-made stays behind.
        """
        validate_stream_name(config.name)  # internal names are the broker's own
        existed = any(m.config.name == config.name for m in self.coordinator.list_streams())
        self.coordinator.create_stream(config)
        self._wait_for_sync()
        failures = self._ingestor.failures if self._ingestor is not None else {}
        problems = {**self._offline, **failures}
        refused = [reason for (stream, _), reason in sorted(problems.items()) if stream == config.name]
        if refused and not existed:
            self.coordinator.delete_stream(config.name)
            self._wait_for_sync()
            raise InvalidArgumentError(f"stream {config.name!r} was not created: {refused[0]}")
        return self.describe_stream(config.name)

    def delete_stream(self, name: str) -> None:
        """Delete a stream and its data."""
        if name.startswith(INTERNAL_PREFIX):
            raise InvalidArgumentError(f"stream {name!r} is internal and cannot be deleted")
        self.coordinator.delete_stream(name)
        self._wait_for_sync()

    def describe_stream(self, name: str) -> StreamInfo:
        """A stream's config and its partitions' offsets and leadership."""
        return self._describe(self.coordinator.get_stream(name))

    def list_streams(self) -> list[StreamInfo]:
        """Every stream (internal ones included), by name."""
        return [self._describe(m) for m in self.coordinator.list_streams()]

    def _describe(self, metadata: StreamMetadata) -> StreamInfo:
        infos = []
        for number, state in enumerate(metadata.partitions):
            with self._partitions_lock:
                partition = self._partitions.get((metadata.config.name, number))
            log = partition.log if partition else None
            infos.append(
                PartitionInfo(
                    partition=number,
                    leader=state.leader,
                    replicas=state.replicas,
                    isr=state.isr,
                    leader_epoch=state.leader_epoch,
                    log_start_offset=log.log_start_offset if log else -1,
                    log_end_offset=log.log_end_offset if log else -1,
                    high_watermark=partition.high_watermark if partition else -1,
                )
            )
        return StreamInfo(metadata.config.to_json(), tuple(infos))

    # ---- cursors -------------------------------------------------------------------

    def set_cursor(self, consumer: str, stream: str, partition: int, offset: int) -> None:
        """Store ``consumer``'s position in ``stream``/``partition`` in the cursor stream."""
        key = cursor_key(consumer, stream, partition)
        self.partition(stream, partition)  # the partition must exist
        if offset < 0:
            raise InvalidArgumentError(f"cursor offset must not be negative, got {offset}")
        with self._cursor_lock:  # the log and the table see cursor writes in one order
            self.partition(CURSOR_STREAM, 0).append([Record(str(offset).encode(), key=key)])
            self._cursors.put(key, offset)

    def fetch_cursor(self, consumer: str, stream: str, partition: int) -> int | None:
        """The stored position, or ``None`` if the consumer never set one."""
        self.partition(stream, partition)
        return self._cursors.get(cursor_key(consumer, stream, partition))

    # ---- status ---------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Broker identity, partitions with offsets, and every cursor with its lag."""
        cursors = []
        for key, offset in self._cursors.items():
            consumer, stream, number = key.decode().rsplit("/", 2)
            with self._partitions_lock:
                partition = self._partitions.get((stream, int(number)))
            hw = partition.high_watermark if partition else None
            cursors.append(
                {
                    "consumer": consumer,
                    "stream": stream,
                    "partition": int(number),
                    "offset": offset,
                    "lag": None if hw is None else max(hw - offset, 0),
                }
            )
        return {
            "broker_id": self.config.broker_id,
            "flight": self.flight_address,
            "nats": self.nats_urls,
            "health": self.health(),
            "streams": [info.to_json() for info in self.list_streams()],
            "cursors": cursors,
        }

    def health(self) -> dict[str, Any]:
        """Whether the broker can do its job: ``{"ok": bool, "problems": [one line each]}``.

        A problem is anything that stops it ingesting or serving some data:
        the embedded nats-server down, the NATS connection down, a partition
        it holds that cannot be opened, a subscription NATS refused.
        """
        problems = []
        if self._nats_server is not None and not self._nats_server.running:
            problems.append("the embedded nats-server is not running (restarting it)")
        if self._ingestor is None or not self._ingestor.connected:
            problems.append(f"not connected to NATS at {', '.join(self.nats_urls)}: nothing is ingested")
        failures = self._ingestor.failures if self._ingestor is not None else {}
        for (stream, number), reason in sorted({**self._offline, **failures}.items()):
            problems.append(f"{stream}/{number}: {reason}")
        problems += [f"{directory}: {reason}" for directory, reason in sorted(self._strays.items())]
        return {"ok": not problems, "problems": problems}

    def _discovery(self) -> dict[str, object]:
        return {"broker_id": self.config.broker_id, "flight": self.flight_address}


def rebuild(config: BrokerConfig) -> list[str]:
    """Rebuild the single-broker metadata from the partitions' records; what it found, line by line."""
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
    if not future.cancelled() and future.exception() is not None:
        logger.error("applying a metadata change failed", exc_info=future.exception())


def _sync_if_due(partition: Partition) -> None:
    partition.log.sync_if_due()
