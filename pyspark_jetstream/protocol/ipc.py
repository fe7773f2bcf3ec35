"""How much memory an Arrow IPC stream will take once decoded, found before decoding it.

A record batch whose buffers are compressed (Arrow IPC ``BodyCompression``)
can be tiny on the wire and enormous in memory: 51 KB of zstd can declare
1.5 GB of zeros.  :func:`decoded_size` reads only the flatbuffer headers of
each message and the 8-byte uncompressed-length prefix of each compressed
buffer, so a caller can refuse a stream before Arrow allocates anything.

What is read, per the Arrow columnar format specification (``Message.fbs``,
``Schema.fbs``):

* a stream is a sequence of encapsulated messages: ``0xFFFFFFFF``, an i32
  metadata length, the ``Message`` flatbuffer, then the body;
* ``Message``: field 1 ``header_type`` (1 Schema, 2 DictionaryBatch,
  3 RecordBatch), field 2 ``header``, field 3 ``bodyLength``;
* ``RecordBatch``: field 2 ``buffers`` (a vector of 16-byte structs: i64
  offset, i64 length, relative to the body), field 3 ``compression`` (present
  when buffers are compressed);
* a compressed buffer starts with an i64 holding its uncompressed length, or
  -1 when that buffer was left uncompressed.

Pure functions, no I/O.  Anything malformed raises ``ValueError``.
"""

from __future__ import annotations

import struct

import pyarrow as pa

_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3
_I64 = struct.Struct("<q")


def decoded_size(stream: bytes | pa.Buffer) -> int:
    """Bytes the record batches of the IPC ``stream`` take once decompressed.

    Raises ``ValueError`` for a stream that is not well formed, or that holds
    dictionary batches (callers here never need them).
    """
    total = 0
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(stream))
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                return total
            kind, batch = _header(message.metadata.to_pybytes())
            if kind == _DICTIONARY_BATCH:
                raise ValueError("dictionary batches are not accepted")
            if kind == _RECORD_BATCH:
                total += _batch_size(batch, memoryview(message.body) if message.body else memoryview(b""))
    except (pa.ArrowException, OSError, struct.error, IndexError) as exc:
        raise ValueError(f"malformed Arrow IPC stream: {exc}") from None


def _header(metadata: bytes) -> tuple[int, tuple[bytes, int] | None]:
    """``(header type, (buffer, position of the header table))`` of a ``Message``."""
    root = _table(metadata, _u32(metadata, 0))
    kind = _field_u8(metadata, root, 1)
    header = _field_offset(metadata, root, 2)
    return kind, None if header is None else (metadata, header)


def _batch_size(batch: tuple[bytes, int] | None, body: memoryview) -> int:
    if batch is None:
        raise ValueError("a record batch message without a header")
    data, table = batch
    buffers = _field_offset(data, table, 2)
    if buffers is None:
        return 0
    count = _u32(data, buffers)
    compressed = _field_offset(data, table, 3) is not None
    size = 0
    for i in range(count):
        offset, length = struct.unpack_from("<qq", data, buffers + 4 + 16 * i)
        if offset < 0 or length < 0 or offset + length > len(body):
            raise ValueError(f"buffer {i} ({offset}+{length}) lies outside the {len(body)}-byte body")
        if not compressed or length == 0:
            size += length
            continue
        if length < 8:
            raise ValueError(f"compressed buffer {i} is {length} bytes, too short for its length prefix")
        declared = _I64.unpack_from(body, offset)[0]
        size += length - 8 if declared == -1 else declared
        if declared < -1:
            raise ValueError(f"compressed buffer {i} declares a negative length {declared}")
    return size


# ---- the few flatbuffer reads needed -------------------------------------------


def _u32(data: bytes, position: int) -> int:
    return int(struct.unpack_from("<I", data, position)[0])


def _table(data: bytes, position: int) -> int:
    """Validate that a table starts at ``position``; return it."""
    vtable = position - struct.unpack_from("<i", data, position)[0]
    if not 0 <= vtable < len(data) or not 0 <= position < len(data):
        raise ValueError("flatbuffer table out of bounds")
    return position


def _field_position(data: bytes, table: int, field: int) -> int | None:
    vtable = table - struct.unpack_from("<i", data, table)[0]
    vtable_size = struct.unpack_from("<H", data, vtable)[0]
    slot = 4 + 2 * field
    if slot + 2 > vtable_size:
        return None
    relative = struct.unpack_from("<H", data, vtable + slot)[0]
    return None if relative == 0 else table + relative


def _field_u8(data: bytes, table: int, field: int) -> int:
    position = _field_position(data, table, field)
    return 0 if position is None else data[position]


def _field_offset(data: bytes, table: int, field: int) -> int | None:
    """Where the table or vector that field ``field`` points to starts."""
    position = _field_position(data, table, field)
    if position is None:
        return None
    target = position + _u32(data, position)
    if target >= len(data):
        raise ValueError("flatbuffer offset out of bounds")
    return target
