"""JetStream publishers work unchanged: nats-py's own ``js.publish`` against a broker's stream."""

from __future__ import annotations

import asyncio

import nats
import nats.js.errors
import pytest

from ..broker.harness import wait_until, with_jetstream


def _values(client, stream: str, partition: int = 0) -> list[bytes]:
    return client.fetch(stream, partition).to_table().column("value").to_pylist()


def test_js_publish_gets_a_pub_ack_with_the_offset(client, broker):
    client.create_stream("orders", "orders.new", partitions=2)

    async def work(js):
        first = await js.publish("orders.new", b"one")
        second = await js.publish("orders.new", b"two", headers={"trace": "t-1"})
        other = await js.publish("orders.new.1", b"three")
        futures = [await js.publish_async("orders.new", b"%d" % i) for i in range(20)]
        pipelined = await asyncio.gather(*futures)
        return first, second, other, pipelined

    first, second, other, pipelined = with_jetstream(broker.nats_url, work)
    assert (first.stream, first.seq, first.duplicate) == ("orders", 0, False)
    assert (second.stream, second.seq, second.duplicate) == ("orders", 1, False)
    assert (other.stream, other.seq) == ("orders", 0)  # partition 1's offset
    assert [a.seq for a in pipelined] == list(range(2, 22))
    rows = client.fetch("orders", 0).to_table().to_pylist()
    assert [r["value"] for r in rows[:2]] == [b"one", b"two"]
    assert rows[1]["headers"] == [{"key": "trace", "value": b"t-1"}]
    assert _values(client, "orders", 1) == [b"three"]


def test_a_repeated_msg_id_is_acked_as_a_duplicate_of_the_original(client, broker):
    client.create_stream("dedup", "dedup")

    async def work(js):
        acks = []
        for value, msg_id in [(b"a", "id-1"), (b"b", "id-2"), (b"a again", "id-1"), (b"c", None)]:
            headers = {"Nats-Msg-Id": msg_id} if msg_id else None
            acks.append(await js.publish("dedup", value, headers=headers))
        return acks

    acks = with_jetstream(broker.nats_url, work)
    assert [(a.seq, a.duplicate) for a in acks] == [(0, False), (1, False), (0, True), (2, False)]
    assert _values(client, "dedup") == [b"a", b"b", b"c"]
    stored = client.fetch("dedup").to_table().column("headers").to_pylist()
    assert stored[0] == [{"key": "Nats-Msg-Id", "value": b"id-1"}]


def test_expected_stream_is_honoured(client, broker):
    client.create_stream("left", "shared.subject")
    client.create_stream("right", "shared.subject")

    async def work(js):
        named = await js.publish("shared.subject", b"for left", stream="left")
        with pytest.raises(nats.js.errors.BadRequestError) as mismatch:
            await js.publish("shared.subject", b"for nobody", stream="missing")
        return named, mismatch.value

    named, error = with_jetstream(broker.nats_url, work)
    # Only the stream named stores it and acks; the other listener leaves it alone.
    assert (named.stream, named.seq, named.duplicate) == ("left", 0, False)
    assert (error.code, error.err_code) == (400, 10060)
    assert "expected stream does not match" in error.description and "'missing'" in error.description
    client.publish("right", b"marker")  # both store it (the ack is right's), after the others
    assert _values(client, "right") == [b"marker"]
    wait_until(lambda: _values(client, "left") == [b"for left", b"marker"], message="left's copy")


def test_errors_raise_nats_py_error_types(client, broker):
    client.create_stream("small", "small", max_message_bytes=10)
    client.create_stream("ids", "ids")

    async def work(js):
        errors = {}
        with pytest.raises(nats.js.errors.BadRequestError) as too_large:
            await js.publish("small", b"x" * 11)
        errors["too_large"] = too_large.value
        with pytest.raises(nats.js.errors.BadRequestError) as unsupported:
            await js.publish("small", b"x", headers={"Nats-Expected-Last-Sequence": "4"})
        errors["unsupported"] = unsupported.value
        with pytest.raises(nats.js.errors.BadRequestError) as bad_id:
            await js.publish("ids", b"x", headers={"Nats-Msg-Id": "i" * 257})
        errors["bad_id"] = bad_id.value
        with pytest.raises(nats.js.errors.NoStreamResponseError):
            await js.publish("nobody.listens", b"x")
        ok = await js.publish("small", b"fits")
        return errors, ok

    errors, ok = with_jetstream(broker.nats_url, work)
    assert (errors["too_large"].code, errors["too_large"].err_code) == (400, 10054)
    assert "11 bytes, over max_message_bytes=10" in errors["too_large"].description
    assert errors["unsupported"].err_code == 10003
    assert "Nats-Expected-Last-Sequence" in errors["unsupported"].description
    assert errors["bad_id"].err_code == 10003 and "257 bytes" in errors["bad_id"].description
    assert ok.seq == 0  # none of the refused ones was stored
    assert _values(client, "small") == [b"fits"]
    assert _values(client, "ids") == []
