"""The batcher: messages arriving one at a time, coalesced into one stored batch per flush.

A flush runs as soon as the subscription's queue is drained (with
``max_delay`` 0), after ``max_delay`` seconds otherwise, or at once when the
pending batch reaches ``max_batch_messages`` or ``max_batch_bytes``; a
message that would take the pending batch over ``max_batch_bytes`` flushes
it first, so every stored batch stays within the limit.  Order: batches are
stored in the order they were taken, and an envelope stored as its own batch
is stored after the pending ones (its caller flushes first), so the log keeps
arrival order.  The batcher also knows which message ids wait in a batch not
yet stored -- the pending one and those being stored -- so a message
repeating one is acked with the original rather than stored twice.  It
stores nothing itself: the flush it calls does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .port import BatchLimits
from .replies import AckTarget

logger = logging.getLogger(__name__)


class Queue(Protocol):
    """A subscription's queue of messages not yet handed over (``nats.aio.subscription.Subscription``)."""

    @property
    def pending_msgs(self) -> int: ...


class Batch:
    """Messages waiting to be stored as one batch, and what to ack once they are."""

    __slots__ = ("ids", "records", "repeats", "size", "targets")

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.targets: list[AckTarget | None] = []
        self.size = 0
        self.ids: dict[str, int] = {}
        """Message id -> index of the record that carries it."""
        self.repeats: list[tuple[int, AckTarget]] = []
        """Messages repeating an id of this batch: the original's index, and where to ack."""


class Batcher:
    """One partition's pending batch, the batches being stored, and when to flush."""

    def __init__(
        self,
        limits: BatchLimits,
        flush: Callable[[], Awaitable[None]],
        name: str,
        fields: dict[str, object],
    ) -> None:
        """``flush`` stores what :meth:`take` gives; ``name`` and ``fields`` label the log line of
        a failed timed flush."""
        self.limits = limits
        self.queue: Queue | None = None
        """The subscription the messages come from: with ``max_delay`` 0, a flush runs as soon
        as its queue is drained (none yet: a loop iteration later)."""
        self.pending = Batch()
        self.storing: list[Batch] = []
        """Batches being appended: the partition remembers their ids only once the append is done."""
        self._flush = flush
        self._name = name
        self._fields = fields
        self._timer: asyncio.Task[None] | None = None

    def overflows(self, size: int) -> bool:
        """Whether a message of ``size`` bytes would take the pending batch over ``max_batch_bytes``
        (then flush first)."""
        pending = self.pending
        return bool(pending.records) and pending.size + size > self.limits.max_batch_bytes

    def waiting(self, message_id: str) -> tuple[Batch, int] | None:
        """The batch not yet stored that carries ``message_id``, and the index of its record."""
        for batch in (self.pending, *self.storing):
            index = batch.ids.get(message_id)
            if index is not None:
                return batch, index
        return None

    def add(self, record: Any, size: int, target: AckTarget | None, message_id: str | None) -> bool:
        """Add a message to the pending batch; return whether to flush now (else a flush is timed)."""
        batch = self.pending
        if message_id is not None:
            batch.ids[message_id] = len(batch.records)
        batch.records.append(record)
        batch.targets.append(target)
        batch.size += size
        limits = self.limits
        if len(batch.records) >= limits.max_batch_messages or batch.size >= limits.max_batch_bytes:
            return True
        # Nothing else queued to coalesce with: store now rather than a loop iteration later.
        if limits.max_delay == 0 and (queue := self.queue) is not None and not queue.pending_msgs:
            return True
        if self._timer is None:
            self._timer = asyncio.ensure_future(self._flush_soon())
        return False

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self.limits.max_delay)  # 0: just let the queue drain first
        self._timer = None
        try:
            await self._flush()
        except Exception:
            logger.exception("flushing %s failed", self._name, extra=self._fields)

    def take(self) -> Batch | None:
        """The pending batch, now being stored (``None`` if empty); a new one is pending."""
        batch = self.pending
        if not batch.records:
            return None
        self.pending = Batch()
        self.storing.append(batch)
        return batch

    def hold(self, ids: list[tuple[str, int]]) -> Batch:
        """A batch stored on its own, being stored: a message repeating one of its ``ids``
        (``(id, row)``) meanwhile waits for it, as it would for a coalesced batch."""
        batch = Batch()
        for message_id, row in ids:
            batch.ids.setdefault(message_id, row)
        self.storing.append(batch)
        return batch

    def stored(self, batch: Batch) -> None:
        """``batch`` (from :meth:`take` or :meth:`hold`) is appended, or failed: the partition knows
        its ids from now on."""
        self.storing.remove(batch)

    def close(self) -> None:
        """Cancel the timed flush (the caller flushes what is pending)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
