"""Writes waiting for their commit: called back as the high watermark passes their last offset.

Kept in a heap by offset, so each advance of the high watermark settles the
waiters it passed in order and touches no other.  Not thread-safe: the
partition calls it under its lock, and the callbacks run there, so they must
only hand the news on (see ``Partition.when_committed``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable

from pyspark_jetstream.protocol.errors import JetStreamError

logger = logging.getLogger(__name__)

Committed = Callable[[JetStreamError | None], None]
"""Called once with ``None`` when an offset is committed, or with the error that ended the wait."""


class CommitWaiters:
    """Callbacks waiting for offsets to be committed (see the module docstring)."""

    def __init__(self) -> None:
        self._waiting: list[tuple[int, int, Committed]] = []
        self._order = itertools.count()

    def add(self, last_offset: int, callback: Committed) -> None:
        """Call ``callback`` once the high watermark passes ``last_offset``."""
        heapq.heappush(self._waiting, (last_offset, next(self._order), callback))

    def due(self, high_watermark: int) -> bool:
        """Whether a waiter's offset is below ``high_watermark``."""
        return bool(self._waiting) and self._waiting[0][0] < high_watermark

    def settle(self, high_watermark: int, error: JetStreamError | None) -> None:
        """Call back every waiter below ``high_watermark`` with ``error`` (``None``: committed)."""
        while self._waiting and self._waiting[0][0] < high_watermark:
            _, _, callback = heapq.heappop(self._waiting)
            _call(callback, error)

    def fail(self, error: JetStreamError) -> None:
        """Call back every waiter with ``error`` (leadership lost, closing)."""
        waiting, self._waiting = self._waiting, []
        for _, _, callback in waiting:
            _call(callback, error)


def _call(callback: Committed, error: JetStreamError | None) -> None:
    try:
        callback(error)
    except Exception:
        logger.exception("a commit callback failed")
