"""Reading over Flight: fetches, tails and subscriptions of committed messages.

A fetch is one Flight read of the partition's leader (or an in-sync follower
with ``from_replicas``): in a worker thread so the event loop never blocks, or
in the caller's own thread for ``SyncClient``.
A tail reads the history over Flight and then takes new batches from the
partition's live tail on NATS (:mod:`.live`); without it, one Flight follow
stream stays open and the broker pushes batches down it, read by a thread of
its own.  Leadership changes are followed (:mod:`.cluster` refreshes the
metadata).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypedDict, Unpack

import pyarrow as pa
from nats.aio.client import Client as NatsClient
from pyarrow import flight

from pyspark_jetstream.protocol.errors import InvalidArgumentError, JetStreamError, UnavailableError
from pyspark_jetstream.protocol.flight import ReadRequest, StartPosition, parse_response_metadata
from pyspark_jetstream.protocol.read_shape import ColumnFilter
from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.streams import INTERNAL_PREFIX

from .cluster import ClusterConnection
from .connection import BrokerConnection, FetchResult
from .live import LiveTail

TAIL_COLUMNS = tuple(LOG_SCHEMA.names)
"""What a tail reads: the log's columns."""
FOLLOW_BUFFER = 16
"""Batches a follow stream reads ahead of its consumer."""

Start = str | int | datetime | StartPosition


@dataclass(frozen=True, slots=True)
class Message:
    """One stored message, as a subscriber sees it."""

    stream: str
    partition: int
    offset: int
    timestamp: datetime
    value: bytes | None
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    subject: str | None
    reply: str | None


class FetchOptions(TypedDict, total=False):
    """The keyword arguments of a fetch (see :meth:`.Client.fetch`), declared once for the
    clients' calls; their defaults are :meth:`Reader.fetch_blocking`'s."""

    start: Start
    max_records: int | None
    max_bytes: int | None
    max_wait: float
    from_replicas: bool
    columns: Sequence[str] | None
    filters: Sequence[ColumnFilter]


class TailOptions(TypedDict, total=False):
    """The keyword arguments of a tail or a subscription (see :meth:`.Client.tail`), declared once
    for the clients' calls; their defaults are :meth:`Reader.tail`'s."""

    start: Start
    follow: float
    max_records: int | None
    max_bytes: int | None
    live: bool


def start_position(start: Start) -> StartPosition:
    """``'earliest'``, ``'latest'``, an offset, an aware ``datetime`` or a StartPosition."""
    if isinstance(start, StartPosition):
        return start
    if start in ("earliest", "latest"):
        return StartPosition(str(start))
    if isinstance(start, datetime):
        if start.tzinfo is None:
            raise InvalidArgumentError(f"start time {start.isoformat()} needs a time zone")
        return StartPosition("timestamp", start.timestamp())
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return StartPosition("offset", start)
    raise InvalidArgumentError(
        f"invalid start {start!r}: use 'earliest', 'latest', an offset >= 0 or an aware datetime"
    )


class Reader:
    """Reads of one client (see the module docstring); its coroutines run on the client's loop.

    It is the source a :class:`~.live.LiveTail` reads from: the NATS connection,
    Flight fetches, and whether the client was closed.
    """

    def __init__(self, nc: NatsClient, cluster: ClusterConnection, timeout: float) -> None:
        self.nc = nc
        self.cluster = cluster
        self.timeout = timeout
        self.closed = False
        """Whether the client was closed (a live tail then ends instead of going on over Flight)."""

    async def fetch(self, stream: str, partition: int = 0, **options: Unpack[FetchOptions]) -> FetchResult:
        """See :meth:`.Client.fetch`: :meth:`fetch_blocking` (which names the options) in a worker
        thread."""
        return await asyncio.to_thread(self.fetch_blocking, stream, partition, **options)

    def fetch_blocking(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "earliest",
        max_records: int | None = None,
        max_bytes: int | None = None,
        max_wait: float = 0.0,
        from_replicas: bool = False,
        columns: Sequence[str] | None = None,
        filters: Sequence[ColumnFilter] = (),
    ) -> FetchResult:
        """See :meth:`.Client.fetch`; blocks the calling thread (``SyncClient`` calls it directly)."""
        request = ReadRequest(
            stream,
            partition,
            start_position(start),
            max_records,
            max_bytes,
            max_wait,
            columns=None if columns is None else tuple(columns),
            from_replicas=from_replicas,
            filters=tuple(filters),
        )
        return self.cluster.read(request)

    def tail(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "earliest",
        follow: float = 30.0,
        max_records: int | None = 10_000,
        max_bytes: int | None = None,
        live: bool = True,
    ) -> AsyncIterator[pa.RecordBatch]:
        """See :meth:`.Client.tail`."""
        position = start_position(start)
        if live and not stream.startswith(INTERNAL_PREFIX):

            def over_flight(offset: int) -> AsyncIterator[pa.RecordBatch]:
                resume = position if offset < 0 else StartPosition("offset", offset)
                return self._flight_tail(
                    stream, partition, resume, follow=follow, max_records=max_records, max_bytes=max_bytes
                )

            return LiveTail(
                self,
                stream,
                partition,
                position,
                max_records=max_records,
                max_bytes=max_bytes,
                flight_tail=over_flight,
            )
        return self._flight_tail(
            stream, partition, position, follow=follow, max_records=max_records, max_bytes=max_bytes
        )

    async def _flight_tail(
        self,
        stream: str,
        partition: int,
        position: StartPosition,
        *,
        follow: float,
        max_records: int | None,
        max_bytes: int | None,
    ) -> AsyncIterator[pa.RecordBatch]:
        """Batches from a Flight follow stream, reopened after each renewal or leader change."""
        retry_until: float | None = None
        while True:
            # The log's columns only, as the live tail sends (a typed stream's fields are not in it).
            request = ReadRequest(
                stream, partition, position, max_records, max_bytes, 0.0, follow, columns=TAIL_COLUMNS
            )
            try:
                async for item in self._follow(request):
                    retry_until = None
                    if isinstance(item, int):  # where the broker resolved the start to
                        position = StartPosition("offset", item)
                        continue
                    position = StartPosition("offset", item.column(0)[-1].as_py() + 1)
                    yield item
            except JetStreamError as exc:
                # The leader moved or went away: find the new one and go on from here.
                now = asyncio.get_running_loop().time()
                retry_until = retry_until or now + self.timeout
                if not exc.retriable or now > retry_until:
                    raise
                if exc.invalid_metadata or isinstance(exc, UnavailableError):
                    await asyncio.to_thread(self._refresh_quietly)
                await asyncio.sleep(0.1)

    def _refresh_quietly(self) -> None:
        with contextlib.suppress(JetStreamError):
            self.cluster.refresh()

    async def _follow(self, request: ReadRequest) -> AsyncIterator[pa.RecordBatch | int]:
        """One follow stream: its resolved start offset, then its batches."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[pa.RecordBatch | int | JetStreamError | None] = asyncio.Queue()
        # Bounded: a slow consumer makes the reader thread (and the broker's stream) wait.
        room = threading.Semaphore(FOLLOW_BUFFER)
        readers: list[flight.FlightStreamReader] = []
        stopped = threading.Event()

        def put(item: pa.RecordBatch | int | JetStreamError | None) -> None:
            while not room.acquire(timeout=0.25):
                if stopped.is_set():
                    return
            if not stopped.is_set():
                # No round trip through the loop: the consumer wakes as soon as it can run.
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def pump() -> None:
            # A thread of its own: it blocks for the whole stream.
            item: pa.RecordBatch | int | JetStreamError | None = None
            connection: BrokerConnection | None = None
            try:
                reader, connection = self.cluster.follow(request)
                readers.append(reader)
                if stopped.is_set():
                    reader.cancel()
                    return
                put(parse_response_metadata(reader.schema.metadata)["next_offset"])
                while not stopped.is_set():
                    put(reader.read_chunk().data)
            except StopIteration:
                item = None
            except JetStreamError as exc:
                item = None if stopped.is_set() else exc
            except flight.FlightError as exc:
                if stopped.is_set():
                    item = None
                elif connection is not None:
                    item = connection.error(exc)
                else:
                    item = UnavailableError(f"cannot follow {request.stream}/{request.partition}: {exc}")
            except RuntimeError:
                return  # the consumer's loop is gone
            with contextlib.suppress(RuntimeError):  # ...or went while the stream ended
                put(item)

        thread = threading.Thread(target=pump, name="jetstream-tail", daemon=True)
        thread.start()
        try:
            while (item := await queue.get()) is not None:
                room.release()
                if isinstance(item, JetStreamError):
                    raise item
                yield item
        finally:
            stopped.set()
            for reader in readers:
                reader.cancel()

    async def subscribe(
        self, stream: str, partition: int = 0, **options: Unpack[TailOptions]
    ) -> AsyncIterator[Message]:
        """See :meth:`.Client.subscribe`."""
        async for batch in self.tail(stream, partition, **options):
            for row in batch.to_pylist():
                yield Message(
                    stream=stream,
                    partition=partition,
                    offset=row["offset"],
                    timestamp=row["timestamp"].astimezone(UTC),
                    value=row["value"],
                    key=row["key"],
                    headers=tuple((h["key"], h["value"]) for h in row["headers"] or ()),
                    subject=row["subject"],
                    reply=row["reply"],
                )

    async def subscribe_partitions(
        self, stream: str, partitions: Sequence[int], *, start: Start = "earliest", live: bool = True
    ) -> AsyncIterator[Message]:
        """See :meth:`.Client.subscribe_partitions`."""
        queue: asyncio.Queue[Message | BaseException] = asyncio.Queue(maxsize=FOLLOW_BUFFER * 64)

        async def pump(partition: int) -> None:
            try:
                async for message in self.subscribe(stream, partition, start=start, live=live):
                    await queue.put(message)
            except Exception as exc:  # noqa: BLE001 - handed to the consumer
                await queue.put(exc)

        pumps = [asyncio.ensure_future(pump(p)) for p in partitions]
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for task in pumps:
                task.cancel()
