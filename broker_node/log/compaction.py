"""Key compaction: which rows of a segment survive.

Pure functions over Arrow batches in the log schema; the log decides which
segments to compact and rewrites them.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc


def latest_offsets(batches: Iterable[pa.RecordBatch]) -> pa.Array:
    """The offset of the newest message of every non-null key in ``batches``."""
    tables = [pa.table({"key": b.column(3), "offset": b.column(0)}) for b in batches]
    if not tables:
        return pa.array([], pa.int64())
    table = pa.concat_tables(tables)
    keyed = table.filter(pc.is_valid(table.column("key")))
    newest = keyed.group_by("key").aggregate([("offset", "max")])
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
