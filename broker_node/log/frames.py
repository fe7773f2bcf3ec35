"""Reading a segment's frames back from its bytes: decode, check, and index them by parsing.

The frame layout is in :mod:`.segment`.  Two uses:

* a batch read for the first time is checked against its index entry: its
  checksum (done by the segment), and then that the decoded first and last
  offsets and row count are the ones the entry claims.  The CRC covers only
  the frame, not the index fields, so an index entry could otherwise move or
  widen a batch's offset range without any checksum failing;
* a segment whose index is lost or wrong is re-indexed by parsing its frames
  (:func:`scan`).  For the active segment the scan stops at the first bad
  frame (what follows was never acknowledged).  For a closed segment it
  *resynchronises*: it searches the following bytes for the next continuation
  marker (``0xFFFFFFFF``) that starts a frame which decodes, validates, and
  holds offsets after the last good frame and below the segment's limit.  The
  offsets between the two good frames are recorded as one damaged range, and
  everything after stays readable.  A false resynchronisation point (a
  continuation marker inside some value) would have to pass a full Arrow
  validation and the offset checks (increasing, after the last good frame,
  below the limit), so it is not a practical concern.
"""

from __future__ import annotations

import itertools
import logging
import struct
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_jetstream.protocol.schema import LOG_SCHEMA

from .index import BatchEntry, SegmentIndex, crc32

logger = logging.getLogger(__name__)

CONTINUATION = 0xFFFFFFFF
_MARKER = struct.pack("<I", CONTINUATION)
SMALL_BATCH = 64
"""Rows up to which :func:`replicated_entry` checks a batch in Python rather than with Arrow compute."""


def batch_bounds(batch: pa.RecordBatch) -> tuple[int, int, int, int]:
    """``(base offset, last offset, leader epoch, max timestamp in µs)`` of a stored batch."""
    offsets = batch.column(0)
    timestamps = batch.column(1).cast(pa.int64())
    return (
        offsets[0].as_py(),
        offsets[-1].as_py(),
        batch.column(2)[0].as_py(),
        pc.max(timestamps).as_py(),
    )


def decode(frame: pa.Buffer) -> pa.RecordBatch:
    """The batch a frame holds (zero-copy unless stored compressed)."""
    return pa.ipc.read_record_batch(pa.ipc.read_message(frame), LOG_SCHEMA)


def mismatch(batch: pa.RecordBatch, base: int, last: int, count: int) -> str | None:
    """Why ``batch`` is not the batch an index entry describes, or ``None`` if it is."""
    offsets = batch.column(0)
    found = (offsets[0].as_py(), offsets[-1].as_py(), batch.num_rows) if len(offsets) else (None, None, 0)
    if found == (base, last, count):
        return None
    return (
        f"the batch holds offsets {found[0]} to {found[1]} in {found[2]} rows, but the index "
        f"says {base} to {last} in {count}"
    )


def parse_frame(view: pa.Buffer, position: int, previous_last: int, limit: int | None) -> BatchEntry | None:
    """Decode and validate the frame at ``position``; ``None`` if it is not a sound frame.

    Sound: a record batch in the log schema that validates fully, with
    strictly increasing offsets after ``previous_last`` and below ``limit``
    (when given), and one leader epoch.
    """
    if position + 8 > view.size:
        return None
    continuation, metadata_size = struct.unpack_from("<Ii", view, position)
    if continuation != CONTINUATION or metadata_size <= 0 or metadata_size % 8:
        return None
    # Anything may be in a damaged file, and Arrow reports bad bytes in several ways.
    try:
        message = pa.ipc.read_message(view.slice(position))
        size = 8 + metadata_size + message.body.size
        if message.type != "record batch" or position + size > view.size:
            return None
        batch = pa.ipc.read_record_batch(message, LOG_SCHEMA)
        batch.validate(full=True)
        bounds = sound_bounds(batch)
    except Exception as exc:  # noqa: BLE001 - any decoding failure means "not a frame"
        logger.debug("no valid frame at byte %d: %s", position, exc)
        return None
    if bounds is None:
        return None
    base, last, epoch, max_ts = bounds
    if base <= previous_last:
        return None
    if limit is not None and last >= limit:
        return None
    crc = crc32(view.slice(position, size))
    return BatchEntry(base, last, position, size, crc, epoch, batch.num_rows, max_ts)


def replicated_entry(frame: pa.Buffer, previous_last: int) -> BatchEntry | None:
    """The index entry of a frame fetched from a leader, or ``None`` if it is not one sound batch.

    Cheaper than :func:`parse_frame` (which judges bytes found in a damaged
    file): the frame comes from a leader that checksummed it, so the checks
    are structural -- one whole record-batch message in the log schema, rows,
    no null offsets, offsets increasing from after ``previous_last``, one
    leader epoch (:func:`sound_bounds`) -- without reading every value.
    """
    try:
        message = pa.ipc.read_message(frame)
        if message.type != "record batch" or 8 + message.metadata.size + message.body.size != frame.size:
            return None
        batch = pa.ipc.read_record_batch(message, LOG_SCHEMA)
        batch.validate()
        bounds = sound_bounds(batch)
    except Exception as exc:  # noqa: BLE001 - any decoding failure means "not a frame"
        logger.debug("not a replicated frame: %s", exc)
        return None
    if bounds is None:
        return None
    base, last, epoch, newest = bounds
    if base <= previous_last:
        return None
    return BatchEntry(base, last, 0, frame.size, crc32(frame), epoch, batch.num_rows, newest)


def sound_bounds(batch: pa.RecordBatch) -> tuple[int, int, int, int] | None:
    """:func:`batch_bounds` of a stored batch, or ``None`` if it is not sound: no rows, a null
    offset, offsets that do not strictly increase, or more than one leader epoch.

    A batch of up to :data:`SMALL_BATCH` rows (what a follower gets under a
    steady trickle of messages) is checked on its value buffers in Python: an
    Arrow compute call costs 10-25 µs each, several times the rest of the check.
    """
    offsets, stamps, epochs = batch.column(0), batch.column(1), batch.column(2)
    rows = batch.num_rows
    if rows == 0 or offsets.null_count:
        return None
    if rows <= SMALL_BATCH and not stamps.null_count and not epochs.null_count:
        return _small_bounds(offsets, stamps, epochs)
    return _bounds(offsets, stamps, epochs)


def _values(array: pa.Array, typecode: Literal["q", "i"]) -> list[int]:
    """The values of a primitive array without nulls, read from its data buffer."""
    data = array.buffers()[1]
    assert data is not None
    width = array.type.bit_width // 8
    start = array.offset * width
    return memoryview(data)[start : start + len(array) * width].cast(typecode).tolist()


def _small_bounds(offsets: pa.Array, stamps: pa.Array, epochs: pa.Array) -> tuple[int, int, int, int] | None:
    """``(base, last, epoch, newest timestamp)`` of a few rows, or ``None`` if their offsets do
    not increase or they hold more than one leader epoch."""
    numbers = _values(offsets, "q")
    found = _values(epochs, "i")
    if len(set(found)) != 1 or any(a >= b for a, b in itertools.pairwise(numbers)):
        return None
    return numbers[0], numbers[-1], found[0], max(_values(stamps, "q"))


def _bounds(offsets: pa.Array, stamps: pa.Array, epochs: pa.Array) -> tuple[int, int, int, int] | None:
    """:func:`_small_bounds` for any number of rows, with Arrow compute."""
    rows = len(offsets)
    epoch = epochs[0].as_py()
    if rows > 1 and not (
        pc.all(pc.greater(offsets.slice(1), offsets.slice(0, rows - 1))).as_py()
        and pc.all(pc.equal(epochs, epoch)).as_py()
    ):
        return None
    return offsets[0].as_py(), offsets[-1].as_py(), epoch, pc.max(stamps.cast(pa.int64())).as_py()


def scan(
    view: pa.Buffer, start: int, end: int, base_offset: int, *, limit: int | None = None
) -> tuple[SegmentIndex, dict[int, str]]:
    """Index the frames in ``view[start:end]`` by parsing them.

    Without ``limit`` (the active segment) the scan stops at the first bad
    frame and returns no damage: the caller cuts the segment there.  With
    ``limit`` (a closed segment: the offset its offsets must stay below) it
    resynchronises past bad bytes, and each stretch of bad bytes becomes a
    placeholder entry covering the offsets between its good neighbours (up
    to ``limit`` for a stretch at the end); the returned dict maps those
    entries' numbers to what was found.
    """
    index = SegmentIndex(base_offset)
    damage: dict[int, str] = {}
    position = start
    previous_last = base_offset - 1
    data: bytes | None = None  # for finding continuation markers, copied only if needed
    while position < end:
        entry = parse_frame(view, position, previous_last, limit)
        if entry is not None:
            index.add(entry)
            position += entry.size
            previous_last = entry.last_offset
            continue
        if limit is None:
            break
        if data is None:
            data = view.to_pybytes()[:end]
        found = None
        candidate = data.find(_MARKER, position + 1)
        while candidate != -1 and found is None:
            found = parse_frame(view, candidate, previous_last, limit)
            candidate = data.find(_MARKER, candidate + 1)
        stop = found.position if found is not None else end
        lost_last = found.base_offset - 1 if found is not None else limit - 1
        detail = f"bytes {position} to {stop - 1} of the file hold no valid frame"
        add_damaged(
            index,
            damage,
            previous_last + 1,
            lost_last,
            position=position,
            size=stop - position,
            detail=detail,
        )
        previous_last = max(previous_last, lost_last)
        if found is None:
            break
        position = found.position
    return index, damage


def add_damaged(
    index: SegmentIndex,
    damage: dict[int, str],
    first: int,
    last: int,
    *,
    position: int,
    size: int,
    detail: str,
) -> None:
    """Add a placeholder entry for offsets ``first..last`` that no readable frame holds."""
    if last < first:
        # Bad bytes between frames with consecutive offsets held no offsets: nothing is lost.
        logger.warning("ignoring %d bad bytes at byte %d that hold no offsets", size, position)
        return
    previous = len(index) - 1
    epoch = index.epochs[previous] if previous >= 0 else 0
    max_ts = index.max_timestamps[previous] if previous >= 0 else 0
    damage[len(index)] = detail
    index.add(BatchEntry(first, last, position, size, 0, epoch, 0, max_ts))
