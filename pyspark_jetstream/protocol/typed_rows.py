"""Typed rows: a typed stream's messages written as Arrow columns of its fields, not as JSON.

A client (``Client.publish_batch``, the Spark sink) may send a typed
stream's rows as the columns of a schema version's fields (a typed batch,
see :mod:`.envelope`); the partition leader checks them and stores them as
the frame's typed columns (``broker_node/log/typed_frames.py``) without
parsing any JSON.  Pure functions; no I/O:

* :func:`conform` (the client's side): the caller's columns as exactly a
  version's fields, cast where no value is lost, or one line naming the
  column and why not;
* :func:`problem` (the broker's side, which never trusts a client): why a
  batch is not exactly a version's fields, naming the field, or ``None``;
* :func:`render_json`: each row's JSON text, the value stored with it;
* :func:`typed_input`: the broker's one check of what is appended to a
  partition of a typed stream -- a typed batch checked by :func:`problem`, or
  JSON values parsed under the current version (:mod:`.typed_values`) -- and
  the typed columns stored beside it.

Casts :func:`conform` makes
===========================

Same type: none.  Integers to another integer type, timestamps to another
unit or zone, decimals to another precision or scale: per value, and a
value the target cannot hold exactly (out of range, a lost fraction) fails
naming the column.  ``float32`` to ``float64``, any string type to
``string``, ``date64`` to ``date32`` (per value), a large list to a list, and
structs and lists field by field (by name, at any depth).  Nothing else:
``float64`` to ``float32`` loses precision, a string is not parsed into a
number; such a column fails before anything is sent.  A field the columns
lack is all nulls, or fails if the field is not nullable; a column the
version lacks fails (update the schema first), as it does in a JSON value.
A ``NaN`` or an infinity fails too: a JSON value cannot hold one, so a
typed stream never does.

The value of a typed row
========================

The partition leader stores, as each typed row's ``value``, the JSON text
of its fields (:func:`render_json`) -- one object, every field of the
version in order, a null as ``null`` -- so plain clients, Kafka-shape
readers and replays see JSON as they do for published values, and parsing
that text under the version gives the typed columns back exactly (the tests
check it).  Rendered in Arrow compute kernels, column by column: a string
escapes ``\\`` and ``"`` in two passes, and the rare string holding a
control character is escaped by Python's ``json``.  Encodings as the
reader takes them (:mod:`.typed_values`): ``date32`` a number of days,
``timestamp`` an ISO-8601 string (``Z`` when the type has a zone; the zone
is kept in the type, not the text), ``decimal128`` a number with the type's
scale.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from .envelope import TYPED_COLUMN, typed_version
from .errors import InvalidArgumentError
from .typed_values import InvalidValuesError, TypedValues, null_violation, nullable_field, parse_json, retyped
from .value_schema import StreamSchema, type_name

_CONTROL = "[\\x00-\\x1f]"
"""A character JSON requires escaped as ``\\uXXXX`` (or a short escape)."""


def conform(columns: pa.RecordBatch, fields: pa.Schema, version: int) -> pa.RecordBatch:
    """``columns`` as exactly ``fields`` (version ``version`` of a stream's schema), cast as the
    module docstring says; ``InvalidArgumentError`` naming the column otherwise."""
    unknown = [name for name in columns.schema.names if name not in fields.names]
    if unknown:
        raise InvalidArgumentError(
            f"column {unknown[0]!r} is not a field of the stream's schema version {version} "
            f"(its fields: {', '.join(fields.names)}): update the schema first, or drop the column"
        )
    arrays = []
    for field in fields:
        if field.name not in columns.schema.names:
            if not field.nullable:
                raise InvalidArgumentError(
                    f"column {field.name!r} is missing, but the schema (version {version}) says it is "
                    "not nullable"
                )
            arrays.append(pa.nulls(columns.num_rows, field.type))
            continue
        array = _cast(_whole(columns.column(field.name)), field, field.name)
        path = null_violation(array, field, field.name)
        if path is not None:
            raise InvalidArgumentError(f"column {path!r} has nulls, but the schema says it is not nullable")
        arrays.append(retyped(array, field.type))
    batch = pa.RecordBatch.from_arrays(arrays, schema=fields)
    found = _non_finite(batch, fields)
    if found is not None:
        raise InvalidArgumentError(f"column {found!r} holds NaN or an infinity, which JSON cannot hold")
    return batch


def problem(batch: pa.RecordBatch, fields: pa.Schema) -> str | None:
    """Why ``batch`` is not exactly ``fields`` (a version's), naming the field, or ``None``."""
    names = batch.schema.names
    for field in fields:
        if field.name not in names:
            return f"field {field.name!r}: missing (a typed batch has every field of its version)"
        column = batch.column(field.name)
        sent = nullable_field(pa.field(field.name, column.type)).type
        if sent != nullable_field(field).type:
            said = type_name(field.type)
            return f"field {field.name!r}: {type_name(column.type)}, but the schema says {said}"
        path = null_violation(column, field, field.name)
        if path is not None:
            return f"field {path!r}: null, but the schema says it is not nullable"
    for name in names:
        if name not in fields.names:
            return f"field {name!r}: not in the schema"
    if names != fields.names:
        return f"the fields are out of order: {', '.join(names)} (the schema's: {', '.join(fields.names)})"
    found = _non_finite(batch, fields)
    if found is not None:
        return f"field {found!r}: NaN or an infinity, which JSON cannot hold"
    return None


def exactly(batch: pa.RecordBatch, fields: pa.Schema) -> pa.RecordBatch:
    """``batch`` (for which :func:`problem` found none) typed exactly as ``fields``, nested
    nullability included."""
    arrays = [retyped(_whole(batch.column(f.name)), f.type) for f in fields]
    return pa.RecordBatch.from_arrays(arrays, schema=fields)


def render_json(batch: pa.RecordBatch) -> pa.Array:
    """Each row of ``batch`` (typed columns, checked) as the text of one JSON object, ``binary``."""
    text = _object([(f.name, batch.column(i)) for i, f in enumerate(batch.schema)], None)
    return text.view(pa.binary())


# ---- casting -------------------------------------------------------------------------------------


def typed_input(
    records: object, schema: StreamSchema | None, *, stream: str, partition: int
) -> tuple[object, TypedValues | None]:
    """What a partition appends, checked against its stream's schema, and the typed columns to
    store with it (``None`` for a stream without one).

    ``records`` is an Arrow table or batch, or an iterable of records with a
    ``value`` (made a list).  A typed batch (an Arrow input with a ``typed``
    column) is checked, never trusted: ``InvalidArgumentError`` names the
    field that does not match (or a stream without a schema, or a version it
    does not have), and its values become each row's JSON text.  Other input
    of a typed stream has its JSON values parsed under the current version:
    ``InvalidValuesError`` names each message that does not match.  Nothing
    is stored of a refused append.
    """
    where = f"stream {stream!r} partition {partition}"
    if isinstance(records, pa.Table | pa.RecordBatch) and TYPED_COLUMN in records.schema.names:
        if schema is None:
            raise InvalidArgumentError(
                f"{where} is not typed: typed rows go to a typed stream (send JSON values here)",
                stream=stream,
                partition=partition,
            )
        return _checked(records, schema, where, stream=stream, partition=partition)
    if schema is None:
        return records, None
    if isinstance(records, pa.Table | pa.RecordBatch):
        names = records.schema.names
        values = records.column("value").to_pylist() if "value" in names else [None] * records.num_rows
    else:
        records = list(records)  # type: ignore[call-overload]
        values = [getattr(r, "value", None) for r in records]  # type: ignore[attr-defined]
    if not values:
        return records, None  # the log refuses an empty append, with its own message
    parsed = parse_json(values, schema)
    if parsed.refused:
        raise InvalidValuesError(parsed.refused, stream=stream, partition=partition)
    return records, parsed.typed


def _checked(
    records: pa.Table | pa.RecordBatch, schema: StreamSchema, where: str, **fields: object
) -> tuple[pa.Table, TypedValues]:
    """A typed batch's typed columns checked against the version they say they hold, and its
    records with each row's value rendered from them."""
    version = typed_version(records)
    if version is None or version > schema.version:
        raise InvalidArgumentError(
            f"{where}: the typed rows are of schema version {version}, but the stream has versions "
            f"1 to {schema.version}",
            **fields,
        )
    table = records if isinstance(records, pa.Table) else pa.Table.from_batches([records])
    column = table.column(TYPED_COLUMN).combine_chunks()
    version_fields = schema.versions[version - 1]
    found = "a row is null" if column.null_count else None
    columns = pa.RecordBatch.from_struct_array(column) if found is None else None
    if columns is not None:
        found = problem(columns, version_fields)
    if found is not None or columns is None:
        raise InvalidArgumentError(
            f"{where}: the typed rows do not match schema version {version}: {found}", **fields
        )
    checked = exactly(columns, version_fields)
    index = table.schema.get_field_index(TYPED_COLUMN)
    rows = table.set_column(index, "value", render_json(checked))
    return rows, TypedValues(version, checked)


def _whole(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``array`` as one array at offset 0 (the rebuilding of nested arrays assumes it)."""
    if isinstance(array, pa.ChunkedArray):
        array = pa.concat_arrays(array.chunks) if array.num_chunks != 1 else array.chunk(0)
    return pa.concat_arrays([array]) if array.offset else array


def _cast(array: pa.Array, field: pa.Field, path: str) -> pa.Array:
    """``array`` as ``field``'s type with every field nullable (see the module docstring)."""
    source, target = array.type, nullable_field(field).type
    if source == target:
        return array
    types = pa.types
    if types.is_struct(target):
        if not types.is_struct(source):
            raise _mismatch(path, source, field.type)
        names = [source.field(i).name for i in range(source.num_fields)]
        unknown = [n for n in names if target.get_field_index(n) < 0]
        if unknown:
            raise InvalidArgumentError(f"column '{path}.{unknown[0]}' is not a field of the stream's schema")
        children = []
        for child in field.type:
            if child.name in names:
                children.append(_cast(array.field(child.name), child, f"{path}.{child.name}"))
            else:
                children.append(pa.nulls(len(array), nullable_field(child).type))
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if types.is_list(target):
        if not (types.is_list(source) or types.is_large_list(source)):
            raise _mismatch(path, source, field.type)
        values = _cast(_whole(array.values), field.type.value_field, f"{path}[]")
        offsets = array.offsets.cast(pa.int32())
        mask = array.is_null() if array.null_count else None
        return pa.ListArray.from_arrays(offsets, values, type=target, mask=mask)
    if not _castable(source, target):
        raise _mismatch(path, source, field.type)
    try:
        return array.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InvalidArgumentError(
            f"column {path!r}: a value does not fit {type_name(field.type)} ({_first_line(exc)})"
        ) from None


def _castable(source: pa.DataType, target: pa.DataType) -> bool:
    types = pa.types
    if types.is_integer(target):
        return types.is_integer(source)
    if types.is_floating(target):
        return types.is_floating(source) and source.bit_width <= target.bit_width
    if types.is_string(target):
        return types.is_string(source) or types.is_large_string(source) or types.is_string_view(source)
    if types.is_date(target):
        return types.is_date(source)
    return any(
        check(source) and check(target) for check in (types.is_timestamp, types.is_decimal, types.is_boolean)
    )


def _mismatch(path: str, source: pa.DataType, target: pa.DataType) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"column {path!r} is {source}, but the schema says {type_name(target)}: cast it first"
    )


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _non_finite(batch: pa.RecordBatch, fields: pa.Schema) -> str | None:
    """The path of a float field holding NaN or an infinity, or ``None``."""
    for field in fields:
        found = _non_finite_in(batch.column(field.name), field.type, field.name)
        if found is not None:
            return found
    return None


def _non_finite_in(array: pa.Array, data_type: pa.DataType, path: str) -> str | None:
    if pa.types.is_floating(data_type):
        return path if pc.any(pc.invert(pc.is_finite(array))).as_py() else None
    if pa.types.is_struct(data_type):
        for i, child in enumerate(data_type):
            found = _non_finite_in(array.field(i), child.type, f"{path}.{child.name}")
            if found is not None:
                return found
    elif pa.types.is_list(data_type):
        return _non_finite_in(array.flatten(), data_type.value_type, f"{path}[]")
    return None


# ---- rendering -----------------------------------------------------------------------------------


def _json(array: pa.Array) -> pa.Array:
    """Each value of ``array`` as JSON text (``string``, no nulls: a null is ``null``)."""
    data_type = array.type
    types = pa.types
    if types.is_struct(data_type):
        children = [(data_type.field(i).name, array.field(i)) for i in range(data_type.num_fields)]
        text = _object(children, array)
    elif types.is_list(data_type):
        items = _json(array.values)
        mask = array.is_null() if array.null_count else None
        lists = pa.ListArray.from_arrays(array.offsets, items, mask=mask)
        text = pc.binary_join_element_wise("[", pc.binary_join(lists, ","), "]", "")
    elif types.is_boolean(data_type):
        text = pc.if_else(array, "true", "false")
    elif types.is_string(data_type):
        text = pc.binary_join_element_wise('"', _escaped(array), '"', "")
    elif types.is_date32(data_type):
        text = array.cast(pa.int32()).cast(pa.string())
    elif types.is_timestamp(data_type):
        naive = array.cast(pa.timestamp(data_type.unit))  # the same instants, read as UTC
        iso = pc.strftime(naive, "%Y-%m-%dT%H:%M:%S" + ("Z" if data_type.tz else ""))
        text = pc.binary_join_element_wise('"', iso, '"', "")
    else:  # integers, floats (finite: checked), decimals
        text = array.cast(pa.string())
    return pc.fill_null(text, "null") if array.null_count else text


def _object(children: list[tuple[str, pa.Array]], parent: pa.Array | None) -> pa.Array:
    """The JSON objects of ``children`` (name, values) row by row; ``null`` where ``parent`` (a
    struct array) is null.  One join of every piece: a string field without nulls has its quotes
    in the constant pieces beside it (a join of its own per field would cost as much again)."""
    pieces: list[str | pa.Array] = []
    before = "{"  # what goes before the next field's name
    for name, array in children:
        key = before + json.dumps(name, ensure_ascii=False) + ":"
        if pa.types.is_string(array.type) and not array.null_count:
            pieces += [key + '"', _escaped(array)]
            before = '",'
        else:
            pieces += [key, _json(array)]
            before = ","
    if not pieces:
        length = len(parent) if parent is not None else 0
        return pa.repeat(pa.scalar("{}"), length)
    text = pc.binary_join_element_wise(*pieces, before[:-1] + "}", "")
    if parent is not None and parent.null_count:
        text = pc.if_else(parent.is_valid(), text, "null")
    return text


def _escaped(array: pa.Array) -> pa.Array:
    """Strings as the inside of JSON strings: ``\\`` and ``"`` escaped by kernels, a control
    character by ``json``; each pass only when the strings' bytes hold such a character (a scan
    of the bytes is cheaper than a pass over the strings)."""
    data = _utf8_bytes(array)
    escaped = array
    if pc.any(pc.or_(pc.equal(data, 0x22), pc.equal(data, 0x5C))).as_py():
        escaped = pc.replace_substring(pc.replace_substring(array, "\\", "\\\\"), '"', '\\"')
    if pc.any(pc.less(data, 0x20)).as_py():
        controls = pc.fill_null(pc.match_substring_regex(array, _CONTROL), False)
        rows = pc.indices_nonzero(controls)
        replacements = [json.dumps(s, ensure_ascii=False)[1:-1] for s in array.take(rows).to_pylist()]
        escaped = pc.replace_with_mask(escaped, controls, pa.array(replacements, pa.string()))
    return escaped


def _utf8_bytes(array: pa.Array) -> pa.Array:
    """The bytes of a ``string`` array's values, as ``uint8`` (a view, no copy)."""
    _, offsets, data = array.buffers()
    if len(array) == 0 or data is None:
        return pa.array([], pa.uint8())
    ends = pa.Array.from_buffers(pa.int32(), len(array) + 1, [None, offsets], offset=array.offset)
    start, end = ends[0].as_py(), ends[-1].as_py()
    return pa.Array.from_buffers(pa.uint8(), end - start, [None, data.slice(start, end - start)])
