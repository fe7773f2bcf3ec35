"""The replica-facing half of the log: stored frames out, a leader's frames in.

A leader serves its followers :meth:`ReplicaMethods.read_frames` (batches byte
for byte as stored) and long-polls with :meth:`ReplicaMethods.wait_for_end`; a
follower appends what it fetched with :meth:`ReplicaMethods.append_replicated`
(the leader's offsets, timestamps and epochs kept), and starts over with
:meth:`ReplicaMethods.reset_to` when the leader no longer has what it lacks.
``Log`` inherits these; they share its lock and state.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

import pyarrow as pa

from .arguments import check_offset
from .errors import InvalidRecordsError, LogStorageError
from .frames import replicated_entry
from .reads import ReplicaFrame, read_frames
from .segment import Segment, encode_frame

if TYPE_CHECKING:
    from .epochs import LeaderEpochCache
    from .log_config import LogConfig
    from .logging_labels import Labels


class ReplicaMethods:
    """Methods of :class:`~.log.Log` for replication (see the module docstring)."""

    directory: Path
    config: LogConfig
    labels: Labels
    _lock: threading.RLock
    _grown: threading.Condition
    _closed: bool
    _segments: list[Segment]
    _bases: list[int]
    _epochs: LeaderEpochCache
    _high_watermark: int
    _last_timestamp: int
    _unsynced: bool

    if TYPE_CHECKING:

        @property
        def log_start_offset(self) -> int: ...
        @property
        def log_end_offset(self) -> int: ...
        @property
        def _active(self) -> Segment: ...
        def _check_open(self) -> None: ...
        def _read_end(self, start_offset: int, upper_bound: int | None) -> int: ...
        def _maybe_roll(self, frame_size: int, last_offset: int, now_us: int) -> None: ...
        def _fsync_due(self) -> bool: ...
        def _record_segments(self, *, required: bool) -> None: ...
        def _checkpoint_high_watermark(self) -> None: ...

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
        """Stored batches from ``start_offset`` on, byte for byte as on disk, for a replica.

        Bounds and errors as :meth:`read` (a batch cut by the range is sliced
        and encoded afresh); ``max_bytes`` counts stored bytes.  Each frame's
        bytes are what :meth:`append_replicated` takes.  With ``wait=False``,
        ``None`` if another thread holds the log (an event loop's caller reads
        in a thread then).
        """
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

    def append_replicated(self, frames: Iterable[pa.Buffer | pa.RecordBatch]) -> range:
        """Append batches a leader stored, keeping its offsets, timestamps and leader epochs.

        ``frames`` are stored frames as :meth:`read_frames` returns them (their
        ``data``), written byte for byte, or record batches in the log schema
        (encoded with this log's compression).  Each must hold strictly
        increasing offsets from the log end offset on (a gap is allowed: the
        leader's compaction removed those offsets; an overlap never is), one
        leader epoch, no older than the log's latest; the epoch cache learns
        each new epoch.  Returns the offsets appended.  Raises
        ``InvalidRecordsError`` naming the first frame that does not fit (the
        ones before it stay appended) and ``LogStorageError`` if the disk
        refuses.
        """
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
                self._maybe_roll(data.size, entry.last_offset, entry.max_timestamp)
                active = self._active
                fsync = self._fsync_due()
                active.append(data, dataclasses.replace(entry, position=active.size), fsync=fsync)
                self._unsynced = not fsync
                if latest is None or entry.leader_epoch > latest:
                    self._epochs.assign(entry.leader_epoch, entry.base_offset)
                self._last_timestamp = max(self._last_timestamp, entry.max_timestamp)
                first = entry.base_offset if first is None else first
                self._grown.notify_all()
            end = self.log_end_offset
            return range(end if first is None else first, end)

    def wait_for_end(self, offset: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the log end offset to pass ``offset``; whether it did."""
        with self._grown:
            return self._grown.wait_for(lambda: self._closed or self.log_end_offset > offset, timeout) and (
                not self._closed
            )

    def reset_to(self, offset: int) -> None:
        """Remove everything and start empty at ``offset`` (log start = log end = ``offset``).

        For a replica whose data a leader no longer has (its log starts
        later): the replica starts over at the leader's log start offset.
        """
        check_offset("offset", offset)
        with self._lock:
            self._check_open()
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
            self._epochs.truncate_from_end(0)
            self._high_watermark = offset
            self._checkpoint_high_watermark()
            self._last_timestamp = 0
            self._grown.notify_all()
