"""Ingestion from NATS: plain messages, subjects, groups, envelopes, acks."""

from __future__ import annotations

import asyncio
import json

import nats
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pyspark_jetstream.client import AckPolicy
from pyspark_jetstream.protocol.envelope import MAGIC, Envelope, EnvelopeError, decode, encode
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)

from ..broker.harness import publish_plain, wait_until


def _rows(client, stream: str, partition: int = 0, expect: int | None = None) -> list[dict]:
    if expect is not None:
        wait_until(
            lambda: client.fetch(stream, partition).num_rows >= expect,
            message=f"{expect} messages in {stream}/{partition}",
        )
    return client.fetch(stream, partition).to_table().to_pylist()


def test_plain_nats_messages_are_stored_as_they_are(client, broker):
    client.create_stream("audit", "orders.created")
    publish_plain(
        broker.nats_url,
        [
            ("orders.created", b"one", None),
            ("orders.created", b"two", {"trace": "t-1"}),
            ("other", b"x", None),
        ],
    )
    rows = _rows(client, "audit", expect=2)
    assert [(r["offset"], r["value"], r["subject"]) for r in rows] == [
        (0, b"one", "orders.created"),
        (1, b"two", "orders.created"),
    ]
    assert rows[1]["headers"] == [{"key": "trace", "value": b"t-1"}]
    assert rows[0]["key"] is None and rows[0]["producer_id"] is None


def test_wildcard_subjects(client, broker):
    client.create_stream("all-events", "events.>")
    client.create_stream("eu-events", "events.eu.*")
    publish_plain(
        broker.nats_url,
        [("events.eu.click", b"1", None), ("events.us.view", b"2", None), ("events.eu.view.x", b"3", None)],
    )
    assert [r["subject"] for r in _rows(client, "all-events", expect=3)] == [
        "events.eu.click",
        "events.us.view",
        "events.eu.view.x",
    ]
    assert [r["subject"] for r in _rows(client, "eu-events", expect=1)] == ["events.eu.click"]


def test_two_streams_on_one_subject_each_get_everything(client, broker):
    client.create_stream("a", "shared")
    client.create_stream("b", "shared")
    publish_plain(broker.nats_url, [("shared", b"%d" % i, None) for i in range(50)])
    expected = [b"%d" % i for i in range(50)]
    assert [r["value"] for r in _rows(client, "a", expect=50)] == expected
    assert [r["value"] for r in _rows(client, "b", expect=50)] == expected


def test_grouped_streams_split_a_subject(client, broker):
    client.create_stream("g1", "work", group="workers")
    client.create_stream("g2", "work", group="workers")
    publish_plain(broker.nats_url, [("work", b"%d" % i, None) for i in range(200)])
    wait_until(lambda: client.fetch("g1").num_rows + client.fetch("g2").num_rows == 200, message="200 split")
    first = {r["value"] for r in _rows(client, "g1")}
    second = {r["value"] for r in _rows(client, "g2")}
    assert first.isdisjoint(second)
    assert first | second == {b"%d" % i for i in range(200)}


def test_partitions_listen_on_numbered_subjects(client, broker):
    client.create_stream("parts", "p", partitions=3)
    publish_plain(broker.nats_url, [("p", b"zero", None), ("p.1", b"one", None), ("p.2", b"two", None)])
    assert [r["value"] for r in _rows(client, "parts", 0, expect=1)] == [b"zero"]
    assert [r["value"] for r in _rows(client, "parts", 1, expect=1)] == [b"one"]
    assert [r["value"] for r in _rows(client, "parts", 2, expect=1)] == [b"two"]


@pytest.mark.parametrize("policy", list(AckPolicy))
def test_each_ack_policy(client, policy):
    client.create_stream("acks", "acks")
    ack = client.publish("acks", b"v", key=b"k", ack_policy=policy)
    if policy is AckPolicy.NONE:
        assert ack is None
    else:
        assert (ack.stream, ack.partition, ack.first_offset, ack.last_offset, ack.ok) == (
            "acks",
            0,
            0,
            0,
            True,
        )
    rows = _rows(client, "acks", expect=1)
    assert (rows[0]["key"], rows[0]["value"]) == (b"k", b"v")


def test_plain_request_is_acked_on_its_reply_subject_unless_disabled(client, broker):
    client.create_stream("replied", "req.on")
    client.create_stream("silent", "req.off", ack_reply=False)

    async def run() -> tuple[dict, bool]:
        nc = await nats.connect(broker.nats_url)
        reply = await nc.request("req.on", b"payload", timeout=5)
        try:
            await nc.request("req.off", b"payload", timeout=0.5)
            answered = True
        except nats.errors.TimeoutError:
            answered = False
        await nc.close()
        return json.loads(reply.data), answered

    ack, answered = asyncio.run(run())
    # JetStream's publish-ack format, with our partition and offset beside it.
    assert ack == {"stream": "replied", "partition": 0, "seq": 0, "duplicate": False, "offset": 0}
    assert not answered
    assert _rows(client, "silent", expect=1)[0]["reply"].startswith("_INBOX.")


def test_batch_publish_is_one_stored_batch(client):
    client.create_stream("batches", "batches")
    table = pa.table({"key": [b"a", b"b", None], "value": [b"1", b"2", b"3"]})
    ack = client.publish_batch("batches", table)
    assert (ack.first_offset, ack.last_offset) == (0, 2)
    result = client.fetch("batches")
    assert len(result.batches) == 1
    assert result.to_table().column("value").to_pylist() == [b"1", b"2", b"3"]
    assert result.to_table().column("subject").to_pylist() == ["batches"] * 3


def test_many_single_messages_are_coalesced(client):
    client.create_stream("coalesced", "coalesced")

    async def run() -> None:
        futures = [await client._client.publish_async("coalesced", b"%d" % i) for i in range(2000)]
        await asyncio.gather(*futures)

    client._run(run())
    result = client.fetch("coalesced")
    assert result.num_rows == 2000
    assert len(result.batches) < 2000 / 4  # stored in far fewer batches than messages


def test_undecodable_envelope_is_stored_as_plain(client, broker):
    client.create_stream("fallback", "fallback")
    good = encode(Envelope(value=b"inside", key=b"k"))
    broken = [MAGIC, MAGIC + b"\x01\x00", good[:-1], good + b"trailing", MAGIC + b"\x63" + good[5:]]
    publish_plain(broker.nats_url, [("fallback", payload, None) for payload in [*broken, good]])
    rows = _rows(client, "fallback", expect=len(broken) + 1)
    assert [r["value"] for r in rows[:-1]] == broken
    assert all(r["key"] is None for r in rows[:-1])
    assert (rows[-1]["key"], rows[-1]["value"]) == (b"k", b"inside")


VALID = encode(Envelope(value=b"inside", key=b"k", headers=(("h", b"v"),)))


@st.composite
def fuzzed_payloads(draw) -> bytes:
    """Valid envelopes with bytes flipped, cut or added, and random bytes after the magic."""
    kind = draw(st.sampled_from(["flip", "cut", "extend", "random"]))
    data = bytearray(VALID)
    if kind == "flip":
        for position in draw(st.lists(st.integers(4, len(data) - 1), min_size=1, max_size=3)):
            data[position] ^= draw(st.integers(1, 255))
    elif kind == "cut":
        data = data[: draw(st.integers(4, len(data) - 1))]
    elif kind == "extend":
        data += draw(st.binary(min_size=1, max_size=16))
    else:
        data = bytearray(MAGIC + draw(st.binary(max_size=64)))
    return bytes(data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads=st.lists(fuzzed_payloads(), min_size=1, max_size=10))
def test_fuzzed_envelopes_never_break_the_broker(client, broker, payloads):
    """The broker stores each payload exactly as the pure decoder reads it: decoded, or plain."""
    expected = []
    for payload in payloads:
        try:
            envelope = decode(payload)
        except EnvelopeError:
            expected.append((None, payload))
            continue
        assume(envelope.batch is None and envelope.producer_id is None)
        expected.append((envelope.key, envelope.value))
    client.create_stream("fuzz", "fuzz", ack_reply=False)
    before = client.describe_stream("fuzz").partitions[0].high_watermark
    publish_plain(broker.nats_url, [("fuzz", p, None) for p in payloads])
    wait_until(lambda: client.describe_stream("fuzz").partitions[0].high_watermark == before + len(payloads))
    rows = client.fetch("fuzz", start=before).to_table().to_pylist()
    assert [(r["key"], r["value"]) for r in rows] == expected
    assert client.publish("fuzz", b"still serving").ok


def test_oversized_message_is_refused_and_the_broker_keeps_serving(client, broker):
    client.create_stream("small", "small", max_message_bytes=1000)
    with pytest.raises(Exception, match="over max_message_bytes=1000") as info:
        client.publish("small", b"x" * 1001)
    assert type(info.value).__name__ == "MessageTooLargeError"
    with pytest.raises(Exception, match="over max_message_bytes"):
        client.publish_batch("small", pa.table({"value": [b"ok", b"y" * 2000]}))
    publish_plain(broker.nats_url, [("small", b"z" * 5000, None)])  # plain: refused, logged
    assert client.publish("small", b"fits").first_offset == 0
    assert [r["value"] for r in _rows(client, "small")] == [b"fits"]


def test_batch_over_the_nats_max_payload_is_refused_by_the_client(client):
    client.create_stream("huge", "huge")
    with pytest.raises(Exception, match="over the NATS server's max_payload of 1048576") as info:
        client.publish_batch("huge", pa.table({"value": [b"x" * 1000] * 2000}))
    assert type(info.value).__name__ == "MessageTooLargeError"
    assert client.publish("huge", b"small").first_offset == 0  # the window slot was given back


def test_duplicate_producer_sequences_are_stored_once(client):
    client.create_stream("idem", "idem")
    first = client.publish("idem", b"a", producer_id="p1", sequence=0)
    again = client.publish("idem", b"a", producer_id="p1", sequence=0)
    batch = client.publish_batch("idem", pa.table({"value": [b"b", b"c"]}), producer_id="p1", sequence=1)
    batch_again = client.publish_batch(
        "idem", pa.table({"value": [b"b", b"c"]}), producer_id="p1", sequence=1
    )
    other = client.publish("idem", b"a", producer_id="p2", sequence=0)
    assert not first.duplicate and again.duplicate
    assert not batch.duplicate and (batch.first_offset, batch.last_offset) == (1, 2)
    assert (again.first_offset, again.last_offset) == (first.first_offset, first.last_offset)
    assert batch_again.duplicate and (batch_again.first_offset, batch_again.last_offset) == (1, 2)
    assert other.first_offset == 3
    assert [r["value"] for r in _rows(client, "idem")] == [b"a", b"b", b"c", b"a"]


def test_a_refused_sequence_is_never_acked_as_a_duplicate(client):
    """Sequence 1 refused, then 2 arrives: 2 must not be stored ahead of 1, and a retry of 1 is stored."""
    client.create_stream("gap", "gap", max_message_bytes=1000)
    assert not client.publish("gap", b"zero", producer_id="p", sequence=0).duplicate
    with pytest.raises(MessageTooLargeError):  # stands for any failed store (disk full, ...)
        client.publish("gap", b"x" * 2000, producer_id="p", sequence=1)
    with pytest.raises(OutOfOrderSequenceError, match="sequence 1 comes next") as info:
        client.publish("gap", b"two", producer_id="p", sequence=2)
    assert info.value.retriable
    retried = client.publish("gap", b"one", producer_id="p", sequence=1)
    assert not retried.duplicate and retried.first_offset == 1
    assert client.publish("gap", b"two", producer_id="p", sequence=2).first_offset == 2
    assert [r["value"] for r in _rows(client, "gap")] == [b"zero", b"one", b"two"]


def test_producer_epochs_start_at_zero_and_fence_older_ones(client):
    client.create_stream("epochs", "epochs")
    with pytest.raises(OutOfOrderSequenceError, match="sequence 0 comes next to start epoch 0"):
        client.publish("epochs", b"late start", producer_id="p", sequence=5)
    client.publish("epochs", b"e0", producer_id="p", sequence=0)
    client.publish("epochs", b"e3", producer_id="p", producer_epoch=3, sequence=0)
    with pytest.raises(ProducerFencedError, match="epoch 3, newer than 0"):
        client.publish("epochs", b"zombie", producer_id="p", producer_epoch=0, sequence=1)
    assert client.publish("epochs", b"e3", producer_id="p", producer_epoch=3, sequence=0).duplicate
    assert [r["value"] for r in _rows(client, "epochs")] == [b"e0", b"e3"]


def test_only_the_named_stream_acks_when_streams_share_a_subject(client):
    client.create_stream("events", "events", partitions=2)
    client.create_stream("allevents", "events.>")
    client.create_stream("copy", "events")
    ack = client.publish("events", b"hello", partition=1)
    assert (ack.stream, ack.partition, ack.first_offset) == ("events", 1, 0)
    for _ in range(20):  # acks race: any other stream's ack would win some of these
        assert client.publish("copy", b"c").stream == "copy"
        assert client.publish("allevents", b"w", subject="events.1").stream == "allevents"
        assert client.publish("events", b"x", subject="events.1").stream == "events"
    # Every stream still stores its copy.
    assert len(_rows(client, "allevents", expect=41)) == 41
    assert len(_rows(client, "copy", expect=20)) == 20
    with pytest.raises(InvalidArgumentError) as refused:
        client.publish("events", b"x", subject="elsewhere")
    assert str(refused.value) == (
        "subject 'elsewhere' is not a subject of stream 'events' (its partitions' subjects: events, events.1)"
    )


def test_a_compressed_batch_that_decodes_past_the_limit_is_refused_unread(client, broker):
    """A few KB of zstd declaring 100 MB: refused by its declared size, never decompressed."""
    client.create_stream("bomb", "bomb")
    zeros = pa.record_batch({"value": pa.array([b"\0" * 4_000_000] * 25, pa.binary())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, zeros.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_batch(zeros)
    bomb = sink.getvalue().to_pybytes()
    assert len(bomb) < 100_000
    header = encode(Envelope(batch=pa.record_batch({"value": [b"v"]}), ack_inbox="acks", correlation_id="7"))
    # Splice the bomb in place of the small batch: same header, new bytes32 body.
    small = len(header) - header.index(b"\xff\xff\xff\xff") + 4
    payload = header[: len(header) - small] + len(bomb).to_bytes(4, "little") + bomb

    async def run() -> dict:
        nc = await nats.connect(broker.nats_url)
        sub = await nc.subscribe("acks")
        await nc.publish("bomb", payload)
        reply = await sub.next_msg(timeout=10)
        await nc.close()
        return json.loads(reply.data)

    ack = asyncio.run(run())
    assert ack["error"] == "too_large" and "decodes to 100000" in ack["message"]
    assert client.fetch("bomb").num_rows == 0
    assert client.publish("bomb", b"still serving").first_offset == 0
