"""What a micro-batch no longer pays for each time (issue 40), and what must not outlive a change.

Connections kept per process are found by servers, timeout and credentials
(their TLS files' stamps too); a small micro-batch is one task; stored
batches of a few messages reach Spark joined; cursors are stored in the
background.  A broker that moved is found by a query restarted with its new
address, and by a kept connection through its cluster's metadata.
(Credentials that change between queries: ``tests/security/test_spark_security.py``.)
"""

from __future__ import annotations

import socket
import time

import pyarrow as pa
import pytest

from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.client.credentials import Credentials
from pyspark_jetstream.local import FlightPlace, LocalBroker
from pyspark_jetstream.protocol.joined_batches import joined
from pyspark_jetstream.spark import connections
from pyspark_jetstream.spark.connections import kept_keys, read_pool, shared_connection
from pyspark_jetstream.spark.cursors import CursorWriter
from pyspark_jetstream.spark.options import parse_source_options
from pyspark_jetstream.spark.range_reads import GATHERED_ROWS, SMALL_BATCH, RangeSpec
from pyspark_jetstream.spark.tasks import SMALL_BATCH_ROWS, group_ranges

from .frames import read

NOWHERE = "grpc://127.0.0.1:1"
"""A broker address nothing answers at (a connection is made without calling it)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(condition, timeout: float = 30.0, message: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{message} not reached within {timeout} s"
        time.sleep(0.05)


# ---- kept connections ----------------------------------------------------------------------------


def test_a_connection_is_kept_per_servers_timeout_and_credentials():
    first = shared_connection(NOWHERE, None, 5.0)
    assert shared_connection(NOWHERE, Credentials(), 5.0) is first  # no credentials are empty ones
    assert shared_connection(NOWHERE, None, 6.0) is not first
    assert shared_connection(f"{NOWHERE},grpc://127.0.0.1:2", None, 5.0) is not first
    alice = shared_connection(NOWHERE, Credentials(user="alice", token="one"), 5.0)
    assert alice is not first
    assert alice.credentials == Credentials(user="alice", token="one")
    renewed = shared_connection(NOWHERE, Credentials(user="alice", token="two"), 5.0)
    assert renewed is not alice
    assert renewed.credentials.token == "two"


def test_a_tls_file_rewritten_in_place_gives_a_new_connection(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("first certificate")
    credentials = Credentials(tls_ca=str(ca))
    before = shared_connection(NOWHERE, credentials, 5.0)
    assert shared_connection(NOWHERE, credentials, 5.0) is before
    ca.write_text("the renewed certificate, longer")
    assert shared_connection(NOWHERE, credentials, 5.0) is not before


def test_only_the_most_recently_used_connections_are_kept():
    connections.forget_connections()
    first = shared_connection(NOWHERE, None, 1.0)
    for i in range(connections.KEPT):
        shared_connection(NOWHERE, None, 2.0 + i)
    keys = kept_keys()
    assert len(keys) == connections.KEPT
    assert all(key.timeout != 1.0 for key in keys)
    assert shared_connection(NOWHERE, None, 1.0) is not first
    connections.forget_connections()
    assert kept_keys() == []


def test_the_read_pool_is_made_once_per_process():
    assert read_pool() is read_pool()


# ---- tasks -----------------------------------------------------------------------------------------


def ranges(*sizes: int) -> list[RangeSpec]:
    return [RangeSpec("grpc://h:1", "s", p, 10, 10 + size) for p, size in enumerate(sizes)]


def test_a_small_micro_batch_is_one_task_and_a_big_one_a_task_per_range():
    options = parse_source_options({"servers": "grpc://h:1", "stream": "s"}, streaming=True)
    small = ranges(600, 500, 0, 700)
    assert group_ranges(small, options) == [tuple(small)]
    big = ranges(SMALL_BATCH_ROWS, 1)
    assert group_ranges(big, options) == [(big[0],), (big[1],)]
    assert group_ranges([], options) == []


def test_min_partitions_and_max_records_per_partition_keep_their_tasks():
    small = ranges(600, 500)
    spread = parse_source_options(
        {"servers": "grpc://h:1", "stream": "s", "minPartitions": "2"}, streaming=True
    )
    assert group_ranges(small, spread) == [(small[0],), (small[1],)]
    capped = parse_source_options(
        {"servers": "grpc://h:1", "stream": "s", "maxRecordsPerPartition": "1000"}, streaming=True
    )
    assert group_ranges(small, capped) == [(small[0],), (small[1],)]  # 1,100 rows > 1,000
    assert group_ranges(ranges(400, 500), capped) == [tuple(ranges(400, 500))]


def batch(first: int, rows: int) -> pa.RecordBatch:
    return pa.record_batch({"offset": pa.array(range(first, first + rows), pa.int64())})


def test_small_stored_batches_reach_spark_joined_and_big_ones_as_they_are():
    stored = [batch(0, 3), batch(3, 0), batch(3, 5), batch(8, SMALL_BATCH), batch(8 + SMALL_BATCH, 2)]
    out = joined(stored, small_rows=SMALL_BATCH, most_rows=GATHERED_ROWS)
    assert [b.num_rows for b in out] == [8, SMALL_BATCH, 2]
    assert out[1] is stored[3]
    offsets = [o for b in out for o in b.column(0).to_pylist()]
    assert offsets == list(range(10 + SMALL_BATCH))
    many = [batch(i * 1000, 1000) for i in range(2 * GATHERED_ROWS // 1000)]
    gathered = joined(many, small_rows=SMALL_BATCH, most_rows=GATHERED_ROWS)
    assert [b.num_rows for b in gathered] == [65_000, 65_000, 1_000]  # at most GATHERED_ROWS each


def test_a_small_batch_read_of_many_partitions_is_one_spark_task(spark, deployment, client, name):
    client.create_stream(name, name, partitions=4)
    for p in range(4):
        client.publish_batch(name, pa.table({"value": [b"v"] * 5}), partition=p)
    df = read(spark, deployment, stream=name)
    assert df.rdd.getNumPartitions() == 1
    assert sorted((r.partition, r.offset) for r in df.collect()) == [
        (p, o) for p in range(4) for o in range(5)
    ]
    assert read(spark, deployment, stream=name, minPartitions="4").rdd.getNumPartitions() == 4


# ---- cursors ---------------------------------------------------------------------------------------


def test_cursors_are_stored_in_the_background_newest_position_last(deployment, client, name):
    client.create_stream(name, name, partitions=2)
    writer = CursorWriter(lambda: shared_connection(deployment.flight, None, 10.0), f"{name}-consumer")
    for end in range(1, 30):
        writer.store({name: {"0": end, "1": 2 * end}})
    assert writer.flush(30.0)
    assert (
        client.fetch_cursor(f"{name}-consumer", name, 0),
        client.fetch_cursor(f"{name}-consumer", name, 1),
    ) == (
        29,
        58,
    )
    writer.close(30.0)
    writer.store({name: {"0": 99, "1": 99}})  # closed: nothing more is stored
    assert client.fetch_cursor(f"{name}-consumer", name, 0) == 29


def test_a_background_writer_finds_cursors_another_query_moved_and_stops(deployment, client, name):
    client.create_stream(name, name)
    consumer = f"{name}-shared"
    ours = CursorWriter(lambda: shared_connection(deployment.flight, None, 10.0), consumer, sole_writer=True)
    ours.store({name: {"0": 5}})
    assert ours.flush(30.0) and ours.failure is None
    ours.store({name: {"0": 6}})  # still where it stored them: stored again
    assert ours.flush(30.0) and ours.failure is None
    assert client.fetch_cursor(consumer, name, 0) == 6
    client.set_cursor(consumer, name, 0, 2)  # another query with the same consumerId
    ours.store({name: {"0": 7}})
    assert ours.flush(30.0)
    assert ours.failure is not None and str(ours.failure).startswith(
        f"consumerId '{consumer}': another query stores its cursors too "
        f"({name}/0 is at 2, this query stored 6)"
    )
    assert client.fetch_cursor(consumer, name, 0) == 2  # not written over
    ours.store({name: {"0": 8}})  # stopped: nothing more is stored
    assert ours.flush(30.0) and client.fetch_cursor(consumer, name, 0) == 2
    ours.close(30.0)


# ---- a broker that moved ---------------------------------------------------------------------------


@pytest.fixture
def moving_broker(tmp_path):
    """A broker and the stream ``moved`` (2 partitions, 3 messages each), and a free port to move
    it to; stopped at the end whatever ran."""
    broker = LocalBroker(tmp_path / "data", flight=FlightPlace(port=free_port()), log_level="WARNING")
    broker.start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        client.create_stream("moved", "moved", partitions=2)
        for p in range(2):
            client.publish_batch("moved", pa.table({"value": [b"a", b"b", b"c"]}), partition=p)
    holder = {"broker": broker}
    yield holder, tmp_path
    holder["broker"].stop()


def test_a_broker_moved_to_a_new_address_is_read_there(spark, moving_broker):
    holder, directory = moving_broker
    old = holder["broker"].flight
    new_port = free_port()
    new = f"grpc://127.0.0.1:{new_port}"
    both = f"{old},{new}"

    def rows(servers: str) -> list[tuple[int, int]]:
        frame = spark.read.format("jetstream").options(servers=servers, stream="moved").load()
        return sorted((r.partition, r.offset) for r in frame.collect())

    wanted = [(p, o) for p in range(2) for o in range(3)]
    assert rows(old) == wanted
    assert rows(both) == wanted  # the driver and the workers now keep connections naming the old one
    holder["broker"].stop()
    holder["broker"] = LocalBroker(directory / "data", flight=FlightPlace(port=new_port), log_level="WARNING")
    holder["broker"].start()
    assert holder["broker"].flight == new
    # A query restarted with the new address; then one with the same servers as before, whose kept
    # connections learn from the cluster's metadata that the broker is now at the other address.
    assert rows(new) == wanted
    assert rows(both) == wanted
