"""Typed rows: a client's columns conformed to a schema version, the broker's check of them, and the
JSON text of each row, which parses back into exactly the same columns."""

from __future__ import annotations

import datetime
import decimal
import math

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyspark_jetstream.protocol.envelope import Envelope, decode, encode, typed_batch, typed_version
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.typed_rows import conform, exactly, problem, render_json
from pyspark_jetstream.protocol.typed_values import parse_json
from pyspark_jetstream.protocol.value_schema import SchemaDocument, StreamSchema

from .test_value_schema import ORDERS

SCHEMA = StreamSchema.first(
    SchemaDocument.from_json(
        {
            **ORDERS,
            "fields": [
                *ORDERS["fields"],
                {"name": "seen", "type": {"type": "timestamp", "unit": "us"}},
                {"name": "score", "type": "float64"},
                {"name": "n", "type": "int64"},
                {
                    "name": "lines",
                    "type": {
                        "type": "list",
                        "item": {
                            "type": "struct",
                            "fields": [
                                {"name": "sku", "type": "string", "nullable": False},
                                {"name": "qty", "type": "int32"},
                            ],
                        },
                    },
                },
            ],
        }
    )
)
FIELDS = SCHEMA.current
UTC = datetime.UTC


def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), strategy)


ROWS = st.fixed_dictionaries(
    {
        "order_id": st.integers(-(2**31), 2**31 - 1),
        "country": maybe(st.text(max_size=12)),  # any character: quotes, backslashes, controls
        "amount": maybe(
            st.decimals(min_value=-(10**10) + 1, max_value=10**10 - 1, places=2, allow_nan=False)
        ),
        "price": maybe(st.floats(width=32, allow_nan=False, allow_infinity=False)),
        "created": maybe(
            st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2200, 1, 1)).map(
                lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000, tzinfo=UTC)
            )
        ),
        "day": maybe(st.dates(datetime.date(1800, 1, 1), datetime.date(2300, 1, 1))),
        "paid": maybe(st.booleans()),
        "tags": maybe(st.lists(maybe(st.text(max_size=5)), max_size=3)),
        "address": maybe(st.fixed_dictionaries({"zip": maybe(st.integers(-(2**31), 2**31 - 1))})),
        "seen": maybe(st.datetimes(datetime.datetime(1000, 1, 1), datetime.datetime(9999, 1, 1))),
        "score": maybe(st.floats(allow_nan=False, allow_infinity=False)),
        "n": maybe(st.integers(-(2**63), 2**63 - 1)),
        "lines": maybe(
            st.lists(
                maybe(st.fixed_dictionaries({"sku": st.text(max_size=4), "qty": maybe(st.integers(0, 9))})),
                max_size=3,
            )
        ),
    }
)


@settings(max_examples=60, deadline=None)
@given(st.lists(ROWS, min_size=1, max_size=20), st.integers(0, 3))
def test_the_json_of_typed_rows_parses_back_into_the_same_columns(rows, skip):
    batch = pa.RecordBatch.from_pylist(rows, schema=FIELDS)
    batch = batch.slice(min(skip, batch.num_rows - 1))  # a chunk of a larger batch, as the sink cuts
    assert problem(batch, FIELDS) is None
    values = render_json(exactly(batch, FIELDS))
    assert values.type == pa.binary() and len(values) == batch.num_rows
    parsed = parse_json(values.to_pylist(), SCHEMA)
    assert parsed.refused == {}
    assert parsed.typed is not None
    assert parsed.typed.batch.equals(exactly(batch, FIELDS))


def test_a_row_renders_as_one_json_object_of_every_field_in_order():
    row = {
        "order_id": 7,
        "country": 'a "q" \\ \n',
        "amount": decimal.Decimal("12.30"),
        "price": 1.5,
        "created": datetime.datetime(2026, 11, 27, 7, 30, tzinfo=UTC),
        "day": datetime.date(2026, 11, 27),
        "paid": False,
        "tags": ["x", None],
        "address": None,
        "seen": datetime.datetime(2026, 1, 2, 3, 4, 5, 6),
        "score": -0.25,
        "n": None,
        "lines": [{"sku": "s", "qty": None}],
    }
    (value,) = render_json(pa.RecordBatch.from_pylist([row], schema=FIELDS)).to_pylist()
    assert value == (
        b'{"order_id":7,"country":"a \\"q\\" \\\\ \\n","amount":12.30,"price":1.5,'
        b'"created":"2026-11-27T07:30:00.000Z","day":20784,"paid":false,"tags":["x",null],'
        b'"address":null,"seen":"2026-01-02T03:04:05.000006","score":-0.25,"n":null,'
        b'"lines":[{"sku":"s","qty":null}]}'
    )


def test_columns_are_cast_where_no_value_is_lost_and_missing_nullable_fields_are_null():
    columns = pa.record_batch(
        {
            "order_id": pa.array([1, 2], pa.int64()),
            "price": pa.array([1.5, None], pa.float32()),
            "country": pa.array(["NL", "DE"], pa.large_string()),
            "created": pa.array([1_700_000_000_000_000, None], pa.timestamp("us", tz="Europe/Paris")),
            "lines": pa.array([[{"sku": "a"}], None], pa.large_list(pa.struct([("sku", pa.string())]))),
        }
    )
    batch = conform(columns, FIELDS, 1)
    assert batch.schema == FIELDS
    assert problem(batch, FIELDS) is None
    first = batch.to_pylist()[0]
    assert first["order_id"] == 1 and first["country"] == "NL" and first["tags"] is None
    assert first["created"] == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert first["lines"] == [{"sku": "a", "qty": None}]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (
            {"order_id": [1], "coupon": ["x"]},
            "column 'coupon' is not a field of the stream's schema version 1",
        ),
        (
            {"country": ["NL"]},
            "column 'order_id' is missing, but the schema (version 1) says it is not nullable",
        ),
        ({"order_id": [1, None]}, "column 'order_id' has nulls, but the schema says it is not nullable"),
        ({"order_id": ["1"]}, "column 'order_id' is string, but the schema says int32: cast it first"),
        ({"order_id": [2**40]}, "column 'order_id': a value does not fit int32"),
        (
            {"order_id": [1], "price": pa.array([0.1], pa.float64())},
            "column 'price' is double, but the schema",
        ),
        ({"order_id": [1], "score": [math.nan]}, "column 'score' holds NaN or an infinity"),
        (
            {"order_id": [1], "created": pa.array([1_000_001], pa.timestamp("us", tz="UTC"))},
            "column 'created': a value does not fit timestamp[ms, UTC]",
        ),
        (
            {"order_id": [1], "address": [{"zip": 1, "street": "x"}]},
            "column 'address.street' is not a field of the stream's schema",
        ),
        ({"order_id": [1], "lines": [[{"qty": 1}]]}, "column 'lines[].sku' has nulls, but the schema says"),
    ],
)
def test_columns_that_do_not_fit_fail_in_one_line_naming_the_column(columns, message):
    with pytest.raises(InvalidArgumentError) as failed:
        conform(pa.record_batch(columns), FIELDS, 1)
    assert str(failed.value).startswith(message), str(failed.value)


def test_the_brokers_check_names_the_field_that_is_not_exactly_the_versions():
    batch = conform(pa.record_batch({"order_id": [1, 2]}), FIELDS, 1)
    assert problem(batch, FIELDS) is None
    wrong = batch.set_column(0, "order_id", pa.array([1, 2], pa.int64()))
    assert problem(wrong, FIELDS) == "field 'order_id': int64, but the schema says int32"
    assert problem(batch.drop_columns(["day"]), FIELDS) == (
        "field 'day': missing (a typed batch has every field of its version)"
    )
    extra = batch.append_column("coupon", pa.array(["x", "y"]))
    assert problem(extra, FIELDS) == "field 'coupon': not in the schema"
    nulls = batch.set_column(0, pa.field("order_id", pa.int32()), pa.array([1, None], pa.int32()))
    assert problem(nulls, FIELDS) == "field 'order_id': null, but the schema says it is not nullable"
    nan = batch.set_column(batch.schema.get_field_index("score"), "score", pa.array([1.0, math.inf]))
    assert problem(nan, FIELDS) == "field 'score': NaN or an infinity, which JSON cannot hold"


def test_a_typed_envelope_round_trips_and_says_its_version():
    typed = conform(pa.record_batch({"order_id": [1, 2]}), FIELDS, 1)
    batch = typed_batch(typed, 3, pa.record_batch({"key": pa.array([b"k", None])}))
    decoded = decode(encode(Envelope(batch=batch, stream="orders", partition=0)))
    assert decoded.batch is not None and decoded.batch.schema.names == ["key", "typed"]
    assert typed_version(decoded.batch) == 3
    assert pa.RecordBatch.from_struct_array(decoded.batch.column("typed")).equals(typed)
    # Flag bit 6 goes with a typed column only: without it, the same bytes are not an envelope.
    payload = bytearray(encode(Envelope(batch=batch)))
    payload[5] &= ~0x40
    with pytest.raises(ValueError, match="a batch needs a 'value' column"):
        decode(bytes(payload))
