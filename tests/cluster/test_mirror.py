"""Mirrors between two clusters on this machine (each its own ZooKeeper, nats-server and brokers):
a Spark query fails over from the source to the mirror with its checkpoint, and the mirror stays
offset-identical through kill -9 of its leader, of the source's leader, and a restart of the
whole source cluster.  The clusters start once for the module."""

from __future__ import annotations

import itertools
import threading
import time

import pyarrow as pa
import pytest

from broker_node.zookeeper_server import free_port
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.local import FlightPlace, LocalBroker, LocalCluster
from pyspark_jetstream.protocol.errors import JetStreamError

from ..broker.harness import wait_until
from ..broker.mirror_harness import COPIED_COLUMNS, wait_caught_up
from .conftest import FAST

pytestmark = pytest.mark.slow(seconds=120)
_names = itertools.count()


@pytest.fixture(scope="module")
def cluster_a(tmp_path_factory):
    """The source: fixed Flight ports, so that a restart of the whole cluster keeps its addresses."""
    places = [FlightPlace(port=free_port()) for _ in range(2)]
    base = tmp_path_factory.mktemp("cluster-a")
    with LocalCluster(2, base_dir=base, extra_config=FAST, flight=places, chroot="/site-a") as running:
        yield running


@pytest.fixture(scope="module")
def cluster_b(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster-b")
    with LocalCluster(2, base_dir=base, extra_config=FAST, chroot="/site-b") as running:
        yield running


@pytest.fixture(scope="module")
def client_a(cluster_a):
    with SyncClient(nats_urls=cluster_a.nats_url, broker=cluster_a.flight, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def client_b(cluster_b):
    with SyncClient(nats_urls=cluster_b.nats_url, broker=cluster_b.flight, timeout=30) as client:
        yield client


def sources(cluster: LocalCluster) -> str:
    """Every broker's Flight address, as ``--source-servers`` takes them."""
    return ",".join(b.flight for b in cluster.brokers)


def table_of(client: SyncClient, stream: str, partition: int) -> pa.Table:
    """Every committed row of a partition, read from its leader, in the columns a mirror copies."""
    batches: list[pa.RecordBatch] = []
    start: object = "earliest"
    while True:
        result = client.fetch(stream, partition, start=start)
        batches += result.batches
        if result.next_offset >= result.high_watermark or not result.num_rows:
            break
        start = result.next_offset
    return pa.Table.from_batches(batches).select(COPIED_COLUMNS) if batches else pa.table({})


def assert_offset_identical(client_a: SyncClient, client_b: SyncClient, name: str, partitions: int) -> None:
    for partition in range(partitions):
        theirs, ours = table_of(client_a, name, partition), table_of(client_b, name, partition)
        assert ours.num_rows == theirs.num_rows > 0, (
            f"partition {partition}: {ours.num_rows} != {theirs.num_rows}"
        )
        assert ours.equals(theirs), f"partition {partition} differs"


class Publisher:
    """Publishes batches to the source until stopped, retrying through its failovers."""

    def __init__(self, client: SyncClient, stream: str, partitions: int) -> None:
        self.client, self.stream, self.partitions = client, stream, partitions
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Publisher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        for n in itertools.count():
            if self._stop.is_set():
                return
            values = [b"%d-%d" % (n, i) for i in range(20)]
            try:
                self.client.publish_batch(
                    self.stream, pa.table({"value": values}), partition=n % self.partitions
                )
                self.sent += 1
            except JetStreamError:
                time.sleep(0.1)  # a leader is moving: the next batch goes to its successor


def leader_of(client: SyncClient, stream: str, partition: int) -> str:
    return wait_until(
        lambda: client.describe_stream(stream).partitions[partition].leader, message=f"a leader of {stream}"
    )


def kill_leader(cluster: LocalCluster, client: SyncClient, stream: str) -> LocalBroker:
    """``kill -9`` of partition 0's leader, once another has taken over; the killed broker."""
    victim = cluster.broker(leader_of(client, stream, 0))
    victim.kill()
    wait_until(lambda: leader_of(client, stream, 0) != victim.broker_id, timeout=30, message="a new leader")
    return victim


def test_the_mirror_stays_offset_identical_through_leader_kills_and_a_source_restart(
    cluster_a, cluster_b, client_a, client_b
):
    name = f"faults{next(_names)}"
    client_a.create_stream(name, name, partitions=2, replication_factor=2)
    client_b.create_mirror(name, name, sources(cluster_a), replication_factor=2)
    with Publisher(client_a, name, 2) as publisher:

        def copied_more(than: int) -> bool:
            return sum(s.mirror_end for s in client_b.mirror_status(name)) > than

        wait_until(lambda: copied_more(0), timeout=30, message="the mirror to copy")
        # kill -9 of the mirroring leader: its successor in cluster B carries on from its own end.
        victim = kill_leader(cluster_b, client_b, name)
        ends = sum(s.mirror_end for s in client_b.mirror_status(name))
        wait_until(lambda: copied_more(ends), timeout=30, message="the new mirror leader to copy")
        victim.start()
        # kill -9 of the source's leader: the mirror finds the source's next leader.
        kill_leader(cluster_a, client_a, name).start()
        ends = sum(s.mirror_end for s in client_b.mirror_status(name))
        wait_until(
            lambda: copied_more(ends), timeout=30, message="the mirror to copy from the new source leader"
        )
        # The whole source cluster restarts (its brokers, on the same addresses).
        for broker in cluster_a.brokers:
            broker.stop()
        for broker in cluster_a.brokers:
            broker.start()
        ends = sum(s.mirror_end for s in client_b.mirror_status(name))
        wait_until(
            lambda: copied_more(ends), timeout=60, message="the mirror to copy after the source restarted"
        )
    assert publisher.sent > 0
    wait_caught_up(client_b, name, client_a, timeout=60)
    assert_offset_identical(client_a, client_b, name, 2)


def test_a_spark_query_fails_over_to_the_mirror_with_its_checkpoint(
    spark, cluster_a, cluster_b, client_a, client_b, tmp_path
):
    name = f"orders{next(_names)}"
    client_a.create_stream(name, name, partitions=2, replication_factor=2)
    client_b.create_mirror(name, name, sources(cluster_a), replication_factor=2)

    def publish(first: int, count: int) -> None:
        for p in range(2):
            values = [b"%d-%d" % (p, i) for i in range(first, first + count)]
            client_a.publish_batch(name, pa.table({"value": values}), partition=p)

    def run(servers: str) -> None:
        query = (
            spark.readStream.format("jetstream")
            .option("servers", servers)
            .option("stream", name)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)

    publish(0, 50)
    run(sources(cluster_a))  # the first half, from the source
    publish(50, 50)
    wait_caught_up(client_b, name, client_a)
    run(sources(cluster_b))  # site A is "lost": the same query, the same checkpoint, the mirror
    rows = spark.read.parquet(str(tmp_path / "out")).select("partition", "offset", "value").collect()
    seen = sorted((r.partition, r.offset, bytes(r.value)) for r in rows)
    assert seen == [(p, i, b"%d-%d" % (p, i)) for p in range(2) for i in range(100)]  # each once
