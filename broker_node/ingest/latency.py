"""Ack latency: how long the broker takes to answer a publish, as histogram counts.

Measured from the moment a partition's subscription hands the broker a
message (the NATS client's own queue before that is not counted) to the
moment the broker publishes the ack, refusals included; an ``ALL`` ack waits
for the in-sync replicas in between.  The counts are kept by hand in fixed
buckets rather than in a ``prometheus_client.Histogram``: the event loop
is the only writer, so an observation is a bisect and two additions, with no
lock; ``/metrics`` reads :meth:`LatencyHistogram.snapshot` at scrape time.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds) of the buckets; one more, unbounded, follows them."""


class LatencyHistogram:
    """Observations counted per bucket of :data:`BUCKETS`, and their sum.

    Written from one thread only (the broker's event loop), read from any:
    a snapshot copies the counts in one step, so its buckets and its count
    agree; its sum may lack an observation made meanwhile.
    """

    __slots__ = ("_counts", "_sum")

    def __init__(self) -> None:
        self._counts = [0] * (len(BUCKETS) + 1)
        self._sum = 0.0

    def observe_since(self, starts: Iterable[float], now: float) -> None:
        """Count one observation of ``now - start`` seconds for each of ``starts``."""
        counts = self._counts
        for start in starts:
            elapsed = now - start
            counts[bisect.bisect_left(BUCKETS, elapsed)] += 1  # le semantics: a bound counts in its bucket
            self._sum += elapsed

    def snapshot(self) -> tuple[list[tuple[float, int]], float]:
        """Cumulative counts per upper bound (``inf`` last, equal to the number of observations)
        and the sum of the observations."""
        counts = list(self._counts)
        total = self._sum
        cumulative, running = [], 0
        for bound, count in zip((*BUCKETS, float("inf")), counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return cumulative, total
