"""A partition's log held in memory: the :class:`~.store.LogStore` interface with no files.

For tests of what sits on a log (partitions, replication, ingest) that need no
disk.  It stores the same frames as the file log -- built by the same helpers,
checked the same way on a replicated append -- so a memory log's follower can
be fed by a file log's leader and the other way round.

It behaves as a file :class:`~.log.Log` whose every batch is a segment of its
own (as one whose ``segment_bytes`` is below every batch's size): each batch
has a *place* that begins where the log ended when it was stored, and
retention and compaction, which work on closed segments below the high
watermark, work on those places (an emptied place stays until retention takes
it, as an emptied segment does).  Offsets, reads, frames, the high watermark,
leader epochs, truncation, retention and compaction then match such a file
log's exactly (``tests/log/test_store_contract.py`` checks it); beside a file
log of larger segments only retention and compaction differ, by working on
smaller units.

Where it differs, because it has no files:

* :attr:`size_bytes` counts the frames only (no segment headers, no indexes),
  and so does ``retention_bytes``;
* nothing is ever damaged: :attr:`damaged` is empty, :meth:`verify` checks
  nothing, :meth:`repair` refuses every batch, as a file log without damage
  does;
* nothing is fsynced or checkpointed (the fsync policy and the checkpoint
  interval are ignored), and nothing outlives the object.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Literal, NamedTuple, overload

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_jetstream.protocol.array_builders import constant_ints
from pyspark_jetstream.protocol.schema import LOG_SCHEMA, TIMESTAMP_TYPE

from .append_input import Records, to_input_columns
from .arguments import check_limit, check_offset, check_offset_arg, to_micros
from .compaction import compact_batches, latest_offsets
from .damage import DamagedRange, place
from .epochs import EpochEndOffset, LeaderEpochCache
from .errors import (
    CorruptSegmentError,
    InvalidRecordsError,
    LogClosedError,
    LogError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from .frames import batch_bounds, decode, replicated_entry
from .index import BatchEntry, SegmentIndex, crc32
from .log_config import LogConfig
from .logging_labels import NO_LABELS, Labels
from .reads import ReplicaFrame, read_batches, read_frames
from .segment import encode_frame
from .store import LogStore


class _Stored(NamedTuple):
    """One stored batch: its frame, the batch it holds, and its index entry."""

    frame: pa.Buffer
    batch: pa.RecordBatch
    entry: BatchEntry


class _Place(NamedTuple):
    """One batch's place in the log, as a segment of the file log is: the offset where it
    begins, and the batch stored there (``None`` when empty: truncation or compaction emptied
    it, or nothing was appended since it began)."""

    base: int
    stored: _Stored | None

    @property
    def next_offset(self) -> int:
        """One past its last offset (its base when empty)."""
        return self.base if self.stored is None else self.stored.entry.last_offset + 1


class _Run:
    """The stored batches in offset order and their index: what the reads of :mod:`.reads` use."""

    def __init__(self, places: Iterable[_Place]) -> None:
        self.stored: list[_Stored] = []
        self.index = SegmentIndex(0)
        for item in places:
            if item.stored is not None:
                self.add(item.stored)

    def add(self, item: _Stored) -> None:
        """Add a batch after the others."""
        self.stored.append(item)
        self.index.add(item.entry)

    def find(self, offset: int) -> int:
        """Index of the first batch whose last offset is >= ``offset`` (may be ``len``)."""
        return bisect.bisect_left(self.index.lasts, offset)

    def batch(self, i: int) -> pa.RecordBatch:
        return self.stored[i].batch

    def frame(self, i: int) -> pa.Buffer:
        return self.stored[i].frame


def _stored(batch: pa.RecordBatch, compression: str) -> _Stored:
    """``batch`` (in the log schema, one epoch) as stored: read back from its frame, as the
    file log reads it, so that both hand out the same batches (sizes included)."""
    frame = encode_frame(batch, compression)
    batch = decode(frame)
    base, last, epoch, newest = batch_bounds(batch)
    return _Stored(
        frame, batch, BatchEntry(base, last, 0, frame.size, crc32(frame), epoch, batch.num_rows, newest)
    )


class MemoryLog:
    """One partition's log in memory, behind the same interface as :class:`~.log.Log`."""

    directory = None
    """No files: nothing is kept beside this log (a partition writes no producer snapshot)."""

    def __init__(
        self,
        config: LogConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        labels: Labels = NO_LABELS,
    ) -> None:
        """An empty log; ``clock`` returns seconds since the epoch (appends' timestamps)."""
        self.config = config or LogConfig()
        self.labels = labels
        self._clock = clock
        self._places = [_Place(0, None)]
        self._run = _Run(self._places)
        self._high_watermark = 0
        self._epochs = LeaderEpochCache(None)
        self._last_timestamp = 0
        self._lock = threading.RLock()
        self._grown = threading.Condition(self._lock)
        self._closed = False

    def __repr__(self) -> str:
        named = self.labels.prefix.removesuffix(": ") or "unnamed"
        return f"MemoryLog({named}, offsets {self.log_start_offset} to {self.log_end_offset})"

    def close(self) -> None:
        """Close the log (later calls raise ``LogClosedError``) and release its waiters; idempotent."""
        with self._lock:
            self._closed = True
            self._grown.notify_all()

    def __enter__(self) -> MemoryLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sync_if_due(self) -> bool:
        """Nothing ever needs syncing: ``False``."""
        return False

    # ---- offsets ---------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        """The first offset still stored (messages below it were deleted by retention)."""
        return self._places[0].base

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended message will get."""
        return self._places[-1].next_offset

    @property
    def high_watermark(self) -> int:
        """The committed offset bound set by replication; within ``[0, log_end_offset]``."""
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        with self._lock:
            self._check_open()
            check_offset_arg("high_watermark", offset)
            if offset > self.log_end_offset:
                raise ValueError(f"high watermark {offset} is past the log end offset {self.log_end_offset}")
            self._high_watermark = offset

    @property
    def size_bytes(self) -> int:
        """Bytes of the stored frames."""
        return sum(self._run.index.sizes)

    @property
    def segment_base_offsets(self) -> list[int]:
        """Where each batch's place begins, oldest first (see the module docstring)."""
        return [p.base for p in self._places]

    @property
    def damaged(self) -> list[DamagedRange]:
        """Always empty: memory holds what was stored."""
        return []

    # ---- leader epochs ---------------------------------------------------------

    @property
    def leader_epoch(self) -> int:
        """The epoch new appends are stamped with (0 until one is assigned)."""
        latest = self._epochs.latest_epoch
        return 0 if latest is None else latest

    @property
    def leader_epochs(self) -> tuple[tuple[int, int], ...]:
        """``(epoch, start offset)`` pairs, oldest first."""
        return self._epochs.entries

    def assign_leader_epoch(self, epoch: int) -> None:
        """As :meth:`Log.assign_leader_epoch`: epochs only grow; an older one than the latest
        is refused (``LogError``) unless the newer ones hold no data (those are forgotten)."""
        with self._lock:
            self._check_open()
            check_offset_arg("epoch", epoch)
            newer = [(e, start) for e, start in self._epochs.entries if e > epoch]
            if newer and all(start >= self.log_end_offset for _, start in newer):
                self._epochs.truncate_from_end(self.log_end_offset)
            elif newer:
                e, start = next((e, start) for e, start in newer if start < self.log_end_offset)
                raise LogError(
                    f"{self!r} cannot take leader epoch {epoch}: it holds data of the newer epoch {e} "
                    f"from offset {start} on"
                )
            self._epochs.assign(epoch, self.log_end_offset)

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        """Largest known epoch <= ``epoch`` and one past its last offset (Kafka's OffsetForLeaderEpoch)."""
        with self._lock:
            return self._epochs.end_offset_for(epoch, self.log_end_offset)

    # ---- writing ---------------------------------------------------------------

    @overload
    def append(self, records: Records, *, wait: Literal[True] = True) -> range: ...
    @overload
    def append(self, records: Records, *, wait: bool) -> range | None: ...

    def append(self, records: Records, *, wait: bool = True) -> range | None:
        """As :meth:`Log.append`: one batch, the current epoch, one timestamp that never goes back."""
        inputs = to_input_columns(records, self.config.max_message_bytes)
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            self._check_open()
            base, count = self.log_end_offset, len(inputs[0])
            now = max(int(self._clock() * 1_000_000), self._last_timestamp)
            epoch = self.leader_epoch
            offsets = pa.array(range(base, base + count), pa.int64())
            columns = [
                offsets,
                constant_ints(now, count, TIMESTAMP_TYPE),
                constant_ints(epoch, count, pa.int32()),
            ]
            batch = pa.RecordBatch.from_arrays([*columns, *inputs], schema=LOG_SCHEMA)
            frame = encode_frame(batch, self.config.compression)
            if frame.size > self.config.max_batch_bytes:
                raise RecordTooLargeError(
                    f"batch of {count} messages is {frame.size} bytes stored, over "
                    f"max_batch_bytes={self.config.max_batch_bytes}",
                    size=frame.size,
                    limit=self.config.max_batch_bytes,
                )
            last = base + count - 1
            entry = BatchEntry(base, last, 0, frame.size, crc32(frame), epoch, count, now)
            self._store(_Stored(frame, decode(frame), entry))
            if self._epochs.latest_epoch is None:
                self._epochs.assign(epoch, base)
            self._last_timestamp = now
            self._grown.notify_all()
            return range(base, last + 1)
        finally:
            self._lock.release()

    def append_replicated(self, frames: Iterable[pa.Buffer | pa.RecordBatch]) -> range:
        """As :meth:`Log.append_replicated`: frames kept byte for byte (batches encoded), each
        checked to follow the log end with an epoch no older than the latest."""
        with self._lock:
            self._check_open()
            first = None
            for item in frames:
                data = (
                    encode_frame(item, self.config.compression) if isinstance(item, pa.RecordBatch) else item
                )
                entry = replicated_entry(data, self.log_end_offset - 1)
                if entry is None:
                    raise InvalidRecordsError(
                        f"a replicated frame of {data.size} bytes is not one sound batch following "
                        f"offset {self.log_end_offset - 1} in the log schema"
                    )
                latest = self._epochs.latest_epoch
                if latest is not None and entry.leader_epoch < latest:
                    raise InvalidRecordsError(
                        f"a replicated batch at offset {entry.base_offset} has leader epoch "
                        f"{entry.leader_epoch}, older than this log's {latest}"
                    )
                if data is item:
                    # A copy of our own: the caller's buffer may be a view of memory that
                    # changes later (a file log's frames map its segment files).
                    copy = pa.BufferOutputStream()
                    copy.write(data)
                    data = copy.getvalue()
                self._store(_Stored(data, decode(data), entry))
                if latest is None or entry.leader_epoch > latest:
                    self._epochs.assign(entry.leader_epoch, entry.base_offset)
                self._last_timestamp = max(self._last_timestamp, entry.max_timestamp)
                first = entry.base_offset if first is None else first
                self._grown.notify_all()
            return range(self.log_end_offset if first is None else first, self.log_end_offset)

    def truncate_to(self, offset: int) -> None:
        """As :meth:`Log.truncate_to`: everything from ``offset`` on goes, the HW and the epoch
        cache with it; past the end nothing changes, at the end only data-less epochs go."""
        check_offset_arg("offset", offset)
        with self._lock:
            self._check_open()
            if offset >= self.log_end_offset:
                if offset == self.log_end_offset:
                    self._epochs.truncate_from_end(offset)
                return
            if offset < self.log_start_offset:
                raise OffsetOutOfRangeError(
                    offset, log_start_offset=self.log_start_offset, log_end_offset=self.log_end_offset
                )
            # As the file log cuts its segments: the place holding ``offset`` keeps what lies
            # before it, the places after it go, and a cut in a gap begins a place at ``offset``.
            n = max(1, bisect.bisect_left(self.segment_base_offsets, offset))
            cut = self._places[n - 1]
            if cut.stored is not None and cut.stored.entry.last_offset >= offset:
                batch = cut.stored.batch
                part = batch.filter(pc.less(batch.column(0), offset))
                cut = _Place(cut.base, _stored(part, self.config.compression) if part.num_rows else None)
            places = [*self._places[: n - 1], cut]
            if cut.next_offset < offset:
                places.append(_Place(offset, None))
            self._set(places)
            self._epochs.truncate_from_end(offset)
            self._high_watermark = min(self._high_watermark, offset)
            self._grown.notify_all()

    def reset_to(self, offset: int) -> None:
        """Remove everything and start empty at ``offset`` (log start = log end = HW = ``offset``)."""
        check_offset("offset", offset)
        with self._lock:
            self._check_open()
            self._set([_Place(offset, None)])
            self._high_watermark = offset
            self._epochs.truncate_from_end(0)
            self._last_timestamp = 0
            self._grown.notify_all()

    # ---- reading ---------------------------------------------------------------

    def read(
        self,
        start_offset: int,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        upper_bound: int | None = None,
    ) -> list[pa.RecordBatch]:
        """As :meth:`Log.read` (the same reader, over batches in memory)."""
        check_offset_arg("start_offset", start_offset, allow_negative=True)
        check_limit("max_records", max_records)
        check_limit("max_bytes", max_bytes)
        if upper_bound is not None:
            check_offset_arg("upper_bound", upper_bound)
        with self._lock:
            end = self._read_end(start_offset, upper_bound)
            return read_batches(
                [self._run],
                [self.log_start_offset],
                start_offset,
                end,
                max_records=max_records,
                max_bytes=max_bytes,
            )

    @overload
    def read_frames(
        self,
        start_offset: int,
        *,
        max_bytes: int | None = None,
        upper_bound: int | None = None,
        wait: Literal[True] = True,
    ) -> list[ReplicaFrame]: ...
    @overload
    def read_frames(
        self, start_offset: int, *, max_bytes: int | None = None, upper_bound: int | None = None, wait: bool
    ) -> list[ReplicaFrame] | None: ...

    def read_frames(
        self,
        start_offset: int,
        *,
        max_bytes: int | None = None,
        upper_bound: int | None = None,
        wait: bool = True,
    ) -> list[ReplicaFrame] | None:
        """As :meth:`Log.read_frames`: the stored frames, a batch cut by the range encoded afresh."""
        check_offset("start_offset", start_offset)
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            end = self._read_end(start_offset, upper_bound)
            return read_frames(
                [self._run],
                [self.log_start_offset],
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
        """Every stored batch from the log start (or ``start_offset``, if later) to the log end as
        of the call; ``on_damaged`` is never called (nothing is damaged)."""
        offset, end = max(self.log_start_offset, start_offset or 0), self.log_end_offset
        while offset < end:
            batches = self.read(offset, max_bytes=max_bytes, upper_bound=end)
            if not batches:
                return  # the rest is a compaction gap
            yield from batches
            offset = batches[-1].column(0)[-1].as_py() + 1

    def offset_for_timestamp(self, timestamp: datetime | float) -> int:
        """The first offset whose timestamp is >= ``timestamp``, or the log end offset if none."""
        target = to_micros(timestamp)
        with self._lock:
            self._check_open()
            i = bisect.bisect_left(self._run.index.max_timestamps, target)
            if i == len(self._run.index):
                return self.log_end_offset
            batch = self._run.batch(i)
            earlier = pc.sum(pc.less(batch.column(1).cast(pa.int64()), target)).as_py() or 0
            return int(batch.column(0)[earlier].as_py())

    def wait_for_end(self, offset: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the log end offset to pass ``offset``; whether it did."""
        with self._grown:
            return self._grown.wait_for(lambda: self._closed or self.log_end_offset > offset, timeout) and (
                not self._closed
            )

    # ---- upkeep ----------------------------------------------------------------

    def enforce_retention(self) -> int:
        """Delete the oldest closed batches (see the module docstring) that retention allows to
        go, by the file log's rules per segment; return how many went."""
        cfg = self.config
        with self._lock:
            self._check_open()
            now_us = int(self._clock() * 1_000_000)
            places = self._places
            total_bytes = sum(self._run.index.sizes)
            total_messages = sum(self._run.index.counts)
            deleted = 0
            for oldest in places[: self._closed_below_high_watermark()]:
                size = 0 if oldest.stored is None else oldest.stored.entry.size
                count = 0 if oldest.stored is None else oldest.stored.entry.record_count
                newest = None if oldest.stored is None else oldest.stored.entry.max_timestamp
                expired = cfg.retention_age is not None and (
                    newest is None or newest < now_us - cfg.retention_age * 1_000_000
                )
                over_bytes = cfg.retention_bytes is not None and total_bytes - size >= cfg.retention_bytes
                over_count = (
                    cfg.retention_messages is not None and total_messages - count >= cfg.retention_messages
                )
                if not (expired or over_bytes or over_count):
                    break
                total_bytes -= size
                total_messages -= count
                deleted += 1
            if deleted:
                self._set(places[deleted:])
                self._epochs.truncate_from_start(self.log_start_offset)
            return deleted

    def compact(self) -> int:
        """Compact the closed places below the HW by key (see :meth:`Log.compact`), each on its
        own as the file log compacts each segment; return the messages removed.  Offsets are
        kept; a place compaction empties stays, empty."""
        with self._lock:
            self._check_open()
            closed = self._closed_below_high_watermark()
            if not closed:
                return 0
            committed = read_batches(
                [self._run],
                [self.log_start_offset],
                self.log_start_offset,
                self._high_watermark,
                max_records=None,
                max_bytes=None,
            )
            horizon = int((self._clock() - self.config.tombstone_retention) * 1_000_000)
            latest = latest_offsets(committed)
            places, removed = list(self._places), 0
            for i in range(closed):
                stored = places[i].stored
                if stored is None:
                    continue
                kept, gone = compact_batches([stored.batch], latest, horizon)
                if gone:
                    replacement = _stored(kept[0], self.config.compression) if kept else None
                    places[i] = _Place(places[i].base, replacement)
                    removed += gone
            if removed:
                self._set(places)
            return removed

    def verify(self, max_bytes: int) -> int:
        """Nothing is unchecked in memory: 0."""
        with self._lock:
            self._check_open()
            return 0

    def repair(self, batches: Iterable[pa.RecordBatch]) -> list[DamagedRange]:
        """Nothing is damaged, so no batch fits: ``InvalidRecordsError`` (as a file log without damage)."""
        with self._lock:
            self._check_open()
            place([], list(batches))  # raises: no batch lies within a damaged range
            return []

    # ---- internals -------------------------------------------------------------

    def _closed_below_high_watermark(self) -> int:
        """How many of the oldest places are closed and wholly below the high watermark: the
        place after each begins at or below it (the newest place is never closed)."""
        return bisect.bisect_right([p.base for p in self._places[1:]], self._high_watermark)

    def _store(self, item: _Stored) -> None:
        """Store a batch at the log end: in the newest place if it is empty, else in a new one."""
        last = self._places[-1]
        if last.stored is None:
            self._places[-1] = _Place(last.base, item)
        else:
            self._places.append(_Place(last.next_offset, item))
        self._run.add(item)

    def _set(self, places: list[_Place]) -> None:
        """Take ``places`` as the log's; the newest timestamp is what they hold now (as in the file log)."""
        self._places = places
        self._run = _Run(places)
        self._last_timestamp = max(self._run.index.max_timestamps, default=0)

    def _read_end(self, start_offset: int, upper_bound: int | None) -> int:
        self._check_open()
        if not self.log_start_offset <= start_offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(
                start_offset, log_start_offset=self.log_start_offset, log_end_offset=self.log_end_offset
            )
        return self.log_end_offset if upper_bound is None else min(self.log_end_offset, upper_bound)

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"{self!r} is closed")


if TYPE_CHECKING:  # mypy checks here that the class has the whole interface
    _SATISFIES_LOG_STORE: type[LogStore] = MemoryLog
