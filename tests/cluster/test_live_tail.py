"""The live tail on a three-broker cluster: a new leader takes over the publishing, and
nothing uncommitted is ever delivered."""

from __future__ import annotations

import asyncio

import pytest

from pyspark_jetstream.client import AckPolicy, Client
from pyspark_jetstream.client.live import LiveTail
from pyspark_jetstream.local import LocalCluster

from .helpers import leader_of, partition_status, publish_all


@pytest.fixture
def cluster(tmp_path):
    """A follower stays in the ISR for 5 s without fetching: time to look at a stalled high
    watermark (the ``client`` fixture of conftest connects to this cluster)."""
    extra = "[replication]\nreplica_max_lag = 5.0\n"
    with LocalCluster(3, base_dir=tmp_path / "cluster", extra_config=extra, log_level="DEBUG") as running:
        yield running


def test_nothing_uncommitted_is_delivered_and_a_new_leader_takes_over(cluster, client):
    """A follower frozen in the ISR holds the high watermark back: the leader stores what is
    published (LEADER acks) but delivers none of it until the ISR moves on without the follower.
    Then the leader is killed: the tail goes on, from the new leader's live tail."""
    client.create_stream("hw", "hw", replication_factor=3, min_insync_replicas=1)
    publish_all(client, "hw", [b"%04d" % i for i in range(10)], "p")
    leader = leader_of(client, "hw")
    address = cluster.broker(leader).flight
    follower = next(b for b in cluster.brokers if b.broker_id != leader)

    async def main() -> tuple[list[int], list[tuple[int, int, int]], int, LiveTail]:
        async with await Client.connect(
            nats_urls=cluster.nats_url, broker=cluster.flight, timeout=20
        ) as consumer:
            tail = consumer.tail("hw", start="earliest")
            got: list[int] = []
            samples: list[tuple[int, int, int]] = []  # (delivered up to, high watermark, log end)

            async def consume(until: int) -> None:
                async for batch in tail:
                    got.extend(batch.column("offset").to_pylist())
                    if got[-1] >= until - 1:
                        return

            consumer_task = asyncio.ensure_future(consume(60))
            while len(got) < 10:
                await asyncio.sleep(0.01)
            await consumer.publish("hw", b"%04d" % 10, ack_policy=AckPolicy.ALL)  # routes known
            follower.pause()
            try:
                for i in range(11, 60):
                    await consumer.publish("hw", b"%04d" % i, ack_policy=AckPolicy.LEADER)
                for _ in range(30):  # the ISR waits 5 s to drop the follower; marks come every 1 s
                    state = await asyncio.to_thread(partition_status, address, "hw")
                    assert state is not None
                    samples.append((len(got), state["high_watermark"], state["log_end_offset"]))
                    await asyncio.sleep(0.05)
            finally:
                follower.resume()
            await asyncio.wait_for(consumer_task, 60)
            assert got == list(range(60))
            live_before = tail.stats.live_batches
            rest = asyncio.ensure_future(consume(110))
            await asyncio.to_thread(cluster.broker(leader).kill)
            await asyncio.to_thread(publish_all, client, "hw", [b"%04d" % i for i in range(60, 110)], "q")
            await asyncio.wait_for(rest, 60)
            # The tail may read all of that over Flight (its read waits out the election). Caught
            # up now, it is waiting on the new leader's live tail for what comes next.
            for i in range(110, 160):
                rest = asyncio.ensure_future(consume(i + 1))
                await consumer.publish("hw", b"%04d" % i, ack_policy=AckPolicy.LEADER)
                await asyncio.wait_for(rest, 60)
            await tail.aclose()
            return got, samples, live_before, tail

    got, samples, live_before, tail = asyncio.run(main())
    stalled = [s for s in samples if s[1] < s[2]]
    assert stalled, f"the high watermark never stalled: {samples}"
    assert all(delivered <= hw for delivered, hw, _ in samples), samples
    assert live_before > 0, tail.stats
    assert got == list(range(160))
    assert tail.stats.live_batches > live_before, tail.stats  # the new leader publishes
