"""Acks: building them and sending them, now or once committed, each one timed.

Every message gets its own ack.  ``LEADER`` is acked once the leader stored
the message; ``ALL`` once it is committed (the high watermark passed it:
every in-sync replica has it) -- or, if the commit fails, with that error.
Refusals are sent at once.  The acks of one flush for one inbox travel
together in one NATS message; a plain NATS request is answered alone, in
JetStream's publish-ack format (the grouping and the payloads are
:mod:`.replies`).  A message repeating a stored id is acked as a duplicate
with the original's offset.  Every ack sent is timed in the stream's
:class:`~.latency.LatencyHistogram`; one that cannot be sent (no connection)
is lost, and the producer's timeout tells it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from time import perf_counter

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError

from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.errors import ErrorCode, JetStreamError

from .latency import LatencyHistogram
from .port import IngestPartition, Refusal
from .replies import AckTarget, Outgoing, grouped, single

logger = logging.getLogger(__name__)


class Acks:
    """One partition's acks: built with its stream and number, sent on the broker's connection."""

    def __init__(
        self,
        nc: NatsClient,
        partition: IngestPartition,
        latency: LatencyHistogram,
        name: str,
        fields: dict[str, object],
    ) -> None:
        self.nc = nc
        """The connection acks are sent on (replaced when the broker reopens it)."""
        self.partition = partition
        self.stream = partition.config.name
        self.number = partition.number
        self.latency = latency
        self._name = name
        self._fields = fields

    def of(self, outcome: int | Refusal, correlation_id: str) -> Ack:
        """The ack of a message stored at ``outcome``, or refused with it."""
        if isinstance(outcome, int):
            return Ack(self.stream, self.number, outcome, outcome, correlation_id)
        error, message = outcome
        return Ack(self.stream, self.number, -1, -1, correlation_id, error, message)

    def duplicate(self, offset: int, correlation_id: str) -> Ack:
        """The ack of a message repeating the id of the one stored at ``offset``."""
        return Ack(self.stream, self.number, offset, offset, correlation_id, ErrorCode.DUPLICATE)

    async def refuse(
        self,
        target: AckTarget | None,
        error: ErrorCode,
        message: str,
        jetstream_error: tuple[int, int] | None = None,
    ) -> None:
        """Send a refusal (``error``) to ``target``, if there is one."""
        if target is None:
            return
        ack = Ack(self.stream, self.number, -1, -1, target.correlation_id, error, message)
        await self.send(target.subject, single(target, ack, jetstream_error), (target.received,))

    async def deliver(self, target: AckTarget, ack: Ack) -> None:
        """Send one message's ack: now, or once its offset is committed (``ALL``, not refused)."""
        if target.committed and ack.ok:
            self.when_committed(ack.last_offset, grouped([(target, ack)]))
        else:
            await self.send(target.subject, single(target, ack), (target.received,))

    async def reply(self, replies: list[tuple[AckTarget, Ack]]) -> None:
        """Send a flush's acks: ``LEADER`` ones and refusals now, ``ALL`` ones once committed."""
        now = [(t, a) for t, a in replies if not (t.committed and a.ok)]
        later = [(t, a) for t, a in replies if t.committed and a.ok]
        # One NATS message per ack inbox per flush: a producer pipelining many
        # messages gets their acks together.
        for outgoing in grouped(now):
            await self.send(outgoing.subject, outgoing.payload(), outgoing.received)
        if later:
            self.when_committed(max(a.last_offset for _, a in later), grouped(later))

    async def reply_now(self, replies: list[tuple[AckTarget, Ack]]) -> None:
        """Send acks now whatever their targets asked: acks of messages stored elsewhere (a dead-letter
        stream), already as committed there as they asked."""
        for outgoing in grouped(replies):
            await self.send(outgoing.subject, outgoing.payload(), outgoing.received)

    def when_committed(self, last_offset: int, outgoing: list[Outgoing]) -> None:
        """Send ``outgoing`` once ``last_offset`` is committed, or their error if that fails."""

        async def send(error: JetStreamError | None) -> None:
            for message in outgoing:
                await self.send(message.subject, message.payload(error), message.received)

        on_loop_when_committed(self.partition, last_offset, lambda error: asyncio.ensure_future(send(error)))

    async def send(self, subject: str, payload: bytes, received: Sequence[float]) -> None:
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


def on_loop_when_committed(
    partition: IngestPartition, offset: int, then: Callable[[JetStreamError | None], object]
) -> None:
    """Call ``then`` on the running event loop once ``offset`` is committed (``None``), or with the
    error if that fails; the partition settles commits on the loop (a follower's acknowledgement)
    or from other threads, and the call is handed over only in the second case.  Nothing is called
    if the loop is gone by then (the broker stopped)."""
    loop = asyncio.get_running_loop()

    def committed(error: JetStreamError | None) -> None:
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:  # the commit was learned on the loop itself (a follower's acknowledgement)
            loop.call_soon(then, error)
            return
        with contextlib.suppress(RuntimeError):  # the loop is gone: the broker stopped
            loop.call_soon_threadsafe(then, error)

    partition.when_committed(offset, committed)


def rows_ack(
    acks: Acks,
    stored: range,
    duplicates: tuple[tuple[int, int], ...],
    correlation_id: str,
) -> Ack:
    """The ack of an envelope batch whose rows repeating a message id were left out: its stored
    offsets (``stored``; empty: every row repeated one), and each repeating row with the offset
    it repeated (see :mod:`pyspark_jetstream.protocol.ack`)."""
    if stored:
        return Ack(acks.stream, acks.number, stored.start, stored[-1], correlation_id, duplicates=duplicates)
    offsets = [offset for _, offset in duplicates]
    return Ack(
        acks.stream,
        acks.number,
        min(offsets),
        max(offsets),
        correlation_id,
        ErrorCode.DUPLICATE,
        duplicates=duplicates,
    )
