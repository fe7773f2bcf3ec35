"""Message ids across a leader change: the new leader knows what its predecessor stored."""

from __future__ import annotations

import asyncio
import time

import nats
import nats.js.errors

from pyspark_jetstream.client import AckPolicy
from pyspark_jetstream.protocol.errors import JetStreamError

from ..broker.harness import wait_until
from .helpers import caught_up, leader_of


def _retried(call, deadline: float = 60):
    """``call()``, retried while what it raises is retriable (a leader change) until ``deadline``."""
    stop = time.monotonic() + deadline
    while True:
        try:
            return call()
        except JetStreamError as exc:
            if not exc.retriable or time.monotonic() > stop:
                raise


def _publish(client, value: bytes, message_id: str):
    """Publish with ALL acks, retried through a leader change."""
    return _retried(
        lambda: client.publish("ids", value, message_id=message_id, ack_policy=AckPolicy.ALL, timeout=2)
    )


def test_a_new_leader_acks_repeats_of_what_its_predecessor_stored(cluster, client):
    client.create_stream("ids", "ids", replication_factor=3, min_insync_replicas=2)
    originals = [_publish(client, b"v%d" % i, f"order-{i}") for i in range(10)]
    headers_only = asyncio.run(_js_publish(cluster.nats_url, "order-js"))
    wait_until(lambda: caught_up(cluster, "ids"), timeout=30, message="every replica caught up")
    victim = leader_of(client, "ids")
    cluster.broker(victim).kill()
    wait_until(lambda: leader_of(client, "ids") != victim, timeout=30, message="a new leader")
    repeats = [_publish(client, b"again", f"order-{i}") for i in range(10)]
    assert all(r.duplicate for r in repeats)
    assert [r.first_offset for r in repeats] == [o.first_offset for o in originals] == list(range(10))
    again_js = asyncio.run(_js_publish(cluster.nats_url, "order-js"))
    assert (again_js.seq, again_js.duplicate) == (headers_only.seq, True)
    fresh = _publish(client, b"new", "order-new")
    assert (fresh.first_offset, fresh.duplicate) == (11, False)
    values = client.fetch("ids", max_records=100).to_table().column("value").to_pylist()
    assert values == [b"v%d" % i for i in range(10)] + [b"js", b"new"]


async def _js_publish(url: str, message_id: str):
    """nats-py's own JetStream publish, retried while leadership moves (no responders, timeouts)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=2)
        deadline = time.monotonic() + 60
        while True:
            try:
                return await js.publish("ids", b"js", headers={"Nats-Msg-Id": message_id})
            except (
                nats.errors.TimeoutError,
                nats.js.errors.NoStreamResponseError,
                nats.js.errors.ServiceUnavailableError,
            ):
                if time.monotonic() > deadline:
                    raise
    finally:
        await nc.close()


def _publish_batch(client, values: list[bytes], ids: list[str]):
    rows = [{"value": v} for v in values]
    return _retried(
        lambda: client.publish_batch("rows", rows, message_ids=ids, ack_policy=AckPolicy.ALL, timeout=2)
    )


def test_a_new_leader_knows_the_ids_of_batch_rows(cluster, client):
    client.create_stream("rows", "rows", replication_factor=3, min_insync_replicas=2)
    first = _publish_batch(client, [b"a", b"b", b"c"], ["order-1", "order-2", "order-3"])
    assert (first.first_offset, first.last_offset, first.duplicates) == (0, 2, ())
    wait_until(lambda: caught_up(cluster, "rows"), timeout=30, message="every replica caught up")
    victim = leader_of(client, "rows")
    cluster.broker(victim).kill()
    wait_until(lambda: leader_of(client, "rows") != victim, timeout=30, message="a new leader")
    again = _publish_batch(client, [b"b again", b"d", b"a again"], ["order-2", "order-4", "order-1"])
    assert (again.first_offset, again.last_offset, again.duplicates) == (3, 3, ((0, 1), (2, 0)))
    assert again.row_offsets(3) == [1, 3, 0]
    values = client.fetch("rows", max_records=100).to_table().column("value").to_pylist()
    assert values == [b"a", b"b", b"c", b"d"]
