"""The live tail: committed records a partition's leader publishes once on NATS.

Subject: ``_PJS.tail.<partition>.<stream>`` (:func:`tail_subject`).  The
stream name comes last and whole (it may hold dots), so the deliveries of one
stream are exactly the subjects ``_PJS.tail.*.<stream>``: one NATS permission
lets a consumer read one stream's live tail and no other's.  Internal streams
(``__cursors``) have no live tail.

Payload: a 32-byte header, then one stored batch as the leader stores it (an
Arrow IPC record-batch message in the log schema, compression intact):

======  =====  ==========================================================
bytes   type   meaning
======  =====  ==========================================================
0-3     4s     magic ``PJT1``
4-11    i64    first offset in the batch
12-19   i64    last offset in the batch
20-23   i32    leader epoch of the batch
24-31   i64    the partition's high watermark when it was published
======  =====  ==========================================================

Little-endian.  A payload of only the header is a *mark*: no records, but
the high watermark; the leader sends one every
:data:`HEARTBEAT_SECONDS` while nothing is published, and one in place of a
batch too large for NATS, or larger than the leader publishes (256 KiB of
stored bytes: bulk writes are read over Flight), ``first``/``last`` then
naming the batch to read over Flight instead.  A consumer that has read up to an offset below a mark's
high watermark has missed something and reads it over Flight.

Only committed records (below the high watermark) are ever published, so
a consumer never sees one that a leader change truncates later.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa

from .ipc import decoded_size
from .schema import LOG_SCHEMA
from .streams import BROKER_SUBJECT_TOKEN

TAIL_PREFIX = f"{BROKER_SUBJECT_TOKEN}.tail"
HEARTBEAT_SECONDS = 1.0
"""How often a leader publishes a mark on a partition with nothing new."""
MAX_DECODED_BYTES = 512 * 1024 * 1024
"""A delivery that would decode to more than this is not decoded (read it over Flight)."""

_HEADER = struct.Struct("<4sqqiq")
_MAGIC = b"PJT1"
HEADER_BYTES = _HEADER.size


def tail_subject(stream: str, partition: int) -> str:
    """The NATS subject of a partition's live tail."""
    return f"{TAIL_PREFIX}.{partition}.{stream}"


def stream_tail_subjects(stream: str) -> str:
    """The subjects of every partition of ``stream`` (for a permission or a subscription)."""
    return f"{TAIL_PREFIX}.*.{stream}"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One live-tail message: a batch of committed records, or a mark (``batch`` is ``None``)."""

    first_offset: int
    last_offset: int
    leader_epoch: int
    high_watermark: int
    batch: pa.RecordBatch | None


def encode_delivery(
    first_offset: int,
    last_offset: int,
    leader_epoch: int,
    high_watermark: int,
    frame: bytes | pa.Buffer = b"",
) -> bytes:
    """A delivery's payload: the header, then ``frame`` (a stored batch) or nothing for a mark."""
    header = _HEADER.pack(_MAGIC, first_offset, last_offset, leader_epoch, high_watermark)
    return header + memoryview(frame)  # one copy, of the frame as stored


def encode_mark(high_watermark: int, leader_epoch: int) -> bytes:
    """A mark with no batch: only the high watermark."""
    return encode_delivery(high_watermark, high_watermark - 1, leader_epoch, high_watermark)


def decode_delivery(payload: bytes) -> Delivery:
    """Parse a delivery; ``ValueError`` naming what is wrong with one that is malformed.

    The batch is checked to hold exactly the offsets the header names, in the
    log schema, and not to decode to more than :data:`MAX_DECODED_BYTES`.
    """
    if len(payload) < HEADER_BYTES:
        raise ValueError(f"a live-tail delivery needs a {HEADER_BYTES}-byte header, got {len(payload)} bytes")
    magic, first, last, epoch, hw = _HEADER.unpack_from(payload)
    if magic != _MAGIC:
        raise ValueError(f"not a live-tail delivery (magic {magic!r})")
    if first < 0 or last < first - 1 or hw < 0:
        raise ValueError(f"a live-tail delivery names offsets {first} to {last} (high watermark {hw})")
    if len(payload) == HEADER_BYTES:
        return Delivery(first, last, epoch, hw, None)
    if last < first or last >= hw:
        raise ValueError(
            f"a live-tail batch of offsets {first} to {last} is not below its high watermark {hw}"
        )
    body = pa.py_buffer(payload).slice(HEADER_BYTES)
    size = decoded_size(body)
    if size > MAX_DECODED_BYTES:
        raise ValueError(f"a live-tail batch would decode to {size} bytes (at most {MAX_DECODED_BYTES})")
    try:
        batch = pa.ipc.read_record_batch(pa.ipc.read_message(body), LOG_SCHEMA)
        batch.validate()
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"a live-tail batch does not decode: {exc}") from None
    offsets = batch.column(0)
    if batch.num_rows == 0 or offsets[0].as_py() != first or offsets[-1].as_py() != last:
        raise ValueError(f"a live-tail batch does not hold offsets {first} to {last}")
    return Delivery(first, last, epoch, hw, batch)
