"""De-duplication by message id: the client's ``message_id=``, plain ``Nats-Msg-Id`` publishers,
the window, the cap, restarts and validation."""

from __future__ import annotations

import asyncio
import time

import pyarrow as pa
import pytest

from broker_node.config import IngestConfig, NatsConfig
from broker_node.coordination.base import PartitionState
from broker_node.ingest.ingestor import Ingestor
from broker_node.log import Log
from broker_node.log_terms import LOG_TERMS
from broker_node.replication.partition import Partition
from pyspark_jetstream.client import AckPolicy, Client, SyncClient
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.schema import HEADER_TYPE
from pyspark_jetstream.protocol.streams import StreamConfig

from .harness import BrokerProcess, publish_plain, wait_until


def _values(client, stream: str, partition: int = 0) -> list[bytes]:
    return client.fetch(stream, partition).to_table().column("value").to_pylist()


@pytest.mark.parametrize("policy", [AckPolicy.LEADER, AckPolicy.ALL])
def test_a_repeated_message_id_returns_the_original_offset(client, policy):
    client.create_stream("once", "once")
    first = client.publish("once", b"v1", message_id="order-17", ack_policy=policy)
    other = client.publish("once", b"v2", message_id="order-18", ack_policy=policy)
    again = client.publish("once", b"v1, sent again", message_id="order-17", ack_policy=policy)
    plain = client.publish("once", b"no id", ack_policy=policy)
    assert (first.first_offset, first.duplicate, first.ok) == (0, False, True)
    assert (other.first_offset, other.duplicate) == (1, False)
    assert (again.first_offset, again.last_offset, again.duplicate, again.ok) == (0, 0, True, True)
    assert (plain.first_offset, plain.duplicate) == (2, False)
    rows = client.fetch("once").to_table().to_pylist()
    assert [r["value"] for r in rows] == [b"v1", b"v2", b"no id"]
    assert rows[0]["headers"] == [{"key": "Nats-Msg-Id", "value": b"order-17"}]


def test_ids_are_per_partition_and_off_with_a_zero_window(client):
    client.create_stream("parts", "parts", partitions=2)
    client.create_stream("off", "off", duplicate_window=0)
    a = client.publish("parts", b"a", message_id="same", partition=0)
    b = client.publish("parts", b"b", message_id="same", partition=1)
    assert not a.duplicate and not b.duplicate
    acks = [client.publish("off", b"%d" % i, message_id="same") for i in range(2)]
    assert [(x.first_offset, x.duplicate) for x in acks] == [(0, False), (1, False)]


@pytest.mark.parametrize(
    ("message_id", "named"),
    [
        ("", "''"),
        ("x" * 257, "257 bytes"),
        ("é" * 129, "258 bytes"),
        ("\ud800", "'\\ud800'"),
        (17, "17"),
    ],
)
def test_bad_message_ids_are_refused_naming_the_value(client, message_id, named):
    client.create_stream("checked", "checked")
    with pytest.raises(InvalidArgumentError, match="message_id") as refused:
        client.publish("checked", b"v", message_id=message_id)
    assert named in str(refused.value)
    assert client.publish("checked", b"v", message_id="é" * 128).ok  # 256 bytes is fine


def test_message_ids_do_not_mix_with_producers_or_a_different_header(client):
    client.create_stream("mixed", "mixed")
    with pytest.raises(InvalidArgumentError, match="producer_id 'p'"):
        client.publish("mixed", b"v", message_id="m", producer_id="p", sequence=0)
    with pytest.raises(InvalidArgumentError, match="contradicts the Nats-Msg-Id header"):
        client.publish("mixed", b"v", message_id="m", headers={"Nats-Msg-Id": b"n"})
    # The header alone is the message id, as for any NATS publisher.
    first = client.publish("mixed", b"v", headers={"Nats-Msg-Id": b"n"})
    assert client.publish("mixed", b"v", message_id="n").first_offset == first.first_offset


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"duplicate_window": -1}, "duplicate_window must be a number of seconds from 0 to 604800, got -1"),
        (
            {"duplicate_window": "2m"},
            "duplicate_window must be a number of seconds from 0 to 604800, got '2m'",
        ),
        ({"duplicate_window": 604801}, "got 604801"),
        ({"duplicate_max_ids": 0}, "duplicate_max_ids must be a positive integer up to 100000000, got 0"),
    ],
)
def test_bad_window_options_are_refused_naming_the_value(client, options, named):
    with pytest.raises(InvalidArgumentError) as refused:
        client.create_stream("windowed", "windowed", **options)
    assert named in str(refused.value)


def _stored_all(client, stream: str, marker: bytes) -> list[bytes]:
    """Every value once ``marker`` (published last, on the same subject) is stored."""
    return wait_until(
        lambda: (values := _values(client, stream)) and values[-1] == marker and values,
        message=f"{marker!r} stored",
    )


def test_plain_publishers_are_deduplicated_within_the_window_only(client, broker):
    client.create_stream("window", "window", duplicate_window=1)
    publish_plain(
        broker.nats_url,
        [
            ("window", b"first", {"Nats-Msg-Id": "a"}),
            ("window", b"repeat", {"Nats-Msg-Id": "a"}),
            ("window", b"other", {"Nats-Msg-Id": "b"}),
            ("window", b"empty id is no id", {"Nats-Msg-Id": ""}),
            ("window", b"empty id is no id", {"Nats-Msg-Id": ""}),
            ("window", b"marker-1", None),
        ],
    )
    assert _stored_all(client, "window", b"marker-1") == [
        b"first",
        b"other",
        b"empty id is no id",
        b"empty id is no id",
        b"marker-1",
    ]
    stored_at = client.fetch("window").to_table().column("timestamp")[0].as_py().timestamp()
    time.sleep(max(0.0, stored_at + 1.2 - time.time()))  # the window's expiry is tested: past 1 s
    publish_plain(
        broker.nats_url,
        [("window", b"after the window", {"Nats-Msg-Id": "a"}), ("window", b"marker-2", None)],
    )
    assert _stored_all(client, "window", b"marker-2")[-2:] == [b"after the window", b"marker-2"]


def test_the_oldest_ids_are_forgotten_past_the_cap(client):
    client.create_stream("capped", "capped", duplicate_max_ids=2)
    for name in ("a", "b", "c"):
        client.publish("capped", name.encode(), message_id=name)
    assert client.publish("capped", b"c", message_id="c").duplicate
    assert client.publish("capped", b"b", message_id="b").duplicate
    forgotten = client.publish("capped", b"a", message_id="a")  # the oldest went when c came
    assert (forgotten.first_offset, forgotten.duplicate) == (3, False)
    assert _values(client, "capped") == [b"a", b"b", b"c", b"a"]


@pytest.mark.parametrize("stop", ["graceful", "crash"])
def test_the_window_survives_a_restart(tmp_path, nats_server, stop):
    broker = BrokerProcess(tmp_path / "b", nats_url=nats_server.url).start()
    try:
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
            client.create_stream("kept", "kept", partitions=2)
            for i in range(10):
                client.publish("kept", b"%d" % i, message_id=f"m{i}", partition=i % 2)
        if stop == "graceful":
            assert broker.stop() == 0
        else:
            broker.kill()
        broker.start()
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
            again = [client.publish("kept", b"again", message_id=f"m{i}", partition=i % 2) for i in range(10)]
            assert all(a.duplicate for a in again)
            assert [a.first_offset for a in again] == [i // 2 for i in range(10)]
            assert client.publish("kept", b"new", message_id="m10", partition=0).first_offset == 5
    finally:
        broker.stop()


def test_repeats_waiting_in_one_flush_are_acked_with_the_original_offset(tmp_path, nats_server):
    """Messages coalesce for a second (max_delay): a repeat finds its original not stored yet."""
    state = PartitionState("b1", ("b1",), ("b1",))
    config = StreamConfig(name="coalesced", subject="coalesced")
    partition = Partition(config, 0, Log.open(tmp_path / "log"), "b1", state)
    partition.become_leader(state)

    async def run() -> list:
        ingestor = Ingestor(
            [nats_server.url], NatsConfig(), IngestConfig(max_delay=1.0), lambda: {}, "t", terms=LOG_TERMS
        )
        await ingestor.start()
        await ingestor.sync({("coalesced", 0): partition})
        client = await Client.connect(nats_urls=nats_server.url, broker="grpc://127.0.0.1:1", timeout=30)
        client._streams = {"coalesced": config}
        try:
            futures = [
                await client.publish_async(
                    "coalesced", b"%d" % i, message_id=f"id-{i % 3}", ack_policy=policy
                )
                for i in range(9)
                for policy in [AckPolicy.ALL if i % 2 else AckPolicy.LEADER]
            ]
            return await asyncio.gather(*futures)
        finally:
            await client.close()
            await ingestor.close()

    try:
        acks = asyncio.run(run())
    finally:
        partition.close()
    assert [(a.first_offset, a.duplicate) for a in acks] == [
        (0, False),
        (1, False),
        (2, False),
        *[(i % 3, True) for i in range(3, 9)],
    ]
    with Log.open(tmp_path / "log") as log:
        assert log.log_end_offset == 3
        assert len(log.read(0)) == 1  # one flush, one stored batch


@pytest.mark.parametrize("policy", [AckPolicy.LEADER, AckPolicy.ALL])
def test_a_batch_stores_only_the_rows_whose_ids_are_new(client, policy):
    client.create_stream("rows", "rows")
    single = client.publish("rows", b"single", message_id="s", ack_policy=policy)
    first = client.publish_batch(
        "rows", [{"value": b"a"}, {"value": b"b"}], message_ids=["a", "b"], ack_policy=policy
    )
    assert (first.first_offset, first.last_offset, first.duplicate, first.duplicates) == (1, 2, False, ())
    # b and s are repeats, c is new, and the second c repeats the first c of the same batch.
    rows = [{"value": v} for v in (b"b again", b"c", b"s again", b"c again")]
    mixed = client.publish_batch("rows", rows, message_ids=["b", "c", "s", "c"], ack_policy=policy)
    assert (mixed.first_offset, mixed.last_offset, mixed.ok, mixed.duplicate) == (3, 3, True, False)
    assert mixed.duplicates == ((0, 2), (2, single.first_offset), (3, 3))
    assert mixed.row_offsets(4) == [2, 3, 0, 3]
    # Nothing new at all: a duplicate whose offsets span the originals.
    again = client.publish_batch("rows", rows[:3], message_ids=["b", "c", "s"], ack_policy=policy)
    assert (again.duplicate, again.first_offset, again.last_offset) == (True, 0, 3)
    assert again.row_offsets(3) == [2, 3, 0]
    # A single message repeating a row's id is a duplicate of that row.
    assert client.publish("rows", b"x", message_id="c", ack_policy=policy).first_offset == 3
    stored = client.fetch("rows").to_table().to_pylist()
    assert [r["value"] for r in stored] == [b"single", b"a", b"b", b"c"]
    assert stored[3]["headers"] == [{"key": "Nats-Msg-Id", "value": b"c"}]


def test_ids_from_a_column_keep_the_other_headers(client):
    client.create_stream("column", "column")
    batch = pa.table(
        {
            "value": [b"1", b"2"],
            "headers": pa.array([[{"key": "k", "value": b"v"}], None], HEADER_TYPE),
            "outbox_id": ["t:1", "t:2"],
        }
    )
    assert client.publish_batch("column", batch, message_ids="outbox_id").last_offset == 1
    assert client.publish_batch("column", batch, message_ids="outbox_id").duplicate
    stored = client.fetch("column").to_table()
    assert "outbox_id" not in stored.column_names
    assert stored.column("headers").to_pylist() == [
        [{"key": "k", "value": b"v"}, {"key": "Nats-Msg-Id", "value": b"t:1"}],
        [{"key": "Nats-Msg-Id", "value": b"t:2"}],
    ]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (["a"], "message_ids has 1 ids for a batch of 2 rows"),
        (["a", None], "message_ids has a null at row 1: every row needs an id"),
        (pa.array([1, 2]), "message_ids must be strings, got int64"),
        (["a", ""], "message_ids, row 1: message_id must be 1 to 256 bytes"),
        (["a", "é" * 129], "message_ids, row 1: message_id must be 1 to 256 bytes"),
        (["a\ud800", "b"], "message_ids, row 0: message_id 'a\\ud800' is not valid UTF-8"),
        (pa.array(["a", "b" * 257]), "message_ids, row 1: message_id must be 1 to 256 bytes"),
        ("missing", "message_ids names the column 'missing', which the batch does not have"),
        ("number", "message_ids column 'number' must be strings, got int64"),
    ],
)
def test_bad_message_id_columns_are_refused_naming_the_column(client, ids, message):
    client.create_stream("bad-ids", "bad-ids")
    batch = pa.table({"value": [b"1", b"2"], "number": [1, 2]})
    with pytest.raises(InvalidArgumentError) as refused:
        client.publish_batch("bad-ids", batch, message_ids=ids)
    assert str(refused.value).startswith(message), str(refused.value)
    with pytest.raises(InvalidArgumentError, match="not combined"):
        client.publish_batch("bad-ids", batch, message_ids=["a", "b"], producer_id="p", sequence=0)
    assert client.fetch("bad-ids").to_table().num_rows == 0
