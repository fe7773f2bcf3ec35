"""One partition's commit log: the interface every other part of the broker uses.

A log lives in one directory and is a sequence of segments (see
:mod:`.segment` for the on-disk layout).  Terms, as in Kafka:

* **log start offset** -- the first offset still stored; retention moves it up.
* **log end offset** (LEO) -- the offset the next appended message gets.
* **high watermark** (HW) -- set by the replication layer: offsets below it are
  committed.  The log only stores it (checkpointed) and keeps it within
  ``[0, LEO]``; readers pass it as ``upper_bound``.

Offsets are contiguous from 0 as appended; compaction later removes messages
but never renumbers, so a read may skip over gaps.  Data that is lost or
damaged is never skipped silently: a read of it raises ``CorruptSegmentError``
naming the range, and :attr:`Log.damaged` lists it.  All methods are
thread-safe: one lock serialises appends, reads and maintenance.

Besides the segments, the directory holds the segment manifest
(:mod:`.manifest`, which segments make up the log), the high-watermark
checkpoint (:mod:`.hw_checkpoint`) and the leader-epoch checkpoint
(:mod:`.epochs`, aligned with the segments at open by :mod:`.epoch_recovery`).
Key compaction's pass over the segments is :mod:`.compaction`'s.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from .compaction import SegmentCompaction
from .damage import DamagedRange, damaged_ranges, repair_segments
from .deferred_sync import DeferredSync
from .epoch_recovery import LEADER_EPOCH_CHECKPOINT, reconcile_epochs
from .epochs import LeaderEpochCache
from .errors import (
    CorruptSegmentError,
    LogClosedError,
    LogError,
    LogStorageError,
)
from .hw_checkpoint import HighWatermarkCheckpoint
from .index import MAX_RELATIVE_OFFSET
from .log_base import LogBase, retention_deletes
from .log_config import FsyncPolicy, LogConfig
from .log_store import LogStore
from .logging_labels import NO_LABELS, Labels
from .manifest import MANIFEST, open_segments, record_segments, start_segment
from .segment import SEGMENT_SUFFIX, TEMP_SUFFIX, Segment
from .typed_frames import sliced_frame

logger = logging.getLogger(__name__)


class Log(LogBase):
    """An append-only, segmented, checksummed log of Arrow record batches."""

    _segments: list[Segment]
    _bases: list[int]

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        clock: Callable[[], float],
        segments: list[Segment],
        epochs: LeaderEpochCache,
        *,
        labels: Labels = NO_LABELS,
    ) -> None:
        self.directory = directory
        self.config = config
        self.labels = labels
        """Whose log it is, for its log lines (see :mod:`.logging_labels`)."""
        self._log = labels.bind(logger)
        self._clock = clock
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._epochs = epochs
        self._lock = threading.RLock()
        self._grown = threading.Condition(self._lock)
        """Notified whenever the log end offset moves (appends, replicated appends, truncation)."""
        self._closed = False
        self._compaction = SegmentCompaction(directory, self._log)
        self._last_timestamp = self._newest_timestamp()
        self._last_fsync = clock()
        self._unsynced = False  # appended data that no fsync has covered yet
        self._deferred = DeferredSync(directory, directory / MANIFEST)
        """The fsyncs owed and paid on the background thread (see :mod:`.deferred_sync`)."""
        self._hw = HighWatermarkCheckpoint(
            directory,
            config.high_watermark_checkpoint_interval,
            clock,
            lambda: None if self._closed else self._high_watermark,
            self._log,
        )
        """The high watermark's checkpoint file (see :mod:`.hw_checkpoint`)."""
        reconcile_epochs(
            epochs,
            segments,
            self.log_start_offset,
            self.log_end_offset,
            log=self._log,
            checkpoint=directory / LEADER_EPOCH_CHECKPOINT,
        )
        self._high_watermark = min(max(self._hw.saved or 0, 0), self.log_end_offset)

    # ---- opening and closing ---------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        labels: Labels = NO_LABELS,
    ) -> Log:
        """Open the log in ``directory``, creating it if needed and recovering from a crash.

        Recovery cuts a torn or corrupt tail of the last segment back to the
        last batch that passes its checksum, rebuilds damaged indexes,
        removes temporary files of interrupted rewrites and checks the
        segment files against the segment manifest (see :mod:`.manifest`:
        a missing segment's range reads as damaged, a stray file is renamed
        aside).  A log that needs no repair is opened without writing
        anything.  ``clock`` returns the current time in seconds since the
        epoch; ``labels`` name the log's stream and partition in every line
        it logs (what recovery did, retention, compaction).  Raises
        ``LogError`` when the directory cannot be opened as a log (naming the
        file and what to do), ``LogStorageError`` when the file system
        refuses.
        """
        path = Path(directory)
        try:
            path.mkdir(parents=True, exist_ok=True)
            for pattern in ("*" + SEGMENT_SUFFIX + TEMP_SUFFIX, "*.checkpoint" + TEMP_SUFFIX):
                for leftover in path.glob(pattern):  # index temps are the segment's to judge
                    labels.bind(logger).info("removing %s left by an interrupted write", leftover)
                    leftover.unlink()
            segments, changed = open_segments(path, labels)
            if not segments:
                segments = [Segment.create(path, 0)]
                segments[0].labels = labels
        except OSError as exc:
            raise LogStorageError(f"cannot open the log in {path}: {exc}") from exc
        log = cls(
            path,
            config or LogConfig(),
            clock,
            segments,
            LeaderEpochCache(path / LEADER_EPOCH_CHECKPOINT),
            labels=labels,
        )
        if changed:
            log._record_segments(required=False)
        return log

    def close(self) -> None:
        """Flush appends not yet on disk, checkpoint a changed high watermark, release everything.

        The log ends closed, every file and memory map released, even when the
        disk refuses a write (full, failing): then one ``LogStorageError``
        names each step that failed, after everything else was done, and is
        not retriable (a second close has nothing left to do).  What was
        appended stays readable after reopening, unless the machine loses
        power before the operating system writes it back; an uncheckpointed
        high watermark falls back to its last checkpoint.  Idempotent.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            failures = []
            try:
                self._deferred.run()  # a roll's manifest before the data, as ever
            except OSError as exc:
                failures.append(f"could not fsync what {self.directory} owed: {exc}")
            if self._unsynced:
                try:
                    self._active.fsync()
                except OSError as exc:
                    failures.append(f"could not fsync {self._active.path}: {exc}")
            if self._hw.changed(self._high_watermark):  # after a background write in flight
                try:
                    self._checkpoint_high_watermark()
                except LogStorageError as exc:
                    failures.append(str(exc))
            for segment in self._segments:
                try:
                    segment.close()
                except OSError as exc:
                    failures.append(f"could not close {segment.path}: {exc}")
            self._grown.notify_all()  # waiters see the log closed
            if failures:
                error = LogStorageError(f"closing the log in {self.directory}: " + "; ".join(failures))
                error.retriable = False
                raise error

    def flush(self) -> None:
        """Force appended data to disk and checkpoint the high watermark.

        Raises ``LogStorageError`` naming the step the disk refused.
        """
        with self._lock:
            self._check_open()
            self._fsync_active()
            self._last_fsync = self._clock()
            self._unsynced = False
            self._checkpoint_high_watermark()

    def sync_if_due(self) -> bool:
        """Under ``FsyncPolicy.INTERVAL``, fsync appends not yet on disk once
        ``fsync_interval`` has passed since the last fsync; return whether it did.

        Appends check the interval themselves, but the last appends of a burst
        would wait for the next append: call this on a timer (the broker does,
        every ``fsync_interval``) so they reach the disk within about one interval.
        """
        with self._lock:
            # Only INTERVAL leaves data unsynced that an interval can make due.
            if (
                self._closed
                or self.config.fsync is not FsyncPolicy.INTERVAL
                or not self._unsynced
                or not self._interval_passed()
            ):
                return False
            self._deferred.owe_files(self._active.paths)
            self._unsynced = False
        try:
            self._deferred.run()  # here, on the caller's (timer) thread, without the log's lock
        except OSError as exc:
            raise LogStorageError(f"could not fsync the appends of {self.directory}: {exc}") from exc
        self._log.debug("interval fsync of %s", self.directory)
        return True

    # ---- offsets ---------------------------------------------------------------

    @property
    def size_bytes(self) -> int:
        """Bytes of all segment files (indexes not counted)."""
        return sum(s.size for s in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        """Base offsets of the segments, oldest first; the last one is active."""
        return list(self._bases)

    @property
    def damaged(self) -> list[DamagedRange]:
        """Every offset range known to be unreadable, in offset order: ``(path, first, last, detail)``.

        Found on open (a segment that had to be re-indexed, a missing file)
        or by a read (a batch that failed its checks): closed segments are not
        read at open, so damage nobody has read yet is not listed.  A range
        stays listed until :meth:`repair` replaces it or retention deletes it.
        """
        with self._lock:
            return damaged_ranges(self._segments)

    # ---- appending -------------------------------------------------------------

    def roll(self) -> None:
        """Close the active segment and start a new one at the log end offset (if it holds data)."""
        with self._lock:
            self._check_open()
            if len(self._active.index):
                self._roll()

    def _maybe_roll(self, frame_size: int, last_offset: int, now_us: int) -> None:
        active = self._active
        if not len(active.index):
            return
        too_big = active.size + frame_size > self.config.segment_bytes
        too_old = now_us - active.index.max_timestamps[0] >= self.config.segment_max_age * 1_000_000
        too_many = last_offset - active.base_offset > MAX_RELATIVE_OFFSET
        if too_big or too_old or too_many:
            self._roll()

    def _roll(self, base_offset: int | None = None) -> None:
        """Start a segment at ``base_offset`` (default: the log end) and seal the active one.

        Its fsyncs are owed (see :mod:`.deferred_sync`) unless every append is synced: a roll
        is made by an append, which may run on an event loop."""
        active = self._active
        policy = self.config.fsync
        sync = policy is FsyncPolicy.ALWAYS
        base = active.next_offset if base_offset is None else base_offset
        segment = start_segment(self.directory, self._bases, active, base, sync=sync, labels=self.labels)
        active.seal()
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        if not sync:
            self._deferred.owe_manifest()
            if policy is FsyncPolicy.INTERVAL and self._unsynced:
                self._deferred.owe_files(active.paths)
            self._deferred.submit()

    def _fsync_due(self) -> bool:
        """Whether this append must reach the disk before it counts (``always``); under
        ``interval``, once the interval passed, the active segment's fsync is owed and paid on the
        background thread instead (the append may run on an event loop)."""
        policy = self.config.fsync
        if policy is FsyncPolicy.ALWAYS:
            return True
        if policy is FsyncPolicy.INTERVAL and self._interval_passed():
            self._deferred.owe_files(self._active.paths)
            self._deferred.submit()
        return False

    def _interval_passed(self) -> bool:
        """Whether ``fsync_interval`` passed since the last interval fsync (then it starts anew)."""
        now = self._clock()
        if now - self._last_fsync >= self.config.fsync_interval:
            self._last_fsync = now
            return True
        return False

    # ---- truncation, retention, compaction -------------------------------------

    def _cut(self, offset: int) -> None:
        """The storage part of :meth:`truncate_to`: the segment cut in two is rewritten from its
        batches below ``offset`` (a damaged one among them raises ``CorruptSegmentError`` and
        leaves the log as it was), the segments after it are deleted."""
        n = max(1, bisect.bisect_left(self._bases, offset))
        last = self._segments[n - 1]
        k = last.find(offset)
        cut_inside = k < len(last.index) and last.index.bases[k] < offset
        if cut_inside:
            # Read what stays before deleting anything: a damaged batch among it
            # (CorruptSegmentError) leaves the log as it was.
            # Stored frames as they are, and the cut one sliced with its typed columns.
            kept: list[pa.Buffer] = [last.frame(j) for j in range(k)]
            partial = last.batch(k)
            sliced = sliced_frame(
                last.frame(k), partial, pc.less(partial.column(0), offset), self.config.compression
            )
            if sliced is not None:
                kept.append(sliced)
        if len(self._segments) > n:
            while len(self._segments) > n:
                self._segments.pop().delete()
                self._bases.pop()
            self._record_segments(required=False)
        if cut_inside:
            last.rewrite(kept, self.config.compression)
            last.open_for_append()
        else:  # at a batch boundary (replication truncates there): cut the files
            last.cut(k)
        if last.next_offset < offset:  # the cut fell in a compaction gap
            self._roll(offset)
        self._last_timestamp = self._newest_timestamp()

    def _start_empty_at(self, offset: int) -> None:
        try:
            fresh = Segment.create(self.directory, offset) if offset not in self._bases else None
        except OSError as exc:
            raise LogStorageError(f"cannot start a new segment in {self.directory}: {exc}") from exc
        for segment in self._segments:
            if segment.base_offset != offset:
                segment.delete()
        if fresh is None:  # a segment already starts there: empty it
            fresh = next(s for s in self._segments if s.base_offset == offset)
            fresh.cut(0)
        fresh.labels = self.labels
        self._segments, self._bases = [fresh], [offset]
        self._record_segments(required=True)

    def enforce_retention(self) -> int:
        """Delete closed segments that retention allows to go; return how many.

        Only closed segments wholly below the high watermark are candidates,
        oldest first, and deletion stops at the first one that must stay.  A
        segment goes when its newest message is older than ``retention_age``,
        or when the log without it still holds at least ``retention_bytes``
        bytes or ``retention_messages`` messages (so the log keeps at least
        the configured amount and exceeds it by less than one segment).  A
        call that deletes anything logs one line: how many segments, which
        offsets, and the new log start offset.
        """
        with self._lock:
            self._check_open()
            first = self.log_start_offset
            deleted = retention_deletes(
                self.config,
                self._closed_below_high_watermark(),
                self.size_bytes,
                sum(s.record_count for s in self._segments),
                int(self._clock() * 1_000_000),
            )
            freed = 0
            for oldest in self._segments[:deleted]:
                freed += oldest.size
                oldest.delete()
            if deleted:
                del self._segments[:deleted]
                del self._bases[:deleted]
                self._record_segments(required=False)
                self._log.info(
                    "retention deleted %d segment(s), offsets %d to %d (%d bytes); the log starts at %d now",
                    deleted,
                    first,
                    self.log_start_offset - 1,
                    freed,
                    self.log_start_offset,
                )
                self._epochs.truncate_from_start(self.log_start_offset)
                self._last_timestamp = self._newest_timestamp()
            return deleted

    def compact(self) -> int:
        """Compact closed segments below the high watermark by key; return messages removed.

        Keeps the newest message of each key (looking at the whole log, so a
        newer value in the active segment supersedes older ones), every
        message without a key, and tombstones younger than
        ``tombstone_retention``.  Offsets are preserved.  Each changed segment
        is rewritten crash-safely.  While committed offsets are damaged (see
        :attr:`damaged`) nothing is compacted and 0 is returned: a lost batch
        may hold a key's newest value or tombstone (logged once per damage,
        not on every call).  A call that removes anything logs one line:
        messages removed, and the log's bytes before and after.
        """
        with self._lock:
            self._check_open()
            closed = self._closed_below_high_watermark()
            if not closed:
                return 0
            before = self.size_bytes
            result = self._compaction.run(
                closed,
                [d for d in self.damaged if d.first_offset < self._high_watermark],
                lambda: self._committed(partial=False),
                lambda: int((self._clock() - self.config.tombstone_retention) * 1_000_000),
                self.config.compression,
            )
            if result is None:
                return 0
            removed, rewritten = result
            self._last_timestamp = self._newest_timestamp()
            if removed:
                self._log.info(
                    "compaction removed %d message(s) from %d segment(s): %d bytes before, %d after",
                    removed,
                    rewritten,
                    before,
                    self.size_bytes,
                )
            return removed

    def verify(self, max_bytes: int) -> int:
        """Check up to ``max_bytes`` of batches no read has checked yet; return the bytes checked.

        Closed segments are not read at open, so damage in data nobody reads
        would stay unknown; calling this now and then (the broker does, with
        its maintenance) finds it, and :attr:`damaged` lists it, so a replica
        can repair it before anyone needs it.
        """
        checked = 0
        with self._lock:
            self._check_open()
            for segment in self._segments:
                for i in segment.unverified():
                    if checked >= max_bytes:
                        return checked
                    with contextlib.suppress(CorruptSegmentError):  # recorded in segment.damage
                        segment.batch(i)
                    checked += segment.index.sizes[i]
        return checked

    def repair(self, batches: Iterable[pa.RecordBatch | pa.Buffer]) -> list[DamagedRange]:
        """Replace damaged ranges (see :attr:`damaged`) with a good copy; return the ranges repaired.

        ``batches`` hold the same offsets read from another replica
        (``read(first, upper_bound=last + 1)`` there, or its stored frames,
        which keep a typed batch's typed columns), for one or more
        damaged ranges.  Each must fit its range exactly (see
        :func:`.repair.place`), and every damaged range of a segment must be
        repaired in the same call, since the segment is rewritten whole
        (crash-safely, as compaction does); otherwise ``InvalidRecordsError``
        and nothing changes.  Rewriting reads the segment's other batches, so
        it may find more damage: then ``CorruptSegmentError`` names it, and
        nothing changes either.
        """
        with self._lock:
            self._check_open()
            return repair_segments(self._segments, list(batches), self.config.compression)

    # ---- internals -------------------------------------------------------------

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    def _closed_below_high_watermark(self) -> list[Segment]:
        """Closed segments, oldest first, whose every offset is below the high watermark."""
        segments = self._segments
        return [
            s
            for s, following in itertools.pairwise(segments)
            if following.base_offset <= self._high_watermark
        ]

    def _newest_timestamp(self) -> int:
        """Newest stored timestamp (µs), the floor for the next append's timestamp."""
        return max((s.max_timestamp for s in self._segments if s.max_timestamp is not None), default=0)

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"the log in {self.directory} is closed")

    def _high_watermark_moved(self) -> None:
        """Checkpoint the high watermark now and then, on the checkpoint thread: the caller is
        the commit path (see :mod:`.hw_checkpoint`)."""
        self._hw.moved()

    def _epochs_forgotten(self, newer: list[tuple[int, int]], epoch: int) -> None:
        self._log.warning(
            "%s names epoch(s) %s with no data, newer than epoch %d given now; forgetting them",
            self.directory / LEADER_EPOCH_CHECKPOINT,
            ", ".join(str(e) for e, _ in newer),
            epoch,
        )

    def _epoch_refused(self, epoch: int, newer: int, start: int) -> LogError:
        return LogError(
            f"{self.directory} cannot take leader epoch {epoch}: it holds data of the newer "
            f"epoch {newer} from offset {start} on, so the coordinator's metadata is older than "
            "this data; restore the coordinator's data, or move this directory aside to start "
            "the partition empty"
        )

    def _checkpoint_high_watermark(self) -> None:
        self._hw.write(self._high_watermark)

    def _record_segments(self, *, required: bool) -> None:
        record_segments(self.directory, self._bases, required=required, labels=self.labels)

    def _fsync_active(self) -> None:
        try:
            self._active.fsync()
        except OSError as exc:
            raise LogStorageError(f"could not fsync {self._active.path}: {exc}") from exc


if TYPE_CHECKING:  # mypy checks here that the class has the whole interface
    _SATISFIES_LOG_STORE: type[LogStore] = Log
