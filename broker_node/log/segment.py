"""One segment of a partition's log: an Arrow IPC stream file and its indexes.

On-disk layout (format version 1)
=================================

``<base>.arrows`` -- ``<base>`` is the segment's base offset (the offset of its
first message) zero-padded to 20 digits.  The file is an Arrow IPC *stream*
(the encapsulated message format, without the end-of-stream marker while the
segment may still grow), so any Arrow reader can open it:

* a schema message: :data:`~pyspark_jetstream.protocol.schema.LOG_SCHEMA` with
  the schema-level metadata ``jetstream.format_version`` (``"1"``) and
  ``jetstream.base_offset`` (the base offset in decimal).  Being a pure
  function of the base offset, it is rewritten if found damaged;
* one record-batch message ("frame") per appended batch, each::

      u32  0xFFFFFFFF            continuation marker
      i32  metadata length M     (a multiple of 8)
      M    flatbuffer Message    (RecordBatch header), padded
      B    body                  column buffers, 8-byte aligned

  The body's buffers may be compressed (Arrow IPC ``BodyCompression``,
  LZ4_FRAME or ZSTD, recorded in the frame's own header) when the stream's
  ``compression`` setting asked for it at the time of writing; batches of
  less than :data:`COMPRESS_MIN_BYTES` are always written plain.  Frames of
  different codecs may sit in one segment; readers need no setting to read them.
  Offsets increase strictly within and across frames; after compaction they
  may have gaps.  Every row of a frame has the same leader epoch.

``<base>.index`` and ``<base>.timeindex`` describe each frame (see
:mod:`broker_node.log.index`); the CRC-32 in the offset index covers every
byte of the frame, continuation marker included.

Integrity
---------
A frame is verified before it is first served: its CRC, then its decoded first
and last offsets and row count against its index entry (see :mod:`.frames`).
On open, the active (last) segment is verified completely against its CRCs (its
last frame also against its offsets, as it sets the log end offset): a torn or
corrupt tail is cut back to the last good frame.  Closed segments are not read
at open -- that would cost reading every byte of the log -- only checked for
structure: their index must describe the whole file, and their offsets must stay
below the next segment's base.  A closed segment that fails this is re-indexed
by parsing its frames, resynchronising past damaged bytes.  Opening a segment
from disk, with these checks and repairs, is :mod:`.segment_recovery`'s.

Damage is kept per batch (:attr:`Segment.damage`) and never makes more than the
damaged batch unreadable: a read of it raises
:class:`~broker_node.log.errors.CorruptSegmentError` naming the file and the
offset range, other batches are served.  Offsets that no readable frame holds
(bytes that resynchronisation skipped, the lost end of a file) get a
placeholder entry covering them, in memory only, which reads the same way.  An
index rebuilt from the segment takes its checksums from the data as found after
a structural check (every frame decodes and validates, offsets increase),
because the checksum lives in the index; it is written back only when the
segment turned out whole, so damaged data stays as found until a repair
rewrites it.

Segments are rewritten (truncation, compaction, repair) by writing a new file and
renaming it over the old one, data file first: readers holding batches of the
old file keep a valid memory map of it, and a crash between the renames
leaves an index that disagrees with its segment and is rebuilt.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

from broker_node.durable import fsync_dir
from pyspark_jetstream.protocol.schema import COMPRESSIONS, FORMAT_VERSION, LOG_SCHEMA

from .errors import CorruptSegmentError, LogStorageError
from .frames import batch_bounds, decode, mismatch
from .index import OFFSET_ENTRY, TIME_ENTRY, BatchEntry, SegmentIndex, crc32
from .logging_labels import NO_LABELS, Labels

logger = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".arrows"
OFFSET_INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TEMP_SUFFIX = ".tmp"


RECENT_FRAMES = 16
RECENT_BYTES = 256 * 1024
"""How many of its newest frames (and bytes) the active segment keeps in memory."""

COMPRESS_MIN_BYTES = 16 * 1024
"""Batches smaller than this (uncompressed) are stored plain: too little to gain."""

_WRITE_OPTIONS = {
    codec: pa.ipc.IpcWriteOptions(compression=codec, use_threads=False)
    for codec in COMPRESSIONS
    if codec != "none"
}
_SCHEMA_MESSAGE_SIZE = LOG_SCHEMA.serialize().size


def encode_frame(batch: pa.RecordBatch, compression: str = "none") -> pa.Buffer:
    """The frame (encapsulated IPC record-batch message) that stores ``batch``.

    ``compression`` is ``none``, ``lz4`` or ``zstd``; small batches stay plain.
    """
    if compression == "none" or batch.get_total_buffer_size() < COMPRESS_MIN_BYTES:
        return batch.serialize()
    # RecordBatch.serialize takes no IPC options: write a one-batch stream and
    # keep its record-batch message, which follows the schema message.
    sink = pa.BufferOutputStream()
    writer = pa.ipc.new_stream(sink, LOG_SCHEMA, options=_WRITE_OPTIONS[compression])
    writer.write_batch(batch)
    return sink.getvalue().slice(_SCHEMA_MESSAGE_SIZE)


def segment_name(base_offset: int) -> str:
    """File stem of the segment starting at ``base_offset``."""
    return f"{base_offset:020d}"


def header_bytes(base_offset: int) -> bytes:
    """The schema message every segment starting at ``base_offset`` begins with."""
    schema = LOG_SCHEMA.with_metadata(
        {
            "jetstream.format_version": str(FORMAT_VERSION),
            "jetstream.base_offset": str(base_offset),
        }
    )
    return schema.serialize().to_pybytes()


def _write_all(f: BinaryIO, data: bytes | pa.Buffer) -> None:
    written = f.write(data)
    if written != len(data):  # a short write: rare, but allowed by write(2)
        view = memoryview(data)[written:]
        while view:
            view = view[f.write(view) :]


class Segment:
    """A segment file with its in-memory index; the last one of a log is writable."""

    def __init__(
        self, directory: Path, base_offset: int, index: SegmentIndex, size: int, labels: Labels = NO_LABELS
    ) -> None:
        self.directory = directory
        self.labels = labels
        """Whose segment it is, for its log lines (see :mod:`.logging_labels`)."""
        self.base_offset = base_offset
        self.index = index
        self.size = size
        """Bytes in the data file, header included."""
        self.damage: dict[int, str] = {}
        """Batches known to be damaged, by batch number: what was found wrong."""
        stem = directory / segment_name(base_offset)
        self.path = stem.with_suffix(SEGMENT_SUFFIX)
        self.offset_index_path = stem.with_suffix(OFFSET_INDEX_SUFFIX)
        self.time_index_path = stem.with_suffix(TIME_INDEX_SUFFIX)
        self._verified = bytearray(len(index))
        self._recent: dict[int, pa.Buffer] = {}
        """The frames last appended, by batch number: a consumer at the end of the
        log reads them from memory instead of re-mapping the growing file."""
        self._recent_bytes = 0
        self._map: pa.MemoryMappedFile | None = None
        self._view: pa.Buffer | None = None
        self._files: tuple[BinaryIO, BinaryIO, BinaryIO] | None = None

    # ---- creation (opening one from disk: :mod:`.segment_recovery`) ----------------

    @classmethod
    def create(cls, directory: Path, base_offset: int, *, sync: bool = True) -> Segment:
        """Create an empty, writable segment starting at ``base_offset`` (set its :attr:`labels`);
        without ``sync`` the caller owes the directory's fsync."""
        header = header_bytes(base_offset)
        segment = cls(directory, base_offset, SegmentIndex(base_offset), len(header))
        with open(segment.path, "wb") as f:
            f.write(header)
        for path in (segment.offset_index_path, segment.time_index_path):
            path.write_bytes(b"")
        if sync:
            fsync_dir(directory)
        segment.open_for_append()
        return segment

    def _set_index(
        self, index: SegmentIndex, size: int, *, verified: bool = False, damage: dict[int, str] | None = None
    ) -> None:
        self.index = index
        self.size = size
        self.damage = damage or {}
        self._verified = bytearray([1 if verified else 0]) * len(index)
        for i in self.damage:
            self._verified[i] = 0  # never served: reads of it raise
        self._forget_recent()

    def _remember(self, i: int, frame: pa.Buffer) -> None:
        self._recent[i] = frame
        self._recent_bytes += frame.size
        while len(self._recent) > RECENT_FRAMES or self._recent_bytes > RECENT_BYTES:
            oldest = next(iter(self._recent))
            self._recent_bytes -= self._recent.pop(oldest).size

    def _forget_recent(self) -> None:
        self._recent.clear()
        self._recent_bytes = 0

    def _write_index_files(self) -> None:
        self._write_index_temps(self.index)
        self._install_index_temps()

    def _index_temps(self) -> tuple[Path, Path]:
        return (
            self.offset_index_path.with_name(self.offset_index_path.name + TEMP_SUFFIX),
            self.time_index_path.with_name(self.time_index_path.name + TEMP_SUFFIX),
        )

    def _write_index_temps(self, index: SegmentIndex) -> None:
        for tmp, data in zip(self._index_temps(), index.encode(), strict=True):
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(self.directory)

    def _install_index_temps(self) -> None:
        for tmp, path in zip(
            self._index_temps(), (self.offset_index_path, self.time_index_path), strict=True
        ):
            os.replace(tmp, path)
        fsync_dir(self.directory)

    # ---- properties ------------------------------------------------------------

    @property
    def _log(self) -> logging.LoggerAdapter[logging.Logger]:
        return self.labels.bind(logger)

    @property
    def next_offset(self) -> int:
        """One past the last offset stored here (the base offset when empty)."""
        return self.next_offset_of(self.index)

    def next_offset_of(self, index: SegmentIndex) -> int:
        """One past the last offset ``index`` describes (the base offset when empty)."""
        return index.lasts[-1] + 1 if len(index) else self.base_offset

    @property
    def record_count(self) -> int:
        """Messages stored in this segment."""
        return sum(self.index.counts)

    @property
    def max_timestamp(self) -> int | None:
        """Newest timestamp in the segment, in microseconds, or ``None`` when empty."""
        return self.index.max_timestamps[-1] if len(self.index) else None

    @property
    def writable(self) -> bool:
        """Whether this is the log's active segment, open for appends."""
        return self._files is not None

    # ---- writing ---------------------------------------------------------------

    def open_for_append(self) -> None:
        """Open the data and index files for appending."""
        if self._files is None:
            # Held open for the segment's life and closed by seal().
            data, offsets, times = (
                open(p, "ab", buffering=0)  # noqa: SIM115
                for p in (self.path, self.offset_index_path, self.time_index_path)
            )
            self._files = (data, offsets, times)

    def append(self, frame: pa.Buffer, entry: BatchEntry, *, fsync: bool = False) -> None:
        """Write one frame and its index entries; ``entry.position`` must equal ``size``.

        With ``fsync``, the files are forced to disk before the entry counts.
        On failure (disk full, ...) the files are cut back, so a failed append
        leaves no trace, and ``LogStorageError`` is raised.
        """
        if self._files is None or entry.position != self.size:
            raise LogStorageError(
                f"append to {self.path} at byte {entry.position}, but it is sealed or at {self.size}"
            )
        data, offset_index, time_index = self._files
        n = len(self.index)
        try:
            _write_all(data, frame)
            _write_all(offset_index, self.index.encode_offset_entry(entry))
            _write_all(time_index, self.index.encode_time_entry(entry))
            if fsync:
                self.fsync()
        except OSError as exc:
            try:
                for f, length in (
                    (data, self.size),
                    (offset_index, n * OFFSET_ENTRY.size),
                    (time_index, n * TIME_ENTRY.size),
                ):
                    f.truncate(length)
            except OSError:
                self._log.exception("cannot cut %s back after a failed append; sealing it", self.path)
                self.seal()
            raise LogStorageError(f"cannot append to {self.path}: {exc}") from exc
        self.index.add(entry)
        self._verified.append(1)
        self.size += entry.size
        self._remember(n, frame)

    @property
    def paths(self) -> tuple[Path, Path, Path]:
        """The data file and its two index files."""
        return (self.path, self.offset_index_path, self.time_index_path)

    def fsync(self) -> None:
        """Force the data and index files to disk."""
        if self._files is not None:
            for f in self._files:
                os.fsync(f.fileno())

    def seal(self) -> None:
        """Stop appending: this segment is now closed.

        Every file is closed even if closing one fails; the first failure is raised after.
        """
        self._forget_recent()
        if self._files is not None:
            files, self._files = self._files, None
            failure = None
            for f in files:
                try:
                    f.close()
                except OSError as exc:
                    failure = failure or exc
            if failure is not None:
                raise failure

    def close(self) -> None:
        """Release files and memory maps (batches already handed out stay valid)."""
        try:
            self.seal()
        finally:
            self._drop_map()

    def delete(self) -> None:
        """Close and remove the segment's files."""
        self.close()
        for path in (self.path, self.offset_index_path, self.time_index_path):
            path.unlink(missing_ok=True)

    def cut(self, keep: int) -> None:
        """Keep only the first ``keep`` batches; stay writable.

        For truncation at a batch boundary.  The data file is replaced by a
        copy of what it keeps, not cut in place: a reader may still hold
        buffers of the old file's mapped pages (a replication stream sending
        the newest frames, a follower's recent frames), and reading a page cut
        off a mapped file kills the process (SIGBUS).  The old file lives on,
        unnamed, until its last buffer goes.  Crash-safe as an append is: the
        data file is replaced first, and recovery of the active segment drops
        index entries past the end of its data (a leftover copy is removed
        when the log opens).
        """
        index = self.index
        end = index.positions[keep] if keep < len(index) else self.size
        self.seal()
        self._drop_map()
        copy = self.path.with_name(self.path.name + TEMP_SUFFIX)
        try:
            with open(self.path, "rb") as source, open(copy, "wb") as target:
                copied = 0
                while copied < end:
                    n = os.copy_file_range(source.fileno(), target.fileno(), end - copied, copied, copied)
                    if n == 0:
                        raise OSError(f"it ended at {copied} bytes")
                    copied += n
                target.flush()
                os.fsync(target.fileno())
            os.replace(copy, self.path)
        except OSError as exc:  # a full disk, say: the segment stays whole and writable
            copy.unlink(missing_ok=True)
            self.open_for_append()
            raise LogStorageError(f"cannot cut {self.path} to {end} bytes: {exc}") from exc
        fsync_dir(self.path.parent)
        for path, length in (
            (self.offset_index_path, keep * OFFSET_ENTRY.size),
            (self.time_index_path, keep * TIME_ENTRY.size),
        ):
            with open(path, "r+b") as f:
                f.truncate(length)
                f.flush()
                os.fsync(f.fileno())
        index.truncate(keep)
        del self._verified[keep:]
        self.damage = {i: detail for i, detail in self.damage.items() if i < keep}
        self.size = end
        self.open_for_append()

    def rewrite(self, batches: Iterable[pa.RecordBatch | pa.Buffer], compression: str = "none") -> None:
        """Replace the segment's contents with ``batches`` (log schema, offsets in order).

        Batches are stored with ``compression`` (see :func:`encode_frame`); a
        stored frame (a ``pyarrow.Buffer``, as :meth:`frame` returns) is written
        as it is, typed columns and all.

        Crash-safe: the new data file and both new index files are written
        and fsynced under temporary names, then the data file is renamed over
        the old one, then the index files.  A crash after the data rename
        leaves the new index files beside it, and opening it adopts them
        (:func:`.segment_recovery.open_segment`).
        Empty batches are skipped.
        """
        writable = self.writable
        self.seal()
        try:
            header = header_bytes(self.base_offset)
            index = SegmentIndex(self.base_offset)
            tmp = self.path.with_name(self.path.name + TEMP_SUFFIX)
            with open(tmp, "wb") as f:
                f.write(header)
                position = len(header)
                for item in batches:
                    if isinstance(item, pa.Buffer):
                        frame, batch = item, decode(item)
                    else:
                        frame, batch = None, item
                    if batch.num_rows == 0:
                        continue
                    if frame is None:
                        frame = encode_frame(batch, compression)
                    base, last, epoch, max_ts = batch_bounds(batch)
                    f.write(frame)
                    index.add(
                        BatchEntry(
                            base, last, position, frame.size, crc32(frame), epoch, batch.num_rows, max_ts
                        )
                    )
                    position += frame.size
                f.flush()
                os.fsync(f.fileno())
            self._write_index_temps(index)
            os.replace(tmp, self.path)
            self._drop_map()
            self._set_index(index, position, verified=True)
            self._install_index_temps()
        finally:
            if writable:
                self.open_for_append()

    # ---- reading ---------------------------------------------------------------

    def find(self, offset: int) -> int:
        """Index of the first batch whose last offset is >= ``offset`` (may be ``len``)."""
        return bisect.bisect_left(self.index.lasts, offset)

    def unverified(self) -> list[int]:
        """Batches not yet checked against their index entry (nor known damaged)."""
        return [i for i, done in enumerate(self._verified) if not done and i not in self.damage]

    def frame(self, i: int) -> pa.Buffer:
        """The stored bytes of batch ``i`` (checked as :meth:`batch` checks them), for replicas."""
        if not self._verified[i]:
            self._first_read(i)
        frame = self._recent.get(i)
        if frame is None:
            position, size = self.index.positions[i], self.index.sizes[i]
            frame = self._buffer(position + size).slice(position, size)
        return frame

    def batch(self, i: int) -> pa.RecordBatch:
        """Batch ``i``, checked against its index entry once (see the module docstring).

        Memory-mapped (no copy), or one of the newest frames kept in memory;
        a frame stored compressed is decompressed.  A damaged batch raises
        ``CorruptSegmentError`` naming its offset range, and is remembered in
        :attr:`damage`.
        """
        if not self._verified[i]:
            return self._first_read(i)
        frame = self._recent.get(i)
        if frame is None:
            position, size = self.index.positions[i], self.index.sizes[i]
            frame = self._buffer(position + size).slice(position, size)
        try:
            return decode(frame)
        except (pa.ArrowException, ValueError) as exc:
            raise self._damaged(i, str(exc)) from exc

    def _first_read(self, i: int) -> pa.RecordBatch:
        index = self.index
        if i in self.damage:
            raise self._damaged(i, self.damage[i])
        position, size = index.positions[i], index.sizes[i]
        frame = self._recent.get(i)
        if frame is None:
            if position + size > self.size:
                raise self._damaged(i, f"the batch ends at byte {position + size}, past the end of the file")
            frame = self._buffer(position + size).slice(position, size)
        crc = crc32(frame)
        if crc != index.crcs[i]:
            raise self._damaged(i, f"checksum {crc:#010x} does not match the index ({index.crcs[i]:#010x})")
        try:
            batch = decode(frame)
        except (pa.ArrowException, ValueError) as exc:
            raise self._damaged(i, str(exc)) from exc
        wrong = mismatch(batch, index.bases[i], index.lasts[i], index.counts[i])
        if wrong is not None:
            raise self._damaged(i, wrong)
        self._verified[i] = 1
        return batch

    def _damaged(self, i: int, detail: str) -> CorruptSegmentError:
        """Remember batch ``i`` as damaged; the error to raise for it."""
        if i not in self.damage:
            self.damage[i] = detail
            self._log.error(
                "segment %s: offsets %d to %d cannot be read: %s",
                self.path,
                self.index.bases[i],
                self.index.lasts[i],
                detail,
            )
        return CorruptSegmentError(str(self.path), self.index.bases[i], self.index.lasts[i], detail)

    def _buffer(self, end: int) -> pa.Buffer:
        """A zero-copy view of the data file covering at least ``end`` bytes."""
        if self._view is None or self._view.size < end:
            self._drop_map()
            self._map = pa.memory_map(str(self.path))
            self._view = self._map.read_buffer(self._map.size())
        return self._view

    def _drop_map(self) -> None:
        if self._map is not None:
            self._map.close()
        self._map = None
        self._view = None
