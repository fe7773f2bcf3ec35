"""Typed streams on a real broker: values parsed at ingest and stored as typed columns beside the raw
value, bad ones refused (client and nats-py publishers) or dead-lettered, schema changes seen at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.js.errors
import pyarrow as pa
import pytest

from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.typed_values import TypedValues

from ..broker.harness import BrokerProcess, publish_plain, with_jetstream

ORDERS = {
    "fields": [
        {"name": "order_id", "type": "int32", "nullable": False},
        {"name": "country", "type": "string"},
        {
            "name": "items",
            "type": {
                "type": "list",
                "item": {"type": "struct", "fields": [{"name": "sku", "type": "string", "nullable": False}]},
            },
        },
    ]
}


def stored_typed(broker, stream: str, partition: int = 0) -> list[tuple[int, TypedValues | None]]:
    """``(first offset, typed columns)`` of every batch in the partition's segment files, read as
    their layout says (:mod:`broker_node.log.typed_frames`): any Arrow reader opens a segment."""
    out: list[tuple[int, TypedValues | None]] = []
    for path in sorted((broker.data_dir / "streams" / stream / str(partition)).glob("*.arrows")):
        reader = pa.ipc.open_stream(path.read_bytes())
        while True:
            try:
                batch, metadata = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            assert batch.schema.equals(LOG_SCHEMA)
            typed = None
            if metadata is not None and b"jetstream.typed" in metadata:
                columns = pa.ipc.open_stream(metadata[b"jetstream.typed"]).read_next_batch()
                assert columns.num_rows == batch.num_rows
                typed = TypedValues(int(metadata[b"jetstream.schema_version"]), columns)
            out.append((batch.column(0)[0].as_py(), typed))
    return out


def typed_rows(broker, stream: str) -> list[tuple[int, dict]]:
    """``(schema version, typed row)`` of every stored message, in offset order."""
    return [
        (t.version, row)
        for _, t in stored_typed(broker, stream)
        if t is not None
        for row in t.batch.to_pylist()
    ]


def test_values_are_parsed_at_ingest_and_stored_as_typed_columns(broker, client):
    client.create_stream("orders", "orders", schema=ORDERS)
    first = client.publish("orders", b'{"order_id": 1, "country": "NL", "items": [{"sku": "a"}]}')
    assert first.first_offset == 0
    pretty = json.dumps({"order_id": 2, "items": []}, indent=2).encode()
    publish_plain(broker.nats_url, [("orders", pretty, None), ("orders", b'{"order_id": 3}', None)])

    async def work(js):
        return await js.publish("orders", b'{"order_id": 4, "country": "DE"}')

    assert with_jetstream(broker.nats_url, work).seq == 3
    # Readers get the log's columns, the raw values as sent, and the typed fields after them.
    table = client.fetch("orders", 0).to_table()
    assert table.schema.names == [*LOG_SCHEMA.names, "order_id", "country", "items"] and table.num_rows == 4
    assert table.column("value").to_pylist()[1] == pretty
    # Stored beside them: the typed columns, under schema version 1.
    assert typed_rows(broker, "orders") == [
        (1, {"order_id": 1, "country": "NL", "items": [{"sku": "a"}]}),
        (1, {"order_id": 2, "country": None, "items": []}),
        (1, {"order_id": 3, "country": None, "items": None}),
        (1, {"order_id": 4, "country": "DE", "items": None}),
    ]


def test_a_value_that_does_not_match_is_refused_with_its_field_and_nothing_is_stored(broker, client):
    client.create_stream("orders", "orders", schema=ORDERS)
    with pytest.raises(InvalidArgumentError) as refused:
        client.publish("orders", b'{"order_id": 3000000000}')
    assert str(refused.value) == (
        "orders/0: field 'order_id': Failed to convert JSON to int32, couldn't parse:3000000000"
    )
    with pytest.raises(InvalidArgumentError, match=r"field 'items\[\].sku': missing or null"):
        client.publish("orders", b'{"order_id": 1, "items": [{}]}')
    with pytest.raises(InvalidArgumentError, match="the value is not one JSON object"):
        client.publish("orders", b"[1, 2]")

    async def work(js):
        errors = []
        for bad in (b'{"order_id": "x"}', b'{"order_id": 1, "coupon": "FREE"}', b"\xff{"):
            with pytest.raises(nats.js.errors.BadRequestError) as error:
                await js.publish("orders", bad)
            errors.append(error.value)
        good = await js.publish("orders", b'{"order_id": 5}')
        return errors, good

    errors, good = with_jetstream(broker.nats_url, work)
    assert all(e.code == 400 and e.err_code == 10003 for e in errors)
    assert "field 'order_id'" in errors[0].description
    assert "field 'coupon': not in the schema" in errors[1].description
    assert "not one JSON object" in errors[2].description
    assert good.seq == 0  # nothing of the refused ones was stored
    assert client.fetch("orders", 0).to_table().column("value").to_pylist() == [b'{"order_id": 5}']
    assert typed_rows(broker, "orders") == [(1, {"order_id": 5, "country": None, "items": None})]


def requests_at_once(url: str, subject: str, values: list[bytes], timeout: float) -> list[dict]:
    """Each value sent as a plain NATS request, all in flight at once (the broker coalesces them
    into few stored batches); the JSON answers, in the values' order."""

    async def run():
        nc = await nats.connect(url)
        try:
            replies = await asyncio.gather(*(nc.request(subject, v, timeout=timeout) for v in values))
        finally:
            await nc.close()
        return [json.loads(r.data) for r in replies]

    return asyncio.run(run())


@contextlib.contextmanager
def orders_broker(directory: Path, nats_url: str, config: str) -> Iterator[BrokerProcess]:
    """A broker started with ``config`` (TOML), holding the typed stream ``orders``."""
    with BrokerProcess(directory, nats_url=nats_url, extra_config=config) as process:
        with SyncClient(nats_urls=process.nats_url, broker=process.flight) as client:
            client.create_stream("orders", "orders", schema=ORDERS)
        yield process


@pytest.fixture
def coalescing(tmp_path, nats_server):
    """A broker that waits up to 0.5 s for more messages before it stores a batch."""
    with orders_broker(tmp_path / "coalescing", nats_server.url, "[ingest]\nmax_delay = 0.5\n") as process:
        yield process


def test_the_good_messages_of_a_coalesced_batch_are_stored_and_the_bad_ones_refused(coalescing):
    broker = coalescing
    values = [b'{"order_id": %d}' % i if i % 3 else b'{"order_id": "bad %d"}' % i for i in range(30)]
    answers = requests_at_once(broker.nats_url, "orders", values, timeout=5)
    refused = [i for i, a in enumerate(answers) if "error" in a]
    assert refused == list(range(0, 30, 3))
    assert all(answers[i]["error"]["code"] == 400 for i in refused)
    assert (
        answers[3]["error"]["description"]
        == "field 'order_id': Column(/order_id) changed from number to string"
    )
    stored = [i for i in range(30) if i % 3]
    assert sorted(a["seq"] for a in answers if "error" not in a) == list(range(len(stored)))
    assert [row["order_id"] for _, row in typed_rows(broker, "orders")] == stored
    assert len(stored_typed(broker, "orders")) == 1  # one coalesced batch: the good ones, parsed again


@pytest.fixture
def tight(tmp_path, nats_server):
    """A coalescing broker whose ingest gathers as many bytes as a stored batch may hold."""
    config = "[ingest]\nmax_delay = 0.5\nmax_batch_bytes = 16384\n[log]\nmax_batch_bytes = 16384\n"
    with orders_broker(tmp_path / "tight", nats_server.url, config) as process:
        yield process


def test_a_coalesced_batch_stored_larger_than_a_batch_may_be_is_stored_in_parts(tight):
    # The parsed columns go beside the values: 16 KiB of coalesced values is well over 16 KiB stored.
    broker = tight
    values = [b'{"order_id": %d, "country": "%s"}' % (i, b"x" * 250) for i in range(120)]
    answers = requests_at_once(broker.nats_url, "orders", values, timeout=10)
    assert [a for a in answers if "error" in a] == []
    assert sorted(a["seq"] for a in answers) == list(range(120))
    assert sorted(row["order_id"] for _, row in typed_rows(broker, "orders")) == list(range(120))
    # Fewer than 3 frames would mean no coalesced batch was ever split.
    assert len(stored_typed(broker, "orders")) >= 3


def test_an_envelope_batch_with_a_bad_row_is_refused_whole(broker, client):
    client.create_stream("orders", "orders", schema=ORDERS)
    rows = pa.table({"value": [b'{"order_id": 1}', b'{"order_id": null}', b'{"order_id": 3}']})
    with pytest.raises(
        InvalidArgumentError, match="message 1 of the batch: field 'order_id': missing or null"
    ):
        client.publish_batch("orders", rows)
    ack = client.publish_batch("orders", pa.table({"value": [b'{"order_id": 1}', b'{"order_id": 2}']}))
    assert (ack.first_offset, ack.last_offset) == (0, 1)
    assert [row["order_id"] for _, row in typed_rows(broker, "orders")] == [1, 2]


def test_invalid_messages_go_to_the_dead_letter_stream_with_the_reason(broker, client):
    client.create_stream("orders-invalid", "orders-invalid", partitions=2)
    document = {**ORDERS, "on_invalid": "dead-letter", "dead_letter": "orders-invalid"}
    client.create_stream("orders", "orders", schema=document)
    ok = client.publish("orders", b'{"order_id": 1}', headers={"trace": b"t-1"})
    dead = client.publish("orders", b'{"order_id": "one"}', key=b"k", headers={"trace": b"t-2"})
    assert (ok.stream, ok.first_offset) == ("orders", 0)
    assert (dead.stream, dead.partition, dead.first_offset) == ("orders-invalid", 0, 0)
    assert dead.message.startswith("invalid, stored in dead-letter stream orders-invalid: field 'order_id'")

    async def work(js):
        return await js.publish("orders", b"not json")

    pub_ack = with_jetstream(broker.nats_url, work)
    assert (pub_ack.stream, pub_ack.seq) == ("orders-invalid", 1)
    rows = client.fetch("orders-invalid", 0).to_table().to_pylist()
    assert [r["value"] for r in rows] == [b'{"order_id": "one"}', b"not json"]
    assert rows[0]["key"] == b"k"
    headers = {h["key"]: h["value"] for h in rows[0]["headers"]}
    assert headers["trace"] == b"t-2"
    assert headers["Jetstream-Invalid-Reason"].startswith(b"field 'order_id'")
    assert headers["Jetstream-Invalid-Stream"] == b"orders/0"
    assert headers["Jetstream-Invalid-Subject"] == b"orders"
    assert client.fetch("orders", 0).to_table().column("value").to_pylist() == [b'{"order_id": 1}']
    # The dead-letter stream is checked when the typed stream is created.
    with pytest.raises(InvalidArgumentError, match="its dead-letter stream 'nowhere' does not exist"):
        client.create_stream(
            "other", "other", schema={**ORDERS, "on_invalid": "dead-letter", "dead_letter": "nowhere"}
        )


def test_a_schema_update_is_parsed_with_by_the_open_partition(broker, client):
    client.create_stream("orders", "orders", schema=ORDERS)
    client.publish("orders", b'{"order_id": 1}')
    with pytest.raises(InvalidArgumentError, match="field 'coupon': not in the schema"):
        client.publish("orders", b'{"order_id": 2, "coupon": "FREE"}')
    widened = [
        {**ORDERS["fields"][0], "type": "int64"},
        *ORDERS["fields"][1:],
        {"name": "coupon", "type": "string"},
    ]
    client.update_schema("orders", {"fields": widened})
    client.publish("orders", b'{"order_id": 3000000000, "coupon": "FREE"}')
    assert typed_rows(broker, "orders") == [
        (1, {"order_id": 1, "country": None, "items": None}),
        (2, {"order_id": 3000000000, "country": None, "items": None, "coupon": "FREE"}),
    ]


def test_a_field_named_as_a_log_column_is_refused_at_create_and_update(broker, client):
    with pytest.raises(
        InvalidArgumentError, match="^schema field 'offset': the name is taken by the log's own columns"
    ):
        client.create_stream("t", "t", schema={"fields": [{"name": "offset", "type": "int64"}]})
    client.create_stream("t", "t", schema={"fields": [{"name": "n", "type": "int64"}]})
    with pytest.raises(InvalidArgumentError, match="^schema field 'partition': the name is taken"):
        client.update_schema(
            "t", {"fields": [{"name": "n", "type": "int64"}, {"name": "partition", "type": "int32"}]}
        )


def test_a_typed_batch_is_stored_as_sent_with_its_json_as_the_value(broker, client):
    client.create_stream("orders", "orders", schema=ORDERS)
    client.publish("orders", b'{"order_id": 1, "country": "NL"}')  # parsed, as before
    rows = pa.table(
        {
            "order_id": pa.array([2, 3], pa.int64()),  # cast to the schema's int32: the values fit
            "items": [[{"sku": 'say "hi"'}], None],
            "key": [b"k2", None],
        }
    )
    ack = client.publish_batch("orders", rows, producer_id="p", sequence=0)
    assert (ack.first_offset, ack.last_offset) == (1, 2)
    table = client.fetch("orders", 0).to_table()
    assert table.column("key").to_pylist() == [None, b"k2", None]
    # Each typed row's value is the JSON of its fields, every field of the version, in order.
    assert table.column("value").to_pylist()[1:] == [
        b'{"order_id":2,"country":null,"items":[{"sku":"say \\"hi\\""}]}',
        b'{"order_id":3,"country":null,"items":null}',
    ]
    assert typed_rows(broker, "orders") == [
        (1, {"order_id": 1, "country": "NL", "items": None}),
        (1, {"order_id": 2, "country": None, "items": [{"sku": 'say "hi"'}]}),
        (1, {"order_id": 3, "country": None, "items": None}),
    ]
    # The client refuses what cannot be cast, naming the column, before anything is sent.
    with pytest.raises(InvalidArgumentError, match="column 'order_id': a value does not fit int32"):
        client.publish_batch("orders", pa.table({"order_id": pa.array([2**40], pa.int64())}))
    with pytest.raises(InvalidArgumentError, match="column 'coupon' is not a field"):
        client.publish_batch("orders", pa.table({"order_id": [1], "coupon": ["FREE"]}))
    with pytest.raises(InvalidArgumentError, match="column 'order_id' is missing, but the schema"):
        client.publish_batch("orders", pa.table({"country": ["NL"]}))


def test_typed_columns_that_do_not_match_are_refused_by_the_broker_naming_the_field(broker, client):
    """The broker checks typed columns again (a client is not trusted): sent as a raw envelope."""
    from pyspark_jetstream.protocol.ack import decode_acks
    from pyspark_jetstream.protocol.envelope import Envelope, encode, typed_batch

    client.create_stream("orders", "orders", schema=ORDERS)
    client.create_stream("plain", "plain")

    def send(stream: str, columns: dict, version: int = 1) -> str:
        batch = typed_batch(pa.record_batch(columns), version)
        payload = encode(Envelope(batch=batch, ack_inbox="acks", stream=stream, partition=0))

        async def run():
            nc = await nats.connect(broker.nats_url)
            try:
                subscription = await nc.subscribe("acks")
                await nc.publish(stream, payload)
                (ack,) = decode_acks((await subscription.next_msg(timeout=5)).data)
                return ack.message
            finally:
                await nc.close()

        return asyncio.run(run())

    wrong_type = send("orders", {"order_id": pa.array([1], pa.int64()), "country": ["NL"]})
    assert "field 'order_id': int64, but the schema says int32" in wrong_type
    items = pa.array([None, None], pa.list_(pa.struct([pa.field("sku", pa.string(), nullable=False)])))
    null = send(
        "orders", {"order_id": pa.array([1, None], pa.int32()), "country": ["NL", None], "items": items}
    )
    assert "field 'order_id': null, but the schema says it is not nullable" in null
    missing = send("orders", {"order_id": pa.array([1], pa.int32())})
    assert "field 'country': missing" in missing
    later = send("orders", {"order_id": pa.array([1], pa.int32())}, version=2)
    assert "schema version 2, but the stream has versions 1 to 1" in later
    untyped = send("plain", {"order_id": pa.array([1], pa.int32())})
    assert "is not typed" in untyped
    assert client.describe_stream("orders").partitions[0].log_end_offset == 0
    assert client.describe_stream("plain").partitions[0].log_end_offset == 0
