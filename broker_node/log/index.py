"""The offset index and time index beside each segment.

Both are flat files of fixed-size little-endian entries, one entry per stored
batch, in batch order, with no header (their format version is the segment's).

Offset index, ``<base>.index``, 32 bytes per entry::

    u32  relative base offset   first offset in the batch - segment base offset
    u32  relative last offset   last offset in the batch - segment base offset
    u64  position               byte position of the batch frame in the segment
    u32  size                   byte length of the batch frame
    u32  crc32                  CRC-32 (zlib's polynomial and value) of the whole
                                frame: all ``size`` bytes
    i32  leader epoch           epoch every row of the batch was written in
    u32  record count           rows in the batch (fewer than last - base + 1
                                after compaction left gaps)

Time index, ``<base>.timeindex``, 16 bytes per entry::

    i64  max timestamp          newest timestamp in the batch, microseconds UTC
    u32  relative base offset   same as the offset index entry
    u32  padding                zero

Entry *i* of both files describes batch *i*.  A batch is complete once its
frame and both entries are written, in that order; anything past the last
complete batch was never acknowledged and is discarded on recovery.  Both
files can be rebuilt from the segment.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass

from zlib_ng import zlib_ng

crc32 = zlib_ng.crc32
"""CRC-32 with zlib's polynomial and values.  zlib-ng computes it several times
faster than zlib, and reads verify every batch they serve, so the checksum
bounds read throughput."""

OFFSET_ENTRY = struct.Struct("<IIQIIiI")
TIME_ENTRY = struct.Struct("<qI4x")
MAX_RELATIVE_OFFSET = 2**32 - 1


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """One stored batch, as both index files describe it (absolute offsets)."""

    base_offset: int
    last_offset: int
    position: int
    size: int
    crc: int
    leader_epoch: int
    record_count: int
    max_timestamp: int


class SegmentIndex:
    """In-memory copy of a segment's two index files, as parallel columns.

    Columns are ``array`` objects so a segment with many batches costs a few
    bytes per batch and ``bisect`` works on them directly.
    """

    def __init__(self, segment_base: int) -> None:
        self.segment_base = segment_base
        self.bases = array("q")
        self.lasts = array("q")
        self.positions = array("q")
        self.sizes = array("q")
        self.crcs = array("L")
        self.epochs = array("l")
        self.counts = array("q")
        self.max_timestamps = array("q")

    def __len__(self) -> int:
        return len(self.bases)

    def add(self, entry: BatchEntry) -> None:
        """Append one batch's entry to the in-memory columns."""
        # ``bases`` last: its length is the entry count, so a reader that checks
        # the length first never sees a half-added entry.
        self.lasts.append(entry.last_offset)
        self.positions.append(entry.position)
        self.sizes.append(entry.size)
        self.crcs.append(entry.crc)
        self.epochs.append(entry.leader_epoch)
        self.counts.append(entry.record_count)
        self.max_timestamps.append(entry.max_timestamp)
        self.bases.append(entry.base_offset)

    def end(self, empty: int) -> int:
        """Byte position just past the last batch, or ``empty`` when there is none."""
        return self.positions[-1] + self.sizes[-1] if len(self.bases) else empty

    def entry(self, i: int) -> BatchEntry:
        """Return batch ``i``'s entry."""
        return BatchEntry(
            self.bases[i],
            self.lasts[i],
            self.positions[i],
            self.sizes[i],
            self.crcs[i],
            self.epochs[i],
            self.counts[i],
            self.max_timestamps[i],
        )

    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` entries."""
        for column in self._columns():
            del column[n:]

    def _columns(self) -> tuple[array, ...]:
        return (
            self.bases,
            self.lasts,
            self.positions,
            self.sizes,
            self.crcs,
            self.epochs,
            self.counts,
            self.max_timestamps,
        )

    def encode_offset_entry(self, entry: BatchEntry) -> bytes:
        """Bytes of ``entry`` in the offset index layout."""
        return OFFSET_ENTRY.pack(
            entry.base_offset - self.segment_base,
            entry.last_offset - self.segment_base,
            entry.position,
            entry.size,
            entry.crc,
            entry.leader_epoch,
            entry.record_count,
        )

    def encode_time_entry(self, entry: BatchEntry) -> bytes:
        """Bytes of ``entry`` in the time index layout."""
        return TIME_ENTRY.pack(entry.max_timestamp, entry.base_offset - self.segment_base)

    def encode(self) -> tuple[bytes, bytes]:
        """Both index files' whole contents."""
        entries = [self.entry(i) for i in range(len(self))]
        return (
            b"".join(self.encode_offset_entry(e) for e in entries),
            b"".join(self.encode_time_entry(e) for e in entries),
        )


def decode_index(
    segment_base: int, offset_bytes: bytes, time_bytes: bytes, first_position: int
) -> tuple[SegmentIndex, bool]:
    """Decode index files into a :class:`SegmentIndex`.

    Returns the index of the longest prefix of batches that both files
    describe consistently, and whether that prefix is the whole story:
    ``False`` means the files contradict themselves (not merely end early)
    and the index should be rebuilt from the segment.  A torn last entry
    (a file length that is not a whole number of entries) and one file
    being an entry ahead of the other are normal after a crash and only
    shorten the prefix.
    """
    index = SegmentIndex(segment_base)
    n_offset = len(offset_bytes) // OFFSET_ENTRY.size
    n_time = len(time_bytes) // TIME_ENTRY.size
    position = first_position
    previous_last = segment_base - 1
    previous_ts = None
    for i in range(min(n_offset, n_time)):
        rel_base, rel_last, pos, size, crc, epoch, count = OFFSET_ENTRY.unpack_from(
            offset_bytes, i * OFFSET_ENTRY.size
        )
        max_ts, time_rel_base = TIME_ENTRY.unpack_from(time_bytes, i * TIME_ENTRY.size)
        base, last = segment_base + rel_base, segment_base + rel_last
        consistent = (
            pos == position
            and size > 0
            and base > previous_last
            and last >= base
            and 1 <= count <= last - base + 1
            and time_rel_base == rel_base
            and (previous_ts is None or max_ts >= previous_ts)
        )
        if not consistent:
            return index, False
        index.add(BatchEntry(base, last, pos, size, crc, epoch, count, max_ts))
        position += size
        previous_last = last
        previous_ts = max_ts
    return index, True
