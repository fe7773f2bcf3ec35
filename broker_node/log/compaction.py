"""Key compaction: which rows of a segment survive, and the file log's pass over its segments.

Pure functions over Arrow batches in the log schema (both logs use them); the
log decides which segments to compact, and :class:`SegmentCompaction` rewrites
them, or waits while damage hides which keys have newer values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from .damage import DamagedRange
from .errors import CorruptSegmentError
from .segment import Segment


def latest_offsets(batches: Iterable[pa.RecordBatch]) -> pa.Array:
    """The offset of the newest message of every non-null key in ``batches``."""
    tables = [pa.table({"key": b.column(3), "offset": b.column(0)}) for b in batches]
    if not tables:
        return pa.array([], pa.int64())
    table = pa.concat_tables(tables)
    keyed = table.filter(pc.is_valid(table.column("key")))
    # One thread: Arrow's own pool would start threads the broker keeps for good.
    newest = keyed.group_by("key", use_threads=False).aggregate([("offset", "max")])
    return newest.column("offset_max").combine_chunks()


def compact_batches(
    batches: Iterable[pa.RecordBatch], latest: pa.Array, tombstone_horizon_us: int
) -> tuple[list[pa.RecordBatch], int]:
    """Filter ``batches`` down to what compaction keeps; return them and the count removed.

    Kept: every message without a key, and the newest message of each key
    (its offset is in ``latest``) unless it is a tombstone (null value)
    written before ``tombstone_horizon_us``.  Offsets are preserved, so the
    result has gaps.  Neighbouring survivors of the same leader epoch are
    merged into one batch, so a compacted segment is not a trail of tiny
    frames.
    """
    kept: list[pa.RecordBatch] = []
    removed = 0
    for batch in batches:
        newest = pc.is_in(batch.column(0), value_set=latest)
        expired_tombstone = pc.and_(
            pc.is_null(batch.column(4)),
            pc.less(batch.column(1).cast(pa.int64()), tombstone_horizon_us),
        )
        keep = pc.or_(pc.is_null(batch.column(3)), pc.and_(newest, pc.invert(expired_tombstone)))
        survivors = batch.filter(keep)
        removed += batch.num_rows - survivors.num_rows
        if survivors.num_rows:
            kept.append(survivors)
    return _merge_same_epoch(kept), removed


def _merge_same_epoch(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    merged: list[pa.RecordBatch] = []
    run: list[pa.RecordBatch] = []
    for batch in batches:
        if run and batch.column(2)[0] != run[0].column(2)[0]:
            merged.append(pa.concat_batches(run))
            run = []
        run.append(batch)
    if run:
        merged.append(pa.concat_batches(run))
    return merged


class Compacted(NamedTuple):
    """What a compaction pass did."""

    removed: int
    """Messages removed."""
    rewritten: int
    """Segments rewritten."""


class SegmentCompaction:
    """A file log's compaction passes over its closed segments, and the damage they wait for."""

    def __init__(self, directory: Path, log: logging.LoggerAdapter[logging.Logger]) -> None:
        self._directory = directory
        self._log = log
        self._blocked = ""
        """The damage compaction last waited for (logged once, not on every pass)."""

    def run(
        self,
        closed: Sequence[Segment],
        damaged: Sequence[DamagedRange],
        committed: Callable[[], list[pa.RecordBatch]],
        tombstone_horizon: Callable[[], int],
        compression: str,
    ) -> Compacted | None:
        """Compact ``closed`` (see ``Log.compact``); messages removed and segments rewritten, or
        ``None`` while committed offsets are ``damaged`` or ``committed()`` (every batch below
        the high watermark) finds damage.  ``tombstone_horizon()``: the timestamp (µs) before
        which a key's newest tombstone goes too."""
        # Damage hides which keys have newer values (a lost tombstone would let
        # an older value come back): compact only a log that reads whole.
        try:
            if damaged:
                raise CorruptSegmentError(*damaged[0])
            # Newest per key among committed messages only: an uncommitted newer value
            # may yet be truncated away by replication.
            batches = committed()
        except CorruptSegmentError as exc:
            if str(exc) != self._blocked:  # once per damage, not every pass
                self._log.warning("not compacting %s until its damage is repaired: %s", self._directory, exc)
                self._blocked = str(exc)
            return None
        self._blocked = ""
        latest = latest_offsets(batches)
        horizon = tombstone_horizon()
        removed = rewritten = 0
        for segment in closed:
            kept, gone = compact_batches(
                (segment.batch(i) for i in range(len(segment.index))), latest, horizon
            )
            if gone:
                segment.rewrite(kept, compression)
                removed += gone
                rewritten += 1
        return Compacted(removed, rewritten)
