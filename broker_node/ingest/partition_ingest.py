"""One partition's ingestion: messages from its NATS subscription into its log, and the acks.

Every partition this broker leads has one NATS subscription on its subject
(in the stream's queue group, if it has a load-balance group; see
:mod:`.ingestor`), whose callback is :meth:`PartitionIngest.handle`.  This
module only wires the rooms that do the work, in the order a message goes
through them: :mod:`.decoding` says what the message asks (no I/O);
:mod:`.batcher` coalesces single messages into one stored batch per flush
(an envelope batch is stored on its own, after the pending ones);
:mod:`.partition_store` appends, one append at a time; :mod:`.acks` sends each
message's ack, once stored or once committed.  A publish that is never acked
times out at the producer; nothing is dropped silently.

Message ids (``Nats-Msg-Id``, or an envelope's message id; see
:mod:`pyspark_jetstream.protocol.headers`): a single message, not an
idempotent producer's, whose id the partition stored within the stream's
``duplicate_window`` -- or that waits in a flush not yet stored -- is not
stored again: it is acked as a duplicate with the original's offset (for
``ALL`` and plain requests once that offset is committed).  After each
append the partition remembers the ids it stored.

A plain message's JetStream headers (``Nats-Expected-Stream`` and the checks
the broker does not make) are read by :mod:`.decoding`, which says what each
leads to.  The partition is reached through :class:`~.port.IngestPartition`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from time import perf_counter

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.envelope import AckPolicy, Envelope
from pyspark_jetstream.protocol.errors import ErrorCode, JetStreamError
from pyspark_jetstream.protocol.streams import StreamConfig

from .acks import Acks, on_loop_when_committed, rows_ack
from .batcher import Batch, Batcher
from .dead_letter import DeadLetters
from .decoding import Reader, Refused, Single, Whole, put_whole, read
from .latency import LatencyHistogram
from .partition_store import Invalid, Outcome, PartitionStore
from .port import BatchLimits, IngestPartition, LogTerms, Refusal, StreamLookup, log_fields
from .replies import AckTarget, failed

logger = logging.getLogger(__name__)


class PartitionIngest:
    """One partition's subscription callback: decodes, coalesces, stores and acks its messages."""

    def __init__(
        self,
        nc: NatsClient,
        partition: IngestPartition,
        settings: BatchLimits,
        terms: LogTerms,
        *,
        latency: LatencyHistogram | None = None,
        streams: StreamLookup | None = None,
    ) -> None:
        """``terms``: the log's (see :class:`~.port.LogTerms`); ``latency``: where to time the acks
        (the stream's histogram; by default its own); ``streams``: every stream's configuration by
        name (by default only this one's)."""
        self.partition = partition
        self.config = config = partition.config
        self._name = name = f"{config.name}/{partition.number}"
        self._fields = fields = log_fields(config.name, partition.number)
        self._subscription: Subscription | None = None
        self.reader = Reader(
            config, partition.number, partition.max_batch_bytes, streams or _only(config), terms
        )
        self.batcher = Batcher(settings, self.flush, name, fields)
        self.store = PartitionStore(partition, terms, name, fields)
        self.acks = Acks(nc, partition, latency if latency is not None else LatencyHistogram(), name, fields)
        self.dead_letters = DeadLetters(
            lambda: self.acks.nc, streams or _only(config), config.name, partition.number
        )
        self._putting = asyncio.Lock()
        """Held from a put chunk's arrival to its append: chunks are appended in the order they came."""

    @property
    def nc(self) -> NatsClient:
        """The connection acks go out on."""
        return self.acks.nc

    @nc.setter
    def nc(self, nc: NatsClient) -> None:
        self.acks.nc = nc

    @property
    def subscription(self) -> Subscription | None:
        """The partition's NATS subscription, whose callback is :meth:`handle`."""
        return self._subscription

    @subscription.setter
    def subscription(self, subscription: Subscription | None) -> None:
        self._subscription = self.batcher.queue = subscription

    @property
    def latency(self) -> LatencyHistogram:
        """Where the acks are timed."""
        return self.acks.latency

    async def handle(self, msg: Msg) -> None:
        """Store one NATS message (plain or envelope) and ack it when asked to."""
        try:
            await self._handle(msg)
        except Exception:
            logger.exception(
                "failed to ingest a message on %s for %s", msg.subject, self._name, extra=self._fields
            )

    async def _handle(self, msg: Msg) -> None:
        got = read(self.reader, msg, perf_counter())
        if type(got) is Single:
            if got.not_envelope is not None:
                logger.debug(
                    "payload on %s is not a valid envelope (%s); storing it as plain",
                    msg.subject,
                    got.not_envelope,
                )
            await self._add(got)
        elif type(got) is Whole:
            await self.flush()
            await self._store_whole(got)
        elif type(got) is Refused:
            logger.log(got.level, *got.log, extra=self._fields)
            await self.acks.refuse(got.target, got.error, got.message, got.jetstream_error)
        # None: left to the stream it names in Nats-Expected-Stream, which receives it too.

    async def _add(self, single: Single) -> None:
        record, size, target, message_id, _ = single
        batcher = self.batcher
        if batcher.overflows(size):
            await self.flush()  # keep every stored batch within the limit
        if message_id is not None and await self._repeated(message_id, target):
            return
        if batcher.add(record, size, target, message_id):
            await self.flush()

    async def _repeated(self, message_id: str, target: AckTarget | None) -> bool:
        """Whether ``message_id`` was stored within the window, or waits to be: then the message
        is acked (or will be) as a duplicate of the original."""
        original = self.partition.message_id_offset(message_id)
        if original is not None:
            if target is not None:
                await self.acks.deliver(target, self.acks.duplicate(original, target.correlation_id))
            return True
        waiting = self.batcher.waiting(message_id)
        if waiting is None:
            return False
        if target is not None:
            batch, index = waiting
            batch.repeats.append((index, target))
        return True

    async def flush(self) -> None:
        """Store the pending messages as one batch and ack them (``ALL`` ones once committed)."""
        batch = self.batcher.take()
        if batch is None:
            return
        try:
            outcomes = await self.store.batch(batch)
        finally:
            # The partition remembered the ids with the append: a message repeating one
            # finds it there from now on, and in the batch until now.
            self.batcher.stored(batch)
        if self.partition.config.schema is not None:
            await self._reply_typed(batch, outcomes)
            return
        acks = self.acks
        replies: list[tuple[AckTarget, Ack]] = []
        for outcome, target in zip(outcomes, batch.targets, strict=True):
            if target is not None:
                replies.append((target, acks.of(outcome, target.correlation_id)))  # type: ignore[arg-type]
        for index, target in batch.repeats:
            outcome = outcomes[index]
            if isinstance(outcome, int):
                replies.append((target, acks.duplicate(outcome, target.correlation_id)))
            else:
                replies.append((target, acks.of(outcome, target.correlation_id)))  # type: ignore[arg-type]
        await acks.reply(replies)

    async def _reply_typed(self, batch: Batch, outcomes: list[Outcome]) -> None:
        """A typed stream's flush's acks: as :meth:`flush` sends them, with the invalid messages
        refused or, stored in the dead-letter stream, acked with its ack at once."""
        settled = await self._settle_invalid(batch, outcomes)
        acks = self.acks
        replies: list[tuple[AckTarget, Ack]] = []
        elsewhere: list[tuple[AckTarget, Ack]] = []
        for outcome, target in zip(settled, batch.targets, strict=True):
            if target is None:
                continue
            if isinstance(outcome, Ack):
                elsewhere.append((target, outcome._replace(correlation_id=target.correlation_id)))
            else:
                replies.append((target, acks.of(outcome, target.correlation_id)))
        for index, target in batch.repeats:
            outcome = settled[index]
            if isinstance(outcome, int):
                replies.append((target, acks.duplicate(outcome, target.correlation_id)))
            elif isinstance(outcome, Ack):
                elsewhere.append((target, outcome._replace(correlation_id=target.correlation_id)))
            else:
                replies.append((target, acks.of(outcome, target.correlation_id)))
        await acks.reply(replies)
        if elsewhere:
            await acks.reply_now(elsewhere)  # committed in the dead-letter stream already

    async def _settle_invalid(self, batch: Batch, outcomes: list[Outcome]) -> list[int | Refusal | Ack]:
        """Each message's outcome with the invalid ones (a typed stream's) refused -- or stored in
        the dead-letter stream, whose ack then stands for it (see :mod:`.dead_letter`)."""
        invalid = [(i, o.reason) for i, o in enumerate(outcomes) if type(o) is Invalid]
        if not invalid:
            return outcomes  # type: ignore[return-value] # no Invalid among them
        settled: list[int | Refusal | Ack] = [
            (ErrorCode.INVALID_ARGUMENT, o.reason) if isinstance(o, Invalid) else o for o in outcomes
        ]
        schema = self.partition.config.schema
        if schema is None or schema.on_invalid != "dead-letter" or schema.dead_letter is None:
            logger.debug("%s: refused %d invalid message(s)", self._name, len(invalid), extra=self._fields)
            return settled
        stored = await self.dead_letters.store(
            schema.dead_letter, [(batch.records[i], r) for i, r in invalid]
        )
        for (i, _), outcome in zip(invalid, stored, strict=True):
            settled[i] = outcome
        return settled

    async def _store_whole(self, whole: Whole) -> None:
        """Store an envelope batch on its own (after the pending ones) and ack it."""
        target = whole.target
        if target is not None and target.committed and (short := self._short_of_replicas()) is not None:
            await self.acks.refuse(target, *short)
            return
        envelope = whole.envelope
        if whole.message_ids and (envelope.producer_id is None or envelope.sequence is None):
            await self._store_new_rows(whole)
            return
        outcome = await self.store.whole(whole)
        if not isinstance(outcome, Ack):
            await self.acks.refuse(target, *outcome)
            return
        if target is not None:
            await self.acks.deliver(target, outcome._replace(correlation_id=target.correlation_id))

    async def put(self, envelope: Envelope, correlation_id: str) -> Ack:
        """Store a chunk written over Flight (see :mod:`pyspark_jetstream.protocol.put`) as the same
        producer's envelope batch on NATS is stored (after the pending messages); its ack once
        stored or, for ``ALL``, once committed -- or the refusal (an ack with an error)."""
        received = perf_counter()
        acks = self.acks
        committed = envelope.ack_policy is AckPolicy.ALL
        async with self._putting:  # taken in arrival order (asyncio's locks are fair)
            whole = put_whole(self.reader, envelope)
            if type(whole) is Refused:
                logger.log(whole.level, *whole.log, extra=self._fields)
                return acks.of((whole.error, whole.message), correlation_id)
            assert type(whole) is Whole
            if committed and (short := self._short_of_replicas()) is not None:
                return acks.of(short, correlation_id)
            await self.flush()
            outcome = await self.store.whole(whole)
        if not isinstance(outcome, Ack):
            return acks.of(outcome, correlation_id)
        ack = outcome._replace(correlation_id=correlation_id)
        if committed and ack.ok:
            error = await self._committed(ack.last_offset)
            ack = failed([ack], error)[0]
        acks.latency.observe_since((received,), perf_counter())
        return ack

    def _short_of_replicas(self) -> Refusal | None:
        """Why an ``ALL`` write is refused now (fewer in-sync replicas than the stream's minimum),
        or ``None``."""
        try:
            self.partition.check_min_insync()
        except JetStreamError as exc:
            return exc.code, str(exc)
        return None

    async def _committed(self, offset: int) -> JetStreamError | None:
        """Wait until ``offset`` is committed; the error if that fails."""
        done: asyncio.Future[JetStreamError | None] = asyncio.get_running_loop().create_future()

        def settle(error: JetStreamError | None) -> None:
            if not done.done():
                done.set_result(error)

        on_loop_when_committed(self.partition, offset, settle)
        return await done

    async def _store_new_rows(self, whole: Whole) -> None:
        """Store the rows whose message ids are new; ack which rows repeated an id and the offset
        each repeated (see :mod:`pyspark_jetstream.protocol.ack`)."""
        target, acks = whole.target, self.acks
        held = self.batcher.hold(whole.message_ids)
        try:
            stored = await self.store.new_rows(whole.table, whole.message_ids)
        finally:
            self.batcher.stored(held)
        outcome = stored.outcome
        if not isinstance(outcome, range):
            waiting = [*held.repeats, *([(0, target)] if target is not None else [])]
            await acks.reply([(t, acks.of(outcome, t.correlation_id)) for _, t in waiting])
            return
        offset_of = stored.offsets()
        replies = [(t, acks.duplicate(offset_of[row], t.correlation_id)) for row, t in held.repeats]
        if target is not None:
            duplicates = tuple(sorted((row, offset_of[row]) for row in stored.repeats))
            replies.append((target, rows_ack(acks, outcome, duplicates, target.correlation_id)))
        await acks.reply(replies)

    async def close(self) -> None:
        """Stop listening and store what is pending."""
        if self.subscription is not None:
            with contextlib.suppress(NatsError):  # the connection may be closed already
                await self.subscription.unsubscribe()
            self.subscription = None
        self.batcher.close()
        await self.flush()


def _only(config: StreamConfig) -> StreamLookup:
    """A stream lookup that knows only ``config``'s stream."""
    return lambda name: config if name == config.name else None
