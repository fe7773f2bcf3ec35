"""Tailing a partition: history over Flight up to the head, then the live tail over NATS.

The consumer subscribes to the partition's live-tail subject *before* it
reads the history, so nothing committed after that read is missed: it
arrives on NATS and waits in the subscription.  From then on every batch is
placed by its offsets against the next offset the consumer expects:

* a delivery that starts there (or covers it) is taken from NATS, sliced to
  what is new;
* one wholly before it is a duplicate (already read over Flight) and is dropped;
* one after it, or a mark whose high watermark is past it, means something
  was missed (NATS dropped deliveries for a slow consumer, the connection was
  lost, a leader changed, a batch was too large for NATS): the gap is read
  over Flight first;
* no delivery and no mark for :data:`IDLE_SECONDS` (marks come every
  second) means the leader may be gone: the consumer reads over Flight, which
  finds the new leader.

So every committed offset is seen once, in order, whatever NATS drops.  If
the NATS connection closes for good, or not one mark has arrived after
:data:`SILENT_CHECKS` checks in a row (a broker with ``live_tail = false``:
its leader answers over Flight but publishes nothing), the tail goes on over
Flight alone, as a Flight follow read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError
from nats.errors import TimeoutError as NatsTimeoutError

from pyspark_jetstream.protocol.flight import StartPosition
from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.tail import HEARTBEAT_SECONDS, decode_delivery, tail_subject

from .connection import FetchResult

logger = logging.getLogger(__name__)

IDLE_SECONDS = 3 * HEARTBEAT_SECONDS
"""With nothing on the live tail for this long, the consumer checks over Flight."""
WATCH_SECONDS = 0.25
"""How often a tail waiting for a delivery checks whether it waited :data:`IDLE_SECONDS` or its
NATS connection closed."""
SILENT_CHECKS = 3
"""Checks in a row with not one mark ever heard: the broker publishes no live tail."""
PENDING_MESSAGES = 4096
PENDING_BYTES = 64 * 1024 * 1024
"""Deliveries a consumer may leave unread before NATS drops the newest (it then reads them over Flight)."""


class TailSource(Protocol):
    """What a tail reads from: the client's NATS connection and its Flight fetches
    (:class:`~.client.Client` is one; so is its reader)."""

    nc: NatsClient
    timeout: float

    @property
    def closed(self) -> bool:
        """Whether the client was closed: a tail then ends instead of going on over Flight."""
        ...

    async def fetch(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: StartPosition,
        max_records: int | None,
        max_bytes: int | None,
        columns: Sequence[str] | None = None,
    ) -> FetchResult:
        """Committed batches from ``start`` (see :meth:`.Client.fetch`)."""
        ...


@dataclass
class TailStats:
    """Where a tail's batches came from; for tests, benchmarks and the curious."""

    live_batches: int = 0
    """Batches taken from the live tail."""
    fetched_batches: int = 0
    """Batches read over Flight (the history, and every gap)."""
    gaps: int = 0
    """Times a missed delivery was noticed and read over Flight."""
    dropped: int = 0
    """Deliveries dropped because they held only what was already read."""
    malformed: int = 0
    """Deliveries that did not parse (ignored; what they held was read over Flight)."""
    flight_only: bool = False
    """Whether the tail went on over Flight alone (the NATS connection closed)."""


class LiveTail:
    """Committed batches of one partition from a start position on; runs until closed.

    Use as ``async for batch in tail``; :attr:`stats` counts where batches came from.
    """

    def __init__(
        self,
        client: TailSource,
        stream: str,
        partition: int,
        start: StartPosition,
        *,
        max_records: int | None,
        max_bytes: int | None,
        flight_tail: Callable[[int], AsyncIterator[pa.RecordBatch]],
        pending_messages: int = PENDING_MESSAGES,
        pending_bytes: int = PENDING_BYTES,
    ) -> None:
        self.stats = TailStats()
        self.stream = stream
        self.partition = partition
        self.next_offset = -1
        """The next offset this consumer expects (-1 until the start is resolved)."""
        self._client = client
        self._start = start
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._flight_tail = flight_tail
        self._pending = (pending_messages, pending_bytes)
        self._batches = self._run()

    def __aiter__(self) -> LiveTail:
        return self

    async def __anext__(self) -> pa.RecordBatch:
        return await self._batches.__anext__()

    async def aclose(self) -> None:
        """Stop tailing and unsubscribe."""
        await self._batches.aclose()

    async def _run(self) -> AsyncGenerator[pa.RecordBatch, None]:
        nc = self._client.nc
        deliveries = _Deliveries(nc)
        try:
            subscription = await nc.subscribe(
                tail_subject(self.stream, self.partition),
                cb=deliveries.received,
                pending_msgs_limit=self._pending[0],
                pending_bytes_limit=self._pending[1],
            )
        except BaseException:
            deliveries.close()
            raise
        try:
            # Once the server has the subscription, every later commit reaches it.
            await nc.flush(timeout=self._client.timeout)  # type: ignore[arg-type]
            async for batch in self._catch_up(None):
                yield batch
            heard = False
            silent = 0
            while True:
                try:
                    payload = await deliveries.next()
                except NatsTimeoutError:
                    # Nothing, not even a mark: the leader may be changing (the Flight read
                    # below waits for the new one, which marks at once), or it publishes no
                    # live tail at all (a reachable leader, silent for SILENT_CHECKS in a row).
                    async for batch in self._catch_up(None):
                        yield batch
                    silent += 1
                    if not heard and silent >= SILENT_CHECKS:
                        break
                    continue
                except ConnectionClosedError:
                    if self._client.closed:
                        return  # closed by its owner: the tail ends with it
                    break
                heard, silent = True, 0
                async for batch in self._take(payload):
                    yield batch
        finally:
            deliveries.close()
            if not nc.is_closed:
                try:
                    await subscription.unsubscribe()
                except Exception as exc:  # noqa: BLE001 - closing anyway
                    logger.debug("live tail: unsubscribe failed: %s", exc)
        # No live tail (the NATS connection is gone, or the broker publishes none): Flight alone.
        self.stats.flight_only = True
        logger.warning("%s/%d: no live tail on NATS; tailing over Flight", self.stream, self.partition)
        async for batch in self._flight_tail(self.next_offset):
            yield batch

    async def _take(self, payload: bytes) -> AsyncGenerator[pa.RecordBatch, None]:
        """What one delivery adds, in order, reading a gap before it over Flight."""
        try:
            delivery = decode_delivery(payload)
        except ValueError as exc:
            self.stats.malformed += 1
            logger.warning("%s/%d: ignoring a live-tail delivery: %s", self.stream, self.partition, exc)
            async for batch in self._catch_up(None):
                yield batch
            return
        if delivery.batch is None or delivery.first_offset > self.next_offset:
            target = delivery.high_watermark if delivery.batch is None else delivery.first_offset
            if target > self.next_offset:
                self.stats.gaps += 1
                async for batch in self._catch_up(target):
                    yield batch
        batch = delivery.batch
        if batch is None:
            return
        if delivery.last_offset < self.next_offset:
            self.stats.dropped += 1
            return
        if delivery.first_offset > self.next_offset:
            return  # the gap could not be read yet: the next delivery or check reads it again
        if delivery.first_offset < self.next_offset:
            batch = batch.slice(pc.sum(pc.less(batch.column(0), self.next_offset)).as_py() or 0)
        self.next_offset = delivery.last_offset + 1
        self.stats.live_batches += 1
        yield batch

    async def _catch_up(self, until: int | None) -> AsyncGenerator[pa.RecordBatch, None]:
        """Read over Flight from the next offset up to ``until`` (or as far as is committed)."""
        while until is None or self.next_offset < until:
            start = self._start if self.next_offset < 0 else StartPosition("offset", self.next_offset)
            result = await self._client.fetch(
                self.stream,
                self.partition,
                start=start,
                max_records=self._max_records,
                max_bytes=self._max_bytes,
                columns=LOG_SCHEMA.names,  # as the live tail's batches: no typed fields
            )
            self.next_offset = max(self.next_offset, result.next_offset)
            for batch in result.batches:
                self.stats.fetched_batches += 1
                yield batch
            # Caught up: what commits next comes live (the subscription came first). Fetching
            # again would chase a steady publisher one message per read and never come back.
            if not result.batches or (until is None and self.next_offset >= result.high_watermark):
                return


class _Deliveries:
    """A live tail's deliveries, handed one at a time from its subscription's callback to the
    consumer.

    The callback returns only once its delivery is taken, so the rest wait in
    the subscription, whose pending limits apply as to any NATS subscriber
    (past them NATS drops deliveries, which the tail reads over Flight).  A
    wait ends with ``NatsTimeoutError`` after :data:`IDLE_SECONDS` with no
    delivery, or ``ConnectionClosedError`` once the connection is closed, both
    noticed by one timer per tail every :data:`WATCH_SECONDS`: no task and no
    timer per delivery, where nats-py's ``next_msg`` starts two tasks and a
    timer for each (20-70 µs of a consumer's CPU per delivery).
    """

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[bytes] | None = None
        self._waiting_since = 0.0
        self._held: tuple[bytes, asyncio.Future[None]] | None = None
        self._closed = False
        self._timer = self._loop.call_later(WATCH_SECONDS, self._watch)

    async def received(self, message: Msg) -> None:
        """The subscription's callback: hand ``message`` over, waiting until it is taken (once
        closed, nothing is taken: it returns at once)."""
        if self._closed:
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._waiter = None
            waiter.set_result(message.data)
            return
        taken = self._loop.create_future()
        self._held = (message.data, taken)
        await taken

    async def next(self) -> bytes:
        """The next delivery's payload (see the class docstring for how a wait ends)."""
        if self._held is not None:
            payload, taken = self._held
            self._held = None
            if not taken.done():
                taken.set_result(None)
            return payload
        if self._nc.is_closed:
            raise ConnectionClosedError
        self._waiter = self._loop.create_future()
        self._waiting_since = self._loop.time()
        return await self._waiter

    def close(self) -> None:
        """Stop the timer; a callback waiting for its delivery to be taken goes on, and later ones
        return at once."""
        self._closed = True
        self._timer.cancel()
        if self._held is not None and not self._held[1].done():
            self._held[1].set_result(None)
        self._held = None

    def _watch(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._nc.is_closed:
                self._waiter = None
                waiter.set_exception(ConnectionClosedError())
            elif self._loop.time() - self._waiting_since >= IDLE_SECONDS:
                self._waiter = None
                waiter.set_exception(NatsTimeoutError())
        self._timer = self._loop.call_later(WATCH_SECONDS, self._watch)
