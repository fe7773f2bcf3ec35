"""Growing a stream on three real brokers: new partitions get replicas and leaders, replicate, take
acks=all writes; growing while the controller is killed leaves a whole stream."""

from __future__ import annotations

import time

import pytest

from pyspark_jetstream.client import AckPolicy
from pyspark_jetstream.protocol.errors import JetStreamError

from ..broker.harness import wait_until
from .helpers import caught_up, replica_table

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)


def publish_to(client, stream: str, partition: int, count: int, deadline: float = 60) -> None:
    """``count`` messages to one partition with ALL acks, an idempotent producer and retries."""
    stop = time.monotonic() + deadline
    for sequence in range(count):
        while True:
            try:
                ack = client.publish(
                    stream,
                    b"%d-%d" % (partition, sequence),
                    partition=partition,
                    ack_policy=AckPolicy.ALL,
                    producer_id=f"{stream}-{partition}",
                    sequence=sequence,
                    timeout=2,
                )
                assert ack.partition == partition
                break
            except JetStreamError as exc:
                if not exc.retriable or time.monotonic() > stop:
                    raise


def test_new_partitions_are_replicated_led_everywhere_and_take_all_acks(cluster, client):
    client.create_stream("grow", "grow", partitions=1, replication_factor=3, min_insync_replicas=2)
    publish_to(client, "grow", 0, 5)
    info = client.add_partitions("grow", 4)
    assert [p.partition for p in info.partitions] == [0, 1, 2, 3]
    for p in info.partitions[1:]:
        assert len(set(p.replicas)) == 3 and set(p.isr) == set(p.replicas) and p.leader == p.replicas[0]
    assert {p.leader for p in info.partitions} == {"broker-1", "broker-2", "broker-3"}  # spread
    for partition in (1, 2, 3):
        publish_to(client, "grow", partition, 20)
    wait_until(lambda: caught_up(cluster, "grow", 4), timeout=30, message="every replica caught up")
    for partition in (1, 2, 3):
        tables = [replica_table(address, "grow", partition) for address in cluster.flights]
        assert tables[0].num_rows == 20 and all(t.equals(tables[0]) for t in tables)
        assert tables[0].column("value").to_pylist() == [b"%d-%d" % (partition, i) for i in range(20)]
    assert replica_table(cluster.flight, "grow", 0).num_rows == 5


def test_growing_while_the_controller_is_killed_leaves_a_whole_stream(cluster, client):
    client.create_stream("fo", "fo", partitions=2, replication_factor=2)
    controller = client.metadata()["controller"]
    cluster.broker(controller).kill()
    # Sent to a live broker, forwarded to the controller: the dead one, then the one elected after it.
    info = client.add_partitions("fo", 5)
    assert info.config["partitions"] == len(info.partitions) == 5
    wait_until(
        lambda: all(p.leader not in ("", controller) for p in client.describe_stream("fo").partitions),
        timeout=30,
        message="every partition led by a live broker",
    )
    for partition in range(5):
        publish_to(client, "fo", partition, 3)
    assert all(p.high_watermark == 3 for p in client.describe_stream("fo").partitions)
