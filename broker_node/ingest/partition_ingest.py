"""One partition's ingestion: messages from its NATS subscription into its log, and the acks.

Every partition this broker leads has one NATS subscription on its subject
(in the stream's queue group, if it has a load-balance group; see
:mod:`.ingestor`).  Messages that arrive one at a time are coalesced into one
stored batch per flush: a flush runs as soon as the subscription's queue is
drained (or after ``max_delay``), or at once when ``max_batch_messages`` or
``max_batch_bytes`` is reached.  An envelope carrying an Arrow batch, or a
producer id, is stored as its own batch after the pending ones, so the log
keeps arrival order.

Appends run in a worker thread, one at a time per partition, so the event
loop goes on receiving (for this partition and every other) while a write or
a compaction holds the log.

Acks: every message gets its own, and the acks of one flush for one inbox
travel together in one NATS message.  ``LEADER`` is acked once the leader
stored the message; ``ALL`` once it is committed (the high watermark passed
it: every in-sync replica has it), and is refused with ``not_enough_replicas``
-- never acked -- while fewer replicas than the stream's
``min_insync_replicas`` are in sync.  A plain NATS message with a reply
subject is acked like ``ALL``.  A publish that is never acked times out at
the producer; nothing is dropped silently.  Every ack sent is timed in the
stream's :class:`~.latency.LatencyHistogram`.

The partition is reached through :class:`IngestPartition`, which
``broker_node.replication.partition.Partition`` satisfies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Literal, NamedTuple, Protocol, overload

import pyarrow as pa
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from broker_node.config import IngestConfig
from broker_node.log import InvalidRecordsError, LogError, Record, RecordTooLargeError
from broker_node.log.labels import Labels
from broker_node.log.records import Records, record_size
from pyspark_jetstream.protocol.ack import Ack, encode_ack, encode_acks
from pyspark_jetstream.protocol.arrays import constant_ints, constant_strings
from pyspark_jetstream.protocol.envelope import (
    AckPolicy,
    BatchTooLargeError,
    Envelope,
    EnvelopeError,
    decode,
    looks_like_envelope,
    producer_position,
)
from pyspark_jetstream.protocol.errors import ErrorCode, JetStreamError
from pyspark_jetstream.protocol.schema import HEADER_TYPE
from pyspark_jetstream.protocol.streams import StreamConfig

from .latency import LatencyHistogram

logger = logging.getLogger(__name__)


INLINE_BYTES = 256 * 1024
"""Batches up to this size are appended on the event loop when the log is free (see ``_append``)."""


class IngestPartition(Protocol):
    """What ingestion needs of a partition."""

    stream: str
    number: int
    config: StreamConfig

    @property
    def max_batch_bytes(self) -> int: ...
    @property
    def appends_sync(self) -> bool: ...
    @overload
    def append(self, records: Records, *, wait: Literal[True] = True) -> range: ...
    @overload
    def append(self, records: Records, *, wait: bool) -> range | None: ...
    def append_idempotent(
        self, records: Records, producer_id: str, epoch: int, sequence: int, *, target: bool = True
    ) -> Ack: ...
    def check_min_insync(self) -> None: ...
    def when_committed(self, last_offset: int, callback: Callable[[JetStreamError | None], None]) -> None: ...


class _AckTarget(NamedTuple):
    subject: str
    correlation_id: str
    committed: bool
    """Ack once committed (``ALL``) rather than once stored (``LEADER``)."""
    received: float
    """When the message reached the broker (``perf_counter``), for the ack latency."""


_Pending = tuple[list[Ack], list[float]]
"""Acks for one inbox, and when each acked message was received."""


class PartitionIngest:
    """Coalesces one partition's incoming messages into batches and acks them."""

    def __init__(
        self,
        nc: NatsClient,
        partition: IngestPartition,
        settings: IngestConfig,
        latency: LatencyHistogram | None = None,
    ) -> None:
        """``latency``: where to time the acks (the stream's histogram; by default its own)."""
        self.nc = nc
        self.partition = partition
        self.config = partition.config
        self.settings = settings
        self.latency = latency if latency is not None else LatencyHistogram()
        self.subscription: Subscription | None = None
        self._records: list[Record] = []
        self._targets: list[_AckTarget | None] = []
        self._bytes = 0
        self._flush_task: asyncio.Task[None] | None = None
        self._writing = asyncio.Lock()
        """One append at a time, in arrival order."""

    async def handle(self, msg: Msg) -> None:
        """Store one NATS message (plain or envelope) and ack it when asked to."""
        try:
            await self._handle(msg)
        except Exception:
            logger.exception(
                "failed to ingest a message on %s for %s", msg.subject, self._name, extra=self._fields
            )

    async def _handle(self, msg: Msg) -> None:
        received = perf_counter()
        data = msg.data
        envelope = None
        if looks_like_envelope(data):
            try:
                envelope = decode(data, max_batch_bytes=self.partition.max_batch_bytes)
            except BatchTooLargeError as exc:
                logger.warning(
                    "refusing an envelope on %s for %s: %s", msg.subject, self._name, exc, extra=self._fields
                )
                target = self._ack_target(exc.header, received)
                await self._ack(target, error=ErrorCode.TOO_LARGE, message=str(exc))
                return
            except EnvelopeError as exc:
                logger.debug(
                    "payload on %s is not a valid envelope (%s); storing it as plain", msg.subject, exc
                )
        if envelope is None:
            headers = tuple((k, v.encode()) for k, v in msg.headers.items()) if msg.headers else ()
            record = Record(data, headers=headers, subject=msg.subject, reply=msg.reply or None)
            target = (
                _AckTarget(msg.reply, "", True, received) if self.config.ack_reply and msg.reply else None
            )
            await self._add(record, target)
            return
        if envelope.batch is None and envelope.producer_id is None:
            record = Record(envelope.value, key=envelope.key, headers=envelope.headers, subject=msg.subject)
            await self._add(record, self._ack_target(envelope, received))
        else:
            await self.flush()
            await self._store_alone(envelope, msg.subject, received)

    def _targeted(self, envelope: Envelope) -> bool:
        """Whether this partition is the one the envelope names (or it names none)."""
        return envelope.stream is None or (
            envelope.stream == self.config.name and envelope.partition == self.partition.number
        )

    def _ack_target(self, envelope: Envelope, received: float) -> _AckTarget | None:
        """Where to ack: only the targeted partition acks; other streams store a silent copy."""
        if not envelope.ack_inbox or envelope.ack_policy is AckPolicy.NONE or not self._targeted(envelope):
            return None
        committed = envelope.ack_policy is AckPolicy.ALL
        return _AckTarget(envelope.ack_inbox, envelope.correlation_id, committed, received)

    async def _add(self, record: Record, target: _AckTarget | None) -> None:
        size = record_size(record)
        limit = self.config.max_message_bytes
        if size > limit:
            logger.warning(
                "refusing a %d-byte message on %s: over max_message_bytes=%d",
                size,
                self._name,
                limit,
                extra=self._fields,
            )
            await self._ack(
                target,
                error=ErrorCode.TOO_LARGE,
                message=f"message is {size} bytes, over max_message_bytes={limit}",
            )
            return
        if self._records and self._bytes + size > self.settings.max_batch_bytes:
            await self.flush()  # keep every stored batch within the limit
        self._records.append(record)
        self._targets.append(target)
        self._bytes += size
        settings = self.settings
        full = len(self._records) >= settings.max_batch_messages or self._bytes >= settings.max_batch_bytes
        # Nothing else queued to coalesce with: store now rather than a loop iteration later.
        idle = (
            settings.max_delay == 0 and self.subscription is not None and not self.subscription.pending_msgs
        )
        if full or idle:
            await self.flush()
        elif self._flush_task is None:
            self._flush_task = asyncio.ensure_future(self._flush_soon())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self.settings.max_delay)  # 0: just let the queue drain first
        self._flush_task = None
        try:
            await self.flush()
        except Exception:
            logger.exception("flushing %s failed", self._name, extra=self._fields)

    async def flush(self) -> None:
        """Store the pending messages as one batch and ack them (``ALL`` ones once committed)."""
        if not self._records:
            return
        records, targets = self._records, self._targets
        self._records, self._targets, self._bytes = [], [], 0
        if any(t is not None and t.committed for t in targets):
            try:
                self.partition.check_min_insync()
            except JetStreamError as exc:
                # Refused before storing (Kafka does the same): the others go ahead.
                for refused in targets:
                    if refused is not None and refused.committed:
                        await self._ack(refused, error=exc.code, message=str(exc))
                kept = [(r, t) for r, t in zip(records, targets, strict=True) if t is None or not t.committed]
                if not kept:
                    return
                records, targets = [r for r, _ in kept], [t for _, t in kept]
        try:
            async with self._writing:
                offsets = await self._append(records, self._bytes_of(records))
        except (LogError, JetStreamError) as exc:
            if _error_code(exc) is ErrorCode.STORAGE:
                logger.exception(
                    "failed to append %d messages to %s", len(records), self._name, extra=self._fields
                )
            for failed in targets:
                await self._ack(failed, error=_error_code(exc), message=str(exc))
            return
        stream, number = self.config.name, self.partition.number
        now: dict[str, _Pending] = {}
        later: dict[str, _Pending] = {}
        for offset, target in zip(offsets, targets, strict=True):
            if target is not None:
                acks, received = (later if target.committed else now).setdefault(target.subject, ([], []))
                acks.append(Ack(stream, number, offset, offset, target.correlation_id))
                received.append(target.received)
        # One NATS message per ack inbox per flush: a producer pipelining many
        # messages gets their acks together.
        for subject, (batch, received) in now.items():
            await self._send(subject, encode_acks(batch), received)
        if later:
            self._when_committed(offsets[-1], later)

    async def _append(self, records: list[Record], size: int) -> range:
        """Append in a worker thread -- or right here when that costs less than the hop to a thread.

        A small batch (``INLINE_BYTES``) whose log is free and does not fsync
        every append is written on the loop: the write is a few microseconds,
        the hop to a thread and back tens of them.  A busy log (a compaction
        holds it) is never waited for on the loop.
        """
        if size <= INLINE_BYTES and not self.partition.appends_sync:
            offsets = self.partition.append(records, wait=False)
            if offsets is not None:
                return offsets
        return await asyncio.to_thread(self.partition.append, records)

    @staticmethod
    def _bytes_of(records: list[Record]) -> int:
        return sum(record_size(r) for r in records)

    def _when_committed(self, last_offset: int, acks: dict[str, _Pending]) -> None:
        """Send ``acks`` once ``last_offset`` is committed, or their error if that fails."""
        loop = asyncio.get_running_loop()

        async def send(error: JetStreamError | None) -> None:
            for subject, (pending, received) in acks.items():
                await self._send(subject, encode_acks(_failed(pending, error)), received)

        def committed(error: JetStreamError | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: the broker stopped
                loop.call_soon_threadsafe(lambda: asyncio.ensure_future(send(error)))

        self.partition.when_committed(last_offset, committed)

    async def _store_alone(self, envelope: Envelope, subject: str, received: float) -> None:
        target = self._ack_target(envelope, received)
        if target is not None and target.committed:
            try:
                self.partition.check_min_insync()
            except JetStreamError as exc:
                await self._ack(target, error=exc.code, message=str(exc))
                return
        table = _envelope_table(envelope, subject)
        producer, sequence, epoch = envelope.producer_id, envelope.sequence, envelope.producer_epoch
        try:
            async with self._writing:
                if producer is not None and sequence is not None:
                    ack = await asyncio.to_thread(
                        self.partition.append_idempotent,
                        table,
                        producer,
                        epoch,
                        sequence,
                        target=self._targeted(envelope),
                    )
                else:
                    offsets = await asyncio.to_thread(self.partition.append, table)
                    ack = Ack(self.config.name, self.partition.number, offsets.start, offsets[-1])
        except (LogError, JetStreamError) as exc:
            if _error_code(exc) is ErrorCode.STORAGE:
                logger.exception("failed to append a batch to %s", self._name, extra=self._fields)
            await self._ack(target, error=_error_code(exc), message=str(exc))
            return
        if target is None:
            return
        ack = ack._replace(correlation_id=target.correlation_id)
        if target.committed and ack.ok:
            self._when_committed(ack.last_offset, {target.subject: ([ack], [target.received])})
        else:
            await self._send(target.subject, encode_ack(ack), (target.received,))

    async def _ack(
        self,
        target: _AckTarget | None,
        first: int = -1,
        last: int = -1,
        error: ErrorCode = ErrorCode.OK,
        message: str = "",
    ) -> None:
        if target is None:
            return
        ack = Ack(self.config.name, self.partition.number, first, last, target.correlation_id, error, message)
        await self._send(target.subject, encode_ack(ack), (target.received,))

    async def _send(self, subject: str, payload: bytes, received: Sequence[float]) -> None:
        """Publish an ack (of messages ``received`` then) and time it; without a connection it is
        lost, and the producer's timeout tells it."""
        try:
            await self.nc.publish(subject, payload)
        except NatsError as exc:
            logger.warning(
                "cannot send an ack for %s to %s: %s", self._name, subject, exc, extra=self._fields
            )
            return
        self.latency.observe_since(received, perf_counter())

    async def close(self) -> None:
        """Stop listening and store what is pending."""
        if self.subscription is not None:
            with contextlib.suppress(NatsError):  # the connection may be closed already
                await self.subscription.unsubscribe()
            self.subscription = None
        if self._flush_task is not None:
            self._flush_task.cancel()
            self._flush_task = None
        await self.flush()

    @property
    def _name(self) -> str:
        return f"{self.config.name}/{self.partition.number}"

    @property
    def _fields(self) -> dict[str, object]:
        """``extra`` of its log lines: stream and partition as fields."""
        return Labels(self.config.name, self.partition.number).fields


def _failed(acks: list[Ack], error: JetStreamError | None) -> list[Ack]:
    """``acks`` as they are (``error`` is ``None``), or turned into refusals carrying ``error``."""
    if error is None:
        return acks
    return [a._replace(first_offset=-1, last_offset=-1, error=error.code, message=str(error)) for a in acks]


def _error_code(exc: LogError | JetStreamError) -> ErrorCode:
    """The ack error for a failed append."""
    if isinstance(exc, JetStreamError):
        return exc.code
    if isinstance(exc, RecordTooLargeError):
        return ErrorCode.TOO_LARGE
    if isinstance(exc, InvalidRecordsError):
        return ErrorCode.INVALID_ARGUMENT
    return ErrorCode.STORAGE


def _envelope_table(envelope: Envelope, subject: str) -> pa.Table:
    """An envelope's messages as an Arrow table in the log's input columns."""
    if envelope.batch is None:
        headers = [[{"key": k, "value": v} for k, v in envelope.headers] or None]
        batch = pa.record_batch(
            {
                "key": pa.array([envelope.key], pa.binary()),
                "value": pa.array([envelope.value], pa.binary()),
                "headers": pa.array(headers, HEADER_TYPE),
            }
        )
    else:
        batch = envelope.batch
    n = batch.num_rows
    columns = {name: batch.column(name) for name in batch.schema.names}
    columns["subject"] = constant_strings(subject, n)
    if envelope.producer_id is not None and envelope.sequence is not None:
        columns["producer_id"] = constant_strings(envelope.producer_id, n)
        position = producer_position(envelope.producer_epoch, envelope.sequence)
        columns["sequence"] = constant_ints(position, n, pa.int64())
    return pa.table(columns)
