"""A partition's log held in memory: the :class:`~.store.LogStore` interface with no files.

For tests of what sits on a log (partitions, replication, ingest) that need no
disk.  It stores the same frames as the file log -- appended, replicated, read
and truncated by the same code (:class:`~.base.LogBase`), over its own storage
-- so a memory log's follower can be fed by a file log's leader and the other
way round.

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
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from .compaction import compact_batches, latest_offsets
from .damage import DamagedRange, place
from .epochs import LeaderEpochCache
from .errors import (
    LogClosedError,
    LogError,
)
from .frames import batch_bounds, decode
from .index import BatchEntry, SegmentIndex, crc32
from .log_base import LogBase, retention_deletes
from .log_config import LogConfig
from .log_store import LogStore
from .logging_labels import NO_LABELS, Labels
from .segment import encode_frame
from .typed_frames import sliced_frame


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

    @property
    def size(self) -> int:
        """Bytes of its frame (0 when empty)."""
        return 0 if self.stored is None else self.stored.entry.size

    @property
    def record_count(self) -> int:
        """Messages it holds."""
        return 0 if self.stored is None else self.stored.entry.record_count

    @property
    def max_timestamp(self) -> int | None:
        """Its batch's newest timestamp, or ``None`` when empty."""
        return None if self.stored is None else self.stored.entry.max_timestamp


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

    @property
    def max_timestamp(self) -> int | None:
        """The newest batch's timestamp, or ``None`` when empty."""
        return self.index.max_timestamps[-1] if len(self.index) else None


class _Tail:
    """Where the shared append code stores a batch: the log's newest place (the file log's
    active segment)."""

    def __init__(self, log: MemoryLog) -> None:
        self._log = log

    @property
    def size(self) -> int:
        """Bytes stored in the newest place."""
        return self._log._places[-1].size

    @property
    def next_offset(self) -> int:
        """One past the newest place's last offset: the log end offset."""
        return self._log._places[-1].next_offset

    def append(self, frame: pa.Buffer, entry: BatchEntry, *, fsync: bool) -> None:
        """Store ``frame`` (copied: the caller's buffer may be a view of memory that changes
        later, as a file log's frames map its segment files)."""
        copy = pa.BufferOutputStream()
        copy.write(frame)
        data = copy.getvalue()
        self._log._store(_Stored(data, decode(data), entry))


def _stored(batch: pa.RecordBatch, compression: str) -> _Stored:
    """``batch`` (in the log schema, one epoch) as stored: read back from its frame, as the
    file log reads it, so that both hand out the same batches (sizes included)."""
    return _from_frame(encode_frame(batch, compression))


def _from_frame(frame: pa.Buffer) -> _Stored:
    """A stored frame (of one epoch) with its batch and index entry."""
    batch = decode(frame)
    base, last, epoch, newest = batch_bounds(batch)
    return _Stored(
        frame, batch, BatchEntry(base, last, 0, frame.size, crc32(frame), epoch, batch.num_rows, newest)
    )


class MemoryLog(LogBase):
    """One partition's log in memory, behind the same interface as :class:`~.log.Log`."""

    directory = None
    """No files: nothing is kept beside this log (a partition writes no producer snapshot)."""
    _segments: list[_Run]
    _bases: list[int]

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
        self._tail = _Tail(self)
        self._set([_Place(0, None)])
        self._high_watermark = 0
        self._epochs = LeaderEpochCache(None)
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

    def sync_if_due(self) -> bool:
        """Nothing ever needs syncing: ``False``."""
        return False

    # ---- offsets ---------------------------------------------------------------

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

    # ---- upkeep ----------------------------------------------------------------

    def enforce_retention(self) -> int:
        """Delete the oldest closed batches (see the module docstring) that retention allows to
        go, by the file log's rules per segment; return how many went."""
        with self._lock:
            self._check_open()
            places = self._places
            deleted = retention_deletes(
                self.config,
                places[: self._closed_below_high_watermark()],
                sum(self._run.index.sizes),
                sum(self._run.index.counts),
                int(self._clock() * 1_000_000),
            )
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
            committed = self._committed()
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

    def repair(self, batches: Iterable[pa.RecordBatch | pa.Buffer]) -> list[DamagedRange]:
        """Nothing is damaged, so no batch fits: ``InvalidRecordsError`` (as a file log without damage)."""
        with self._lock:
            self._check_open()
            place([], list(batches))  # raises: no batch lies within a damaged range
            return []

    # ---- the storage beneath the shared methods ----------------------------------

    @property
    def _active(self) -> _Tail:
        return self._tail

    def _maybe_roll(self, frame_size: int, last_offset: int, now_us: int) -> None:
        """Every batch gets a place of its own: a new one begins after a place that holds one."""
        last = self._places[-1]
        if last.stored is not None:
            self._places.append(_Place(last.next_offset, None))

    def _fsync_due(self) -> bool:
        return False

    def _cut(self, offset: int) -> None:
        # As the file log cuts its segments: the place holding ``offset`` keeps what lies
        # before it, the places after it go, and a cut in a gap begins a place at ``offset``.
        n = max(1, bisect.bisect_left(self.segment_base_offsets, offset))
        cut = self._places[n - 1]
        if cut.stored is not None and cut.stored.entry.last_offset >= offset:
            batch = cut.stored.batch
            frame = sliced_frame(
                cut.stored.frame, batch, pc.less(batch.column(0), offset), self.config.compression
            )
            cut = _Place(cut.base, _from_frame(frame) if frame is not None else None)
        places = [*self._places[: n - 1], cut]
        if cut.next_offset < offset:
            places.append(_Place(offset, None))
        self._set(places)

    def _start_empty_at(self, offset: int) -> None:
        self._set([_Place(offset, None)])

    def _checkpoint_high_watermark(self) -> None:
        """Nothing outlives the object."""

    def _high_watermark_moved(self) -> None:
        """Nothing to checkpoint."""

    def _epochs_forgotten(self, newer: list[tuple[int, int]], epoch: int) -> None:
        """No checkpoint could have named them: nothing to warn of."""

    def _epoch_refused(self, epoch: int, newer: int, start: int) -> LogError:
        return LogError(
            f"{self!r} cannot take leader epoch {epoch}: it holds data of the newer epoch {newer} "
            f"from offset {start} on"
        )

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
        self._segments, self._bases = [self._run], [places[0].base]
        self._last_timestamp = max(self._run.index.max_timestamps, default=0)

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"{self!r} is closed")


if TYPE_CHECKING:  # mypy checks here that the class has the whole interface
    _SATISFIES_LOG_STORE: type[LogStore] = MemoryLog
