"""Typed streams' values: a batch of JSON payloads parsed in one call, each bad one refused with
its field and reason, and typed columns read under a later schema version (no I/O)."""

from __future__ import annotations

import datetime
import decimal
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.streams import StreamConfig, check_dead_letter, check_new_typed
from pyspark_jetstream.protocol.typed_values import TypedValues, as_version, parse_json
from pyspark_jetstream.protocol.value_schema import RESERVED_NAMES, SchemaDocument, StreamSchema

from .test_value_schema import ORDERS

SCHEMA = StreamSchema.first(SchemaDocument.from_json(ORDERS))
"""order_id int32 not null, country, amount decimal128(12, 2), price float32, created
timestamp[ms, UTC], day date32, paid, tags list<string>, address struct<zip int32>."""

GOOD = {
    "order_id": 7,
    "country": "NL",
    "amount": "12.34",
    "price": 1.5,
    "created": "2026-11-27T07:30:00Z",
    "day": 20784,  # days since 1970-01-01
    "paid": True,
    "tags": ["a", "b"],
    "address": {"zip": 1234},
}


def value(**changes: object) -> bytes:
    document = {**GOOD, **changes}
    return json.dumps({k: v for k, v in document.items() if v is not ...}).encode()


def test_a_batch_parses_in_one_call_into_the_current_versions_columns():
    values = [value(order_id=i, country=None if i % 2 else "DE") for i in range(5)]
    parsed = parse_json(values, SCHEMA)
    assert parsed.refused == {} and parsed.rows == [0, 1, 2, 3, 4]
    assert parsed.typed is not None and parsed.typed.version == 1
    batch = parsed.typed.batch
    assert batch.schema == SCHEMA.current
    row = batch.to_pylist()[2]
    assert row["order_id"] == 2 and row["country"] == "DE"
    assert row["amount"] == decimal.Decimal("12.34")
    assert row["created"] == datetime.datetime(2026, 11, 27, 7, 30, tzinfo=datetime.UTC)
    assert row["day"] == datetime.date(2026, 11, 27)
    assert row["tags"] == ["a", "b"] and row["address"] == {"zip": 1234} and row["paid"] is True
    assert batch.column("country").to_pylist() == ["DE", None, "DE", None, "DE"]


def test_pretty_printed_values_and_missing_nullable_fields_parse():
    pretty = json.dumps(GOOD, indent=2).encode()
    sparse = b'  {"order_id": 1}\r\n'
    parsed = parse_json([pretty, sparse, value()], SCHEMA)
    assert parsed.refused == {} and parsed.typed is not None
    assert parsed.typed.batch.num_rows == 3
    assert parsed.typed.batch.to_pylist()[1] == {**{f: None for f in SCHEMA.current.names}, "order_id": 1}


BAD = [
    (None, "the value is null"),
    (b"", "the value is empty"),
    (b"  \n ", "the value is empty"),
    (b"[1, 2]", "not one JSON object"),
    (b"42", "not one JSON object"),
    (b'"text"', "not one JSON object"),
    (b'{"order_id": 1}{"order_id": 2}', "not one JSON object"),
    (b'{"order_id": 1}\n{"order_id": 2}', "not one JSON object"),
    (b'{"order_id": 1', "not one JSON object"),
    (b'{"order_id": 1} {"order_id": 2}', "not one JSON object"),
    (b'{"order_id": 1}}', "not one JSON object"),
    (b'{"country": "}', "not valid JSON"),  # a string open to the end: the next value must not close it
    (b'{"order_id": 1, "address": {}', "not valid JSON"),  # an object open to the end
    (b'{"order_id": 1,}', "not valid JSON"),
    (b'{"order_id": 1, "country": "\xff\xfe"}', "not valid UTF-8"),
    (b'{"order_id": 3000000000}', "field 'order_id'"),
    (b'{"order_id": "seven"}', "field 'order_id'"),
    (b'{"country": "NL"}', "field 'order_id': missing or null, but the schema says it is not nullable"),
    (b'{"order_id": null}', "field 'order_id': missing or null"),
    (b'{"order_id": 1, "coupon": "X"}', "field 'coupon': not in the schema"),
    (b'{"order_id": 1, "tags": "a"}', "field 'tags'"),
    (b'{"order_id": 1, "address": {"zip": "x"}}', "field 'address'"),
    (b'{"order_id": 1, "created": "yesterday"}', "field 'created'"),
    (b'{"order_id": 1, "amount": "12.345"}', "field 'amount'"),
    (b'{"order_id": 1, "paid": "yes"}', "field 'paid'"),
]


@pytest.mark.parametrize(("bad", "reason"), BAD, ids=[repr(b)[:40] for b, _ in BAD])
def test_each_bad_value_gets_its_own_reason_and_the_good_ones_are_kept(bad, reason):
    values = [value(order_id=1), bad, value(order_id=3)]
    parsed = parse_json(values, SCHEMA)
    assert list(parsed.refused) == [1]
    assert reason in parsed.refused[1], parsed.refused[1]
    assert parsed.rows == [0, 2]
    assert parsed.typed is not None and parsed.typed.batch.column("order_id").to_pylist() == [1, 3]


def test_a_non_nullable_field_inside_a_struct_is_checked_where_the_struct_is_not_null():
    schema = StreamSchema.first(
        SchemaDocument.from_json(
            {
                "fields": [
                    {
                        "name": "items",
                        "type": {
                            "type": "list",
                            "item": {
                                "type": "struct",
                                "fields": [{"name": "sku", "type": "string", "nullable": False}],
                            },
                        },
                    },
                    {
                        "name": "ship",
                        "type": {
                            "type": "struct",
                            "fields": [{"name": "to", "type": "string", "nullable": False}],
                        },
                    },
                ]
            }
        )
    )
    values = [
        b'{"items": [{"sku": "a"}], "ship": null}',
        b'{"items": [{"sku": "a"}, {}]}',
        b'{"ship": {}}',
        b'{"items": null, "ship": {"to": "x"}}',
    ]
    parsed = parse_json(values, schema)
    assert parsed.rows == [0, 3]
    assert "field 'items[].sku': missing or null" in parsed.refused[1]
    assert "field 'ship.to': missing or null" in parsed.refused[2]


def test_nothing_parses_when_every_value_is_bad():
    parsed = parse_json([b"1", None], SCHEMA)
    assert parsed.typed is None and parsed.rows == [] and sorted(parsed.refused) == [0, 1]


GOOD_VALUES = st.builds(
    lambda i, country, zip_, indent: json.dumps(
        {**GOOD, "order_id": i, "country": country, "address": {"zip": zip_}}, indent=indent
    ).encode(),
    st.integers(-(2**31), 2**31 - 1),
    st.one_of(st.none(), st.text(max_size=10)),
    st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
    st.sampled_from([None, 2]),  # on one line, or pretty-printed over several
)
BAD_VALUES = st.sampled_from([b for b, _ in BAD])


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.one_of(GOOD_VALUES.map(lambda v: (True, v)), BAD_VALUES.map(lambda v: (False, v))),
        min_size=1,
        max_size=40,
    )
)
def test_a_mixed_batch_keeps_exactly_the_good_values_in_order(mixed):
    values = [v for _, v in mixed]
    parsed = parse_json(values, SCHEMA)
    good = [i for i, (ok, _) in enumerate(mixed) if ok]
    assert parsed.rows == good
    assert sorted(parsed.refused) == [i for i, (ok, _) in enumerate(mixed) if not ok]
    if good:
        assert parsed.typed is not None
        expected = [json.loads(values[i])["order_id"] for i in good]
        assert parsed.typed.batch.column("order_id").to_pylist() == expected
        assert parsed.typed.batch.column("country").to_pylist() == [
            json.loads(values[i])["country"] for i in good
        ]


def test_columns_written_under_an_old_version_read_under_a_new_one():
    v1 = SchemaDocument.from_json(
        {
            "fields": [
                {"name": "id", "type": "int32", "nullable": False},
                {"name": "price", "type": "float32"},
                {"name": "where", "type": {"type": "struct", "fields": [{"name": "zip", "type": "int32"}]}},
                {
                    "name": "lines",
                    "type": {
                        "type": "list",
                        "item": {"type": "struct", "fields": [{"name": "n", "type": "int32"}]},
                    },
                },
            ]
        }
    )
    v2 = SchemaDocument.from_json(
        {
            "fields": [
                {"name": "id", "type": "int64"},
                {"name": "price", "type": "float64"},
                {
                    "name": "where",
                    "type": {
                        "type": "struct",
                        "fields": [{"name": "zip", "type": "int64"}, {"name": "city", "type": "string"}],
                    },
                },
                {
                    "name": "lines",
                    "type": {
                        "type": "list",
                        "item": {
                            "type": "struct",
                            "fields": [{"name": "n", "type": "int64"}, {"name": "sku", "type": "string"}],
                        },
                    },
                },
                {"name": "coupon", "type": "string"},
            ]
        }
    )
    first = StreamSchema.first(v1)
    written = parse_json(
        [
            b'{"id": 1, "price": 2.5, "where": {"zip": 9}, "lines": [{"n": 1}, null]}',
            b'{"id": 2, "where": null}',
        ],
        first,
    ).typed
    assert written is not None and written.version == 1
    schema = first.evolved(v2)
    read = as_version(written, schema)
    assert read.schema == schema.current
    assert read.to_pylist() == [
        {
            "id": 1,
            "price": 2.5,
            "where": {"zip": 9, "city": None},
            "lines": [{"n": 1, "sku": None}, None],
            "coupon": None,
        },
        {"id": 2, "price": None, "where": None, "lines": None, "coupon": None},
    ]
    assert as_version(written, schema, 1) is written.batch
    newer = TypedValues(2, read)
    with pytest.raises(
        InvalidArgumentError, match="written under schema version 2 cannot be read as version 1"
    ):
        as_version(newer, schema, 1)


@pytest.mark.parametrize("name", RESERVED_NAMES)
def test_a_field_named_as_a_log_column_is_refused_in_one_line(name):
    with pytest.raises(InvalidArgumentError) as refused:
        SchemaDocument.from_json(
            {"fields": [{"name": "id", "type": "int32"}, {"name": name, "type": "string"}]}
        )
    assert str(refused.value).startswith(f"schema field {name!r}: the name is taken by the log's own columns")
    assert "\n" not in str(refused.value)
    # Inside a struct the name is free: it does not sit beside the log's columns.
    SchemaDocument.from_json(
        {"fields": [{"name": "s", "type": {"type": "struct", "fields": [{"name": name, "type": "int32"}]}}]}
    )


def test_on_invalid_and_the_dead_letter_stream_are_checked():
    fields = [{"name": "id", "type": "int32"}]
    document = SchemaDocument.from_json({"fields": fields, "on_invalid": "dead-letter", "dead_letter": "bad"})
    schema = StreamSchema.first(document)
    assert (schema.on_invalid, schema.dead_letter) == ("dead-letter", "bad")
    assert StreamSchema.from_json(schema.to_json()) == schema
    assert "on_invalid" not in StreamSchema.first(SchemaDocument.from_json({"fields": fields})).to_json()
    # An update without on_invalid keeps the policy; one with it changes it.
    assert schema.evolved(SchemaDocument.from_json({"fields": fields})) is schema
    refusing = schema.evolved(SchemaDocument.from_json({"fields": fields, "on_invalid": "refuse"}))
    assert (refusing.version, refusing.on_invalid, refusing.dead_letter) == (1, "refuse", None)
    for bad, message in [
        ({"on_invalid": "drop"}, "on_invalid must be one of refuse, dead-letter, got 'drop'"),
        ({"on_invalid": "dead-letter"}, 'on_invalid "dead-letter" needs "dead_letter"'),
        ({"dead_letter": "bad"}, '"dead_letter" (\'bad\') goes with on_invalid "dead-letter"'),
    ]:
        with pytest.raises(InvalidArgumentError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
            SchemaDocument.from_json({"fields": fields, **bad})
    with pytest.raises(InvalidArgumentError, match="cannot be its own dead-letter stream"):
        StreamConfig(name="bad", subject="bad", schema=schema)
    with pytest.raises(InvalidArgumentError, match="a typed stream cannot be compacted yet"):
        check_new_typed(StreamConfig(name="t", subject="t", schema=schema, compaction=True), {}.get)
    typed = StreamConfig(name="t", subject="t", schema=schema)
    plain = StreamConfig(name="bad", subject="bad")
    check_dead_letter(typed, {"bad": plain}.get)
    with pytest.raises(InvalidArgumentError, match="its dead-letter stream 'bad' does not exist"):
        check_dead_letter(typed, {}.get)
    with pytest.raises(InvalidArgumentError, match="its dead-letter stream 'bad' is typed"):
        check_dead_letter(
            typed,
            {
                "bad": StreamConfig(
                    name="bad",
                    subject="bad",
                    schema=StreamSchema.first(SchemaDocument.from_json({"fields": fields})),
                )
            }.get,
        )
    with pytest.raises(InvalidArgumentError, match="listens on a wildcard subject"):
        check_dead_letter(typed, {"bad": StreamConfig(name="bad", subject="bad.>")}.get)
