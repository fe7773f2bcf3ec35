"""Resending idempotent publishes that a leadership change lost.

A published message reaches a partition only through the leader's NATS
subscription.  When the leader dies, what was in flight to it (and what is
published before the new leader subscribes) is lost without a word; with
acks awaited, each would end as a timeout, and an idempotent producer's next
messages would then be refused as out of order.

Messages the broker de-duplicates -- an idempotent producer's (producer id
and sequence) or one with a message id -- are safe to send again, so the
client keeps their payloads until acked and resends them itself, in the
order first sent, within each message's own ack timeout:

* when a partition has messages unacked for longer than ``check`` seconds
  (a stall), the client reads the partition's leader epoch; if it moved past
  the epoch a message was sent in, the leadership changed under it: every
  pending message of that partition is sent again;
* a message refused as out of order while an earlier sequence of the same
  producer is still pending here, or refused by a broker that no longer
  leads, is not an answer yet: it waits for the resend of the ones before it;
* so is one refused for want of in-sync replicas (``not_enough_replicas``:
  a follower fell behind or died, and may be back within the message's
  timeout, as Kafka's producer retries it); if the message's timeout comes
  first, that refusal is its answer, not a timeout;
* a message already resent is resent again after a growing pause while
  unacked (the new leader may have subscribed only after the resend); so
  is one held, never sooner, and only once its sender's messages on that
  partition have gone unanswered for as long: while answers come in, the
  leader is still working through the last resend, and sending it all
  again would only bury it (an overloaded leader once got four rounds of
  2,000 copies and answered nothing in time).  Resends must not flood a
  leader that is just taking over.

Others (a plain publish, no producer, no message id) are never resent: a
copy could be stored twice.  They time out as before, and their error says
so.  Each message still ends at its deadline: resending never extends it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.errors import ErrorCode, JetStreamError
from pyspark_jetstream.protocol.flight import StreamInfo

logger = logging.getLogger(__name__)

Sender = tuple[str, int, tuple[str, int] | None]
"""Whose messages on which partition: stream, partition and the producer (``None`` for messages
with ids)."""

CHECK = 0.25
"""Seconds a message may wait for its ack before its partition's leadership is checked."""
MAX_PAUSE = 2.0
"""The longest pause between two resends of the same message."""


@dataclass
class Pending:
    """A published message the broker de-duplicates, kept until its ack."""

    order: int
    """Send order (the correlation id's number)."""
    subject: str
    payload: bytes
    stream: str
    partition: int
    producer: tuple[str, int] | None
    """``(producer id, epoch)`` of an idempotent producer; ``None`` for a message id."""
    sequence: int
    epoch: int
    """The partition's leader epoch as known when the message was (last) sent; -1 if unknown."""
    sent: float
    pause: float = 0.0
    """Seconds before a resent message is resent again (0: never resent)."""
    held: bool = False
    """Refused for now (out of order behind a pending one, by a broker that no longer leads, or
    for want of in-sync replicas): waits for the next resend of its partition."""
    refusal: Ack | None = None
    """The last ``not_enough_replicas`` refusal held: the answer if the timeout comes first."""


class Resender:
    """Pending de-duplicated publishes of one client, and the task that resends them."""

    def __init__(
        self,
        describe: Callable[[str], Awaitable[StreamInfo]],
        publish: Callable[[str, bytes], Awaitable[None]],
        *,
        check: float = CHECK,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``describe(stream)`` reads a stream's partitions (leaders and epochs); ``publish``
        sends a payload on NATS; ``clock``: seconds, the event loop's time unless given."""
        self._clock = clock
        self._describe = describe
        self._publish = publish
        self._check = check
        self._pending: dict[str, Pending] = {}
        self._epochs: dict[tuple[str, int], int] = {}
        self._answered: dict[Sender, float] = {}
        """When a broker last answered a sender's message on a partition (the key: stream,
        partition and the producer, ``None`` for messages with ids), other than a refusal held."""
        self._task: asyncio.Task[None] | None = None
        self.resent = 0
        """Messages sent again so far."""

    def learn(self, info: StreamInfo) -> None:
        """Take the leader epochs of a described stream."""
        name = info.config["name"]
        for p in info.partitions:
            self._epochs[(name, p.partition)] = p.leader_epoch

    def track(
        self,
        correlation_id: str,
        subject: str,
        payload: bytes,
        *,
        stream: str,
        partition: int,
        producer: tuple[str, int] | None,
        sequence: int,
    ) -> None:
        """Keep a message sent just now until :meth:`done` (the event loop's thread only)."""
        self._pending[correlation_id] = Pending(
            int(correlation_id),
            subject,
            payload,
            stream,
            partition,
            producer,
            sequence,
            self._epochs.get((stream, partition), -1),
            self._now(),
        )
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def done(self, correlation_id: str) -> None:
        """The message's wait ended (acked, timed out, failed): forget it."""
        self._pending.pop(correlation_id, None)
        if not self._pending:
            self._answered.clear()  # nothing waits: no sender's last answer matters any more

    def holds(self, ack: Ack) -> bool:
        """Whether ``ack`` is no answer yet for its tracked message, which waits for a resend: a
        refusal as out of order behind a sequence still pending here, or by a non-leader."""
        pending = self._pending.get(ack.correlation_id)
        if pending is None:
            return False
        if ack.error is ErrorCode.NOT_LEADER:
            pending.held = True
            return True
        if ack.error is ErrorCode.NOT_ENOUGH_REPLICAS:
            pending.held, pending.refusal = True, ack
            return True
        if ack.error is ErrorCode.OUT_OF_ORDER_SEQUENCE and pending.producer is not None:
            earlier = any(
                other.producer == pending.producer
                and (other.stream, other.partition) == (pending.stream, pending.partition)
                and other.sequence < pending.sequence
                for other in self._pending.values()
            )
            if earlier:
                pending.held = True
                return True
        self._answered[_sender(pending)] = self._now()
        return False

    def refusal(self, correlation_id: str) -> Ack | None:
        """The refusal a message held for a resend last got, if one was held for want of in-sync
        replicas (its answer when its timeout comes)."""
        pending = self._pending.get(correlation_id)
        return None if pending is None else pending.refusal

    def close(self) -> None:
        """Stop resending and forget everything."""
        if self._task is not None:
            self._task.cancel()
        self._pending.clear()
        self._answered.clear()

    async def _run(self) -> None:
        while self._pending:
            await asyncio.sleep(self._check)
            try:
                await self._resend_due(self._now())
            except asyncio.CancelledError:
                raise
            except Exception:  # a task that died would leave every later stall unhandled
                logger.exception("resending publishes failed; trying again")

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    async def _resend_due(self, now: float) -> None:
        """Resend the partitions whose pending messages a leadership change may have lost."""
        stalled: dict[tuple[str, int], list[Pending]] = {}
        for pending in self._pending.values():
            if now - pending.sent >= self._check or pending.held:
                stalled.setdefault((pending.stream, pending.partition), []).append(pending)
        if not stalled:
            return
        for stream in {s for s, _ in stalled}:
            try:
                self.learn(await self._describe(stream))
            except JetStreamError as exc:  # no broker answers now: the next check asks again
                logger.debug("cannot read the leadership of %s: %s", stream, exc)
        for key, messages in stalled.items():
            epoch = self._epochs.get(key, -1)
            if any(m.epoch < epoch for m in messages):  # the leadership moved: everything again
                await self._resend(key, epoch, now)
                continue
            # Resent before: again only after its pause, whatever refused it meanwhile (a burst
            # of resends must not feed on its own out-of-order refusals), and only once its
            # sender has had no answer for as long (see the module docstring).
            due = {
                _sender(m)
                for m in messages
                if (m.pause or m.held)
                and now - max(m.sent, self._answered.get(_sender(m), m.sent)) >= max(m.pause, self._check)
            }
            if due:
                await self._resend(key, epoch, now, due)

    async def _resend(
        self,
        key: tuple[str, int],
        epoch: int,
        now: float,
        senders: set[Sender] | None = None,
    ) -> None:
        """Send every pending message of partition ``key`` (of ``senders`` only, if given) again,
        in the order first sent."""
        messages = sorted(
            (
                p
                for p in self._pending.values()
                if (p.stream, p.partition) == key and (senders is None or _sender(p) in senders)
            ),
            key=lambda p: p.order,
        )
        if not messages:
            return  # acked while the leadership was being read
        reason = (
            "after a leadership change"
            if senders is None
            else "refused for a retry, or unanswered for their pause,"
        )
        logger.info(
            "%s/%d: resending %d unacknowledged message(s) %s (epoch %d) %s-%s",
            *key,
            len(messages),
            reason,
            epoch,
            messages[0].order,
            messages[-1].order,
        )
        for pending in messages:
            pending.epoch, pending.held, pending.sent = epoch, False, now
            pending.pause = min(max(pending.pause * 2, self._check * 2), MAX_PAUSE)
            await self._publish(pending.subject, pending.payload)
            self.resent += 1


def _sender(pending: Pending) -> Sender:
    """Whose messages on which partition ``pending`` is among (see ``Resender._answered``)."""
    return pending.stream, pending.partition, pending.producer
