"""Typed streams' values: JSON payloads parsed into the columns of a schema version, and typed
columns stored under one version read under a later one.  Pure functions; no I/O.

Parsing (what a typed stream's partition leader does with each batch it stores)
==============================================================================

:func:`parse_json` parses a batch of message values in **one** call of
pyarrow's C++ JSON reader (``pyarrow.json.open_json``, read whole) with the version's
fields as its explicit schema:

* the values are joined with ``\\n`` between them; pretty-printed values (with
  newlines inside) are read too (``newlines_in_values``);
* a field the schema does not have is **refused** (``unexpected_field_behavior
  = "error"``): a producer sending a new field updates the schema first, so
  nothing it sends is silently left out of the typed columns (the raw value
  is stored anyway);
* a field missing from a value is null; a missing or null non-nullable field
  (at any depth: inside a struct that is not null itself) is refused.

The joined read is trusted only when every value, leading and trailing JSON
whitespace aside, begins with ``{`` and ends with ``}`` and the read gives
exactly one row per value.  Then each value is exactly one object: a string
cannot hold the raw ``\\n`` between two values (JSON forbids raw control
characters in strings), so an object that does not close at the end of its
value would meet the next value's ``{`` where a ``,`` or ``}`` must be, which
the reader refuses; every value therefore ends at least one object, and as
many rows as values means exactly one each.  Anything else -- a value that is
empty, a scalar, an array, two objects, invalid UTF-8 or JSON, a number out of
its type's range, a missing non-nullable field -- makes the joined read fail
or miscount (a value failing the first-and-last-byte check is refused at
once), and only then is the batch halved, each half read on its own, down to
the single bad values (about ``k log n`` reads for ``k`` bad among ``n``): each
bad one gets its own reason naming the field, the good ones are still
returned, in order.  The reasoning above holds for any subset of the values.

JSON encodings of the types follow pyarrow's reader: ``int32``/``int64`` a
number within the type's range, ``float32``/``float64`` a number, ``bool``
``true``/``false``, ``string`` a string (UTF-8), ``date32`` a number of days since
1970-01-01, ``timestamp`` an ISO-8601 string (UTC unless it says otherwise) or a
number in the unit, ``decimal128`` a number or a string with at most the
type's scale, ``list`` an array, ``struct`` an object.

Reading under a later version
=============================

:func:`as_version` turns typed columns written under one version into the
columns of a later, compatible one (:func:`.value_schema.check_compatible`):
fields are matched by name (inside structs and lists too), a field the older
version lacks is all nulls, a widened type (``int32`` -> ``int64``,
``float32`` -> ``float64``) is cast.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import NamedTuple

import pyarrow as pa
import pyarrow.json as pa_json

from .errors import InvalidArgumentError
from .value_schema import StreamSchema

_WHITESPACE = b" \t\r\n"
_COLUMN = re.compile(r"Column\((/[^)]*)\)")
_ROW = re.compile(r"\.? in row \d+$")


class TypedValues(NamedTuple):
    """The typed columns of a stored batch: one row per message, in the fields of ``version``."""

    version: int
    """The schema version the values were parsed with (1 is the first)."""
    batch: pa.RecordBatch


class Parsed(NamedTuple):
    """What :func:`parse_json` made of a batch of values."""

    typed: TypedValues | None
    """The rows that parsed, in input order (``None`` if none did)."""
    rows: list[int]
    """Which input rows those are, ascending."""
    refused: dict[int, str]
    """Each input row that did not parse: why, naming the field (``field 'a.b': ...``)."""


class InvalidValuesError(InvalidArgumentError):
    """Values of a typed stream's messages do not match its schema; nothing of the batch is stored.

    ``refused`` maps each bad message's row in the batch to the reason (naming the field).
    """

    def __init__(self, refused: dict[int, str], **fields: object) -> None:
        first = min(refused)
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        super().__init__(f"message {first} of the batch: {refused[first]}{more}", **fields)
        self.refused = refused


def parse_json(values: Sequence[bytes | None], schema: StreamSchema) -> Parsed:
    """Parse ``values`` (one JSON object each) under ``schema``'s current version; see the module
    docstring for what is refused and how."""
    fields = schema.current
    version = schema.version
    refused: dict[int, str] = {}
    candidates: list[int] = []
    for row, value in enumerate(values):
        problem = _shape_problem(value)
        if problem is None:
            candidates.append(row)
        else:
            refused[row] = problem
    parts: list[tuple[list[int], pa.RecordBatch]] = []
    _parse_rows(values, candidates, fields, parts, refused)
    if not parts:
        return Parsed(None, [], refused)
    rows = [row for part_rows, _ in parts for row in part_rows]
    batch = parts[0][1] if len(parts) == 1 else pa.concat_batches([b for _, b in parts])
    return Parsed(TypedValues(version, batch), rows, refused)


def _parse_rows(
    values: Sequence[bytes | None],
    rows: list[int],
    fields: pa.Schema,
    parts: list[tuple[list[int], pa.RecordBatch]],
    refused: dict[int, str],
) -> None:
    """Parse ``values[rows]`` in one read; if it fails or miscounts, each half on its own, down to
    single values, which are refused with their reason: a batch with ``k`` bad values among ``n``
    takes about ``k log n`` reads, not ``n``.  Appends ``(rows, batch)`` in row order."""
    if not rows:
        return
    if len(rows) == 1:
        value = values[rows[0]]
        assert value is not None
        one = _read(value, fields)
        if isinstance(one, NullFieldError):
            refused[rows[0]] = str(one)
        elif not isinstance(one, pa.RecordBatch):
            refused[rows[0]] = explain(value, fields, one)
        elif one.num_rows != 1:
            refused[rows[0]] = "the value is not one JSON object (it holds several)"
        else:
            parts.append((rows, one))
        return
    joined = _read(b"\n".join(values[r] for r in rows), fields)  # type: ignore[misc] # none is None
    if isinstance(joined, pa.RecordBatch) and joined.num_rows == len(rows):
        parts.append((rows, joined))
        return
    middle = len(rows) // 2
    _parse_rows(values, rows[:middle], fields, parts, refused)
    _parse_rows(values, rows[middle:], fields, parts, refused)


def _shape_problem(value: bytes | None) -> str | None:
    """Why ``value`` cannot be one JSON object, judged by its first and last bytes only."""
    if value is None:
        return "the value is null; a typed stream's message value is one JSON object"
    if value[:1] == b"{" and value[-1:] == b"}":
        return None
    stripped = value.strip(_WHITESPACE)
    if not stripped:
        return "the value is empty; a typed stream's message value is one JSON object"
    if stripped[:1] == b"{" and stripped[-1:] == b"}":
        return None
    return f"the value is not one JSON object (it begins {_shown(stripped[:20])})"


def _read(data: bytes, fields: pa.Schema) -> pa.RecordBatch | Exception:
    """One read of ``data`` by pyarrow's JSON reader: the batch, or the reader's error.

    The reader is given ``fields`` with every field nullable: it would refuse a null struct
    holding a non-nullable field, which the schema allows; :func:`null_violation` checks
    nullability instead, and the columns then take ``fields``' types.
    """
    try:
        # The streaming reader, whole input in one block: the same parser without read_json's
        # setup of a parallel read and a table, which cost more than the parse of a small batch.
        reader = pa_json.open_json(
            pa.BufferReader(data),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=len(data) + 1),
            parse_options=_options(fields),
        )
        columns = reader.read_next_batch().columns  # one block: one batch
    except StopIteration:
        columns = [pa.array([], f.type) for f in nullable_schema(fields)]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OverflowError) as exc:
        return exc
    for column, field in zip(columns, fields, strict=True):
        path = null_violation(column, field, field.name)
        if path is not None:
            return NullFieldError(path)
    batch = pa.RecordBatch.from_arrays(
        [retyped(c, f.type) for c, f in zip(columns, fields, strict=True)], schema=fields
    )
    try:
        batch.validate(full=True)  # the reader does not check that strings are UTF-8
    except pa.ArrowInvalid as exc:
        return exc
    return batch


class NullFieldError(ValueError):
    """A non-nullable field is missing or null (where its parent is not)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"field {path!r}: missing or null, but the schema says it is not nullable")
        self.path = path


def retyped(array: pa.Array, data_type: pa.DataType) -> pa.Array:
    """``array`` (as the reader makes it: offset 0, every field nullable) with ``data_type``, which
    differs at most in nullability; its nulls are known to be allowed (see :func:`null_violation`),
    but a cast would refuse the nulls a non-nullable field holds under a null parent."""
    if array.type == data_type:
        return array
    if pa.types.is_struct(data_type):
        children = [retyped(array.field(i), data_type.field(i).type) for i in range(data_type.num_fields)]
        return pa.Array.from_buffers(
            data_type, len(array), array.buffers()[:1], array.null_count, array.offset, children
        )
    if pa.types.is_list(data_type):
        values = retyped(array.values, data_type.value_type)
        return pa.Array.from_buffers(
            data_type, len(array), array.buffers()[:2], array.null_count, array.offset, [values]
        )
    return array.cast(data_type)


@functools.lru_cache(maxsize=64)
def _options(fields: pa.Schema) -> pa_json.ParseOptions:
    return pa_json.ParseOptions(
        explicit_schema=nullable_schema(fields), newlines_in_values=True, unexpected_field_behavior="error"
    )


@functools.lru_cache(maxsize=64)
def nullable_schema(fields: pa.Schema) -> pa.Schema:
    """``fields`` with every field nullable, at every depth."""
    return pa.schema([nullable_field(f) for f in fields])


def nullable_field(field: pa.Field) -> pa.Field:
    data_type = field.type
    if pa.types.is_struct(data_type):
        data_type = pa.struct([nullable_field(f) for f in data_type])
    elif pa.types.is_list(data_type):
        data_type = pa.list_(nullable_field(data_type.value_field))
    return pa.field(field.name, data_type, nullable=True)


def explain(value: bytes, fields: pa.Schema, error: Exception) -> str:
    """Why the reader refused ``value`` (one message's), naming the field where it can be found."""
    try:
        document = json.loads(value)
    except UnicodeDecodeError as exc:
        return f"the value is not valid UTF-8 ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            return f"the value is not one JSON object (more follows the first, at byte {exc.pos})"
        return f"the value is not valid JSON: {exc}"
    except (ValueError, RecursionError) as exc:
        return f"the value is not valid JSON: {exc}"
    if not isinstance(document, dict):
        return f"the value is not one JSON object (it is a JSON {type(document).__name__})"
    unknown = [name for name in document if name not in fields.names]
    if unknown:
        return f"field {unknown[0]!r}: not in the schema (update the stream's schema before sending it)"
    for field in fields:
        if document.get(field.name) is None:
            if not field.nullable:
                return f"field {field.name!r}: missing or null, but the schema says it is not nullable"
            continue
        path = _missing(document[field.name], field, field.name)
        if path is not None:
            return f"field {path!r}: missing or null, but the schema says it is not nullable"
        one = _read(json.dumps({field.name: document[field.name]}).encode(), pa.schema([field]))
        if isinstance(one, NullFieldError):
            return str(one)
        if isinstance(one, Exception):
            return f"field {field.name!r}: {_reason(one)}"
    found = _COLUMN.search(str(error))
    if found is not None:
        return f"field {found.group(1).strip('/').replace('/', '.')!r}: {_reason(error)}"
    return f"the value does not match the schema: {_reason(error)}"


def _missing(value: object, field: pa.Field, path: str) -> str | None:
    """The path of a non-nullable field missing or null inside ``value`` (``field``'s JSON value,
    not null), or ``None``."""
    data_type = field.type
    if pa.types.is_struct(data_type) and isinstance(value, dict):
        for child in data_type:
            inner = value.get(child.name)
            found = (
                (None if child.nullable else f"{path}.{child.name}")
                if inner is None
                else _missing(inner, child, f"{path}.{child.name}")
            )
            if found is not None:
                return found
    elif pa.types.is_list(data_type) and isinstance(value, list):
        for item in value:
            found = None if item is None else _missing(item, data_type.value_field, f"{path}[]")
            if found is not None:
                return found
    return None


def _reason(error: Exception) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return _ROW.sub("", text.removeprefix("JSON parse error: "))  # the row of a one-value read


def null_violation(array: pa.Array, field: pa.Field, path: str) -> str | None:
    if array.null_count:
        if not field.nullable:
            return path
        array = array.drop_null()
    data_type = field.type
    if pa.types.is_struct(data_type):
        for i, child in enumerate(data_type):
            found = null_violation(array.field(i), child, f"{path}.{child.name}")
            if found is not None:
                return found
    elif pa.types.is_list(data_type):
        return null_violation(array.flatten(), data_type.value_field, f"{path}[]")
    return None


def as_version(typed: TypedValues, schema: StreamSchema, version: int | None = None) -> pa.RecordBatch:
    """``typed`` (written under ``typed.version``) as the columns of ``version`` of ``schema``
    (by default its current one): matched by name, nulls for fields added since, widened types
    cast.  ``InvalidArgumentError`` if ``version`` is older than the one written, or unknown."""
    target = schema.version if version is None else version
    if not 1 <= typed.version <= target <= schema.version:
        raise InvalidArgumentError(
            f"typed values written under schema version {typed.version} cannot be read as version "
            f"{target} (the stream has versions 1 to {schema.version}; a later one reads an earlier one)"
        )
    fields = schema.versions[target - 1]
    if typed.version == target:
        return typed.batch
    batch = typed.batch
    columns = [
        _convert(batch.column(f.name) if f.name in batch.schema.names else None, f.type, batch.num_rows)
        for f in fields
    ]
    return pa.RecordBatch.from_arrays(columns, schema=fields)


def _convert(array: pa.Array | None, data_type: pa.DataType, length: int) -> pa.Array:
    if array is None:
        return pa.nulls(length, data_type)
    if array.type == data_type:
        return array
    if pa.types.is_struct(data_type):
        assert isinstance(array, pa.StructArray)
        names = [f.name for f in array.type]
        children = [
            _convert(array.field(f.name) if f.name in names else None, f.type, len(array)) for f in data_type
        ]
        return pa.StructArray.from_arrays(
            children, fields=list(data_type), mask=array.is_null() if array.null_count else None
        )
    if pa.types.is_list(data_type):
        assert isinstance(array, pa.ListArray)
        values = _convert(array.values, data_type.value_type, len(array.values))
        return pa.ListArray.from_arrays(
            array.offsets, values, type=data_type, mask=array.is_null() if array.null_count else None
        )
    return array.cast(data_type)


def _shown(data: bytes) -> str:
    return repr(data)
