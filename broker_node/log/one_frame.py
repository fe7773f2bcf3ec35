"""The frame of a one-message batch, written from a prepared shape instead of Arrow arrays.

Publishing one message at a time makes the log append one-row batches.
Building seven Arrow arrays, a record batch and its IPC message for each took
most of an append's 100 µs; but a one-row batch of the log schema has few
shapes: which of its input columns are null.  For each shape that a plain
message can have (``key``, ``value``, ``subject`` and ``reply`` each present
or null; no headers, no producer), :class:`OneFrames` keeps the frame pyarrow
writes for such a batch -- the encapsulated IPC message: continuation
marker, metadata length, the flatbuffer ``Message`` (a ``RecordBatch``
header: the row count, a field node per column, an offset and a length per
body buffer) and the body -- and finds where in the flatbuffer the body
length and the buffers' offsets and lengths lie.  A message of that shape is
then written by laying out its body (its offset, timestamp and epoch; its
present columns' value offsets and bytes; every null column's buffers as the
kept frame has them, padded to 8 bytes as Arrow lays them) and writing the
new offsets, lengths and body length into a copy of the kept metadata.  The
result is byte for byte what pyarrow writes for the same batch
(``tests/log/test_one_frame.py`` checks it against pyarrow for any
message), so the log, its replicas and its readers cannot tell the two apart.

Messages of other shapes (headers, an idempotent producer's, a typed
stream's, several at once) are written by pyarrow as before.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import pyarrow as pa

from pyspark_jetstream.protocol.schema import LOG_SCHEMA

from .append_input import Record

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U16 = struct.Struct("<H")
_PADDING = bytes(8)
_FIELD_BUFFERS = (2, 2, 2, 3, 3, 2 + 1 + 3 + 3, 3, 3, 3, 2)
"""Body buffers per column of the log schema, in order: validity and data for the fixed-width
ones, validity, offsets and data for binary and string; the headers' list, struct and its two
children's.  The flatbuffer must name exactly these (checked when a shape is prepared)."""
_BUFFER_COUNT = sum(_FIELD_BUFFERS)
_OFFSET, _TIMESTAMP, _EPOCH = 1, 3, 5
"""The data buffers of the three assigned columns."""
_VARIABLE = {"key": 6, "value": 9, "subject": 21, "reply": 24}
"""Each input column a plain message may carry: its first (validity) buffer; offsets and data follow."""


class _Shape(NamedTuple):
    metadata: bytes
    """The frame up to the body: marker, length and flatbuffer, as pyarrow wrote them."""
    body_length_at: int
    buffers_at: int
    """Where the ``Buffer`` structs (offset, length: two i64 each) start in ``metadata``."""
    constant: list[bytes | None]
    """Each buffer's bytes when they do not depend on the message (``None``: they do)."""


class OneFrames:
    """Frames of one-message batches of plain messages (see the module docstring)."""

    def __init__(self) -> None:
        self._shapes: dict[tuple[bool, bool, bool, bool], _Shape] = {}

    def frame(self, offset: int, timestamp: int, epoch: int, record: Record) -> bytes:
        """The stored frame of a batch of this one message (its headers and producer are not
        written: the caller sends only messages without them)."""
        key, value, subject, reply = record.key, record.value, record.subject, record.reply
        present = (key is not None, value is not None, subject is not None, reply is not None)
        shape = self._shapes.get(present)
        if shape is None:
            shape = self._shapes[present] = _prepare(present)
        contents = list(shape.constant)
        contents[_OFFSET] = _I64.pack(offset)
        contents[_TIMESTAMP] = _I64.pack(timestamp)
        contents[_EPOCH] = _I32.pack(epoch)
        for data, first in (
            (key, _VARIABLE["key"]),
            (value, _VARIABLE["value"]),
            (None if subject is None else subject.encode(), _VARIABLE["subject"]),
            (None if reply is None else reply.encode(), _VARIABLE["reply"]),
        ):
            if data is not None:
                contents[first + 1] = _I32.pack(0) + _I32.pack(len(data))
                contents[first + 2] = data
        pieces: list[bytes] = []
        places: list[int] = []
        position = 0
        for content in contents:
            assert content is not None
            size = len(content)
            places.append(position)
            places.append(size)
            if size:
                pieces.append(content)
                padding = -size % 8
                if padding:
                    pieces.append(_PADDING[:padding])
                position += size + padding
        metadata = bytearray(shape.metadata)
        struct.pack_into(f"<{2 * _BUFFER_COUNT}q", metadata, shape.buffers_at, *places)
        _I64.pack_into(metadata, shape.body_length_at, position)
        pieces.insert(0, bytes(metadata))
        return b"".join(pieces)


def _prepare(present: tuple[bool, bool, bool, bool]) -> _Shape:
    """The kept frame of a shape and where its variable parts lie."""
    key, value, subject, reply = present
    batch = pa.RecordBatch.from_pylist(
        [
            {
                "offset": 0,
                "timestamp": 0,
                "leader_epoch": 0,
                "key": b"k" if key else None,
                "value": b"v" if value else None,
                "headers": None,
                "subject": "s" if subject else None,
                "reply": "r" if reply else None,
                "producer_id": None,
                "sequence": None,
            }
        ],
        schema=LOG_SCHEMA,
    )
    frame = batch.serialize().to_pybytes()
    (marker,) = _U32.unpack_from(frame, 0)
    if marker != 0xFFFFFFFF:
        raise AssertionError("pyarrow wrote a frame without the continuation marker")
    (length,) = _I32.unpack_from(frame, 4)
    start = 8
    flatbuffer = frame[start : start + length]
    body_length_at, buffers_at, count = _locate(flatbuffer)
    if count != _BUFFER_COUNT:
        raise AssertionError(
            f"pyarrow wrote {count} buffers for a row of the log schema, not {_BUFFER_COUNT}"
        )
    body = frame[start + length :]
    constant: list[bytes | None] = []
    for i in range(count):
        at, size = struct.unpack_from("<qq", flatbuffer, buffers_at + 16 * i)
        constant.append(body[at : at + size])
    for index in (_OFFSET, _TIMESTAMP, _EPOCH):
        constant[index] = None
    for first, there in zip(_VARIABLE.values(), present, strict=True):
        if there:  # its validity buffer stays as kept (empty: no nulls)
            constant[first + 1] = constant[first + 2] = None
    return _Shape(frame[: start + length], start + body_length_at, start + buffers_at, constant)


def _locate(flatbuffer: bytes) -> tuple[int, int, int]:
    """Where a record-batch ``Message`` flatbuffer holds its body length, and its ``Buffer``
    structs and how many (Arrow's ``Message.fbs``: ``Message`` fields version, header_type,
    header, bodyLength; ``RecordBatch`` fields length, nodes, buffers)."""
    message = _table(flatbuffer, 0, _U32.unpack_from(flatbuffer, 0)[0])
    body_length_at = message(3)
    header_at = message(2)
    if not body_length_at or not header_at:
        raise AssertionError("a record-batch message without a body length or header")
    batch_start = header_at + _U32.unpack_from(flatbuffer, header_at)[0]
    batch = _table(flatbuffer, 0, batch_start)
    buffers_field = batch(2)
    vector = buffers_field + _U32.unpack_from(flatbuffer, buffers_field)[0]
    (count,) = _U32.unpack_from(flatbuffer, vector)
    return body_length_at, vector + 4, count


def _table(flatbuffer: bytes, _: int, table: int):  # type: ignore[no-untyped-def]
    """A flatbuffer table at ``table``: a function from a field's number to its absolute position
    (0 when the field is absent)."""
    vtable = table - _I32.unpack_from(flatbuffer, table)[0]
    (vtable_size,) = _U16.unpack_from(flatbuffer, vtable)

    def field(number: int) -> int:
        entry = 4 + 2 * number
        if entry >= vtable_size:
            return 0
        (relative,) = _U16.unpack_from(flatbuffer, vtable + entry)
        return table + relative if relative else 0

    return field
