"""A broker's replication throttle: the bytes/s its reassignment fetches may take together.

Fetchers of partitions being moved onto this broker (and not yet in sync)
report what they received; the bytes all of them received drain at the
rate, and each fetcher waits until what is left fits a quarter second's
worth before it fetches again.  The rate is read again at every turn of
that wait, from the partition's state: a changed throttle applies at once,
and a partition no longer throttled (its move done or cancelled, or in sync)
stops waiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MIN_CHUNK = 64 * 1024
"""Smallest fetch a throttled follower asks for (bytes)."""
SLICE = 0.25
"""Longest wait (seconds) before the rate is read again."""


class Throttle:
    """Shared by every fetcher of one broker (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._owed = 0.0
        """Bytes received that the rate has not paid off yet."""
        self._at = clock()

    def add(self, received: int, rate: int) -> None:
        """``received`` bytes arrived for a fetcher throttled at ``rate`` bytes/s."""
        with self._lock:
            self._drain(rate)
            self._owed += received

    def delay(self, rate: int) -> float:
        """Seconds to wait before the next fetch under ``rate`` (0 when none, or no limit)."""
        if rate <= 0:
            return 0.0
        with self._lock:
            self._drain(rate)
            return max(self._owed - rate * SLICE, 0.0) / rate

    def wait(self, rate: Callable[[], int], stopped: threading.Event) -> None:
        """Block while the bytes owed exceed a quarter second at ``rate()`` (read at every turn)."""
        while (pause := self.delay(rate())) > 0:
            if stopped.wait(min(pause, SLICE)):
                return

    def _drain(self, rate: int) -> None:
        now = self._clock()
        if rate > 0:
            self._owed = max(self._owed - rate * (now - self._at), 0.0)
        self._at = now

    @staticmethod
    def chunk(rate: int, max_bytes: int) -> int:
        """How much one throttled fetch asks for: about a quarter second's worth."""
        return max_bytes if rate <= 0 else min(max_bytes, max(int(rate * SLICE), MIN_CHUNK))
