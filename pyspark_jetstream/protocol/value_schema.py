"""Typed streams: the schema of a stream's message values, its JSON form and its versions.

A stream may declare what its message values hold: named fields of Arrow
types, and the payload format they arrive in (``json``: one JSON object per
message).  The declaration is kept in the stream's configuration, so it is
stored and replicated with the rest of the stream's metadata.  Pure functions
and frozen value types; no I/O.

The JSON form of one schema (a *schema document*, what ``jetstream stream
create --schema FILE`` reads)::

    {"format": "json",                              # optional; "json" is the only format
     "fields": [FIELD, ...]}

    FIELD = {"name": "amount", "type": TYPE, "nullable": true}   # nullable defaults to true
    TYPE  = "bool" | "int32" | "int64" | "float32" | "float64" | "string" | "date32"
          | {"type": "timestamp", "unit": "s" | "ms" | "us" | "ns", "tz": "UTC"}   # tz optional
          | {"type": "decimal128", "precision": 1-38, "scale": 0-precision}
          | {"type": "list", "item": TYPE}                        # items are nullable
          | {"type": "struct", "fields": [FIELD, ...]}

A simple type may also be written as an object (``{"type": "int64"}``); the
canonical form written back is the string.  Field names are non-empty,
printable and unique among their siblings; a top-level field may not take the
name of one of the log's own columns (:data:`RESERVED_NAMES`: ``offset``,
``timestamp``, ... and ``partition``, which readers add), so typed columns
can sit beside them.

What the partition leader does with a message whose value does not match
(see :mod:`.typed_values`) is the document's too, optional keys beside
``fields``::

    "on_invalid": "refuse" | "dead-letter"   # "refuse" unless given
    "dead_letter": "STREAM"                  # with "dead-letter" only: the stream that takes them

``refuse`` answers the publisher with an error naming the field and reason;
``dead-letter`` stores the raw message in the named stream (which must exist
when the stream is created, untyped) with the reason in a header.  On an
update a document without ``on_invalid`` keeps the stream's policy.

A stream keeps every version of its schema (:class:`StreamSchema`), numbered
from 1, so that data written under an older version stays readable.  Its
JSON form, inside the stream's configuration::

    {"format": "json", "versions": [{"version": 1, "fields": [...]}, ...],
     "on_invalid": "dead-letter", "dead_letter": "orders-invalid"}   # both left out when "refuse"

A new version must be *compatible* with the current one
(:func:`check_compatible`): fields are matched by name; a field may be added
if it is nullable, a field's type may widen from ``int32`` to ``int64`` or
from ``float32`` to ``float64``, and a non-nullable field may become
nullable (all of this inside structs and lists too).  Anything else is
refused with one line naming the field and the reason: removing or renaming
a field, any other change of type, adding a non-nullable field, making a
nullable field non-nullable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import pyarrow as pa

from .errors import InvalidArgumentError
from .schema import LOG_SCHEMA

PAYLOAD_FORMATS = ("json",)
"""Payload formats a typed stream may declare (one JSON object per message value)."""
SIMPLE_TYPES: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "string": pa.string(),
    "date32": pa.date32(),
}
"""Types written as a bare name."""
TIME_UNITS = ("s", "ms", "us", "ns")
MAX_DECIMAL_PRECISION = 38
MAX_DEPTH = 8
"""Deepest nesting of lists and structs."""
MAX_NAME_LENGTH = 256
MAX_FIELDS = 1000
"""Most fields in one schema, nested ones included."""
MAX_SCHEMA_BYTES = 256 * 1024
"""Largest JSON form of a stream's schema versions: it is stored with the stream's metadata
(a ZooKeeper node holds at most 1 MiB by default, and every broker reads it)."""
RESERVED_NAMES: tuple[str, ...] = (*LOG_SCHEMA.names, "partition")
"""Names a top-level value field may not take: the log's own columns, and ``partition``, which
readers (the client, the Spark source) add beside them."""
ON_INVALID = ("refuse", "dead-letter")
"""What a typed stream does with a message whose value does not match its schema."""
WIDENINGS = {(pa.int32(), pa.int64()), (pa.float32(), pa.float64())}
"""Type changes that keep every stored value readable."""


def type_from_json(spec: object, path: str = "value", depth: int = 0) -> pa.DataType:
    """The Arrow type written as ``spec`` (see the module docstring) of the field at ``path``."""
    where = f"schema field {path!r}"
    if isinstance(spec, str):
        simple = SIMPLE_TYPES.get(spec)
        if simple is None:
            raise InvalidArgumentError(f"{where}: unknown type {_shown(spec)}; {_TYPE_HELP}")
        return simple
    if not isinstance(spec, dict):
        raise InvalidArgumentError(
            f"{where}: a type is a name or an object, got {_shown(spec)}; {_TYPE_HELP}"
        )
    kind = spec.get("type")
    if not isinstance(kind, str):
        raise InvalidArgumentError(
            f"{where}: a type object needs a 'type' name, got {_shown(kind)}; {_TYPE_HELP}"
        )
    if kind in SIMPLE_TYPES:
        _only(spec, {"type"}, where)
        return SIMPLE_TYPES[kind]
    if kind == "timestamp":
        _only(spec, {"type", "unit", "tz"}, where)
        unit, tz = spec.get("unit"), spec.get("tz")
        if unit not in TIME_UNITS:
            raise InvalidArgumentError(
                f"{where}: a timestamp's unit is one of {', '.join(TIME_UNITS)}, got {_shown(unit)}"
            )
        if tz is not None and (not isinstance(tz, str) or not tz):
            raise InvalidArgumentError(f"{where}: a timestamp's tz is a time zone name, got {_shown(tz)}")
        return pa.timestamp(unit, tz)
    if kind == "decimal128":
        _only(spec, {"type", "precision", "scale"}, where)
        precision, scale = spec.get("precision"), spec.get("scale")
        if not _is_int(precision) or not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise InvalidArgumentError(
                f"{where}: a decimal128's precision is 1 to {MAX_DECIMAL_PRECISION}, got {_shown(precision)}"
            )
        if not _is_int(scale) or not 0 <= scale <= precision:
            raise InvalidArgumentError(
                f"{where}: a decimal128's scale is 0 to its precision ({precision}), got {_shown(scale)}"
            )
        return pa.decimal128(precision, scale)
    if kind in ("list", "struct"):
        if depth >= MAX_DEPTH:
            raise InvalidArgumentError(f"{where}: lists and structs nest at most {MAX_DEPTH} deep")
        if kind == "list":
            _only(spec, {"type", "item"}, where)
            if "item" not in spec:
                raise InvalidArgumentError(f"{where}: a list needs its 'item' type")
            return pa.list_(type_from_json(spec["item"], f"{path}[]", depth + 1))
        _only(spec, {"type", "fields"}, where)
        return pa.struct(fields_from_json(spec.get("fields"), f"{path}.", depth + 1))
    raise InvalidArgumentError(f"{where}: unknown type {_shown(kind)}; {_TYPE_HELP}")


def type_to_json(data_type: pa.DataType, path: str = "value") -> object:
    """The JSON form of ``data_type`` (of the field at ``path``); ``InvalidArgumentError`` for a type
    outside the documented set."""
    where = f"schema field {path!r}"
    for name, simple in SIMPLE_TYPES.items():
        if data_type == simple:
            return name
    if pa.types.is_timestamp(data_type):
        stored: dict[str, Any] = {"type": "timestamp", "unit": data_type.unit}
        if data_type.tz is not None:
            stored["tz"] = data_type.tz
        return stored
    if pa.types.is_decimal128(data_type):
        return {"type": "decimal128", "precision": data_type.precision, "scale": data_type.scale}
    if pa.types.is_list(data_type):
        if not data_type.value_field.nullable:
            raise InvalidArgumentError(f"{where}: list items must be nullable")
        return {"type": "list", "item": type_to_json(data_type.value_type, f"{path}[]")}
    if pa.types.is_struct(data_type):
        return {"type": "struct", "fields": fields_to_json(list(data_type), f"{path}.")}
    raise InvalidArgumentError(f"{where}: type {data_type} is not supported; {_TYPE_HELP}")


def fields_from_json(data: object, prefix: str = "", depth: int = 0) -> list[pa.Field]:
    """Fields written as a list of ``{"name", "type", "nullable"}`` objects; ``prefix`` names the parent."""
    where = f"schema field {prefix.rstrip('.')!r}" if prefix else "schema"
    if not isinstance(data, list) or not data:
        raise InvalidArgumentError(f"{where}: 'fields' must be a non-empty list, got {_shown(data)}")
    fields = []
    for i, spec in enumerate(data):
        if not isinstance(spec, dict):
            raise InvalidArgumentError(f"{where}: field {i + 1} must be an object, got {_shown(spec)}")
        name = _name(spec.get("name"), prefix, i)
        path = f"schema field {prefix + name!r}"
        _only(spec, {"name", "type", "nullable"}, path)
        if "type" not in spec:
            raise InvalidArgumentError(f"{path}: it has no 'type'")
        nullable = spec.get("nullable", True)
        if not isinstance(nullable, bool):
            raise InvalidArgumentError(f"{path}: 'nullable' must be true or false, got {_shown(nullable)}")
        fields.append(pa.field(name, type_from_json(spec["type"], prefix + name, depth), nullable=nullable))
    _unique(fields, prefix)
    return fields


def fields_to_json(fields: list[pa.Field], prefix: str = "") -> list[dict[str, Any]]:
    """The JSON form of ``fields`` (``nullable`` written only when false)."""
    _unique(fields, prefix)
    stored = []
    for i, f in enumerate(fields):
        name = _name(f.name, prefix, i)
        entry: dict[str, Any] = {"name": name, "type": type_to_json(f.type, prefix + name)}
        if not f.nullable:
            entry["nullable"] = False
        stored.append(entry)
    return stored


def check_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` without metadata, if every field is of a documented type; else raise naming the field."""
    if not isinstance(schema, pa.Schema):
        raise InvalidArgumentError(f"a value schema is a pyarrow.Schema, got {_shown(schema)}")
    return schema_from_json(schema_to_json(schema))


def schema_to_json(schema: pa.Schema) -> list[dict[str, Any]]:
    """The JSON form of ``schema``'s fields."""
    return fields_to_json(list(schema))


def schema_from_json(data: object) -> pa.Schema:
    """A schema from the JSON form of its fields; ``InvalidArgumentError`` naming a bad field."""
    fields = fields_from_json(data)
    count = _count(fields)
    if count > MAX_FIELDS:
        raise InvalidArgumentError(f"schema: {count} fields (nested ones included), at most {MAX_FIELDS}")
    return pa.schema(fields)


def schema_from_ipc(data: bytes) -> pa.Schema:
    """A schema from an Arrow IPC schema message (``pyarrow.Schema.serialize()``) or stream/file."""
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(data))
    except pa.ArrowException:
        schema = None
    if schema is None:
        for opener in (pa.ipc.open_stream, pa.ipc.open_file):
            try:
                schema = opener(pa.py_buffer(data)).schema
                break
            except pa.ArrowException:
                continue
    if schema is None:
        raise InvalidArgumentError("not an Arrow IPC schema, stream or file (nor a JSON schema document)")
    return check_schema(schema)


@dataclass(frozen=True)
class SchemaDocument:
    """One schema as a user gives it: the value's fields, the payload format, and what to do
    with a message that does not match (``None``: ``refuse`` for a new stream, unchanged on an
    update)."""

    schema: pa.Schema
    format: str = "json"
    on_invalid: str | None = None
    dead_letter: str | None = None

    def __post_init__(self) -> None:
        _check_format(self.format)
        object.__setattr__(self, "schema", check_schema(self.schema))
        check_reserved(self.schema)
        if self.on_invalid is not None or self.dead_letter is not None:
            check_on_invalid(self.on_invalid or "refuse", self.dead_letter)

    def to_json(self) -> dict[str, Any]:
        """The document's JSON form (``on_invalid`` and ``dead_letter`` when given)."""
        stored: dict[str, Any] = {
            "format": self.format,
            "fields": schema_to_json(self.schema),
            "on_invalid": self.on_invalid,
            "dead_letter": self.dead_letter,
        }
        return {key: value for key, value in stored.items() if value is not None}

    @classmethod
    def from_json(cls, data: object) -> SchemaDocument:
        """Parse a document (``{"format", "fields"}``); ``InvalidArgumentError`` naming a bad field."""
        if not isinstance(data, dict):
            raise InvalidArgumentError(
                f'a schema document is an object {{"format", "fields"}}, got {_shown(data)}'
            )
        _only(data, {"format", "fields", "on_invalid", "dead_letter"}, "schema document")
        return cls(
            schema_from_json(data.get("fields")),
            data.get("format", "json"),
            data.get("on_invalid"),
            data.get("dead_letter"),
        )

    @classmethod
    def parse(cls, raw: bytes) -> SchemaDocument:
        """A document from a file's bytes: the JSON form, or an Arrow IPC schema (format ``json``)."""
        if raw.lstrip()[:1] == b"{":
            try:
                data = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                raise InvalidArgumentError(f"the schema document is not valid JSON: {exc}") from None
            return cls.from_json(data)
        return cls(schema_from_ipc(raw))


def as_document(value: object) -> SchemaDocument:
    """A schema document from what a client is given: a :class:`SchemaDocument`, a
    ``pyarrow.Schema`` (payload format ``json``) or the document's JSON form (a dict)."""
    if isinstance(value, SchemaDocument):
        return value
    if isinstance(value, pa.Schema):
        return SchemaDocument(value)
    if isinstance(value, dict):
        return SchemaDocument.from_json(value)
    raise InvalidArgumentError(
        f"a schema is a pyarrow.Schema, a schema document or its JSON form (a dict), got {_shown(value)}"
    )


@dataclass(frozen=True)
class StreamSchema:
    """Every version of a stream's value schema, oldest first (version ``n`` is ``versions[n - 1]``),
    and what the partition leader does with a message that does not match the current one."""

    format: str
    versions: tuple[pa.Schema, ...] = field(default=())
    on_invalid: str = "refuse"
    """``refuse`` or ``dead-letter`` (:data:`ON_INVALID`)."""
    dead_letter: str | None = None
    """The stream invalid messages are stored in, with ``on_invalid`` ``dead-letter``."""

    def __post_init__(self) -> None:
        _check_format(self.format)
        check_on_invalid(self.on_invalid, self.dead_letter)
        if not isinstance(self.versions, tuple) or not self.versions:
            raise InvalidArgumentError("a stream schema needs at least one version")
        checked = tuple(check_schema(s) for s in self.versions)
        for number in range(1, len(checked)):
            check_compatible(checked[number - 1], checked[number], number + 1)
        object.__setattr__(self, "versions", checked)
        size = len(json.dumps(self.to_json(), separators=(",", ":")))
        if size > MAX_SCHEMA_BYTES:
            raise InvalidArgumentError(
                f"schema versions take {size} bytes of metadata, at most {MAX_SCHEMA_BYTES}: "
                "create a new stream for a schema this large or changed this often"
            )

    @classmethod
    def first(cls, document: SchemaDocument) -> StreamSchema:
        """A new stream's schema: ``document`` as version 1 (``refuse`` unless it says otherwise)."""
        return cls(document.format, (document.schema,), document.on_invalid or "refuse", document.dead_letter)

    @property
    def version(self) -> int:
        """The current version's number."""
        return len(self.versions)

    @property
    def current(self) -> pa.Schema:
        """The current version."""
        return self.versions[-1]

    def evolved(self, document: SchemaDocument) -> StreamSchema:
        """These versions and ``document`` as the next, if compatible (the current one again: ``self``,
        unless the document changes ``on_invalid`` or ``dead_letter``).

        Raises ``InvalidArgumentError`` with one line naming the field and why it cannot change so.
        """
        if document.format != self.format:
            raise InvalidArgumentError(
                f"the payload format cannot change (it is {self.format!r}, not {document.format!r})"
            )
        on_invalid, dead_letter = self.on_invalid, self.dead_letter
        if document.on_invalid is not None:
            on_invalid, dead_letter = document.on_invalid, document.dead_letter
        if document.schema.equals(self.current):
            if (on_invalid, dead_letter) == (self.on_invalid, self.dead_letter):
                return self
            return StreamSchema(self.format, self.versions, on_invalid, dead_letter)
        check_compatible(self.current, document.schema, self.version + 1)
        return StreamSchema(self.format, (*self.versions, document.schema), on_invalid, dead_letter)

    def to_json(self) -> dict[str, Any]:
        """The stored form: ``{"format", "versions": [{"version", "fields"}, ...]}``, and
        ``on_invalid`` and ``dead_letter`` unless ``refuse``."""
        stored: dict[str, Any] = {
            "format": self.format,
            "versions": [{"version": n, "fields": schema_to_json(s)} for n, s in enumerate(self.versions, 1)],
        }
        if self.on_invalid != "refuse":
            stored["on_invalid"] = self.on_invalid
            stored["dead_letter"] = self.dead_letter
        return stored

    @classmethod
    def from_json(cls, data: object) -> StreamSchema:
        """Parse the stored form strictly (versions numbered 1, 2, ... in order)."""
        if not isinstance(data, dict):
            raise InvalidArgumentError(f"a stream schema is an object, got {_shown(data)}")
        _only(data, {"format", "versions", "on_invalid", "dead_letter"}, "stream schema")
        versions = data.get("versions")
        if not isinstance(versions, list) or not versions:
            raise InvalidArgumentError(
                f"a stream schema's versions are a non-empty list, got {_shown(versions)}"
            )
        schemas = []
        for number, entry in enumerate(versions, 1):
            if not isinstance(entry, dict) or entry.get("version") != number:
                raise InvalidArgumentError(
                    f"schema version {number} is missing or out of order: {_shown(entry)}"
                )
            _only(entry, {"version", "fields"}, f"schema version {number}")
            schemas.append(schema_from_json(entry.get("fields")))
        return cls(
            data.get("format"),  # type: ignore[arg-type] # checked on construction
            tuple(schemas),
            data.get("on_invalid", "refuse"),
            data.get("dead_letter"),
        )

    def describe(self) -> list[str]:
        """One line per field of the current version: ``name: type`` (``not null`` when so)."""
        return [_describe(f) for f in self.current]

    def __repr__(self) -> str:
        policy = f"; invalid messages to {self.dead_letter}" if self.on_invalid == "dead-letter" else ""
        return f"<{self.format} schema version {self.version}: {', '.join(self.describe())}{policy}>"


def check_reserved(schema: pa.Schema) -> None:
    """Raise ``InvalidArgumentError`` naming the first top-level field named as one of the log's
    own columns (:data:`RESERVED_NAMES`)."""
    for name in schema.names:
        if name in RESERVED_NAMES:
            raise InvalidArgumentError(
                f"schema field {name!r}: the name is taken by the log's own columns "
                f"({', '.join(RESERVED_NAMES)}); rename the field"
            )


def check_on_invalid(on_invalid: object, dead_letter: object) -> None:
    """Raise ``InvalidArgumentError`` unless ``on_invalid`` is one of :data:`ON_INVALID` and
    ``dead_letter`` names a stream exactly when it is ``dead-letter``."""
    if on_invalid not in ON_INVALID:
        raise InvalidArgumentError(
            f"on_invalid must be one of {', '.join(ON_INVALID)}, got {_shown(on_invalid)}"
        )
    if on_invalid == "dead-letter" and (not isinstance(dead_letter, str) or not dead_letter):
        raise InvalidArgumentError(
            f'on_invalid "dead-letter" needs "dead_letter": the name of the stream to store them in, '
            f"got {_shown(dead_letter)}"
        )
    if on_invalid == "refuse" and dead_letter is not None:
        raise InvalidArgumentError(
            f'"dead_letter" ({_shown(dead_letter)}) goes with on_invalid "dead-letter", not "refuse"'
        )


def check_compatible(old: pa.Schema, new: pa.Schema, version: int | None = None) -> None:
    """Raise ``InvalidArgumentError`` (one line, naming the field) unless ``new`` may follow ``old``.

    Data written under ``old`` must stay readable as ``new``: fields are matched by name; a
    new field must be nullable; a type may only widen (:data:`WIDENINGS`); a field may become
    nullable, never non-nullable; nothing may be removed.
    """
    problem = _incompatibility(list(old), list(new), "")
    if problem is not None:
        to = f" to version {version}" if version is not None else ""
        raise InvalidArgumentError(f"incompatible schema change{to}: {problem}")


def _incompatibility(old: list[pa.Field], new: list[pa.Field], prefix: str) -> str | None:
    after = {f.name: f for f in new}
    before = {f.name: f for f in old}
    for f in old:
        path = prefix + f.name
        changed = after.get(f.name)
        if changed is None:
            return (
                f"field {path!r} was removed; data written before still has it, so fields may only be "
                "added (a rename is a removal)"
            )
        if f.nullable and not changed.nullable:
            return f"field {path!r} became non-nullable; data written before may hold nulls in it"
        problem = _type_change(f.type, changed.type, path)
        if problem is not None:
            return problem
    for f in new:
        if f.name not in before and not f.nullable:
            return (
                f"new field {prefix + f.name!r} is not nullable; data written before lacks it, so add "
                'it with "nullable": true'
            )
    return None


def _type_change(old: pa.DataType, new: pa.DataType, path: str) -> str | None:
    if old == new or (old, new) in WIDENINGS:
        return None
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        return _incompatibility(list(old), list(new), f"{path}.")
    if pa.types.is_list(old) and pa.types.is_list(new):
        return _type_change(old.value_type, new.value_type, f"{path}[]")
    return (
        f"field {path!r} changed type from {type_name(old)} to {type_name(new)}; only int32 -> int64 "
        "and float32 -> float64 widen compatibly"
    )


_TYPE_HELP = (
    f"use {', '.join(SIMPLE_TYPES)}, or an object for timestamp (unit, tz), decimal128 (precision, "
    "scale), list (item) or struct (fields)"
)


def type_name(data_type: pa.DataType) -> str:
    """A short name of a documented type, for messages: ``int64``, ``timestamp[ms, UTC]``,
    ``decimal128(12, 2)``, ``list<string>``, ``struct<zip: string, n: int32 not null>``."""
    for name, simple in SIMPLE_TYPES.items():
        if data_type == simple:
            return name
    if pa.types.is_timestamp(data_type):
        return f"timestamp[{data_type.unit}{', ' + data_type.tz if data_type.tz else ''}]"
    if pa.types.is_decimal128(data_type):
        return f"decimal128({data_type.precision}, {data_type.scale})"
    if pa.types.is_list(data_type):
        return f"list<{type_name(data_type.value_type)}>"
    if pa.types.is_struct(data_type):
        return f"struct<{', '.join(_describe(f) for f in data_type)}>"
    return str(data_type)


def _describe(f: pa.Field) -> str:
    return f"{f.name}: {type_name(f.type)}{'' if f.nullable else ' not null'}"


def _check_format(value: object) -> None:
    if value not in PAYLOAD_FORMATS:
        raise InvalidArgumentError(
            f"payload format must be one of {', '.join(PAYLOAD_FORMATS)}, got {_shown(value)}"
        )


def _name(name: object, prefix: str, index: int) -> str:
    where = f"schema field {index + 1}" + (f" of {prefix.rstrip('.')!r}" if prefix else "")
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH or not name.isprintable():
        raise InvalidArgumentError(
            f"{where}: a field's name is 1-{MAX_NAME_LENGTH} printable characters, got {_shown(name)}"
        )
    return name


def _unique(fields: list[pa.Field], prefix: str) -> None:
    seen: set[str] = set()
    for f in fields:
        if f.name in seen:
            raise InvalidArgumentError(f"schema field {prefix + f.name!r} appears twice")
        seen.add(f.name)


def _only(spec: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in set(spec) - allowed)
    if unknown:
        raise InvalidArgumentError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def _count(fields: list[pa.Field]) -> int:
    total = 0
    for f in fields:
        total += 1
        data_type = f.type
        while pa.types.is_list(data_type):
            data_type = data_type.value_type
        if pa.types.is_struct(data_type):
            total += _count(list(data_type))
    return total


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:56]}..."
