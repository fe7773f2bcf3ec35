"""Clients, the CLI and Spark across a leader change, on a real three-broker cluster."""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pytest

from pyspark_jetstream.client import AckPolicy

from ..broker.harness import run_cli, wait_until
from .helpers import leader_of, publish_all

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)


def copied_rows(client) -> int:
    return sum(p.high_watermark for p in client.describe_stream("copy").partitions)


def test_a_subscriber_follows_the_new_leader_without_gaps_or_repeats(cluster, client):
    client.create_stream("sub", "sub", replication_factor=3, min_insync_replicas=2)
    publish_all(client, "sub", [b"%04d" % i for i in range(100)], "p")
    seen: list[bytes] = []
    done = threading.Event()

    def consume() -> None:
        for message in client.subscribe("sub", start="earliest", follow=5):
            seen.append(message.value)
            if len(seen) == 200:
                done.set()
                return

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    wait_until(lambda: len(seen) >= 100, message="the first hundred")
    cluster.broker(leader_of(client, "sub")).kill()
    publish_all(client, "sub", [b"%04d" % i for i in range(100, 200)], "p", first=100)
    assert done.wait(60), f"only {len(seen)} messages seen"
    assert seen == [b"%04d" % i for i in range(200)]


def test_the_cli_shows_the_cluster_and_rebalances_leaders(cluster, client):
    env = {**os.environ, "JETSTREAM_NATS": cluster.nats_url, "JETSTREAM_BROKER": cluster.flight}

    def cli(*args: str) -> str:
        run = run_cli(*args, env=env, timeout=120)
        assert run.returncode == 0, run.stderr
        return run.stdout

    out = cli(
        "stream",
        "create",
        "shown",
        "--subject",
        "shown",
        "--partitions",
        "3",
        "--replication-factor",
        "3",
        "--min-insync-replicas",
        "2",
    )
    assert "3 partition(s)" in out
    publish_all(client, "shown", [b"x"] * 5, "p")
    status = cli("cluster", "status")
    assert "controller broker-" in status and status.count("broker-") >= 9
    assert "shown" in status and "(lag 0)" in status
    # After a restart, leadership is uneven until the preferred replicas lead again.
    victim = leader_of(client, "shown", 0)
    cluster.broker(victim).stop()
    cluster.broker(victim).start()
    wait_until(lambda: len(client.describe_stream("shown").partitions[0].isr) == 3, timeout=30)
    moved = cli("cluster", "elect-leaders")
    assert f"shown/0 -> {victim}" in moved
    assert leader_of(client, "shown", 0) == victim
    describe = cli("stream", "describe", "shown")
    assert "min_insync_replicas  2" in describe


def test_a_streaming_query_reads_and_writes_across_leader_changes(cluster, client, spark, tmp_path):
    client.create_stream("source", "source", partitions=2, replication_factor=3, min_insync_replicas=2)
    client.create_stream("copy", "copy", partitions=2, replication_factor=3, min_insync_replicas=2)
    for p in range(2):
        rows = pa.table(
            {"key": [b"k%d" % i for i in range(300)], "value": [b"%d-%04d" % (p, i) for i in range(300)]}
        )
        client.publish_batch("source", rows, partition=p, ack_policy=AckPolicy.ALL)
    query = (
        spark.readStream.format("jetstream")
        .option("servers", ",".join(cluster.flights))
        .option("stream", "source")
        .option("startingOffsets", "earliest")
        .option("readFromReplicas", "true")  # followers serve, the leader what they lack
        .option("maxRecordsPerTrigger", "60")
        .load()
        .selectExpr("key", "value", "partition")
        .writeStream.format("jetstream")
        .option("servers", ",".join(cluster.flights))
        .option("nats", cluster.nats_url)
        .option("stream", "copy")
        .option("timeout", "5")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: client.describe_stream("copy").partitions[0].high_watermark >= 60, timeout=120)
        cluster.broker(leader_of(client, "source", 0)).kill()
        wait_until(
            lambda: sum(p.high_watermark for p in client.describe_stream("copy").partitions) >= 400,
            timeout=180,
        )
        cluster.broker(leader_of(client, "copy", 1)).kill()
        wait_until(
            lambda: sum(p.high_watermark for p in client.describe_stream("copy").partitions) >= 600,
            timeout=180,
        )
    finally:
        query.stop()
    copied = []
    for p in range(2):
        copied += client.fetch("copy", p, max_records=10_000).to_table().column("value").to_pylist()
    assert sorted(copied) == sorted(b"%d-%04d" % (p, i) for p in range(2) for i in range(300))
