"""Repairing damaged batches from another replica's copy: which replacement fills which hole.

Pure functions over Arrow batches; the log checks with them, then rewrites the
segments crash-safely (``Segment.rewrite``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_jetstream.protocol.schema import LOG_SCHEMA

from .errors import InvalidRecordsError


class DamagedRange(NamedTuple):
    """Offsets that cannot be read, as ``Log.damaged`` lists them."""

    path: str
    """The segment file (which may be missing)."""
    first_offset: int
    last_offset: int
    detail: str
    """What was found wrong."""


class Hole(NamedTuple):
    """One damaged batch (or stretch of lost offsets) of one segment."""

    segment_base: int
    batch: int
    """The damaged entry's number in the segment's index."""
    first: int
    last: int
    rows: int | None
    """Rows the lost batch held, when its index entry says (``None`` for lost stretches)."""


def place(holes: Sequence[Hole], batches: Sequence[pa.RecordBatch]) -> dict[Hole, list[pa.RecordBatch]]:
    """Assign each replacement batch to the hole it fills; raise ``InvalidRecordsError`` if one does not fit.

    Every replacement batch must be in the log schema, non-empty, with
    strictly increasing offsets (also across batches) and one leader epoch,
    and lie wholly inside one hole.  A hole whose batch's index entry is
    known must be filled exactly: the same first and last offsets and row
    count.  A lost stretch (its content unknown) takes any such batches
    within its range.
    """
    if not batches:
        raise InvalidRecordsError("repair needs the batches that replace a damaged range; none were given")
    placed: dict[Hole, list[pa.RecordBatch]] = {}
    previous_last: int | None = None
    for batch in batches:
        first, last = _check_batch(batch)
        if previous_last is not None and first <= previous_last:
            raise InvalidRecordsError(
                f"repair batches must hold increasing offsets; offset {first} follows {previous_last}"
            )
        previous_last = last
        hole = next((h for h in holes if h.first <= first and last <= h.last), None)
        if hole is None:
            raise InvalidRecordsError(
                f"a repair batch holds offsets {first} to {last}, which are not within one damaged "
                f"range (damaged: {_ranges(holes)})"
            )
        placed.setdefault(hole, []).append(batch)
    for hole, filling in placed.items():
        if hole.rows is None:
            continue
        first, last = filling[0].column(0)[0].as_py(), filling[-1].column(0)[-1].as_py()
        rows = sum(b.num_rows for b in filling)
        if (first, last, rows) != (hole.first, hole.last, hole.rows):
            raise InvalidRecordsError(
                f"the repair of damaged offsets {hole.first} to {hole.last} holds offsets {first} to "
                f"{last} in {rows} rows; it must hold exactly the lost batch: offsets {hole.first} to "
                f"{hole.last} in {hole.rows} rows"
            )
    return placed


def _check_batch(batch: pa.RecordBatch) -> tuple[int, int]:
    if not isinstance(batch, pa.RecordBatch) or not batch.schema.equals(LOG_SCHEMA):
        raise InvalidRecordsError("repair batches must be record batches in the log schema, as reads return")
    offsets = batch.column(0)
    if batch.num_rows == 0 or offsets.null_count:
        raise InvalidRecordsError("repair batches must hold at least one row, each with an offset")
    if (
        batch.num_rows > 1
        and not pc.all(pc.greater(offsets.slice(1), offsets.slice(0, len(offsets) - 1))).as_py()
    ):
        raise InvalidRecordsError("a repair batch's offsets must increase strictly")
    epochs = batch.column(2)
    if epochs.null_count or pc.count_distinct(epochs).as_py() != 1:
        raise InvalidRecordsError("every row of a repair batch must have the same leader epoch")
    return offsets[0].as_py(), offsets[-1].as_py()


def _ranges(holes: Sequence[Hole]) -> str:
    return ", ".join(f"{h.first} to {h.last}" for h in holes) or "none"
