"""Typed reads on a real broker: ``do_get`` returns a typed stream's fields beside the log's columns
(to any Flight client), the ticket's columns and filters decide what crosses the wire, and a schema
change mid-stream reads older messages with the new fields null."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest
from pyarrow import flight

from pyspark_jetstream.client import Client
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.flight import ReadRequest
from pyspark_jetstream.protocol.read_shape import ColumnFilter
from pyspark_jetstream.protocol.schema import LOG_SCHEMA

ORDERS = {
    "fields": [
        {"name": "order_id", "type": "int32", "nullable": False},
        {"name": "country", "type": "string"},
        {"name": "amount", "type": "float64"},
    ]
}


def publish_orders(client, count: int) -> None:
    for i in range(count):
        country = ("NL", "DE", "FR")[i % 3]
        client.publish(
            "orders", b'{"order_id": %d, "country": "%s", "amount": %d.5}' % (i, country.encode(), i)
        )


def test_a_plain_flight_client_reads_the_typed_columns_and_only_the_columns_it_asks_for(broker, client):
    client.create_stream("orders", "orders", schema=ORDERS)
    publish_orders(client, 3)
    raw = flight.connect(broker.flight)
    try:
        table = raw.do_get(flight.Ticket(b'{"stream": "orders"}')).read_all()
        assert table.schema.names == [*LOG_SCHEMA.names, "order_id", "country", "amount"]
        assert (
            table.schema.field("order_id").type == pa.int32()
            and table.schema.field("amount").type == pa.float64()
        )
        assert table.select(["order_id", "country"]).to_pylist() == [
            {"order_id": 0, "country": "NL"},
            {"order_id": 1, "country": "DE"},
            {"order_id": 2, "country": "FR"},
        ]
        ticket = ReadRequest("orders", columns=("country", "timestamp")).to_ticket()
        narrow = raw.do_get(flight.Ticket(ticket)).read_all()
        assert narrow.schema.names == ["offset", "timestamp", "country"]
        with pytest.raises(flight.FlightServerError, match=r"\[invalid_argument\] unknown column 'colour'"):
            raw.do_get(flight.Ticket(b'{"stream": "orders", "columns": ["colour"]}')).read_all()
    finally:
        raw.close()


def test_filters_send_only_the_matching_rows_and_the_reader_moves_past_the_others(client):
    client.create_stream("orders", "orders", schema=ORDERS)
    publish_orders(client, 30)
    everything = client.fetch("orders", columns=["country"])
    german = client.fetch(
        "orders",
        columns=["order_id"],
        filters=[ColumnFilter("eq", "country", "DE"), ColumnFilter("lt", "order_id", 20)],
    )
    assert german.to_table().column("order_id").to_pylist() == [1, 4, 7, 10, 13, 16, 19]
    assert german.next_offset == everything.next_offset == 30
    assert german.to_table().nbytes < everything.to_table().nbytes / 3  # fewer rows crossed
    none = client.fetch("orders", filters=[ColumnFilter("in", "country", ("BE",))])
    assert none.num_rows == 0 and none.next_offset == 30
    assert none.to_table().schema.names == [*LOG_SCHEMA.names, "order_id", "country", "amount"]
    with pytest.raises(
        InvalidArgumentError, match="filter on 'order_id': 'x' is not a value of its type int32"
    ):
        client.fetch("orders", filters=[ColumnFilter("eq", "order_id", "x")])


def test_older_messages_read_under_the_current_version_with_new_fields_null(client):
    client.create_stream("orders", "orders", schema=ORDERS)
    publish_orders(client, 2)
    widened = [
        {**ORDERS["fields"][0], "type": "int64"},
        *ORDERS["fields"][1:],
        {"name": "coupon", "type": "string"},
    ]
    client.update_schema("orders", {"fields": widened})
    client.publish("orders", b'{"order_id": 3000000000, "coupon": "FREE"}')
    table = client.fetch("orders", columns=["order_id", "coupon", "country"]).to_table()
    assert table.schema.field("order_id").type == pa.int64()
    assert table.drop_columns(["offset"]).to_pylist() == [
        {"order_id": 0, "country": "NL", "coupon": None},
        {"order_id": 1, "country": "DE", "coupon": None},
        {"order_id": 3000000000, "country": None, "coupon": "FREE"},
    ]


def test_a_tail_of_a_typed_stream_reads_the_logs_columns_over_flight_and_live_alike(broker, client):
    """The live tail publishes the stored frames' log columns: its Flight reads ask for the same."""
    client.create_stream("orders", "orders", schema=ORDERS)
    publish_orders(client, 3)

    async def tail(live: bool) -> tuple[list[pa.RecordBatch], object]:
        async with await Client.connect(nats_urls=broker.nats_url, broker=broker.flight) as reader:
            batches = reader.tail("orders", start="earliest", live=live)
            seen: list[pa.RecordBatch] = []
            while sum(b.num_rows for b in seen) < 3:  # the history...
                seen.append(await asyncio.wait_for(anext(batches), 30))
            await reader.publish("orders", b'{"order_id": 3}')  # ...then one more, live
            while sum(b.num_rows for b in seen) < 4:
                seen.append(await asyncio.wait_for(anext(batches), 30))
            await batches.aclose()
            return seen, getattr(batches, "stats", None)

    for live in (True, False):
        seen, stats = asyncio.run(tail(live))
        assert all(b.schema.names == LOG_SCHEMA.names for b in seen), [b.schema.names for b in seen]
        if live:
            assert stats.fetched_batches and stats.live_batches, stats  # both paths were taken
