"""Reading a log's segments: batches for consumers, stored frames for replicas.

Both walk the segments from an offset up to an end offset (exclusive) and
stop at a byte budget, but always return at least one batch when any data is
in range.  A damaged batch ends a read that found batches before it; a read
that starts at it raises ``CorruptSegmentError``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_jetstream.protocol.typed_values import TypedValues

from .errors import CorruptSegmentError
from .index import SegmentIndex
from .typed_frames import sliced_frame, typed_of


class ReplicaFrame(NamedTuple):
    """A stored batch as it is on disk, for a replica: its bytes and what they hold."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    data: pa.Buffer


class TypedRead(NamedTuple):
    """A batch read for a consumer, and the typed columns stored with its rows (``None`` for a
    batch stored without: written before its stream was typed, or untyped)."""

    batch: pa.RecordBatch
    typed: TypedValues | None


class StoredBatches(Protocol):
    """What the reads need of a run of stored batches: a file :class:`~.segment.Segment`, or the
    memory-backed log's one in-memory run (:mod:`.memory`)."""

    @property
    def index(self) -> SegmentIndex:
        """One entry per stored batch, in offset order."""

    def find(self, offset: int) -> int:
        """Index of the first batch whose last offset is >= ``offset`` (may be ``len``)."""

    def batch(self, i: int) -> pa.RecordBatch:
        """Batch ``i``, checked; ``CorruptSegmentError`` if it is damaged."""

    def frame(self, i: int) -> pa.Buffer:
        """The stored bytes of batch ``i``, checked as :meth:`batch` checks them."""


def read_batches(
    segments: Sequence[StoredBatches],
    bases: Sequence[int],
    offset: int,
    end: int,
    *,
    max_records: int | None,
    max_bytes: int | None,
    partial: bool = True,
    frames: list[tuple[pa.Buffer, int]] | None = None,
) -> list[pa.RecordBatch]:
    """Batches (zero-copy slices) from ``offset`` to before ``end``; see ``Log.read``.

    With ``partial``, damage ends a read that has found batches.  With ``frames``, each batch's
    stored frame and the row of it the batch starts at are appended there.
    """
    out: list[pa.RecordBatch] = []
    rows = 0
    stored_bytes = 0
    for segment in segments[bisect.bisect_right(bases, offset) - 1 :]:
        index = segment.index
        for i in range(segment.find(offset), len(index)):
            if index.bases[i] >= end:
                return out
            if out and max_bytes is not None and stored_bytes + index.sizes[i] > max_bytes:
                return out
            # The check above spares decompressing a batch that is over the
            # limit by its stored size already; this one counts its size in memory.
            try:
                batch = segment.batch(i)
            except CorruptSegmentError:
                if out and partial:
                    return out  # the next read, starting at the damage, raises
                raise
            size = max(index.sizes[i], batch.nbytes)  # larger if it was stored compressed
            if out and max_bytes is not None and stored_bytes + size > max_bytes:
                return out
            gapless = index.counts[i] == index.lasts[i] - index.bases[i] + 1
            lo = row_of(batch, offset, index.bases[i], gapless)
            hi = row_of(batch, end, index.bases[i], gapless) if index.lasts[i] >= end else batch.num_rows
            if max_records is not None:
                hi = min(hi, lo + max_records - rows)
            if hi > lo:
                out.append(batch.slice(lo, hi - lo))
                rows += hi - lo
                if frames is not None:
                    frames.append((segment.frame(i), lo))
            stored_bytes += size
            if max_records is not None and rows >= max_records:
                return out
            offset = index.lasts[i] + 1
    return out


def with_typed(batches: list[pa.RecordBatch], frames: list[tuple[pa.Buffer, int]]) -> list[TypedRead]:
    """Each batch of a :func:`read_batches` with ``frames``, and the same rows of its frame's typed
    columns.  ``CorruptSegmentError``-free: the frames were checked when their batches were read;
    typed columns that do not decode raise ``ValueError``."""
    out = []
    for batch, (frame, lo) in zip(batches, frames, strict=True):
        typed = typed_of(frame)
        if typed is not None and (lo or typed.batch.num_rows != batch.num_rows):
            typed = TypedValues(typed.version, typed.batch.slice(lo, batch.num_rows))
        out.append(TypedRead(batch, typed))
    return out


def read_frames(
    segments: Sequence[StoredBatches],
    bases: Sequence[int],
    offset: int,
    end: int,
    *,
    max_bytes: int | None,
    compression: str,
) -> list[ReplicaFrame]:
    """Stored frames from ``offset`` to before ``end``, byte for byte as on disk.

    A batch that the range cuts (a fetch that starts inside one, after a
    truncation to an offset within it) is sliced and encoded afresh with
    ``compression``; every other batch travels as stored, its checksum intact.
    """
    out: list[ReplicaFrame] = []
    stored_bytes = 0
    for segment in segments[bisect.bisect_right(bases, offset) - 1 :]:
        index = segment.index
        for i in range(segment.find(offset), len(index)):
            base, last = index.bases[i], index.lasts[i]
            if base >= end:
                return out
            if out and max_bytes is not None and stored_bytes + index.sizes[i] > max_bytes:
                return out
            try:
                frame: ReplicaFrame | None
                if offset <= base and last < end:
                    frame = ReplicaFrame(base, last, index.epochs[i], segment.frame(i))
                else:
                    frame = _sliced(segment, i, offset, end, compression)
            except CorruptSegmentError:
                if out:
                    return out
                raise
            if frame is not None:
                out.append(frame)
                stored_bytes += frame.data.size
            offset = last + 1
    return out


def _sliced(segment: StoredBatches, i: int, offset: int, end: int, compression: str) -> ReplicaFrame | None:
    """Batch ``i``'s rows from ``offset`` to before ``end`` as a frame of their own (typed columns
    sliced alike, see :mod:`.typed_frames`)."""
    batch = segment.batch(i)
    offsets = batch.column(0)
    keep = pc.and_(pc.greater_equal(offsets, offset), pc.less(offsets, end))
    frame = sliced_frame(segment.frame(i), batch, keep, compression)
    if frame is None:
        return None
    kept = pc.filter(offsets, keep)
    return ReplicaFrame(kept[0].as_py(), kept[-1].as_py(), segment.index.epochs[i], frame)


def row_of(batch: pa.RecordBatch, offset: int, base: int, gapless: bool) -> int:
    """Row of the first offset >= ``offset`` in a batch (offsets ascending)."""
    if gapless:
        return min(max(offset - base, 0), batch.num_rows)
    return pc.sum(pc.less(batch.column(0), offset)).as_py() or 0
