"""What a read returns: the log's columns, a typed stream's fields, and the rows kept by filters.

Pure functions; no I/O.  The broker builds a read's response with them, and
readers (the client, the Spark source) use them to know the response's
schema before the first batch arrives.

Columns
    A read of an untyped stream returns the log's columns
    (:data:`~.schema.LOG_SCHEMA`).  A read of a typed stream returns them and,
    after them, the fields of the stream's *current* schema version, each
    nullable (a message stored before the stream was typed, or under an older
    version lacking the field, has nulls there; see
    :func:`~.typed_values.as_version`).  A ticket's ``columns`` list names any
    of these (``offset`` is always sent); an unknown name is refused, naming it.

Filters
    A ticket's ``filters`` is a JSON list of conditions, all of which a row
    must meet (AND) to be sent::

        ["eq" | "lt" | "le" | "gt" | "ge", COLUMN, VALUE]
        ["in", COLUMN, [VALUE, ...]]
        ["is_null" | "is_not_null", COLUMN]

    ``COLUMN`` is any column the read could return (whether or not it is in
    ``columns``) of a boolean, integer, floating-point, string, date or
    timestamp type; ``VALUE`` a JSON boolean, number or string (a date or
    timestamp as ISO-8601), converted to the column's type (a value that does
    not convert is refused, naming the column).  Comparisons follow SQL: a null
    never passes ``eq``/``lt``/.../``in``.  Offsets and the response's
    ``next_offset`` are as without filters: a read whose rows were all filtered
    out still moves the reader on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .errors import InvalidArgumentError, shown
from .schema import LOG_SCHEMA
from .value_schema import StreamSchema

COMPARISONS = {"eq": pc.equal, "lt": pc.less, "le": pc.less_equal, "gt": pc.greater, "ge": pc.greater_equal}
NULL_TESTS = ("is_null", "is_not_null")
FILTER_OPS = (*COMPARISONS, "in", *NULL_TESTS)
MAX_FILTERS = 64
MAX_IN_VALUES = 10_000


@dataclass(frozen=True, slots=True)
class ColumnFilter:
    """One condition of a read's ``filters`` (see the module docstring)."""

    op: str
    column: str
    value: Any = None
    """A comparison's value, a tuple of values for ``in``, ``None`` for the null tests."""

    def to_json(self) -> list[Any]:
        """Wire form: ``[op, column]`` and the value (a list for ``in``)."""
        if self.op in NULL_TESTS:
            return [self.op, self.column]
        return [self.op, self.column, list(self.value) if self.op == "in" else self.value]

    @classmethod
    def from_json(cls, data: object) -> ColumnFilter:
        """Parse the wire form strictly; ``InvalidArgumentError`` naming what is wrong."""
        if not isinstance(data, list) or len(data) not in (2, 3) or not isinstance(data[0], str):
            raise InvalidArgumentError(f"a filter is [op, column] or [op, column, value], got {shown(data)}")
        op, column = data[0], data[1]
        if op not in FILTER_OPS:
            raise InvalidArgumentError(f"unknown filter op {shown(op)}: use one of {', '.join(FILTER_OPS)}")
        if not isinstance(column, str) or not column:
            raise InvalidArgumentError(f"filter {op!r} needs a column name, got {shown(column)}")
        if op in NULL_TESTS:
            if len(data) != 2:
                raise InvalidArgumentError(f"filter {op!r} on {column!r} takes no value, got {shown(data)}")
            return cls(op, column)
        if len(data) != 3:
            raise InvalidArgumentError(f"filter {op!r} on {column!r} needs a value")
        value = data[2]
        if op == "in":
            if not isinstance(value, list) or not 0 < len(value) <= MAX_IN_VALUES:
                raise InvalidArgumentError(
                    f"filter 'in' on {column!r} needs a list of 1 to {MAX_IN_VALUES} values, "
                    f"got {shown(value)}"
                )
            for item in value:
                _check_value(column, item)
            return cls(op, column, tuple(value))
        _check_value(column, value)
        return cls(op, column, value)


def filters_from_json(data: object) -> tuple[ColumnFilter, ...]:
    """A ticket's ``filters``: a list of at most :data:`MAX_FILTERS` conditions."""
    if not isinstance(data, list) or len(data) > MAX_FILTERS:
        raise InvalidArgumentError(
            f"filters must be a list of at most {MAX_FILTERS} conditions, got {shown(data)}"
        )
    return tuple(ColumnFilter.from_json(item) for item in data)


def _check_value(column: str, value: object) -> None:
    if value is None or not isinstance(value, bool | int | float | str):
        raise InvalidArgumentError(
            f"filter on {column!r}: a value is a boolean, number or string, got {shown(value)}"
        )


@functools.lru_cache(maxsize=256)
def typed_fields(schema: StreamSchema) -> pa.Schema:
    """The typed columns a read of a stream with ``schema`` returns: its current version's fields,
    each nullable."""
    return pa.schema([f.with_nullable(True) for f in schema.current])


def read_schema(schema: StreamSchema | None, columns: tuple[str, ...] | None = None) -> pa.Schema:
    """The schema of a read's response: the log's columns, then (for a typed stream) its fields,
    only those in ``columns`` if given (``offset`` always).  ``InvalidArgumentError`` naming a
    column the read cannot return."""
    everything = list(LOG_SCHEMA) + ([] if schema is None else list(typed_fields(schema)))
    if columns is None:
        return pa.schema(everything)
    names = {f.name for f in everything}
    unknown = [c for c in columns if c not in names]
    if unknown:
        fields = "" if schema is None else f"; its fields: {', '.join(schema.current.names)}"
        raise InvalidArgumentError(
            f"unknown column {unknown[0]!r}: a read returns the log's columns "
            f"({', '.join(LOG_SCHEMA.names)}){fields}",
            column=unknown[0],
        )
    wanted = set(columns) | {"offset"}
    return pa.schema([f for f in everything if f.name in wanted])


def filter_mask(batch: pa.RecordBatch, filters: tuple[ColumnFilter, ...]) -> pa.Array:
    """Whether each row of ``batch`` meets every filter (nulls count as not met)."""
    mask: pa.Array | None = None
    for condition in filters:
        index = batch.schema.get_field_index(condition.column)
        if index < 0:
            raise InvalidArgumentError(
                f"filter on unknown column {condition.column!r}: filters name a column the read "
                f"could return ({', '.join(batch.schema.names)})",
                column=condition.column,
            )
        column = batch.column(index)
        met = _condition(condition, column)
        met = pc.fill_null(met, False)
        mask = met if mask is None else pc.and_(mask, met)
    return mask if mask is not None else pa.array([True] * batch.num_rows)


def _condition(condition: ColumnFilter, column: pa.Array) -> pa.Array:
    data_type = column.type
    if not _filterable(data_type):
        raise InvalidArgumentError(
            f"filter on {condition.column!r}: its type {data_type} cannot be filtered at the broker "
            "(booleans, numbers, strings, dates and timestamps can)",
            column=condition.column,
        )
    if condition.op == "is_null":
        return pc.is_null(column)
    if condition.op == "is_not_null":
        return pc.is_valid(column)
    if condition.op == "in":
        values = pa.array(
            [_scalar(condition.column, v, data_type).as_py() for v in condition.value], data_type
        )
        return pc.is_in(column, value_set=values)
    return COMPARISONS[condition.op](column, _scalar(condition.column, condition.value, data_type))


def _filterable(data_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_boolean(data_type)
        or pa.types.is_integer(data_type)
        or pa.types.is_floating(data_type)
        or pa.types.is_string(data_type)
        or pa.types.is_date(data_type)
        or pa.types.is_timestamp(data_type)
    )


def _scalar(column: str, value: object, data_type: pa.DataType) -> pa.Scalar:
    """``value`` as a scalar of the column's type; refused if it does not convert exactly."""
    try:
        if isinstance(value, bool) != pa.types.is_boolean(data_type):
            raise ValueError("booleans compare with booleans only")
        if isinstance(value, str) != (
            pa.types.is_string(data_type) or pa.types.is_date(data_type) or pa.types.is_timestamp(data_type)
        ):
            raise ValueError("strings compare with strings, dates and timestamps only")
        if isinstance(value, float) and pa.types.is_integer(data_type) and not value.is_integer():
            raise ValueError("not an integer")
        if pa.types.is_date(data_type) and isinstance(value, str):
            return pa.scalar(value).cast(pa.timestamp("s")).cast(data_type)
        return pa.scalar(value).cast(data_type)
    except (ValueError, TypeError, pa.ArrowException) as exc:
        raise InvalidArgumentError(
            f"filter on {column!r}: {shown(value)} is not a value of its type {data_type} ({exc})",
            column=column,
        ) from None
