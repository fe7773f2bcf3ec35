"""A broker's replication throttle: the bytes/s its reassignment fetches may take together.

Fetchers of partitions being moved onto this broker report what they
received; each is then held back until the bytes all of them received fit
the rate (a virtual clock: every report reserves ``bytes / rate`` seconds
after the previous reservation).  The rate comes with each report, from the
partition's state, so a changed throttle applies at the next fetch.
"""

from __future__ import annotations

import threading
import time

MIN_CHUNK = 64 * 1024
"""Smallest fetch a throttled follower asks for (bytes)."""


class Throttle:
    """Shared by every fetcher of one broker (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free_at = 0.0

    def delay(self, received: int, rate: int) -> float:
        """Seconds to wait after receiving ``received`` bytes under ``rate`` bytes/s (0: no limit)."""
        if rate <= 0 or received <= 0:
            return 0.0
        with self._lock:
            now = time.monotonic()
            self._free_at = max(self._free_at, now) + received / rate
            return self._free_at - now

    @staticmethod
    def chunk(rate: int, max_bytes: int) -> int:
        """How much one throttled fetch asks for: about a quarter second's worth."""
        return max_bytes if rate <= 0 else min(max_bytes, max(rate // 4, MIN_CHUNK))
