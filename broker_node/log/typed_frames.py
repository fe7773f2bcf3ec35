"""Typed columns stored in a frame, beside the log's own columns.

A typed stream's partition leader parses each batch's values once (see
:mod:`pyspark_jetstream.protocol.typed_values`) and stores the typed columns in
the same frame as the batch, so they reach followers through replication
byte for byte (followers never parse) and every replica holds the same
schema version per offset range.  An untyped stream's frames are unchanged.

Layout (format version 1 of the segment, unchanged)
===================================================

The frame is the ordinary record-batch message of the log schema (see
:mod:`.segment`); its flatbuffer ``Message`` carries ``custom_metadata``
(Arrow IPC's per-message key-value pairs, which every Arrow reader skips)::

    jetstream.schema_version   the version the values were parsed with, in decimal ("1", "2", ...)
    jetstream.typed            an Arrow IPC stream: the schema message of that version's fields,
                               then one record-batch message holding one row per row of the
                               frame, in the same order (no end-of-stream marker); its buffers
                               are compressed as the frame's are (same codec, same threshold)

The CRC in the offset index covers the whole frame, so the typed columns are
checked with the log's columns.  Readers of the log's columns (Flight reads,
the live tail, the Spark source) decode the frame as before and never see
them; :func:`typed_of` reads them back.  A frame whose rows are cut (a
truncation inside a batch, a replica fetch starting inside one) keeps the same
rows of its typed columns (:func:`sliced_frame`).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.typed_values import TypedValues, as_version
from pyspark_jetstream.protocol.value_schema import StreamSchema

from .errors import InvalidRecordsError
from .frames import decode
from .segment import COMPRESS_MIN_BYTES, encode_frame

VERSION_KEY = b"jetstream.schema_version"
TYPED_KEY = b"jetstream.typed"
_LOG_SCHEMA_MESSAGE = LOG_SCHEMA.serialize()
_OPTIONS = {
    codec: pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec, use_threads=False)
    for codec in ("none", "lz4", "zstd")
}


def encode_typed_frame(
    batch: pa.RecordBatch, typed: TypedValues | None, compression: str = "none"
) -> pa.Buffer:
    """The frame storing ``batch`` and, if given, its typed columns (one row per row of ``batch``)."""
    if typed is None:
        return encode_frame(batch, compression)
    if typed.batch.num_rows != batch.num_rows:
        raise InvalidRecordsError(
            f"typed columns of {typed.batch.num_rows} rows cannot be stored with a batch of {batch.num_rows}"
        )
    codec = compression if batch.get_total_buffer_size() >= COMPRESS_MIN_BYTES else "none"
    if codec == "none":  # the stream's two messages, without a writer's set-up
        inner = _schema_message(typed.batch.schema) + typed.batch.serialize().to_pybytes()
    else:
        sink = pa.BufferOutputStream()
        pa.ipc.new_stream(sink, typed.batch.schema, options=_OPTIONS[codec]).write_batch(typed.batch)
        inner = sink.getvalue().to_pybytes()
    metadata = {VERSION_KEY: str(typed.version).encode(), TYPED_KEY: inner}
    sink = pa.BufferOutputStream()
    writer = pa.ipc.new_stream(sink, LOG_SCHEMA, options=_OPTIONS[codec])
    writer.write_batch(batch, custom_metadata=metadata)
    return sink.getvalue().slice(_LOG_SCHEMA_MESSAGE.size)


@functools.lru_cache(maxsize=64)
def _schema_message(schema: pa.Schema) -> bytes:
    return schema.serialize().to_pybytes()


def typed_of(frame: pa.Buffer) -> TypedValues | None:
    """The typed columns stored in ``frame`` and their schema version; ``None`` for a frame of an
    untyped batch.  ``ValueError`` if they are there but do not decode."""
    try:
        rows, pairs = _message_parts(pa.ipc.read_message(frame).metadata)
    except (struct.error, IndexError) as exc:
        raise ValueError(f"the frame's message header does not decode: {exc}") from exc
    if TYPED_KEY not in pairs:
        return None
    try:
        version = int(pairs[VERSION_KEY].to_pybytes())
        typed = pa.ipc.open_stream(pairs[TYPED_KEY]).read_next_batch()
    except (KeyError, ValueError, pa.ArrowException) as exc:
        raise ValueError(f"the frame's typed columns do not decode: {exc}") from exc
    if typed.num_rows != rows:
        raise ValueError(f"the frame holds {rows} rows but typed columns of {typed.num_rows}")
    return TypedValues(version, typed)


def version_of(frame: pa.Buffer) -> tuple[int, pa.Schema] | None:
    """The schema version a frame's typed columns were parsed with and their fields, read from the
    frame's header and the typed stream's schema message alone; ``None`` for an untyped frame.
    ``ValueError`` if they are there but do not decode."""
    try:
        _, pairs = _message_parts(pa.ipc.read_message(frame).metadata)
        if TYPED_KEY not in pairs:
            return None
        return int(pairs[VERSION_KEY].to_pybytes()), pa.ipc.read_schema(pairs[TYPED_KEY])
    except (struct.error, IndexError, KeyError, ValueError, pa.ArrowException) as exc:
        raise ValueError(f"the frame's typed columns do not decode: {exc}") from exc


def _message_parts(header: pa.Buffer) -> tuple[int, dict[bytes, pa.Buffer]]:
    """The row count and the custom metadata of a record-batch message, read from its flatbuffer
    ``header`` (``pyarrow.ipc.Message.metadata``) in place: the values are slices of it, so the
    typed columns are neither copied nor is the frame's batch decoded to find them (pyarrow
    gives a message's custom metadata only with its batch, from a stream reader).

    The layout is Arrow's ``Message.fbs``: the root table ``Message`` has fields ``version`` (0),
    ``header_type`` (1), ``header`` (2: a ``RecordBatch`` table, whose field 0 is ``length``),
    ``bodyLength`` (3) and ``custom_metadata`` (4: a vector of ``KeyValue`` tables, fields
    ``key`` and ``value``, both strings).  Offsets are little-endian; a flatbuffer that does not
    hold together raises ``struct.error`` or ``IndexError``."""
    view = memoryview(header)
    root = _at(view, 0)
    batch = _field(view, root, 2)
    length = None if batch is None else _field(view, _at(view, batch), 0)
    rows = 0 if length is None else struct.unpack_from("<q", view, length)[0]
    pairs: dict[bytes, pa.Buffer] = {}
    vector = _field(view, root, 4)
    if vector is not None:
        start = _at(view, vector)
        for i in range(struct.unpack_from("<I", view, start)[0]):
            entry = _at(view, start + 4 + 4 * i)
            key, value = _field(view, entry, 0), _field(view, entry, 1)
            if key is None or value is None:
                raise IndexError(f"custom metadata entry {i} lacks its key or value")
            key_at, key_size = _string(view, key)
            value_at, value_size = _string(view, value)
            pairs[bytes(view[key_at : key_at + key_size])] = header.slice(value_at, value_size)
    return rows, pairs


def _at(view: memoryview, position: int) -> int:
    """Where the offset stored at ``position`` points (offsets count from where they are stored)."""
    target = position + struct.unpack_from("<I", view, position)[0]
    if target >= len(view):
        raise IndexError(f"an offset at {position} points past the header's {len(view)} bytes")
    return target


def _field(view: memoryview, table: int, number: int) -> int | None:
    """Where field ``number`` of the table at ``table`` is stored, ``None`` if the table lacks it."""
    vtable = table - struct.unpack_from("<i", view, table)[0]
    if vtable < 0:
        raise IndexError(f"the table at {table} names a vtable before the header's start")
    vtable_size = struct.unpack_from("<H", view, vtable)[0]
    slot = 4 + 2 * number
    if slot + 2 > vtable_size:
        return None
    offset = struct.unpack_from("<H", view, vtable + slot)[0]
    return table + offset if offset else None


def _string(view: memoryview, position: int) -> tuple[int, int]:
    """Start and size of the string the offset at ``position`` points to."""
    at = _at(view, position)
    size = struct.unpack_from("<I", view, at)[0]
    if at + 4 + size > len(view):
        raise IndexError(f"a string of {size} bytes at {at} runs past the header's {len(view)} bytes")
    return at + 4, size


def sliced_frame(
    frame: pa.Buffer, batch: pa.RecordBatch, keep: pa.Array, compression: str
) -> pa.Buffer | None:
    """The frame of the rows of ``batch`` (decoded from ``frame``) where ``keep`` is true, with the
    same rows of its typed columns if it has some; ``None`` if no row is kept."""
    part = batch.filter(keep)
    if part.num_rows == 0:
        return None
    typed = typed_of(frame)
    if typed is not None:
        typed = TypedValues(typed.version, typed.batch.filter(keep))
    return encode_typed_frame(part, typed, compression)


def frames_in_range(frames: Iterable[pa.Buffer], first: int, last: int, compression: str) -> list[pa.Buffer]:
    """Stored ``frames`` (in offset order) cut to offsets ``first`` to ``last``: a frame within the
    range as it is, byte for byte; of one reaching past it, the rows within it, with the same rows
    of its typed columns (:func:`sliced_frame`).  A repair's copy of a damaged range."""
    copies: list[pa.Buffer] = []
    for frame in frames:
        batch = decode(frame)
        offsets = batch.column(0)
        if offsets[0].as_py() > last:
            break
        if offsets[0].as_py() >= first and offsets[-1].as_py() <= last:
            copies.append(frame)
            continue
        keep = pc.and_(pc.greater_equal(offsets, first), pc.less_equal(offsets, last))
        sliced = sliced_frame(frame, batch, keep, compression)
        if sliced is not None:
            copies.append(sliced)
    return copies


def typed_columns(
    frame: pa.Buffer, schema: StreamSchema, version: int | None = None
) -> pa.RecordBatch | None:
    """The typed columns stored in ``frame`` as the columns of ``version`` of ``schema`` (by default
    its current one; see :func:`~pyspark_jetstream.protocol.typed_values.as_version`); ``None`` for
    a frame of an untyped batch."""
    typed = typed_of(frame)
    return None if typed is None else as_version(typed, schema, version)
