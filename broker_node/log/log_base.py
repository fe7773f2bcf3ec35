"""What the file log and the memory log share: the logic of every method that does not depend
on how batches are stored.

:class:`LogBase` holds appends, replicated appends, leader epochs, the high
watermark, and the checks and bookkeeping of truncation and reset; it derives
the reads (batches, frames for replicas, scans, timestamps, waits for the log
end) from :class:`~.reads.LogReads`; :class:`~.log.Log` and :class:`~.memory.MemoryLog`
supply the storage beneath them through a few small methods (``_active``,
``_maybe_roll``, ``_cut``, ``_start_empty_at``, ...).  The hot paths
(:meth:`LogBase.append`, :meth:`LogBase.append_replicated`,
:meth:`LogReads.read_frames <.reads.LogReads.read_frames>`) call the file log's segments directly, as
before: the memory log's newest place answers the same few calls a segment
does.  The contract of each method is :class:`~.store.LogStore`'s.
"""

from __future__ import annotations

import abc
import dataclasses
from array import array
from collections.abc import Callable, Iterable
from typing import Protocol, Self

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_jetstream.protocol.array_builders import constant_ints
from pyspark_jetstream.protocol.schema import LOG_SCHEMA, TIMESTAMP_TYPE
from pyspark_jetstream.protocol.typed_values import TypedValues

from .append_input import Record, Records, record_size, to_input_columns
from .arguments import check_offset, check_offset_arg
from .epochs import EpochEndOffset, LeaderEpochCache
from .errors import (
    InvalidRecordsError,
    LogError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from .frames import replicated_entry
from .index import BatchEntry, crc32
from .log_config import LogConfig
from .logging_labels import Labels
from .one_frame import OneFrames
from .reads import LogReads
from .segment import COMPRESS_MIN_BYTES, encode_frame
from .typed_frames import encode_typed_frame


class ActiveStore(Protocol):
    """Where appends go: the file log's active segment, or the memory log's newest place."""

    @property
    def size(self) -> int:
        """Bytes stored in it so far: the position the next batch gets."""

    @property
    def next_offset(self) -> int:
        """One past its last offset: the log end offset."""

    def append(self, frame: pa.Buffer, entry: BatchEntry, *, fsync: bool) -> None:
        """Store ``frame``, described by ``entry``; with ``fsync``, on stable storage before returning."""


class Unit(Protocol):
    """One unit retention deletes whole: a closed segment, or a memory log's place."""

    @property
    def size(self) -> int: ...
    @property
    def record_count(self) -> int: ...
    @property
    def max_timestamp(self) -> int | None: ...


def retention_deletes(
    config: LogConfig, units: Iterable[Unit], total_bytes: int, total_messages: int, now_us: int
) -> int:
    """How many of ``units`` (the oldest closed ones below the HW, oldest first) retention lets go:
    each goes when its newest message is older than ``retention_age``, or when what stays without
    it still holds at least ``retention_bytes`` bytes or ``retention_messages`` messages; counting
    stops at the first that must stay."""
    deleted = 0
    for unit in units:
        newest = unit.max_timestamp
        expired = config.retention_age is not None and (
            newest is None or newest < now_us - config.retention_age * 1_000_000
        )
        over_bytes = config.retention_bytes is not None and total_bytes - unit.size >= config.retention_bytes
        over_count = (
            config.retention_messages is not None
            and total_messages - unit.record_count >= config.retention_messages
        )
        if not (expired or over_bytes or over_count):
            break
        total_bytes -= unit.size
        total_messages -= unit.record_count
        deleted += 1
    return deleted


class LogBase(LogReads):
    """The methods both logs run alike (see the module docstring); the storage is the subclass's."""

    labels: Labels
    _clock: Callable[[], float]
    _epochs: LeaderEpochCache
    _last_timestamp: int
    """The newest stored timestamp (µs): the floor for the next append's."""
    _unsynced: bool = False
    """Appended data that no fsync has covered yet."""
    _iota: pa.Array = pa.array([], pa.int64())

    # ---- what the storage supplies ---------------------------------------------

    @property
    @abc.abstractmethod
    def _active(self) -> ActiveStore:
        """Where the next batch is stored."""

    @abc.abstractmethod
    def _maybe_roll(self, frame_size: int, last_offset: int, now_us: int) -> None:
        """Begin a new unit at the log end if the active one should take no batch of ``frame_size``
        bytes ending at ``last_offset``, stamped ``now_us``."""

    @abc.abstractmethod
    def _fsync_due(self) -> bool:
        """Whether this append must reach stable storage before it counts."""

    @abc.abstractmethod
    def _cut(self, offset: int) -> None:
        """Remove the stored messages at and after ``offset``, which lies within the log, and set
        ``_last_timestamp`` to the newest that stays."""

    @abc.abstractmethod
    def _start_empty_at(self, offset: int) -> None:
        """Remove every stored message and begin the (empty) storage at ``offset``."""

    @abc.abstractmethod
    def _checkpoint_high_watermark(self) -> None:
        """Make the high watermark survive a restart, if anything of the log does."""

    @abc.abstractmethod
    def _high_watermark_moved(self) -> None:
        """Replication set the high watermark (to checkpoint it now and then)."""

    @abc.abstractmethod
    def _epochs_forgotten(self, newer: list[tuple[int, int]], epoch: int) -> None:
        """``newer`` epochs, begun at the log end with no data, are forgotten for ``epoch``."""

    @abc.abstractmethod
    def _epoch_refused(self, epoch: int, newer: int, start: int) -> LogError:
        """The error for ``epoch`` given while the log holds data of epoch ``newer`` from ``start`` on."""

    # ---- the shared logic ------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abc.abstractmethod
    def close(self) -> None: ...

    @property
    def log_start_offset(self) -> int:
        """The first offset still stored (messages below it were deleted by retention): where the
        oldest unit begins."""
        return self._bases[0]

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended message will get: where the active unit ends."""
        return self._active.next_offset

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
            self._high_watermark_moved()

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
        """Stamp appends from now on with ``epoch``, which starts at the log end offset.

        Epochs only grow; assigning the current one again does nothing.
        An epoch older than the latest one is refused (``LogError``) -- unless
        the newer ones began at the log end and hold no data: those are
        forgotten (a file log warns: a damaged checkpoint named them; nothing
        was written in them).
        """
        with self._lock:
            self._check_open()
            check_offset_arg("epoch", epoch)
            end = self.log_end_offset
            newer = [(e, start) for e, start in self._epochs.entries if e > epoch]
            if newer and all(start >= end for _, start in newer):
                self._epochs_forgotten(newer, epoch)
                self._epochs.truncate_from_end(end)
            elif newer:
                e, start = next((e, start) for e, start in newer if start < end)
                raise self._epoch_refused(epoch, e, start)
            self._epochs.assign(epoch, end)

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        """Largest known epoch <= ``epoch`` and one past its last offset (Kafka's OffsetForLeaderEpoch)."""
        with self._lock:
            return self._epochs.end_offset_for(epoch, self.log_end_offset)

    # ---- appending -------------------------------------------------------------

    def append(self, records: Records, *, typed: TypedValues | None = None) -> range:
        """Append messages and return the offsets they were given.

        ``records`` is an Arrow ``RecordBatch`` or ``Table`` with a ``value``
        column and any of the other input columns of the log schema, or an
        iterable of :class:`~broker_node.log.append_input.Record`.  The messages
        are written as one batch, stamped with the current leader epoch and
        one timestamp: the current time, or the previous batch's if the clock
        went back, so timestamps never decrease along the log.

        Raises ``InvalidRecordsError`` for empty or malformed input and
        ``RecordTooLargeError`` for a message over ``max_message_bytes`` or a
        batch over ``max_batch_bytes``; the log is unchanged then.

        ``typed``: a typed stream's values parsed, one row per message, stored
        in the same frame (see :mod:`.typed_frames`); they count against
        ``max_batch_bytes`` with the rest of the frame.
        """
        offsets = self._append(records, typed, wait=True)
        assert offsets is not None  # a waiting append stores or raises
        return offsets

    def try_append(self, records: Records, *, typed: TypedValues | None = None) -> range | None:
        """:meth:`append`, or ``None`` at once, appending nothing, if another call holds the log
        (a compaction, say): a caller on an event loop then appends from a worker thread."""
        return self._append(records, typed, wait=False)

    def _append(self, records: Records, typed: TypedValues | None, *, wait: bool) -> range | None:
        if typed is None and (one := _one_plain(records)) is not None:
            return self._append_one(one, wait)
        inputs = to_input_columns(records, self.config.max_message_bytes)
        if typed is not None and typed.batch.num_rows != len(inputs[0]):
            raise InvalidRecordsError(
                f"typed columns of {typed.batch.num_rows} rows cannot be stored with "
                f"{len(inputs[0])} messages"
            )
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            self._check_open()
            base = self.log_end_offset
            count = len(inputs[0])
            now = max(int(self._clock() * 1_000_000), self._last_timestamp)
            epoch = self.leader_epoch
            batch = pa.RecordBatch.from_arrays(
                [
                    self._offsets(base, count),
                    constant_ints(now, count, TIMESTAMP_TYPE),
                    constant_ints(epoch, count, pa.int32()),
                    *inputs,
                ],
                schema=LOG_SCHEMA,
            )
            frame = encode_typed_frame(batch, typed, self.config.compression)
            return self._store_frame(frame, base, count, now, epoch)
        finally:
            self._lock.release()

    def _append_one(self, record: Record, wait: bool) -> range | None:
        """:meth:`append` of one plain message, its frame written from a prepared shape (see
        :mod:`.one_frame`); the caller checked that it is one."""
        size = record_size(record)
        if size > self.config.max_message_bytes:
            raise RecordTooLargeError(
                f"message 0 of the batch is {size} bytes, over max_message_bytes="
                f"{self.config.max_message_bytes}",
                size=size,
                limit=self.config.max_message_bytes,
            )
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            self._check_open()
            base = self.log_end_offset
            now = max(int(self._clock() * 1_000_000), self._last_timestamp)
            epoch = self.leader_epoch
            frame = pa.py_buffer(_ONE_FRAMES.frame(base, now, epoch, record))
            return self._store_frame(frame, base, 1, now, epoch)
        finally:
            self._lock.release()

    def _store_frame(self, frame: pa.Buffer, base: int, count: int, now: int, epoch: int) -> range:
        """Store an appended batch's frame (the caller holds the lock); its offsets."""
        if frame.size > self.config.max_batch_bytes:
            raise RecordTooLargeError(
                f"batch of {count} messages is {frame.size} bytes stored, over "
                f"max_batch_bytes={self.config.max_batch_bytes}",
                size=frame.size,
                limit=self.config.max_batch_bytes,
            )
        last = base + count - 1
        self._maybe_roll(frame.size, last, now)
        active = self._active
        entry = BatchEntry(base, last, active.size, frame.size, crc32(frame), epoch, count, now)
        fsync = self._fsync_due()
        active.append(frame, entry, fsync=fsync)
        self._unsynced = not fsync
        if self._epochs.latest_epoch is None:
            self._epochs.assign(epoch, base)
        self._last_timestamp = now
        self._grown.notify_all()
        return range(base, last + 1)

    def _offsets(self, base: int, count: int) -> pa.Array:
        if count <= 64:  # cheaper than a compute call for the one-message path
            return pa.Array.from_buffers(
                pa.int64(), count, [None, pa.py_buffer(array("q", range(base, base + count)))]
            )
        if len(self._iota) < count:
            self._iota = pa.array(array("q", range(max(count, 2 * len(self._iota)))), pa.int64())
        return pc.add(self._iota.slice(0, count), pa.scalar(base, pa.int64()))

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

    # ---- truncation ------------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every message at and after ``offset``; the log end offset becomes ``offset``.

        Used by replication to drop a diverged tail.  An offset past the log
        end offset changes nothing; at the log end offset only leader epochs
        that began there (and hold no data) are forgotten; one below the log
        start offset raises ``OffsetOutOfRangeError``.  The high watermark and
        leader-epoch cache are cut back with it.  A file log rewrites the
        segment cut in two from its batches below ``offset``: a damaged one
        among them raises ``CorruptSegmentError`` and leaves the log as it was.
        """
        check_offset_arg("offset", offset)
        with self._lock:
            self._check_open()
            if offset >= self.log_end_offset:
                if offset == self.log_end_offset:
                    # A leadership that wrote nothing: the new leader's batches of an
                    # older epoch must be able to follow.
                    self._epochs.truncate_from_end(offset)
                return
            if offset < self.log_start_offset:
                raise OffsetOutOfRangeError(
                    offset, log_start_offset=self.log_start_offset, log_end_offset=self.log_end_offset
                )
            self._cut(offset)
            self._epochs.truncate_from_end(offset)
            self._high_watermark = min(self._high_watermark, offset)
            self._checkpoint_high_watermark()
            self._grown.notify_all()

    def reset_to(self, offset: int) -> None:
        """Remove everything and start empty at ``offset`` (log start = log end = HW = ``offset``).

        For a replica whose data a leader no longer has (its log starts
        later): the replica starts over at the leader's log start offset.
        """
        check_offset("offset", offset)
        with self._lock:
            self._check_open()
            self._start_empty_at(offset)
            self._epochs.truncate_from_end(0)
            self._high_watermark = offset
            self._checkpoint_high_watermark()
            self._last_timestamp = 0
            self._grown.notify_all()


_ONE_FRAMES = OneFrames()
"""The prepared shapes of one-message batches, shared by every log (their frames depend on the
message only)."""


def _one_plain(records: Records) -> Record | None:
    """The message, if ``records`` is one plain message whose frame :mod:`.one_frame` writes: a
    list or tuple of one :class:`Record` without headers or producer, of the types the log schema
    takes, and small enough that no compression applies (see ``COMPRESS_MIN_BYTES``)."""
    if type(records) not in (list, tuple) or len(records) != 1:  # type: ignore[arg-type]
        return None
    record = records[0]  # type: ignore[index]
    if type(record) is not Record or record.headers or record.producer_id is not None:
        return None
    if record.sequence is not None:
        return None
    key, value, subject, reply = record.key, record.value, record.subject, record.reply
    if not (
        (value is None or type(value) is bytes)
        and (key is None or type(key) is bytes)
        and (subject is None or type(subject) is str)
        and (reply is None or type(reply) is str)
    ):
        return None  # the general path names what does not fit
    size = len(value or b"") + len(key or b"") + len(subject or "") * 4 + len(reply or "") * 4
    if size + 512 >= COMPRESS_MIN_BYTES:
        return None
    return record
