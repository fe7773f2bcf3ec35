"""What ``Log.append`` accepts, turned into Arrow batches in the log's input schema."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import Any, NamedTuple, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_jetstream.protocol.schema import ASSIGNED_FIELDS, INPUT_COLUMNS, INPUT_SCHEMA

from .errors import InvalidRecordsError, RecordTooLargeError

_ASSIGNED_NAMES = frozenset(f.name for f in ASSIGNED_FIELDS)
_KEY, _VALUE, _HEADERS, _SUBJECT, _REPLY, _PRODUCER_ID, _SEQUENCE = INPUT_SCHEMA
_ONE_NULL = {field.name: pa.nulls(1, field.type) for field in INPUT_SCHEMA}


class Record(NamedTuple):
    """One message to append: a value and optional key, headers and NATS context.

    A named tuple rather than a dataclass: one is built per message, and tuples build fastest.
    """

    value: bytes | None
    """The payload; ``None`` is a tombstone for key compaction."""
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes]] = ()
    subject: str | None = None
    reply: str | None = None
    producer_id: str | None = None
    sequence: int | None = None


Records: TypeAlias = pa.RecordBatch | pa.Table | Iterable[Record]


def to_input_columns(records: Records, max_message_bytes: int) -> list[pa.Array]:
    """Return ``records`` as the columns of the log's input schema, each message within the limit.

    Arrow input may hold any subset of the input columns but must have
    ``value``; missing columns are null, and columns are cast to the schema's
    types (``large_binary`` to ``binary``, ...).  Raises
    :class:`InvalidRecordsError` naming the offending column, and
    :class:`RecordTooLargeError` naming the first message over
    ``max_message_bytes``.
    """
    if isinstance(records, pa.Table):
        records = records.combine_chunks()
        batches = records.to_batches()
        if not batches:
            raise InvalidRecordsError("cannot append an empty table: it has no rows")
        records = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
    if isinstance(records, pa.RecordBatch):
        columns = _from_arrow(records)
        check_message_sizes(columns, max_message_bytes)
        return columns
    return _from_rows(list(records), max_message_bytes)


def _from_arrow(batch: pa.RecordBatch) -> list[pa.Array]:
    if batch.num_rows == 0:
        raise InvalidRecordsError("cannot append an empty batch: it has no rows")
    names = batch.schema.names
    assigned = sorted(_ASSIGNED_NAMES.intersection(names))
    if assigned:
        raise InvalidRecordsError(
            f"column(s) {', '.join(assigned)} are assigned by the log and cannot be appended"
        )
    unknown = sorted(set(names) - INPUT_COLUMNS)
    if unknown:
        raise InvalidRecordsError(
            f"unknown column(s) {', '.join(unknown)}; the log accepts {', '.join(INPUT_SCHEMA.names)}"
        )
    if "value" not in names:
        raise InvalidRecordsError("records need a 'value' column (use nulls for tombstones)")
    columns = []
    for field in INPUT_SCHEMA:
        if field.name not in names:
            columns.append(pa.nulls(batch.num_rows, field.type))
            continue
        column = batch.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InvalidRecordsError(
                    f"column {field.name!r} has type {column.type}, "
                    f"which does not convert to {field.type}: {exc}"
                ) from None
        columns.append(column)
    return columns


def _from_rows(rows: list[Record], max_message_bytes: int) -> list[pa.Array]:
    if not rows:
        raise InvalidRecordsError("cannot append no records: give at least one")
    for i, row in enumerate(rows):
        if not isinstance(row, Record):
            raise InvalidRecordsError(
                f"record {i} is a {type(row).__name__}; append takes Record objects or an Arrow table/batch"
            )
        size = record_size(row)
        if size > max_message_bytes:
            raise RecordTooLargeError(
                f"message {i} of the batch is {size} bytes, over max_message_bytes={max_message_bytes}",
                size=size,
                limit=max_message_bytes,
            )
    try:
        columns = [
            _column([r.key for r in rows], _KEY),
            _column([r.value for r in rows], _VALUE),
            _column([list(r.headers) if r.headers else None for r in rows], _HEADERS),
            _column([r.subject for r in rows], _SUBJECT),
            _column([r.reply for r in rows], _REPLY),
            _column([r.producer_id for r in rows], _PRODUCER_ID),
            _column([r.sequence for r in rows], _SEQUENCE),
        ]
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise InvalidRecordsError(f"records do not fit the log schema: {exc}") from None
    return columns


def record_size(row: Record) -> int:
    """Bytes of ``row`` counted against ``max_message_bytes``: key, value, header names and values."""
    size = len(row.value or b"") + len(row.key or b"")
    for key, value in row.headers:
        size += len(key.encode()) + len(value or b"")
    return size


def _column(values: list[Any], field: pa.Field) -> pa.Array:
    """An Arrow array of ``values``, without pyarrow's per-call conversion cost in common cases.

    Appending one message at a time is a hot path: a column of nulls and a
    binary column without nulls are built straight from buffers.
    """
    if all(v is None for v in values):
        return _ONE_NULL[field.name] if len(values) == 1 else pa.nulls(len(values), field.type)
    if field.type == pa.binary() and all(type(v) is bytes for v in values):
        offsets = array("i", accumulate(map(len, values), initial=0))
        return pa.Array.from_buffers(
            field.type, len(values), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))]
        )
    return pa.array(values, field.type)


def message_sizes(key: pa.Array, value: pa.Array, headers: pa.Array) -> pa.Array:
    """Bytes per message counted against ``max_message_bytes``: key, value, header keys and values."""
    sizes = pc.add(_lengths(key), _lengths(value))
    if headers.null_count < len(headers):
        items = pc.list_flatten(headers)
        per_item = pc.add(_lengths(items.field("key")), _lengths(items.field("value")))
        per_row = (
            pa.table({"row": pc.list_parent_indices(headers), "bytes": per_item})
            .group_by("row", use_threads=False)
            .aggregate([("bytes", "sum")])
        )
        extra = pc.take(
            pc.fill_null(per_row.column("bytes_sum"), 0),
            pc.index_in(pa.array(range(len(headers)), pa.int64()), per_row.column("row")),
        )
        sizes = pc.add(sizes, pc.fill_null(extra, 0))
    return sizes


def check_message_sizes(columns: list[pa.Array], limit: int) -> None:
    """Raise :class:`RecordTooLargeError` for the first message over ``limit`` bytes.

    ``columns`` are in input-schema order (key, value, headers first).
    """
    key, value, headers = columns[:3]
    # Their buffers' sizes, at least their messages' (nbytes is exact but ~20x slower).
    if key.get_total_buffer_size() + value.get_total_buffer_size() + headers.get_total_buffer_size() <= limit:
        return  # no single message can be larger than all of them together
    sizes = message_sizes(key, value, headers)
    largest = pc.max(sizes).as_py() or 0
    if largest > limit:
        row = pc.indices_nonzero(pc.greater(sizes, limit))[0].as_py()
        size = sizes[row].as_py()
        raise RecordTooLargeError(
            f"message {row} of the batch is {size} bytes, over max_message_bytes={limit}",
            size=size,
            limit=limit,
        )


def _lengths(column: pa.Array) -> pa.Array:
    return pc.fill_null(pc.binary_length(column), 0).cast(pa.int64())
