"""A micro-batch's Spark tasks: a small one is one task, whose ranges are fetched side by side.

Each Spark task of a Python data source costs a fixed amount on top of its
rows: the JVM hands it to a Python worker, which unpickles the reader and
sends its rows back.  A micro-batch of a few thousand rows over many
partitions -- the usual one of a query that keeps up -- spent more on that
than on its rows.  So a micro-batch of at most :data:`SMALL_BATCH_ROWS`
offsets (and at most ``maxRecordsPerPartition``) is planned as one task
that reads every range of it, the first read of each asked for at once
(Flight calls wait in threads, side by side); a bigger one keeps a task per
range (long ranges split by ``maxRecordsPerPartition``), so that every core
works.  ``minPartitions`` asks for its number of tasks whatever the size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future

import pyarrow as pa

from pyspark_jetstream.client.connection import FetchResult

from .options import SourceOptions
from .range_reads import RangeSpec, ReadSettings, read_range, start_read

SMALL_BATCH_ROWS = 20_000
"""Offsets of a micro-batch read by one task (more: a task per range)."""


def group_ranges(ranges: Sequence[RangeSpec], options: SourceOptions) -> list[tuple[RangeSpec, ...]]:
    """The tasks of a micro-batch (or a batch read) of ``ranges``: each task's ranges."""
    rows = sum(r.end - r.start for r in ranges)
    if not ranges:
        return []
    if options.min_partitions or rows > min(SMALL_BATCH_ROWS, options.max_records_per_partition):
        return [(r,) for r in ranges]
    return [tuple(ranges)]


def read_ranges(
    specs: Sequence[RangeSpec], target: pa.Schema, settings: ReadSettings
) -> Iterator[pa.RecordBatch]:
    """One task's ranges, one after the other (see :func:`.reading.read_range`); with several, the
    first read of each is asked for at once."""
    firsts: list[Future[FetchResult] | None] = [None] * len(specs)
    if len(specs) > 1:
        firsts = [start_read(spec, target, settings) for spec in specs]
    try:
        for spec, first in zip(specs, firsts, strict=True):
            yield from read_range(spec, target, settings, first)
    finally:
        for pending in firsts:  # the task ended early: reads not started yet are not needed
            if pending is not None:
                pending.cancel()
