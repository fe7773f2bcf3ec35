"""Reading a log's segments: batches for consumers, stored frames for replicas.

Both walk the segments from an offset up to an end offset (exclusive) and
stop at a byte budget, but always return at least one batch when any data is
in range.  A damaged batch ends a read that found batches before it; a read
that starts at it raises ``CorruptSegmentError``.

:class:`LogReads` is the reading side both logs share (:class:`~.base.LogBase`
derives from it): each read's arguments checked, the log's lock held, and
these walks run over its units.
"""

from __future__ import annotations

import abc
import bisect
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import NamedTuple, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_jetstream.protocol.typed_values import TypedValues

from .arguments import check_limit, check_offset, check_offset_arg, to_micros
from .errors import CorruptSegmentError, OffsetOutOfRangeError
from .index import SegmentIndex
from .log_config import LogConfig
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
            # get_total_buffer_size, not nbytes: equal for a decoded batch, and ~60x cheaper (pyarrow
            # 26 walks the referenced ranges of every buffer for nbytes: ~55 µs a batch).
            size = max(index.sizes[i], batch.get_total_buffer_size())  # larger if stored compressed
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


class Stored(StoredBatches, Protocol):
    """What the shared reads walk: a file log's segment, or the memory log's run of batches."""

    @property
    def max_timestamp(self) -> int | None:
        """The newest batch's timestamp, or ``None`` when empty."""


class LogReads(abc.ABC):
    """The reads both logs run alike, over the units the log declares (``_segments``, ``_bases``),
    under its lock: batches for consumers (with their typed columns, or without), stored frames
    for replicas, scans, timestamps, and waits for the log end to move.  :class:`~.base.LogBase`
    derives from it; each method's contract is stated here."""

    config: LogConfig
    _lock: threading.RLock
    _grown: threading.Condition
    """Notified whenever the log end offset moves (appends, replicated appends, truncation)."""
    _closed: bool
    _high_watermark: int
    _segments: Sequence[Stored]
    """What the reads walk, oldest first, and their base offsets (``_bases``)."""
    _bases: Sequence[int]

    @property
    @abc.abstractmethod
    def log_start_offset(self) -> int:
        """The first offset still stored."""

    @property
    @abc.abstractmethod
    def log_end_offset(self) -> int:
        """The offset the next appended message will get."""

    @abc.abstractmethod
    def _check_open(self) -> None:
        """``LogClosedError`` if the log is closed."""

    def read(
        self,
        start_offset: int,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        upper_bound: int | None = None,
    ) -> list[pa.RecordBatch]:
        """Return stored batches from ``start_offset`` on, in offset order.

        The first row of the first batch is ``start_offset`` (or the next
        stored offset after a compaction gap); batches are zero-copy slices of
        the stored ones (a file log's memory-mapped segments; batches stored
        compressed are decompressed).  Reading stops before ``upper_bound``
        (default: the log end offset; pass the high watermark to read only
        committed data), after ``max_records`` rows, or before the batch that
        would take the bytes read past ``max_bytes`` (a batch counts its
        stored size, or its decompressed size if larger) -- but at least one
        batch is returned when any data is in range, however large.

        ``start_offset`` equal to the log end offset (or at/after
        ``upper_bound``) gives an empty list.  Outside
        ``[log_start_offset, log_end_offset]`` it raises
        ``OffsetOutOfRangeError`` with the valid range.  A damaged batch (one
        that fails its checks, or offsets whose data is lost) ends the read
        before it; a read that starts at it raises ``CorruptSegmentError``
        naming the file and the unreadable range.
        """
        return self._checked_read(start_offset, max_records, max_bytes, upper_bound)

    def read_typed(
        self,
        start_offset: int,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        upper_bound: int | None = None,
    ) -> list[TypedRead]:
        """:meth:`read`, each batch with the typed columns stored with its rows (see
        :mod:`.typed_frames`; ``None`` for a batch stored without).  Typed columns that do not
        decode raise ``CorruptSegmentError`` naming the batch's offsets."""
        frames: list[tuple[pa.Buffer, int]] = []
        batches = self._checked_read(start_offset, max_records, max_bytes, upper_bound, frames=frames)
        try:
            return with_typed(batches, frames)
        except ValueError as exc:
            first = batches[0].column(0)[0].as_py()
            last = batches[-1].column(0)[-1].as_py()
            raise CorruptSegmentError(repr(self), first, last, str(exc)) from exc

    def _read_end(self, start_offset: int, upper_bound: int | None) -> int:
        """Where a read from ``start_offset`` stops (the log end, or ``upper_bound`` if lower);
        raises ``OffsetOutOfRangeError`` for a start outside the log.  Called holding the lock."""
        self._check_open()
        end = self.log_end_offset
        if not self.log_start_offset <= start_offset <= end:
            raise OffsetOutOfRangeError(
                start_offset, log_start_offset=self.log_start_offset, log_end_offset=end
            )
        return end if upper_bound is None else min(end, upper_bound)

    def _checked_read(
        self,
        start_offset: int,
        max_records: int | None,
        max_bytes: int | None,
        upper_bound: int | None,
        *,
        frames: list[tuple[pa.Buffer, int]] | None = None,
    ) -> list[pa.RecordBatch]:
        """:meth:`read` (and :meth:`read_typed`, which also collects each batch's ``frames``)."""
        check_offset_arg("start_offset", start_offset, allow_negative=True)
        check_limit("max_records", max_records)
        check_limit("max_bytes", max_bytes)
        if upper_bound is not None:
            check_offset_arg("upper_bound", upper_bound)
        with self._lock:
            end = self._read_end(start_offset, upper_bound)
            return read_batches(
                self._segments,
                self._bases,
                start_offset,
                end,
                max_records=max_records,
                max_bytes=max_bytes,
                frames=frames,
            )

    def _committed(self, *, partial: bool = True) -> list[pa.RecordBatch]:
        """Every stored batch below the high watermark, without ``read``'s checks (compaction's
        input); with ``partial``, damage ends a read that has found batches."""
        return read_batches(
            self._segments,
            self._bases,
            self.log_start_offset,
            self._high_watermark,
            max_records=None,
            max_bytes=None,
            partial=partial,
        )

    def read_frames(
        self, start_offset: int, *, max_bytes: int | None = None, upper_bound: int | None = None
    ) -> list[ReplicaFrame]:
        """Stored batches from ``start_offset`` on, byte for byte as stored, for a replica.

        Bounds and errors as :meth:`read` (a batch cut by the range is sliced
        and encoded afresh); ``max_bytes`` counts stored bytes.  Each frame's
        bytes are what :meth:`append_replicated` takes.
        """
        frames = self._read_frames(start_offset, max_bytes, upper_bound, wait=True)
        assert frames is not None  # a waiting read reads or raises
        return frames

    def try_read_frames(
        self, start_offset: int, *, max_bytes: int | None = None, upper_bound: int | None = None
    ) -> list[ReplicaFrame] | None:
        """:meth:`read_frames`, or ``None`` at once if another thread holds the log (an event
        loop's caller reads in a thread then)."""
        return self._read_frames(start_offset, max_bytes, upper_bound, wait=False)

    def _read_frames(
        self, start_offset: int, max_bytes: int | None, upper_bound: int | None, *, wait: bool
    ) -> list[ReplicaFrame] | None:
        check_offset("start_offset", start_offset)
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            end = self._read_end(start_offset, upper_bound)
            return read_frames(
                self._segments,
                self._bases,
                start_offset,
                end,
                max_bytes=max_bytes,
                compression=self.config.compression,
            )
        finally:
            self._lock.release()

    def scan(
        self,
        *,
        max_bytes: int = 16 * 1024 * 1024,
        on_damaged: Callable[[CorruptSegmentError], None] | None = None,
        start_offset: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Every stored batch from the log start (or ``start_offset``, if later) to the log end
        as of the call, in order.

        Reads ``max_bytes`` at a time (see :meth:`read`); used to rebuild
        state kept beside the log (producer sequences, cursors).  A damaged
        range raises ``CorruptSegmentError``, unless ``on_damaged`` is given:
        then it is called with that error and the scan goes on after the
        range.  Rebuilds pass it, so that one bad batch costs what it held
        rather than the whole partition (the range stays in ``damaged``
        until repaired).
        """
        offset, end = max(self.log_start_offset, start_offset or 0), self.log_end_offset
        while offset < end:
            try:
                batches = self.read(offset, max_bytes=max_bytes, upper_bound=end)
            except CorruptSegmentError as exc:
                if on_damaged is None:
                    raise
                on_damaged(exc)
                offset = max(offset, exc.last_offset) + 1
                continue
            if not batches:
                return  # the rest is a compaction gap
            yield from batches
            offset = batches[-1].column(0)[-1].as_py() + 1

    def offset_for_timestamp(self, timestamp: datetime | float) -> int:
        """The first offset whose timestamp is >= ``timestamp``, or the log end offset if none.

        ``timestamp`` is a timezone-aware ``datetime`` or seconds since the
        Unix epoch.  Only messages still stored are considered.
        """
        target = to_micros(timestamp)
        with self._lock:
            self._check_open()
            for segment in self._segments:
                newest = segment.max_timestamp
                if newest is None or newest < target:
                    continue
                i = bisect.bisect_left(segment.index.max_timestamps, target)
                batch = segment.batch(i)
                earlier = pc.sum(pc.less(batch.column(1).cast(pa.int64()), target)).as_py() or 0
                return int(batch.column(0)[earlier].as_py())
            return self.log_end_offset

    def wait_for_end(self, offset: int, timeout: float, *, unless: Callable[[], bool] | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the log end offset to pass ``offset``, or until
        ``unless()`` is true when checked (at each append and each :meth:`wake_waiters`); whether
        the end passed ``offset``."""
        with self._grown:
            self._grown.wait_for(
                lambda: self._closed or self.log_end_offset > offset or (unless is not None and unless()),
                timeout,
            )
            return not self._closed and self.log_end_offset > offset

    def wake_waiters(self) -> None:
        """Have every :meth:`wait_for_end` check its ``unless`` now."""
        with self._grown:
            self._grown.notify_all()
