"""Replication across three real brokers: identical replicas, failover, the ISR, controlled shutdown."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from pyspark_jetstream.client import AckPolicy
from pyspark_jetstream.protocol.errors import NotEnoughReplicasError

from ..broker.harness import wait_until
from .helpers import caught_up, leader_of, publish_all, replica_table, stored_frames

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)


def test_every_replica_stores_the_same_bytes(cluster, client):
    client.create_stream("same", "same", partitions=2, replication_factor=3, compression="lz4")
    for i in range(200):
        client.publish(
            "same", b"value-%d" % i, key=b"k%d" % (i % 7), partition=i % 2, ack_policy=AckPolicy.ALL
        )
    for p in range(2):
        rows = pa.table({"value": [b"x" * 100 + b"%d" % i for i in range(2000)]})
        client.publish_batch("same", rows, partition=p, ack_policy=AckPolicy.ALL)
    wait_until(lambda: caught_up(cluster, "same", 2), message="every replica caught up")
    # Served the same by every replica (a follower serves with from_replicas) ...
    for p in range(2):
        tables = [replica_table(address, "same", p) for address in cluster.flights]
        assert tables[0].num_rows == 2100 and all(t.equals(tables[0]) for t in tables)
    cluster.stop()
    # ... and stored byte for byte the same: offsets, timestamps, epochs, checksums, compression.
    for p in range(2):
        frames = [stored_frames(b, "same", p) for b in cluster.brokers]
        assert frames[0] and frames[0] == frames[1] == frames[2]


def test_a_killed_leader_loses_no_acknowledged_message(cluster, client):
    client.create_stream("fo", "fo", replication_factor=3, min_insync_replicas=2)
    stop = threading.Event()
    acked: list[bytes] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            values = [b"v%05d" % i for i in range(100_000)]
            sequence = 0
            while not stop.is_set():
                acks = publish_all(client, "fo", values[sequence : sequence + 1], "p1", first=sequence)
                acked.extend(values[sequence : sequence + len(acks)])
                sequence += len(acks)
        except BaseException as exc:
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    wait_until(lambda: len(acked) >= 50, message="acks before the crash")
    victim = leader_of(client, "fo")
    cluster.broker(victim).kill()
    started = time.monotonic()
    before = len(acked)
    wait_until(lambda: len(acked) >= before + 50, timeout=60, message="acks after the failover")
    assert time.monotonic() - started < 30
    stop.set()
    producer.join(60)
    assert not errors, errors
    assert leader_of(client, "fo") != victim
    # The crashed broker comes back as a follower and catches up.
    cluster.broker(victim).start()
    wait_until(lambda: caught_up(cluster, "fo"), timeout=60, message="the old leader caught up")
    stored = client.fetch("fo", max_records=1_000_000).to_table().column("value").to_pylist()
    assert len(stored) == len(set(stored)), "a value is stored twice"
    assert set(acked) <= set(stored), f"lost: {sorted(set(acked) - set(stored))[:10]}"
    tables = [replica_table(address, "fo") for address in cluster.flights]
    assert all(t.equals(tables[0]) for t in tables)


def test_a_paused_follower_leaves_the_isr_and_rejoins(cluster, client):
    client.create_stream("isr", "isr", replication_factor=3, min_insync_replicas=2)
    leader = leader_of(client, "isr")
    follower = next(b for b in client.describe_stream("isr").partitions[0].replicas if b != leader)
    cluster.broker(follower).pause()
    try:
        wait_until(
            lambda: follower not in client.describe_stream("isr").partitions[0].isr,
            timeout=30,
            message="the paused follower to leave the ISR",
        )
        # Writes go on with the two others.
        assert len(publish_all(client, "isr", [b"a", b"b", b"c"], "p")) == 3
    finally:
        cluster.broker(follower).resume()
    wait_until(
        lambda: follower in client.describe_stream("isr").partitions[0].isr,
        timeout=30,
        message="the follower to rejoin the ISR",
    )
    wait_until(lambda: caught_up(cluster, "isr"), message="caught up")
    assert replica_table(cluster.broker(follower).flight, "isr").column("value").to_pylist() == [
        b"a",
        b"b",
        b"c",
    ]


def test_all_acks_fail_without_enough_in_sync_replicas_and_nothing_is_acked(cluster, client):
    client.create_stream("minisr", "minisr", replication_factor=3, min_insync_replicas=2)
    assert len(publish_all(client, "minisr", [b"before"], "p")) == 1
    leader = leader_of(client, "minisr")
    followers = [b for b in client.describe_stream("minisr").partitions[0].replicas if b != leader]
    for follower in followers:
        cluster.broker(follower).pause()
    try:
        wait_until(
            lambda: client.describe_stream("minisr").partitions[0].isr == (leader,),
            timeout=30,
            message="the ISR to shrink to the leader",
        )
        for i in range(2):  # each is retried (the ISR may grow back) until its timeout, then refused
            with pytest.raises(NotEnoughReplicasError, match="fewer than min_insync_replicas=2"):
                client.publish("minisr", b"refused-%d" % i, ack_policy=AckPolicy.ALL, timeout=2)
        # LEADER acks still work: they do not promise replication.
        assert client.publish("minisr", b"leader-only", ack_policy=AckPolicy.LEADER).ok
    finally:
        for follower in followers:
            cluster.broker(follower).resume()
    stored = client.fetch("minisr").to_table().column("value").to_pylist()
    assert not any(v.startswith(b"refused") for v in stored)


def test_a_controlled_shutdown_hands_leadership_over_without_loss(cluster, client):
    client.create_stream("roll", "roll", partitions=3, replication_factor=3, min_insync_replicas=2)
    stop = threading.Event()
    acked: list[bytes] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            sequence = 0
            while not stop.is_set():
                value = b"r%05d" % sequence
                publish_all(client, "roll", [value], "roller", first=sequence)
                acked.append(value)
                sequence += 1
        except BaseException as exc:
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        # A rolling restart: each broker in turn stops (SIGTERM) and comes back.
        for broker in cluster.brokers:
            wait_until(
                lambda: all(len(p.isr) == 3 for p in client.describe_stream("roll").partitions),
                timeout=60,
                message="every replica in sync before the next restart",
            )
            led = [
                p.partition for p in client.describe_stream("roll").partitions if p.leader == broker.broker_id
            ]
            logged = broker.log_path.stat().st_size
            assert broker.stop() == 0
            with open(broker.log_path, "rb") as log:
                log.seek(logged)
                stopping = log.read().decode(errors="replace")
            # It stopped once its own view of the metadata had no leadership left to hand over ...
            assert "controlled shutdown: no partition led here can move" in stopping, stopping[-3000:]
            assert "controlled shutdown timed out" not in stopping
            # ... which the broker asked here learns from ZooKeeper's watch, a moment later.
            wait_until(
                lambda gone=broker.broker_id, moved=led: all(
                    client.describe_stream("roll").partitions[p].leader != gone for p in moved
                ),
                timeout=10,
                message=f"the partitions {led} led by the stopped broker to show another leader",
            )
            broker.start()
    finally:
        stop.set()
        producer.join(60)
    assert not errors, errors
    stored = []
    for p in range(3):
        stored += client.fetch("roll", p, max_records=1_000_000).to_table().column("value").to_pylist()
    assert len(stored) == len(set(stored)) and set(acked) <= set(stored)
    assert len(acked) > 20
