"""Damaged ranges of a log, and their repair from another replica's copy.

Which replacement fills which hole is decided by a pure function
(:func:`place`); the segments are then rewritten crash-safely
(``Segment.rewrite``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_jetstream.protocol.schema import LOG_SCHEMA

from .errors import InvalidRecordsError, LogStorageError
from .frames import decode

if TYPE_CHECKING:
    from .segment import Segment


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


def damaged_ranges(segments: Sequence[Segment]) -> list[DamagedRange]:
    """Every damaged range known in ``segments``, in offset order."""
    return [
        DamagedRange(str(s.path), s.index.bases[i], s.index.lasts[i], detail)
        for s in segments
        for i, detail in sorted(s.damage.items())
    ]


def repair_segments(
    segments: Sequence[Segment], batches: Sequence[pa.RecordBatch | pa.Buffer], compression: str
) -> list[DamagedRange]:
    """Fill damaged ranges of ``segments`` with ``batches``; return the ranges repaired (see ``Log.repair``).

    Everything is checked and every batch that stays is read before the
    first segment is rewritten, so a refusal changes nothing.
    """
    holes = [
        Hole(s.base_offset, i, s.index.bases[i], s.index.lasts[i], s.index.counts[i] or None)
        for s in segments
        for i in sorted(s.damage)
    ]
    placed = place(holes, batches)
    by_base = {s.base_offset: s for s in segments}
    rewrites: list[tuple[Segment, list[pa.RecordBatch | pa.Buffer]]] = []
    for base in sorted({hole.segment_base for hole in placed}):
        segment = by_base[base]
        missed = [h for h in holes if h.segment_base == base and h not in placed]
        if missed:
            raise InvalidRecordsError(
                f"{segment.path} also has damaged offsets {_ranges(missed)}: repair all of a "
                "segment's damaged ranges in one call"
            )
        fills = {h.batch: placed[h] for h in placed if h.segment_base == base}
        replacement: list[pa.RecordBatch | pa.Buffer] = []
        for i in range(len(segment.index)):
            # Reading a batch that was never read may find more damage: CorruptSegmentError.
            # The others stay as stored (a typed batch's frame keeps its typed columns).
            replacement.extend(fills[i] if i in fills else [segment.frame(i)])
        rewrites.append((segment, replacement))
    repaired = sorted(
        DamagedRange(
            str(by_base[h.segment_base].path), h.first, h.last, by_base[h.segment_base].damage[h.batch]
        )
        for h in placed
    )
    for segment, replacement in rewrites:
        try:
            segment.rewrite(replacement, compression)
        except OSError as exc:
            raise LogStorageError(f"cannot rewrite {segment.path} to repair it: {exc}") from exc
    return repaired


def place(
    holes: Sequence[Hole], batches: Sequence[pa.RecordBatch | pa.Buffer]
) -> dict[Hole, list[pa.RecordBatch | pa.Buffer]]:
    """Assign each replacement batch to the hole it fills; raise ``InvalidRecordsError`` if one does not fit.

    A replacement is a record batch, or a stored frame (a ``pyarrow.Buffer``, as a replica's
    ``read_frames`` gives it: written as it is, a typed batch's typed columns with it).

    Every replacement batch must be in the log schema, non-empty, with
    strictly increasing offsets (also across batches) and one leader epoch,
    and lie wholly inside one hole.  A hole whose batch's index entry is
    known must be filled exactly: the same first and last offsets and row
    count.  A lost stretch (its content unknown) takes any such batches
    within its range.
    """
    if not batches:
        raise InvalidRecordsError("repair needs the batches that replace a damaged range; none were given")
    placed: dict[Hole, list[pa.RecordBatch | pa.Buffer]] = {}
    decoded: dict[int, pa.RecordBatch] = {}
    previous_last: int | None = None
    for batch in batches:
        first, last = _check_batch(_decoded(batch, decoded))
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
        shown = [_decoded(b, decoded) for b in filling]
        first, last = shown[0].column(0)[0].as_py(), shown[-1].column(0)[-1].as_py()
        rows = sum(b.num_rows for b in shown)
        if (first, last, rows) != (hole.first, hole.last, hole.rows):
            raise InvalidRecordsError(
                f"the repair of damaged offsets {hole.first} to {hole.last} holds offsets {first} to "
                f"{last} in {rows} rows; it must hold exactly the lost batch: offsets {hole.first} to "
                f"{hole.last} in {hole.rows} rows"
            )
    return placed


def _decoded(item: pa.RecordBatch | pa.Buffer, decoded: dict[int, pa.RecordBatch]) -> pa.RecordBatch:
    """``item``'s batch: itself, or the batch its frame holds (decoded once)."""
    if not isinstance(item, pa.Buffer):
        return item
    if id(item) not in decoded:
        try:
            decoded[id(item)] = decode(item)
        except (pa.ArrowException, ValueError) as exc:
            raise InvalidRecordsError(f"a repair frame of {item.size} bytes does not decode: {exc}") from None
    return decoded[id(item)]


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
