"""Typed streams' schemas: the JSON form, its versions and the compatibility rules (no I/O)."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.streams import StreamConfig, schema_updated
from pyspark_jetstream.protocol.value_schema import (
    MAX_SCHEMA_BYTES,
    RESERVED_NAMES,
    SchemaDocument,
    StreamSchema,
    as_document,
    check_compatible,
    schema_from_json,
    schema_to_json,
    type_name,
)

ORDERS = {
    "format": "json",
    "fields": [
        {"name": "order_id", "type": "int32", "nullable": False},
        {"name": "country", "type": "string"},
        {"name": "amount", "type": {"type": "decimal128", "precision": 12, "scale": 2}},
        {"name": "price", "type": "float32"},
        {"name": "created", "type": {"type": "timestamp", "unit": "ms", "tz": "UTC"}},
        {"name": "day", "type": "date32"},
        {"name": "paid", "type": "bool"},
        {"name": "tags", "type": {"type": "list", "item": "string"}},
        {
            "name": "address",
            "type": {"type": "struct", "fields": [{"name": "zip", "type": "int32"}]},
        },
    ],
}


def orders(*changes: tuple[str, object], added: list[dict] | None = None) -> SchemaDocument:
    """The orders document with fields replaced (``(name, new field or None to drop)``) and added."""
    fields = [dict(f) for f in ORDERS["fields"]]
    for name, new in changes:
        index = next(i for i, f in enumerate(fields) if f["name"] == name)
        if new is None:
            del fields[index]
        else:
            fields[index] = new  # type: ignore[assignment]
    return SchemaDocument.from_json({"fields": fields + (added or [])})


def test_the_json_form_maps_to_arrow_types_and_back():
    document = SchemaDocument.from_json(ORDERS)
    assert document.schema == pa.schema(
        [
            pa.field("order_id", pa.int32(), nullable=False),
            ("country", pa.string()),
            ("amount", pa.decimal128(12, 2)),
            ("price", pa.float32()),
            ("created", pa.timestamp("ms", "UTC")),
            ("day", pa.date32()),
            ("paid", pa.bool_()),
            ("tags", pa.list_(pa.string())),
            ("address", pa.struct([("zip", pa.int32())])),
        ]
    )
    assert document.to_json() == ORDERS
    # A simple type may be spelled as an object; the canonical form is the name.
    spelled = SchemaDocument.from_json({"fields": [{"name": "n", "type": {"type": "int64"}}]})
    assert spelled.to_json() == {"format": "json", "fields": [{"name": "n", "type": "int64"}]}


def test_an_arrow_ipc_schema_is_accepted_without_its_metadata():
    schema = pa.schema([pa.field("n", pa.int64(), metadata={"a": "b"})], metadata={"c": "d"})
    for raw in (schema.serialize().to_pybytes(), _ipc_stream(schema)):
        document = SchemaDocument.parse(raw)
        assert document.schema == pa.schema([("n", pa.int64())])
        assert document.schema.metadata is None and document.format == "json"
    assert SchemaDocument.parse(json.dumps(ORDERS).encode()).to_json() == ORDERS
    for garbage in (b"", b"\x00" * 8, b"\xff\xff\xff\xff\x10\x00\x00\x00garbage", b"[1, 2]"):
        with pytest.raises(InvalidArgumentError, match="^not an Arrow IPC schema, stream or file"):
            SchemaDocument.parse(garbage)
    with pytest.raises(InvalidArgumentError, match="^the schema document is not valid JSON: "):
        SchemaDocument.parse(b"{bad")


def _ipc_stream(schema: pa.Schema) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema):
        pass
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"fields": [{"name": "a", "type": "int"}]},
            r"^schema field 'a': unknown type 'int'; use bool, int32",
        ),
        (
            {"fields": [{"name": "a", "type": "int32", "size": 4}]},
            r"^schema field 'a': unknown key\(s\) size",
        ),
        ({"fields": [{"name": "a"}]}, r"^schema field 'a': it has no 'type'"),
        ({"fields": [{"name": "a", "type": "int32", "nullable": "no"}]}, r"'a': 'nullable' must be true or"),
        ({"fields": [{"name": "", "type": "int32"}]}, r"^schema field 1: a field's name is 1-256 printable"),
        (
            {"fields": [{"name": "a", "type": "int32"}, {"name": "a", "type": "bool"}]},
            "field 'a' appears twice",
        ),
        ({"fields": []}, r"^schema: 'fields' must be a non-empty list"),
        ({"fields": [{"name": "t", "type": {"type": "timestamp", "unit": "m"}}]}, r"'t': a timestamp's unit"),
        (
            {"fields": [{"name": "d", "type": {"type": "decimal128", "precision": 39, "scale": 0}}]},
            r"^schema field 'd': a decimal128's precision is 1 to 38, got 39",
        ),
        (
            {"fields": [{"name": "d", "type": {"type": "decimal128", "precision": 5, "scale": 6}}]},
            r"'d': a decimal128's scale is 0 to its precision \(5\), got 6",
        ),
        (
            {"fields": [{"name": "l", "type": {"type": "list"}}]},
            r"^schema field 'l': a list needs its 'item'",
        ),
        (
            {
                "fields": [
                    {
                        "name": "a",
                        "type": {
                            "type": "struct",
                            "fields": [{"name": "b", "type": {"type": "list", "item": "u8"}}],
                        },
                    }
                ]
            },
            r"^schema field 'a\.b\[\]': unknown type 'u8'",
        ),
        (
            {"fields": [{"name": "a", "type": {"type": ["x"]}}]},
            r"^schema field 'a': a type object needs a 'type'",
        ),
        (
            {"format": "avro", "fields": [{"name": "a", "type": "int32"}]},
            "payload format must be one of json",
        ),
        (
            {"fields": [{"name": "a", "type": "int32"}], "extra": 1},
            r"^schema document: unknown key\(s\) extra",
        ),
        ([1], "a schema document is an object"),
    ],
)
def test_bad_documents_are_refused_in_one_line_naming_the_field(document, message):
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        SchemaDocument.from_json(document)
    assert "\n" not in str(caught.value)


def test_types_outside_the_documented_set_are_refused_naming_the_field():
    with pytest.raises(InvalidArgumentError, match=r"^schema field 'b': type uint8 is not supported"):
        SchemaDocument(pa.schema([("a", pa.int32()), ("b", pa.uint8())]))
    item = pa.list_(pa.field("item", pa.int32(), nullable=False))
    with pytest.raises(InvalidArgumentError, match=r"^schema field 'l': list items must be nullable"):
        SchemaDocument(pa.schema([("l", item)]))
    deep: dict = {"type": "int32"}
    for _ in range(9):
        deep = {"type": "list", "item": deep}
    with pytest.raises(InvalidArgumentError, match="nest at most 8 deep"):
        SchemaDocument.from_json({"fields": [{"name": "d", "type": deep}]})
    with pytest.raises(InvalidArgumentError, match="at most 1000"):
        SchemaDocument.from_json({"fields": [{"name": f"f{i}", "type": "bool"} for i in range(1001)]})


# ---- compatibility -------------------------------------------------------------------------


def test_compatible_changes_are_accepted_as_the_next_version():
    first = StreamSchema.first(SchemaDocument.from_json(ORDERS))
    assert first.version == 1
    changed = orders(
        ("order_id", {"name": "order_id", "type": "int64", "nullable": False}),  # widened
        ("price", {"name": "price", "type": "float64"}),  # widened
        ("paid", {"name": "paid", "type": "bool", "nullable": True}),
        (
            "address",
            {
                "name": "address",
                "type": {
                    "type": "struct",
                    "fields": [{"name": "zip", "type": "int64"}, {"name": "city", "type": "string"}],
                },
            },
        ),
        added=[{"name": "coupon", "type": "string"}],
    )
    second = first.evolved(changed)
    assert second.version == 2 and second.versions[0] == first.current
    assert second.current == changed.schema
    assert second.evolved(changed) is second  # the same schema again: nothing changes
    # A non-nullable field may become nullable.
    relaxed = orders(("order_id", {"name": "order_id", "type": "int64"}))
    assert (
        second.evolved(
            SchemaDocument(pa.schema([relaxed.schema.field("order_id"), *list(changed.schema)[1:]]))
        ).version
        == 3
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (orders(("country", None)), "field 'country' was removed; data written before still has it"),
        (
            orders(("country", {"name": "nation", "type": "string"})),
            "field 'country' was removed; data written before still has it, so fields may only be added",
        ),
        (
            orders(("order_id", {"name": "order_id", "type": "string", "nullable": False})),
            "field 'order_id' changed type from int32 to string; only int32 -> int64 and float32 -> float64",
        ),
        (
            orders(("price", {"name": "price", "type": "int32"})),
            "field 'price' changed type from float32 to int32",
        ),
        (
            orders(
                ("created", {"name": "created", "type": {"type": "timestamp", "unit": "us", "tz": "UTC"}})
            ),
            r"field 'created' changed type from timestamp\[ms, UTC\] to timestamp\[us, UTC\]",
        ),
        (
            orders(("country", {"name": "country", "type": "string", "nullable": False})),
            "field 'country' became non-nullable; data written before may hold nulls in it",
        ),
        (
            orders(added=[{"name": "coupon", "type": "string", "nullable": False}]),
            "new field 'coupon' is not nullable; data written before lacks it",
        ),
        (
            orders(
                (
                    "address",
                    {
                        "name": "address",
                        "type": {"type": "struct", "fields": [{"name": "zip", "type": "string"}]},
                    },
                )
            ),
            "field 'address.zip' changed type from int32 to string",
        ),
        (
            orders(("tags", {"name": "tags", "type": {"type": "list", "item": "int32"}})),
            r"field 'tags\[\]' changed type from string to int32",
        ),
        (
            orders(("tags", {"name": "tags", "type": "string"})),
            r"field 'tags' changed type from list<string> to string",
        ),
    ],
)
def test_incompatible_changes_are_refused_in_one_line_naming_the_field(document, message):
    current = StreamSchema.first(SchemaDocument.from_json(ORDERS))
    with pytest.raises(
        InvalidArgumentError, match=f"^incompatible schema change to version 2: {message}"
    ) as caught:
        current.evolved(document)
    assert "\n" not in str(caught.value)


def test_the_payload_format_cannot_change_and_a_stream_without_schema_gets_none_later():
    config = StreamConfig(name="s", subject="s")
    with pytest.raises(InvalidArgumentError, match="stream 's' has no schema: a schema is given when"):
        schema_updated(config, SchemaDocument.from_json(ORDERS))
    typed = StreamConfig(name="s", subject="s", schema=StreamSchema.first(SchemaDocument.from_json(ORDERS)))
    assert schema_updated(typed, SchemaDocument.from_json(ORDERS)) is None
    grown = schema_updated(typed, orders(added=[{"name": "x", "type": "bool"}]))
    assert grown is not None and grown.schema is not None and grown.schema.version == 2
    assert grown.differences(typed) == [f"schema: {grown.schema!r} != {typed.schema!r}"]


def test_stored_versions_are_checked_against_each_other():
    a = pa.schema([("a", pa.int32())])
    with pytest.raises(InvalidArgumentError, match="to version 2: field 'a' was removed"):
        StreamSchema("json", (a, pa.schema([("b", pa.int32())])))
    stored = StreamSchema("json", (a, pa.schema([("a", pa.int64())]))).to_json()
    stored["versions"][1]["version"] = 3
    with pytest.raises(InvalidArgumentError, match="schema version 2 is missing or out of order"):
        StreamSchema.from_json(stored)


def test_the_stored_history_is_bounded():
    big = [{"name": f"field_{i:04d}_{'x' * 240}", "type": "string"} for i in range(999)]
    versions = [pa.schema([("a", pa.int32())])]
    with pytest.raises(InvalidArgumentError, match=f"at most {MAX_SCHEMA_BYTES}"):
        StreamSchema("json", (*versions, schema_from_json([{"name": "a", "type": "int32"}, *big])))


def test_a_config_stores_its_schema_and_leaves_it_out_when_untyped():
    plain = StreamConfig(name="s", subject="s")
    assert "schema" not in plain.to_json()
    assert StreamConfig.from_json(plain.to_json()) == plain
    typed = StreamConfig(name="s", subject="s", schema=StreamSchema.first(SchemaDocument.from_json(ORDERS)))
    stored = json.loads(json.dumps(typed.to_json()))
    assert stored["schema"] == {"format": "json", "versions": [{"version": 1, "fields": ORDERS["fields"]}]}
    assert StreamConfig.from_json(stored) == typed
    with pytest.raises(InvalidArgumentError, match="schema must be a StreamSchema"):
        StreamConfig(name="s", subject="s", schema=ORDERS)  # type: ignore[arg-type]


def test_a_client_gives_a_schema_as_arrow_a_document_or_its_json_form():
    document = SchemaDocument.from_json(ORDERS)
    assert as_document(document) is document
    assert as_document(document.schema) == document
    assert as_document(ORDERS) == document
    with pytest.raises(InvalidArgumentError, match="a schema is a pyarrow.Schema"):
        as_document("orders.schema.json")


# ---- property: every documented type round-trips --------------------------------------------

names = st.text(st.characters(codec="utf-8", categories=("L", "N", "P")), min_size=1, max_size=12)
simple = st.sampled_from(
    [pa.bool_(), pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.string(), pa.date32()]
)
timestamps = st.builds(
    pa.timestamp, st.sampled_from(["s", "ms", "us", "ns"]), st.sampled_from([None, "UTC", "Europe/Paris"])
)
decimals = st.integers(1, 38).flatmap(lambda p: st.integers(0, p).map(lambda s: pa.decimal128(p, s)))


def _fields(
    types: st.SearchStrategy[pa.DataType], named: st.SearchStrategy[str] = names
) -> st.SearchStrategy[list[pa.Field]]:
    return st.lists(
        st.tuples(named, types, st.booleans()), min_size=1, max_size=4, unique_by=lambda t: t[0]
    ).map(lambda fs: [pa.field(n, t, nullable=b) for n, t, b in fs])


types = st.recursive(
    simple | timestamps | decimals,
    lambda inner: inner.map(pa.list_) | _fields(inner).map(pa.struct),
    max_leaves=8,
)


# A stream's own fields may not take the log's column names (Hypothesis tries the names it finds
# in the code, "sequence" among them); inside a struct any name is free.
@given(_fields(types, names.filter(lambda name: name not in RESERVED_NAMES)))
def test_every_documented_schema_round_trips_through_its_json_form(fields):
    schema = pa.schema(fields)
    stored = json.loads(json.dumps(schema_to_json(schema)))
    assert schema_from_json(stored).equals(schema)
    assert SchemaDocument(schema).schema.equals(schema)
    for f in fields:
        assert type_name(f.type)


@given(_fields(types), names)
def test_adding_a_nullable_field_is_compatible_and_dropping_one_is_refused_naming_it(fields, extra):
    old = pa.schema(fields)
    if extra in old.names:
        return
    check_compatible(old, old.append(pa.field(extra, pa.string())))
    with pytest.raises(InvalidArgumentError, match=re.escape(f"field {fields[0].name!r} was removed")):
        check_compatible(old, pa.schema([*fields[1:], pa.field(extra, pa.string())]))
