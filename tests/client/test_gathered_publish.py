"""Plain messages published while the client's loop is busy leave as one envelope batch per
partition, and each keeps its own ack: offsets, order, refusals and timeouts as if sent alone."""

from __future__ import annotations

import asyncio
import contextlib
import types

import nats
import pytest

from pyspark_jetstream.client import Client
from pyspark_jetstream.client.publisher import GATHER_MESSAGE_BYTES, AckWindow, Deadlines, Publisher
from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.envelope import decode
from pyspark_jetstream.protocol.errors import ErrorCode, RequestTimeoutError


async def _envelopes(url: str, subject: str, ready: asyncio.Event, into: list) -> None:
    """Every envelope NATS carries on ``subject``, decoded, until cancelled."""
    nc = await nats.connect(url)
    try:
        sub = await nc.subscribe(subject)
        await nc.flush()
        ready.set()
        async for msg in sub.messages:
            into.append(decode(msg.data))
    finally:
        await nc.close()


def _run(broker, body):
    """Run ``body(client, envelopes)`` with an async client and a watcher of the stream's subject."""

    async def main():
        seen: list = []
        ready = asyncio.Event()
        watcher = asyncio.ensure_future(_envelopes(broker.nats_url, "gather.>", ready, seen))
        await ready.wait()
        client = await Client.connect(nats_urls=broker.nats_url, broker=broker.flight, timeout=10)
        try:
            result = await body(client, seen)
        finally:
            await client.close()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        return result, seen

    return asyncio.run(main())


def test_pipelined_messages_leave_as_batches_and_keep_their_own_acks(broker):
    async def body(client, seen):
        await client.create_stream("gathered", "gather.one")
        futures = [
            await client.publish_async("gathered", b"v%d" % i, key=None if i % 3 else b"k%d" % i)
            for i in range(3000)
        ]
        acks = await asyncio.gather(*futures)
        kept = len(list(client._publisher._deadlines.entries()))
        stored = await client.fetch("gathered", 0)
        return acks, stored.to_table(), kept

    (acks, table, kept), seen = _run(broker, body)
    # Answered acks' deadlines are not kept for the whole timeout (the garbage collector walks them).
    assert kept <= Deadlines.SLACK
    assert [(a.first_offset, a.last_offset, a.ok) for a in acks] == [(i, i, True) for i in range(3000)]
    assert len({a.correlation_id for a in acks}) == 3000
    assert table.column("value").to_pylist() == [b"v%d" % i for i in range(3000)]
    assert table.column("key").to_pylist() == [None if i % 3 else b"k%d" % i for i in range(3000)]
    # Far fewer NATS messages than messages: batches of what waited together.
    assert sum(e.message_count for e in seen) == 3000
    assert len(seen) < 3000 / 20
    assert any(e.batch is not None for e in seen)


def test_a_message_alone_leaves_as_a_single_envelope_at_once(broker):
    async def body(client, seen):
        await client.create_stream("alone", "gather.alone")
        return [await client.publish("alone", b"only-%d" % i) for i in range(3)]

    acks, seen = _run(broker, body)
    assert [a.first_offset for a in acks] == [0, 1, 2]
    assert [(e.batch, e.value) for e in seen] == [(None, b"only-%d" % i) for i in range(3)]


def test_what_is_not_gathered_leaves_in_call_order_after_what_was(broker):
    """A batch, a message with an id or headers, and a large value each go alone, and never
    overtake the plain messages published before them to the same partition."""

    async def body(client, seen):
        await client.create_stream("mixed", "gather.mixed")
        big = b"b" * (GATHER_MESSAGE_BYTES + 1)
        calls = [
            client.publish_async("mixed", b"p0"),
            client.publish_async("mixed", b"p1"),
            client.publish_batch_async("mixed", [{"value": b"batch0"}, {"value": b"batch1"}]),
            client.publish_async("mixed", b"p2"),
            client.publish_async("mixed", b"id", message_id="m-1"),
            client.publish_async("mixed", b"p3"),
            client.publish_async("mixed", b"h", headers={"trace": b"t"}),
            client.publish_async("mixed", big),
            client.publish_async("mixed", b"p4"),
            client.publish_async("mixed", b"p5"),
        ]
        futures = [await call for call in calls]
        acks = await asyncio.gather(*futures)
        stored = await client.fetch("mixed", 0)
        return acks, stored.to_table().column("value").to_pylist()

    (acks, values), seen = _run(broker, body)
    assert values == [
        b"p0",
        b"p1",
        b"batch0",
        b"batch1",
        b"p2",
        b"id",
        b"p3",
        b"h",
        b"b" * 16385,
        b"p4",
        b"p5",
    ]
    assert [a.first_offset for a in acks] == [0, 1, 2, 4, 5, 6, 7, 8, 9, 10]
    shapes = [e.value if e.batch is None else e.batch.column("value").to_pylist() for e in seen]
    assert shapes == [
        [b"p0", b"p1"],
        [b"batch0", b"batch1"],
        b"p2",
        b"id",
        b"p3",
        b"h",
        b"b" * 16385,
        [b"p4", b"p5"],
    ]


def test_a_typed_stream_gets_each_message_alone(broker):
    """A typed stream refuses an invalid value alone, not the batch around it."""

    async def body(client, seen):
        schema = {"fields": [{"name": "n", "type": "int64"}]}
        await client.create_stream("typed", "gather.typed", schema=schema)
        futures = [await client.publish_async("typed", v) for v in (b'{"n": 1}', b"not json", b'{"n": 3}')]
        return await asyncio.gather(*futures)

    acks, seen = _run(broker, body)
    assert [a.ok for a in acks] == [True, False, True]
    assert all(e.batch is None for e in seen)


def test_messages_still_waiting_leave_when_the_client_closes(broker):
    async def body(client, seen):
        await client.create_stream("closing", "gather.closing")
        return [await client.publish_async("closing", b"c%d" % i) for i in range(5)]

    futures, _ = _run(broker, body)
    # Closed before the acks came: each future ended (with its ack or the closing's error).
    assert all(f.done() and (f.cancelled() or f.exception() is None or f.exception()) for f in futures)

    async def stored():
        client = await Client.connect(nats_urls=broker.nats_url, broker=broker.flight, timeout=10)
        try:
            result = await client.fetch("closing", 0)
        finally:
            await client.close()
        return result.to_table().column("value").to_pylist()

    assert asyncio.run(stored()) == [b"c%d" % i for i in range(5)]


def test_gathered_messages_nobody_acks_each_time_out_and_are_forgotten(broker):
    async def body(client, seen):
        await client.create_stream("silent", "gather.silent")
        await client.publish("silent", b"first")  # the route is learnt
        broker.stop()
        futures = [await client.publish_async("silent", b"lost-%d" % i, timeout=0.5) for i in range(50)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        return results, dict(client._publisher._batches), dict(client._publisher._acks)

    (results, batches, pending), seen = _run(broker, body)
    assert all(isinstance(r, RequestTimeoutError) for r in results)
    assert batches == {} and pending == {}
    assert sum(e.message_count for e in seen) == 51 and len(seen) < 50


def _publisher_with(members: list[str]) -> tuple[Publisher, dict[str, asyncio.Future[Ack]]]:
    """A publisher (its connection never used) whose batch ``b`` holds ``members``."""
    loop = asyncio.get_running_loop()
    nc = types.SimpleNamespace(new_inbox=lambda: "_INBOX.test", publish=None)
    publisher = Publisher(
        nc,  # type: ignore[arg-type]
        timeout=5,
        max_pending=10,
        user=None,
        describe=None,  # type: ignore[arg-type]
        leadership=None,  # type: ignore[arg-type]
    )
    futures = {m: loop.create_future() for m in members}
    publisher._acks.update(futures)
    publisher._batches["b"] = list(members)
    return publisher, futures


@pytest.mark.parametrize(
    ("batch", "expected"),
    [
        (
            Ack("s", 0, 7, 9, "b"),
            [(7, 7, ErrorCode.OK), (8, 8, ErrorCode.OK), (9, 9, ErrorCode.OK)],
        ),
        (
            Ack("s", 0, -1, -1, "b", ErrorCode.NOT_ENOUGH_REPLICAS, "1 of 2 in sync"),
            [(-1, -1, ErrorCode.NOT_ENOUGH_REPLICAS)] * 3,
        ),
        (
            Ack("s", 0, 7, 8, "b", duplicates=((1, 3),)),
            [(7, 7, ErrorCode.OK), (3, 3, ErrorCode.DUPLICATE), (8, 8, ErrorCode.OK)],
        ),
        (  # an ack of two rows for three messages: each gets an error, never a wrong offset
            Ack("s", 0, 7, 8, "b"),
            [(-1, -1, ErrorCode.UNAVAILABLE)] * 3,
        ),
    ],
)
def test_a_batch_ack_is_split_into_each_message_s_own(batch, expected):
    async def run():
        publisher, futures = _publisher_with(["m1", "m2", "m3"])
        msg = types.SimpleNamespace(data=_ack_bytes(batch))
        await publisher._on_ack(msg)  # type: ignore[arg-type]
        assert publisher._batches == {}
        acks = [futures[m].result() for m in ("m1", "m2", "m3")]
        assert [a.correlation_id for a in acks] == ["m1", "m2", "m3"]
        if batch.error is not ErrorCode.OK:
            assert all(a.message == batch.message for a in acks)
        return [(a.first_offset, a.last_offset, a.error) for a in acks]

    assert asyncio.run(run()) == expected


def _ack_bytes(ack: Ack) -> bytes:
    from pyspark_jetstream.protocol.ack import encode_ack

    return encode_ack(ack)


def test_the_ack_window_hands_slots_over_first_come_first_served():
    async def run():
        window = AckWindow(2)
        await window.acquire()
        await window.acquire()
        assert window.full and window.free == 0
        order: list[str] = []

        async def take(name: str) -> None:
            await window.acquire()
            order.append(name)

        first, second, third = (asyncio.ensure_future(take(n)) for n in ("first", "second", "third"))
        await asyncio.sleep(0)
        second.cancel()  # cancelled while waiting: never takes a slot
        await asyncio.sleep(0)
        window.release()
        await asyncio.sleep(0)
        assert order == ["first"] and window.free == 0
        window.release()
        third.cancel()  # handed a slot, then cancelled before it ran: the slot is passed on
        await asyncio.gather(first, second, third, return_exceptions=True)
        assert order == ["first"] and window.free == 1 and not window.full
        window.release()
        window.release()
        assert window.free == 3

    asyncio.run(run())


def test_a_value_that_is_not_bytes_fails_at_the_call_and_spoils_no_batch(broker):
    """A str value is never gathered (Arrow would take it as UTF-8 bytes): it fails at the call,
    as a message alone always did, and the messages around it are stored."""

    async def body(client, seen):
        await client.create_stream("typing", "gather.typing")
        before = await client.publish_async("typing", b"first")
        with pytest.raises(TypeError):
            await client.publish_async("typing", "not bytes")
        with pytest.raises(TypeError):
            await client.publish_async("typing", b"v", key="not bytes")
        after = await client.publish_async("typing", b"last")
        acks = await asyncio.gather(before, after)
        stored = await client.fetch("typing", 0)
        return acks, stored.to_table().column("value").to_pylist()

    (acks, values), _ = _run(broker, body)
    assert [a.first_offset for a in acks] == [0, 1]
    assert values == [b"first", b"last"]
