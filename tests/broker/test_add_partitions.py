"""Growing a stream on one broker (the local coordinator): the command, refusals, ingest and routing."""

from __future__ import annotations

import subprocess
import zlib

import pytest

from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.client.connection import BrokerConnection
from pyspark_jetstream.protocol.errors import InvalidArgumentError, UnknownStreamError
from pyspark_jetstream.protocol.flight import ActionType

from .harness import rebuild_metadata, run_cli, wait_until


def jetstream(broker, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``jetstream`` against ``broker`` as a user would."""
    return run_cli("--nats", broker.nats_url, *args)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def key_for(partition: int, partitions: int) -> bytes:
    """A key the default partitioner sends to ``partition`` of ``partitions`` (and to 0 or 1 of 2)."""
    return next(b"k%d" % i for i in range(10_000) if zlib.crc32(b"k%d" % i) % partitions == partition)


def test_stream_update_adds_partitions_that_are_ingested_and_led(broker, client):
    client.create_stream("orders", "orders", partitions=2)
    client.publish("orders", b"before", partition=1)
    result = jetstream(broker, "stream", "update", "orders", "--partitions", "4")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("stream orders now has 4 partitions (was 2); keyed messages")
    info = client.describe_stream("orders")
    assert info.config["partitions"] == 4 and [p.partition for p in info.partitions] == [0, 1, 2, 3]
    assert all(p.leader == info.partitions[0].leader for p in info.partitions)
    # The broker subscribes the new partitions' subjects: a plain NATS publish there is stored.
    stored = jetstream(broker, "publish", "orders", "new", "--partition", "3")
    assert "stored in orders/3 at offset 0" in stored.stdout, stored.stderr
    assert client.fetch("orders", 1).num_rows == 1  # the old partitions keep what they had
    again = jetstream(broker, "stream", "update", "orders", "--partitions", "4")
    assert (
        again.returncode == 0
        and again.stdout.strip() == "stream orders already has 4 partition(s): nothing changed"
    )


@pytest.mark.parametrize("count", [2, 1])
def test_fewer_partitions_are_refused_in_one_line_and_nothing_changes(broker, client, count):
    client.create_stream("orders", "orders", partitions=3)
    result = jetstream(broker, "stream", "update", "orders", "--partitions", str(count))
    assert result.returncode == 1
    assert one_line(result) == (
        f"jetstream: stream 'orders' has 3 partitions and cannot go down to {count}: partitions can only "
        "be added (removing one would drop its messages and move its keys)"
    )
    assert len(client.describe_stream("orders").partitions) == 3


@pytest.mark.parametrize("count", ["0", "-3", "x", "2.5", "1025", "99999999999999999999"])
def test_a_bad_count_is_a_usage_error_naming_it(count):
    result = run_cli("stream", "update", "orders", "--partitions", count)
    assert result.returncode == 2
    assert f"argument --partitions: must be a positive integer up to 1024, got '{count}'" in one_line(result)


def test_bad_requests_are_refused_by_the_client_and_the_broker_alike(broker, client):
    client.create_stream("orders", "orders", partitions=2)
    for bad in (0, 1025, "3", 2.0, None):
        with pytest.raises(InvalidArgumentError, match=r"^partitions must be a positive integer up to 1024"):
            client.add_partitions("orders", bad)
        connection = BrokerConnection(broker.flight)
        try:
            with pytest.raises(
                InvalidArgumentError, match=r"^partitions must be a positive integer up to 1024"
            ):
                connection.action(ActionType.ADD_PARTITIONS, {"name": "orders", "partitions": bad})
        finally:
            connection.close()
    with pytest.raises(UnknownStreamError, match="no stream named 'nope'"):
        client.add_partitions("nope", 3)
    with pytest.raises(InvalidArgumentError, match="'__cursors' is internal"):
        client.add_partitions("__cursors", 3)
    client.create_stream("all", "all.>")
    with pytest.raises(InvalidArgumentError, match="already matches every partition subject"):
        client.add_partitions("all", 2)
    assert len(client.describe_stream("orders").partitions) == 2
    assert len(client.describe_stream("all").partitions) == 1


def test_publishers_route_keys_over_the_new_count(broker, client):
    client.create_stream("keyed", "keyed", partitions=2)
    key = key_for(3, 4)  # partition 3 of 4; of 2 it went to 0 or 1
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight, metadata_max_age=0.2) as other:
        assert other.publish("keyed", b"a", key=key).partition == zlib.crc32(key) % 2
        # A partition this publisher has not seen yet: it reads the stream again, not refuse it.
        client.add_partitions("keyed", 3)
        assert other.publish("keyed", b"b", partition=2).partition == 2
        # The client that grew the stream routes over the new count at once ...
        client.add_partitions("keyed", 4)
        assert client.publish("keyed", b"c", key=key).partition == 3
        # ... another within its metadata_max_age: keyed messages then hash over all four.
        wait_until(
            lambda: other.publish("keyed", b"d", key=key).partition == 3,
            timeout=10,
            message="the other publisher to route the key over four partitions",
        )
    assert client.fetch("keyed", 3).num_rows >= 2


def test_a_grown_stream_outlives_a_restart_and_a_rebuild_of_lost_metadata(broker):
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        client.create_stream("orders", "orders", partitions=2)
        client.add_partitions("orders", 4)
        for partition in range(4):
            client.publish("orders", b"%d" % partition, partition=partition)
    assert broker.stop() == 0
    # The older partitions' own records still say 2 partitions, the newer ones 4.
    (broker.data_dir / "metadata.json").write_text("{ damaged")
    rebuilt = rebuild_metadata(broker)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "stream 'orders' on 'orders': 4 partition(s)" in rebuilt.stdout
    broker.start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        assert len(client.describe_stream("orders").partitions) == 4
        assert [client.fetch("orders", p).num_rows for p in range(4)] == [1, 1, 1, 1]
        assert client.publish("orders", b"again", partition=3).first_offset == 1
