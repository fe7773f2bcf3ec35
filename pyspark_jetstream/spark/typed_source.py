"""A typed stream read by the source: its fields as Spark columns, and filters pushed to the broker.

The rows of ``format("jetstream")`` are Kafka's (see :mod:`.range_reads`).  For a
typed stream (:mod:`pyspark_jetstream.protocol.value_schema`) the option
``valueFormat`` decides what stands for ``value``:

``typed`` (the default when every stream read is typed alike)
    ``value`` is left out and the fields of the stream's current schema
    version follow the source's columns, each nullable, in Spark types
    (Arrow's mapping: ``int32`` int, ``int64`` bigint, ``float32`` float,
    ``string``, ``date32`` date, ``timestamp`` timestamp (or timestamp_ntz
    without a zone), ``decimal128`` decimal, ``list`` array, ``struct``).
    The broker sends the typed columns it stored at ingest (older messages
    read as the current version: nulls for fields added since).  The option
    ``columns`` (comma-separated field names) keeps only those fields, and
    only they are fetched.
``binary``
    Kafka's shape: ``value`` is the raw bytes, as for an untyped stream.

The schema is described when the query is planned (``DataSource.schema``);
a schema given by the user must be the same (names and types), else the
query is refused with the expected one.  Streams read together must share
their fields for ``typed`` (else the query is refused at planning, naming two
that differ); read them apart or as ``binary``.  A stream that matches
``streamPattern`` once the query runs is read if it has the query's fields
(with the same types; fields of its own are left out), and otherwise left out
of the query with a warning naming it and why -- never a failure mid-query.

Filters (batch reads only)
    PySpark's Python Data Source API (4.1+) offers ``pushFilters`` on batch
    readers only: ``DataSourceStreamReader`` has no such hook in 4.2, and
    neither kind gets the columns a query needs (there is no column-pruning
    callback; hence ``columns``).  With the option ``pushFilters=true`` and
    Spark's ``spark.sql.python.filterPushdown.enabled=true`` (Spark refuses a
    reader that pushes filters while it is off), a batch read hands the
    broker these filters on typed fields of type boolean, int, bigint or
    string: ``=``, ``<``, ``<=``, ``>``, ``>=``, ``IN`` and ``IS [NOT] NULL``
    (Spark splits ``AND`` into its parts); the broker sends only the rows that
    pass.  Every other filter (``<>``, ``OR``, ``LIKE``, floating-point and
    other types, nested fields) stays with Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_jetstream.client.cluster import ClusterConnection
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.read_shape import ColumnFilter, typed_fields
from pyspark_jetstream.protocol.value_schema import StreamSchema

from .options import SourceOptions
from .range_reads import describe_configs

SOURCE_COLUMNS = ("key", "value", "stream", "subject", "partition", "offset", "timestamp", "headers")
"""The source's own columns (``headers`` with ``includeHeaders``)."""
_PUSHED = {
    EqualTo: "eq",
    GreaterThan: "gt",
    GreaterThanOrEqual: "ge",
    LessThan: "lt",
    LessThanOrEqual: "le",
}
_INT_RANGES = {pa.int32(): (-(2**31), 2**31 - 1), pa.int64(): (-(2**63), 2**63 - 1)}


def value_fields(connection: ClusterConnection, options: SourceOptions) -> pa.Schema | None:
    """The typed fields the source's rows carry (``None``: ``value`` as bytes), per ``valueFormat``
    and ``columns`` (see the module docstring); refuses streams that cannot be read so."""
    configs = describe_configs(connection, options)
    schemas = {name: _schema_of(config) for name, config in configs.items()}
    fmt = options.value_format
    if fmt == "binary" or (fmt is None and not any(schemas.values())):
        if options.columns is not None:
            raise InvalidArgumentError(
                "option 'columns' chooses a typed stream's fields: it needs valueFormat=typed"
            )
        return None
    untyped = sorted(name for name, schema in schemas.items() if schema is None)
    if untyped or not schemas:
        raise InvalidArgumentError(
            f"valueFormat=typed reads typed streams; {', '.join(untyped) or 'no stream'} "
            f"{'has' if len(untyped) == 1 else 'have'} no schema: set valueFormat=binary"
        )
    fields = {name: typed_fields(schema) for name, schema in schemas.items() if schema is not None}
    first, shape = next(iter(sorted(fields.items())))
    for name, other in sorted(fields.items()):
        if not other.equals(shape):
            raise InvalidArgumentError(
                f"streams {first} and {name} have different fields ({', '.join(shape.names)} / "
                f"{', '.join(other.names)}): read them apart, or set valueFormat=binary"
            )
    if "stream" in shape.names:
        raise InvalidArgumentError(
            f"stream {first}'s field 'stream' has the name of the source's column 'stream': "
            "set valueFormat=binary (the value's JSON then holds it), or rename the field"
        )
    if options.columns is None:
        return shape
    unknown = [c for c in options.columns if c not in shape.names]
    if unknown:
        raise InvalidArgumentError(
            f"option 'columns' names {unknown[0]!r}, which is not a field of {first} "
            f"(its fields: {', '.join(shape.names)})"
        )
    return pa.schema([f for f in shape if f.name in options.columns])


def unreadable(configs: Mapping[str, Mapping[str, Any]], fields: pa.Schema) -> dict[str, str]:
    """The streams of ``configs`` whose rows cannot be read as ``fields`` (a query's typed columns),
    each with why: no schema, a field missing, or a field of another type.  A stream with more
    fields than the query's is read: its common fields are the query's."""
    found: dict[str, str] = {}
    for name, config in configs.items():
        schema = _schema_of(config)
        if schema is None:
            found[name] = "has no schema"
            continue
        shape = typed_fields(schema)
        missing = [f.name for f in fields if f.name not in shape.names]
        changed = [f for f in fields if f.name in shape.names and not shape.field(f.name).type.equals(f.type)]
        if missing:
            found[name] = f"lacks the field(s) {', '.join(missing)}"
        elif changed:
            field = changed[0]
            found[name] = f"has field {field.name!r} of type {shape.field(field.name).type}, not {field.type}"
    return found


def _schema_of(config: Mapping[str, Any]) -> StreamSchema | None:
    data = config.get("schema")
    return None if data is None else StreamSchema.from_json(data)


def spark_struct(include_headers: bool, fields: pa.Schema | None) -> StructType:
    """The source's rows: Kafka's shape, or (with typed ``fields``) ``value`` replaced by them."""
    columns = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("stream", StringType()),
        StructField("subject", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
    ]
    if include_headers:
        element = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        columns.append(StructField("headers", ArrayType(element)))
    if fields is None:
        return StructType(columns)
    typed = [StructField(f.name, from_arrow_type(f.type), True) for f in fields]
    return StructType([c for c in columns if c.name != "value"] + typed)


def check_schema(given: StructType, expected: StructType) -> None:
    """Refuse a user's schema that is not the source's (names and types, in order)."""
    shown = [(f.name, f.dataType) for f in given.fields]
    if shown != [(f.name, f.dataType) for f in expected.fields]:
        raise InvalidArgumentError(
            f"the schema given ({given.simpleString()}) is not this source's: its rows are "
            f"{expected.simpleString()} (set valueFormat or columns to choose the typed fields)"
        )


def pushable(filters: Iterable[Filter], fields: pa.Schema | None) -> tuple[list[ColumnFilter], list[Filter]]:
    """The filters the broker can apply (as :class:`ColumnFilter`), and the rest, for Spark."""
    pushed: list[ColumnFilter] = []
    kept: list[Filter] = []
    for spark_filter in filters:
        converted = _converted(spark_filter, fields)
        if converted is None:
            kept.append(spark_filter)
        else:
            pushed.append(converted)
    return pushed, kept


def _converted(spark_filter: Filter, fields: pa.Schema | None) -> ColumnFilter | None:
    attribute: tuple[str, ...] = getattr(spark_filter, "attribute", ())
    if fields is None or len(attribute) != 1 or attribute[0] not in fields.names:
        return None
    name = attribute[0]
    data_type = fields.field(name).type
    if isinstance(spark_filter, IsNull | IsNotNull):
        return ColumnFilter("is_null" if isinstance(spark_filter, IsNull) else "is_not_null", name)
    if isinstance(spark_filter, In):
        values = tuple(spark_filter.value)
        if values and all(_fits(v, data_type) for v in values):
            return ColumnFilter("in", name, values)
        return None
    op = _PUSHED.get(type(spark_filter))
    value = getattr(spark_filter, "value", None)
    if op is not None and _fits(value, data_type):
        return ColumnFilter(op, name, value)
    return None


def _fits(value: object, data_type: pa.DataType) -> bool:
    """Whether the broker compares ``value`` with a column of ``data_type`` exactly as Spark does."""
    if pa.types.is_boolean(data_type):
        return isinstance(value, bool)
    if data_type in _INT_RANGES:
        low, high = _INT_RANGES[data_type]
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    if pa.types.is_string(data_type):
        return isinstance(value, str)
    return False  # floats (NaN orders differently), dates, times, decimals, nested: Spark's
