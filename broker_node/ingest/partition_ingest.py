"""One partition's ingestion: messages from its NATS subscription into its log, and the acks.

Every partition this broker leads has one NATS subscription on its subject
(in the stream's queue group, if it has a load-balance group; see
:mod:`.ingestor`).  Messages that
arrive one at a time are coalesced into one stored batch per flush: a flush
runs as soon as the subscription's queue is drained (or after
``max_delay``), or at once when ``max_batch_messages`` or ``max_batch_bytes``
is reached.  Every message still gets its own ack; the acks of one flush for
one inbox travel together in one NATS message.  An envelope carrying an Arrow
batch, or a producer id, is stored as its own batch after the pending ones,
so the log keeps arrival order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import NamedTuple

import pyarrow as pa
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from broker_node.config import IngestConfig
from broker_node.log import InvalidRecordsError, LogError, Record, RecordTooLargeError
from broker_node.log.records import record_size
from broker_node.replication.partition import Partition
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
from pyspark_jetstream.protocol.errors import ErrorCode
from pyspark_jetstream.protocol.schema import HEADER_TYPE
from pyspark_jetstream.protocol.streams import StreamConfig

from .producers import ProducerTable, Verdict

logger = logging.getLogger(__name__)


class _AckTarget(NamedTuple):
    subject: str
    correlation_id: str


class PartitionIngest:
    """Coalesces one partition's incoming messages into batches and acks them."""

    def __init__(
        self,
        nc: NatsClient,
        partition: Partition,
        config: StreamConfig,
        producers: ProducerTable,
        settings: IngestConfig,
    ) -> None:
        self.nc = nc
        self.partition = partition
        self.config = config
        self.producers = producers
        self.settings = settings
        self.subscription: Subscription | None = None
        self._records: list[Record] = []
        self._targets: list[_AckTarget | None] = []
        self._bytes = 0
        self._flush_task: asyncio.Task[None] | None = None

    async def handle(self, msg: Msg) -> None:
        """Store one NATS message (plain or envelope) and ack it when asked to."""
        try:
            await self._handle(msg)
        except Exception:
            logger.exception("failed to ingest a message on %s for %s", msg.subject, self._name)

    async def _handle(self, msg: Msg) -> None:
        data = msg.data
        envelope = None
        if looks_like_envelope(data):
            try:
                envelope = decode(data, max_batch_bytes=self.partition.log.config.max_batch_bytes)
            except BatchTooLargeError as exc:
                logger.warning("refusing an envelope on %s for %s: %s", msg.subject, self._name, exc)
                await self._ack(self._ack_target(exc.header), error=ErrorCode.TOO_LARGE, message=str(exc))
                return
            except EnvelopeError as exc:
                logger.debug(
                    "payload on %s is not a valid envelope (%s); storing it as plain", msg.subject, exc
                )
        if envelope is None:
            headers = tuple((k, v.encode()) for k, v in msg.headers.items()) if msg.headers else ()
            record = Record(data, headers=headers, subject=msg.subject, reply=msg.reply or None)
            target = _AckTarget(msg.reply, "") if self.config.ack_reply and msg.reply else None
            await self._add(record, target)
            return
        if envelope.batch is None and envelope.producer_id is None:
            record = Record(envelope.value, key=envelope.key, headers=envelope.headers, subject=msg.subject)
            await self._add(record, self._ack_target(envelope))
        else:
            await self.flush()
            await self._store_alone(envelope, msg.subject)

    def _targeted(self, envelope: Envelope) -> bool:
        """Whether this partition is the one the envelope names (or it names none)."""
        return envelope.stream is None or (
            envelope.stream == self.config.name and envelope.partition == self.partition.number
        )

    def _ack_target(self, envelope: Envelope) -> _AckTarget | None:
        """Where to ack: only the targeted partition acks; other streams store a silent copy."""
        if not envelope.ack_inbox or envelope.ack_policy is AckPolicy.NONE or not self._targeted(envelope):
            return None
        return _AckTarget(envelope.ack_inbox, envelope.correlation_id)

    async def _add(self, record: Record, target: _AckTarget | None) -> None:
        size = record_size(record)
        limit = self.config.max_message_bytes
        if size > limit:
            logger.warning(
                "refusing a %d-byte message on %s: over max_message_bytes=%d", size, self._name, limit
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
            logger.exception("flushing %s failed", self._name)

    async def flush(self) -> None:
        """Store the pending messages as one batch and ack them."""
        if not self._records:
            return
        records, targets = self._records, self._targets
        self._records, self._targets, self._bytes = [], [], 0
        try:
            offsets = self.partition.append(records)
        except LogError as exc:
            logger.exception("failed to append %d messages to %s", len(records), self._name)
            for target in targets:
                await self._ack(target, error=_error_code(exc), message=str(exc))
            return
        # One NATS message per ack inbox per flush: a producer pipelining many
        # messages gets their acks together.
        by_subject: dict[str, list[Ack]] = {}
        stream, number = self.config.name, self.partition.number
        for offset, target in zip(offsets, targets, strict=True):
            if target is not None:
                by_subject.setdefault(target.subject, []).append(
                    Ack(stream, number, offset, offset, target.correlation_id)
                )
        for subject, acks in by_subject.items():
            await self._send(subject, encode_acks(acks))

    async def _store_alone(self, envelope: Envelope, subject: str) -> None:
        target = self._ack_target(envelope)
        producer, sequence, epoch = envelope.producer_id, envelope.sequence, envelope.producer_epoch
        if producer is not None and sequence is not None:
            check = self.producers.check(producer, epoch, sequence, target=self._targeted(envelope))
            if check.verdict is Verdict.DUPLICATE:
                await self._ack(target, check.first, check.last, error=ErrorCode.DUPLICATE)
                return
            if check.verdict is not Verdict.STORE:
                code = (
                    ErrorCode.OUT_OF_ORDER_SEQUENCE
                    if check.verdict is Verdict.OUT_OF_ORDER
                    else ErrorCode.PRODUCER_FENCED
                )
                await self._ack(target, error=code, message=check.reason)
                return
        try:
            offsets = self.partition.append(_envelope_table(envelope, subject))
        except LogError as exc:
            if _error_code(exc) is ErrorCode.STORAGE:
                logger.exception("failed to append a batch to %s", self._name)
            await self._ack(target, error=_error_code(exc), message=str(exc))
            return
        if producer is not None and sequence is not None:
            self.producers.record(producer, epoch, sequence, offsets.start, offsets[-1])
        await self._ack(target, offsets.start, offsets[-1])

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
        await self._send(target.subject, encode_ack(ack))

    async def _send(self, subject: str, payload: bytes) -> None:
        """Publish an ack; without a connection it is lost, and the producer's timeout tells it."""
        try:
            await self.nc.publish(subject, payload)
        except NatsError as exc:
            logger.warning("cannot send an ack for %s to %s: %s", self._name, subject, exc)

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


def _error_code(exc: LogError) -> ErrorCode:
    """The ack error for a failed append."""
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
