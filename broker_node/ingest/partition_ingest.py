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
subject is acked like ``ALL``, alone and in JetStream's publish-ack format
(:mod:`.replies`).  A publish that is never acked times out at the producer;
nothing is dropped silently.  Every ack sent is timed in the stream's
:class:`~.latency.LatencyHistogram`.

Message ids (``Nats-Msg-Id``, or an envelope's message id; see
:mod:`pyspark_jetstream.protocol.headers`): a single message, not an
idempotent producer's, whose id the partition stored within the stream's
``duplicate_window`` -- or that waits in a flush not yet stored -- is not
stored again: it is acked as a duplicate with the original's offset (for
``ALL`` and plain requests once that offset is committed).  After each
append the partition remembers the ids it stored.

A plain message's JetStream headers: one with ``Nats-Expected-Stream`` naming
another stream that also receives the message (it listens on the subject and
is not in this stream's load-balance group) is left to that stream: neither
stored nor acked here.  Naming no such stream, it is refused with JetStream's
"expected stream does not match" (400, 10060), nothing stored.  A header
asking for a check the broker does not make (``Nats-Expected-Last-Sequence``
and its kin) is refused too.

The partition is reached through :class:`IngestPartition`, which
``broker_node.replication.partition.Partition`` satisfies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from time import perf_counter
from typing import Literal, Protocol, overload

import pyarrow as pa
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from broker_node.config import IngestConfig
from broker_node.log import InvalidRecordsError, LogError, Record, RecordTooLargeError
from broker_node.log.append_input import Records, record_size
from broker_node.log.logging_labels import Labels
from pyspark_jetstream.protocol.ack import STREAM_MISMATCH, Ack
from pyspark_jetstream.protocol.array_builders import constant_ints, constant_strings
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
from pyspark_jetstream.protocol.headers import (
    EXPECTED_STREAM_HEADER,
    MSG_ID_HEADER,
    UNSUPPORTED_EXPECTATIONS,
    decoded_id,
    message_id_problem,
    message_ids_in,
)
from pyspark_jetstream.protocol.schema import HEADER_TYPE
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.subjects import subject_matches

from .latency import LatencyHistogram
from .replies import AckTarget, Outgoing, grouped, single

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
    def append(
        self, records: Records, *, wait: Literal[True] = True, message_ids: MessageIds = ()
    ) -> range: ...
    @overload
    def append(self, records: Records, *, wait: bool, message_ids: MessageIds = ()) -> range | None: ...
    def append_idempotent(
        self,
        records: Records,
        producer_id: str,
        epoch: int,
        sequence: int,
        *,
        target: bool = True,
        message_ids: MessageIds = (),
    ) -> Ack: ...
    def check_min_insync(self) -> None: ...
    def when_committed(self, last_offset: int, callback: Callable[[JetStreamError | None], None]) -> None: ...
    def message_id_offset(self, message_id: str) -> int | None: ...


MessageIds = Sequence[tuple[str, int]]
"""The message ids of records to append, ``(id, index of the record)``: the partition remembers
them with the append."""
StreamLookup = Callable[[str], StreamConfig | None]
"""A stream's configuration by name (``None``: no such stream), for ``Nats-Expected-Stream``."""

_Refusal = tuple[ErrorCode, str]
"""Why a message was not stored: the ack's error and message."""


class _Batch:
    """Messages waiting to be stored as one batch, and what to ack once they are."""

    __slots__ = ("ids", "records", "repeats", "size", "targets")

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.targets: list[AckTarget | None] = []
        self.size = 0
        self.ids: dict[str, int] = {}
        """Message id -> index of the record that carries it."""
        self.repeats: list[tuple[int, AckTarget]] = []
        """Messages repeating an id of this batch: the original's index, and where to ack."""


class PartitionIngest:
    """Coalesces one partition's incoming messages into batches and acks them."""

    def __init__(
        self,
        nc: NatsClient,
        partition: IngestPartition,
        settings: IngestConfig,
        latency: LatencyHistogram | None = None,
        streams: StreamLookup | None = None,
    ) -> None:
        """``latency``: where to time the acks (the stream's histogram; by default its own);
        ``streams``: every stream's configuration by name (by default only this one's)."""
        self.nc = nc
        self.partition = partition
        self.config = partition.config
        self.settings = settings
        self.latency = latency if latency is not None else LatencyHistogram()
        self.subscription: Subscription | None = None
        self._streams = streams or (lambda name: self.config if name == self.config.name else None)
        self._batch = _Batch()
        self._storing: list[_Batch] = []
        """Batches being appended: the partition remembers their ids only once the append is done."""
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
            await self._add_plain(msg, received)
        elif envelope.batch is None and envelope.producer_id is None:
            headers = envelope.headers
            message_id = envelope.message_id
            if message_id is not None:
                headers = _with_message_id(headers, message_id)
            elif headers:
                message_id = next((decoded_id(v) for k, v in headers if k == MSG_ID_HEADER), None) or None
            record = Record(envelope.value, key=envelope.key, headers=headers, subject=msg.subject)
            await self._add(record, self._ack_target(envelope, received), message_id)
        else:
            await self.flush()
            await self._store_alone(envelope, msg.subject, received)

    async def _add_plain(self, msg: Msg, received: float) -> None:
        """Store a plain NATS message as it is, its NATS headers as the record's."""
        reply = msg.reply
        target = AckTarget(reply, "", True, received, True) if self.config.ack_reply and reply else None
        headers = msg.headers
        if not headers:
            await self._add(Record(msg.data, subject=msg.subject, reply=reply or None), target)
            return
        if not await self._expectations_met(headers, msg.subject, target):
            return
        stored = tuple((k, v.encode()) for k, v in headers.items())
        record = Record(msg.data, headers=stored, subject=msg.subject, reply=reply or None)
        await self._add(record, target, headers.get(MSG_ID_HEADER) or None)

    async def _expectations_met(
        self, headers: Mapping[str, str], subject: str, target: AckTarget | None
    ) -> bool:
        """Whether a plain message's JetStream headers let this partition store it; if not, the
        refusal is acked (see the module docstring)."""
        for name in UNSUPPORTED_EXPECTATIONS:
            if name in headers:
                await self._refuse_plain(
                    target,
                    ErrorCode.INVALID_ARGUMENT,
                    f"bad request: the {name} header asks for a check pyspark-jetstream does not "
                    f"make; nothing was stored on {subject!r}",
                )
                return False
        expected = headers.get(EXPECTED_STREAM_HEADER)
        if expected is None or expected == self.config.name:
            return True
        other = self._streams(expected)
        if (
            other is not None
            and (other.group is None or other.group != self.config.group)
            and any(subject_matches(pattern, subject) for pattern in other.partition_subjects())
        ):
            return False  # that stream receives it too: it stores and acks it
        await self._refuse_plain(
            target,
            ErrorCode.INVALID_ARGUMENT,
            f"expected stream does not match: the message on {subject!r} names stream {expected!r} "
            f"in {EXPECTED_STREAM_HEADER}, but it reached stream {self.config.name!r}"
            + ("" if other is not None else f", and no stream {expected!r} exists"),
            STREAM_MISMATCH,
        )
        return False

    async def _refuse_plain(
        self,
        target: AckTarget | None,
        error: ErrorCode,
        message: str,
        jetstream_error: tuple[int, int] | None = None,
    ) -> None:
        logger.info("refusing a message for %s: %s", self._name, message, extra=self._fields)
        await self._ack(target, error=error, message=message, jetstream_error=jetstream_error)

    def _targeted(self, envelope: Envelope) -> bool:
        """Whether this partition is the one the envelope names (or it names none)."""
        return envelope.stream is None or (
            envelope.stream == self.config.name and envelope.partition == self.partition.number
        )

    def _ack_target(self, envelope: Envelope, received: float) -> AckTarget | None:
        """Where to ack: only the targeted partition acks; other streams store a silent copy."""
        if not envelope.ack_inbox or envelope.ack_policy is AckPolicy.NONE or not self._targeted(envelope):
            return None
        committed = envelope.ack_policy is AckPolicy.ALL
        return AckTarget(envelope.ack_inbox, envelope.correlation_id, committed, received)

    async def _add(self, record: Record, target: AckTarget | None, message_id: str | None = None) -> None:
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
                message=f"message size exceeds maximum allowed: the message is {size} bytes, over "
                f"max_message_bytes={limit}",
            )
            return
        if message_id is not None and self.config.duplicate_window <= 0:
            message_id = None  # de-duplication by id is off
        if message_id is not None:
            problem = message_id_problem(message_id)
            if problem is not None:
                logger.info("refusing a message for %s: %s", self._name, problem, extra=self._fields)
                await self._ack(target, error=ErrorCode.INVALID_ARGUMENT, message=problem)
                return
        batch = self._batch
        if batch.records and batch.size + size > self.settings.max_batch_bytes:
            await self.flush()  # keep every stored batch within the limit
            batch = self._batch
        if message_id is not None:
            if await self._repeated(message_id, target):
                return
            batch.ids[message_id] = len(batch.records)
        batch.records.append(record)
        batch.targets.append(target)
        batch.size += size
        settings = self.settings
        full = len(batch.records) >= settings.max_batch_messages or batch.size >= settings.max_batch_bytes
        # Nothing else queued to coalesce with: store now rather than a loop iteration later.
        idle = (
            settings.max_delay == 0 and self.subscription is not None and not self.subscription.pending_msgs
        )
        if full or idle:
            await self.flush()
        elif self._flush_task is None:
            self._flush_task = asyncio.ensure_future(self._flush_soon())

    async def _repeated(self, message_id: str, target: AckTarget | None) -> bool:
        """Whether ``message_id`` was stored within the window, or waits to be: then the message
        is acked (or will be) as a duplicate of the original."""
        original = self.partition.message_id_offset(message_id)
        if original is not None:
            if target is not None:
                ack = self._duplicate(original, target.correlation_id)
                if target.committed:
                    self._when_committed(original, grouped([(target, ack)]))
                else:
                    await self._send(target.subject, single(target, ack), (target.received,))
            return True
        for pending in (self._batch, *self._storing):
            index = pending.ids.get(message_id)
            if index is not None:
                if target is not None:
                    pending.repeats.append((index, target))
                return True
        return False

    def _duplicate(self, offset: int, correlation_id: str) -> Ack:
        return Ack(
            self.config.name, self.partition.number, offset, offset, correlation_id, ErrorCode.DUPLICATE
        )

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self.settings.max_delay)  # 0: just let the queue drain first
        self._flush_task = None
        try:
            await self.flush()
        except Exception:
            logger.exception("flushing %s failed", self._name, extra=self._fields)

    async def flush(self) -> None:
        """Store the pending messages as one batch and ack them (``ALL`` ones once committed)."""
        batch = self._batch
        if not batch.records:
            return
        self._batch = _Batch()
        self._storing.append(batch)
        try:
            outcomes = await self._store(batch)
        finally:
            # The partition remembered the ids with the append: a message repeating one
            # finds it there from now on, and in the batch until now.
            self._storing.remove(batch)
        stream, number = self.config.name, self.partition.number
        replies: list[tuple[AckTarget, Ack]] = []
        for outcome, target in zip(outcomes, batch.targets, strict=True):
            if target is not None:
                replies.append((target, _ack(stream, number, outcome, target.correlation_id)))
        for index, target in batch.repeats:
            outcome = outcomes[index]
            if isinstance(outcome, int):
                replies.append((target, self._duplicate(outcome, target.correlation_id)))
            else:
                replies.append((target, _ack(stream, number, outcome, target.correlation_id)))
        await self._reply(replies)

    async def _store(self, batch: _Batch) -> list[int | _Refusal]:
        """Append the batch; for each message, its offset or why it was not stored."""
        records, targets = batch.records, batch.targets
        outcomes: list[int | _Refusal] = [(ErrorCode.STORAGE, "not stored")] * len(records)
        kept = list(range(len(records)))
        ids = list(batch.ids.items())
        if any(t is not None and t.committed for t in targets):
            try:
                self.partition.check_min_insync()
            except JetStreamError as exc:
                # Refused before storing (Kafka does the same): the others go ahead.
                kept = [i for i, t in enumerate(targets) if t is None or not t.committed]
                for i, target in enumerate(targets):
                    if target is not None and target.committed:
                        outcomes[i] = (exc.code, str(exc))
                if not kept:
                    return outcomes
                records = [records[i] for i in kept]
                ids = _kept_ids(ids, kept)
        try:
            async with self._writing:
                offsets = await self._append(records, self._bytes_of(records), ids)
        except (LogError, JetStreamError) as exc:
            if _error_code(exc) is ErrorCode.STORAGE:
                logger.exception(
                    "failed to append %d messages to %s", len(records), self._name, extra=self._fields
                )
            for i in kept:
                outcomes[i] = (_error_code(exc), str(exc))
            return outcomes
        for i, offset in zip(kept, offsets, strict=True):
            outcomes[i] = offset
        return outcomes

    async def _reply(self, replies: list[tuple[AckTarget, Ack]]) -> None:
        """Send acks: ``LEADER`` ones and refusals now, ``ALL`` ones once committed."""
        now = [(t, a) for t, a in replies if not (t.committed and a.ok)]
        later = [(t, a) for t, a in replies if t.committed and a.ok]
        # One NATS message per ack inbox per flush: a producer pipelining many
        # messages gets their acks together.
        for outgoing in grouped(now):
            await self._send(outgoing.subject, outgoing.payload(), outgoing.received)
        if later:
            self._when_committed(max(a.last_offset for _, a in later), grouped(later))

    async def _append(self, records: list[Record], size: int, message_ids: MessageIds) -> range:
        """Append in a worker thread -- or right here when that costs less than the hop to a thread.

        A small batch (``INLINE_BYTES``) whose log is free and does not fsync
        every append is written on the loop: the write is a few microseconds,
        the hop to a thread and back tens of them.  A busy log (a compaction
        holds it) is never waited for on the loop.
        """
        if size <= INLINE_BYTES and not self.partition.appends_sync:
            offsets = self.partition.append(records, wait=False, message_ids=message_ids)
            if offsets is not None:
                return offsets
        return await asyncio.to_thread(self.partition.append, records, message_ids=message_ids)

    @staticmethod
    def _bytes_of(records: list[Record]) -> int:
        return sum(record_size(r) for r in records)

    def _when_committed(self, last_offset: int, outgoing: list[Outgoing]) -> None:
        """Send ``outgoing`` once ``last_offset`` is committed, or their error if that fails."""
        loop = asyncio.get_running_loop()

        async def send(error: JetStreamError | None) -> None:
            for message in outgoing:
                await self._send(message.subject, message.payload(error), message.received)

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
        ids = _ids_of(table) if self.config.duplicate_window > 0 else []
        if ids and (producer is None or sequence is None):
            await self._store_new_rows(table, ids, target)
            return
        # An idempotent producer's batch is stored whole (its sequence de-duplicates it): its
        # ids are remembered, not checked.
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
                        message_ids=ids,
                    )
                else:
                    offsets = await asyncio.to_thread(self.partition.append, table, message_ids=ids)
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
            self._when_committed(ack.last_offset, grouped([(target, ack)]))
        else:
            await self._send(target.subject, single(target, ack), (target.received,))

    async def _store_new_rows(self, table: pa.Table, ids: MessageIds, target: AckTarget | None) -> None:
        """Store the rows of ``table`` whose message ids are new, one batch in row order; ack
        which rows repeated an id and the offset each repeated (see :mod:`..protocol.ack`)."""
        # Stands for this batch among those being stored: a message repeating one of its ids
        # while it is appended waits for it, as it would for a coalesced batch.
        pending = _Batch()
        for message_id, row in ids:
            pending.ids.setdefault(message_id, row)
        self._storing.append(pending)
        try:
            async with self._writing:
                # Every earlier append is done: the partition knows the ids they stored.
                repeats, first_rows = _repeats(ids, self.partition.message_id_offset)
                kept = [row for row in range(table.num_rows) if row not in repeats]
                stored_ids = _kept_ids(ids, kept)
                outcome: range | _Refusal = range(0)
                if kept:
                    rows = table if len(kept) == table.num_rows else table.take(kept)
                    outcome = await asyncio.to_thread(self.partition.append, rows, message_ids=stored_ids)
        except (LogError, JetStreamError) as exc:
            if _error_code(exc) is ErrorCode.STORAGE:
                logger.exception("failed to append a batch to %s", self._name, extra=self._fields)
            outcome = (_error_code(exc), str(exc))
        finally:
            self._storing.remove(pending)
        stream, number = self.config.name, self.partition.number
        if not isinstance(outcome, range):
            waiting = [*pending.repeats, *([(0, target)] if target is not None else [])]
            await self._reply([(t, _ack(stream, number, outcome, t.correlation_id)) for _, t in waiting])
            return
        offset_of = {row: outcome.start + n for n, row in enumerate(kept)}
        for row, original in repeats.items():
            offset_of[row] = original if isinstance(original, int) else offset_of[first_rows[original]]
        replies = [(t, self._duplicate(offset_of[row], t.correlation_id)) for row, t in pending.repeats]
        if target is not None:
            duplicates = tuple(sorted((row, offset_of[row]) for row in repeats))
            if kept:
                ack = Ack(
                    stream, number, outcome.start, outcome[-1], target.correlation_id, duplicates=duplicates
                )
            else:
                offsets = [offset for _, offset in duplicates]
                ack = Ack(
                    stream,
                    number,
                    min(offsets),
                    max(offsets),
                    target.correlation_id,
                    ErrorCode.DUPLICATE,
                    duplicates=duplicates,
                )
            replies.append((target, ack))
        await self._reply(replies)

    async def _ack(
        self,
        target: AckTarget | None,
        error: ErrorCode = ErrorCode.OK,
        message: str = "",
        jetstream_error: tuple[int, int] | None = None,
    ) -> None:
        """Send a refusal (``error``) to ``target``, if there is one."""
        if target is None:
            return
        ack = Ack(self.config.name, self.partition.number, -1, -1, target.correlation_id, error, message)
        await self._send(target.subject, single(target, ack, jetstream_error), (target.received,))

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


def _ack(stream: str, partition: int, outcome: int | _Refusal, correlation_id: str) -> Ack:
    """The ack of a message stored at ``outcome``, or refused with it."""
    if isinstance(outcome, int):
        return Ack(stream, partition, outcome, outcome, correlation_id)
    error, message = outcome
    return Ack(stream, partition, -1, -1, correlation_id, error, message)


def _kept_ids(ids: MessageIds, kept: Sequence[int]) -> list[tuple[str, int]]:
    """The message ids of the rows ``kept`` (row numbers, ascending), numbered as those rows are
    once the others are left out."""
    position = {row: n for n, row in enumerate(kept)}
    return [(message_id, position[row]) for message_id, row in ids if row in position]


def _repeats(
    ids: MessageIds, stored: Callable[[str], int | None]
) -> tuple[dict[int, int | str], dict[str, int]]:
    """Which rows of a batch repeat a message id: ``{row: the offset stored with the id, or the
    id itself when an earlier row of the batch carries it}``, and the first row of each new id."""
    repeats: dict[int, int | str] = {}
    first_rows: dict[str, int] = {}
    for message_id, row in ids:
        original = stored(message_id)
        if original is not None:
            repeats[row] = original
        elif message_id in first_rows:
            repeats[row] = message_id
        else:
            first_rows[message_id] = row
    return repeats, first_rows


def _ids_of(table: pa.Table) -> list[tuple[str, int]]:
    """The message ids the rows of ``table`` carry, with their row numbers."""
    if "headers" not in table.column_names:
        return []
    rows, ids = message_ids_in(table.column("headers").combine_chunks())
    return list(zip(ids, rows, strict=True))


def _with_message_id(
    headers: tuple[tuple[str, bytes], ...], message_id: str
) -> tuple[tuple[str, bytes], ...]:
    """``headers`` with ``Nats-Msg-Id`` set to ``message_id`` (it is stored as that header)."""
    kept = tuple((k, v) for k, v in headers if k != MSG_ID_HEADER)
    return (*kept, (MSG_ID_HEADER, message_id.encode()))


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
