"""Publishes in flight when a leader dies: the client resends what the broker de-duplicates."""

from __future__ import annotations

import asyncio
import time

from pyspark_jetstream.client import AckPolicy, Client
from pyspark_jetstream.protocol.errors import RequestTimeoutError

RATE = 300
"""Messages per second: enough to have hundreds in flight when the leader dies (a few seconds pass
before another broker leads), and well below what a cluster of three sharing two busy cores with
the rest of the suite acknowledges with all replicas (at 600/s it fell behind before the kill)."""


async def _publish_through_a_kill(cluster, stream: str, count: int, **per_message) -> list:
    """Publish ``count`` values pipelined at :data:`RATE`, SIGKILL the leader a third of the way;
    return each publish's outcome (its ack, or the exception) and the kill's time."""
    async with await Client.connect(nats_urls=cluster.nats_url, broker=cluster.flight, timeout=8) as client:
        leader = (await client.describe_stream(stream)).partitions[0].leader
        futures, killed = [], 0.0
        started = time.monotonic()
        for n in range(count):
            if n == count // 3:
                cluster.broker(leader).kill()
                killed = time.monotonic()
            options = {k: (v(n) if callable(v) else v) for k, v in per_message.items()}
            futures.append(
                await client.publish_async(stream, b"v%d" % n, ack_policy=AckPolicy.ALL, **options)
            )
            await asyncio.sleep(max(0.0, started + n / RATE - time.monotonic()))
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        stored = (await client.fetch(stream, max_records=10 * count)).to_table().column("value").to_pylist()
        return outcomes, stored, killed


def test_an_idempotent_producers_publishes_in_flight_follow_the_new_leader(cluster, client):
    client.create_stream("fo", "fo", replication_factor=3, min_insync_replicas=2)
    count = 1200
    outcomes, stored, _ = asyncio.run(
        _publish_through_a_kill(cluster, "fo", count, producer_id="p", sequence=lambda n: n)
    )
    failed = [(n, o) for n, o in enumerate(outcomes) if isinstance(o, Exception) or not o.ok]
    assert not failed, f"{len(failed)} failed, first {failed[:3]}"
    assert stored == [b"v%d" % n for n in range(count)]  # each once, in order


def test_publishes_with_message_ids_follow_the_new_leader(cluster, client):
    client.create_stream("fm", "fm", replication_factor=3, min_insync_replicas=2)
    count = 1200
    outcomes, stored, _ = asyncio.run(
        _publish_through_a_kill(cluster, "fm", count, message_id=lambda n: f"m{n}")
    )
    failed = [(n, o) for n, o in enumerate(outcomes) if isinstance(o, Exception) or not o.ok]
    assert not failed, f"{len(failed)} failed, first {failed[:3]}"
    assert sorted(stored) == sorted(b"v%d" % n for n in range(count))  # each once


def test_plain_publishes_lost_with_the_leader_time_out_saying_why_they_were_not_resent(cluster, client):
    client.create_stream("fp", "fp", replication_factor=3, min_insync_replicas=2)
    outcomes, stored, _ = asyncio.run(_publish_through_a_kill(cluster, "fp", 1200))
    lost = [o for o in outcomes if isinstance(o, RequestTimeoutError)]
    assert lost, "some plain publishes were lost with the leader"
    assert "a message id, is resent after a leader change; others are not" in str(lost[0])
    assert len(stored) == len(set(stored))  # never resent, so never stored twice
