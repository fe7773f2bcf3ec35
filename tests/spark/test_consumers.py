"""Whose cursors a streaming query stores: its own name per checkpoint, kept across restarts; one
``consumerId`` written by two running queries at once is refused."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.spark.consumers import CONSUMER_KEY, check_sole_writer, split_consumer, with_consumer
from pyspark_jetstream.spark.options import parse_source_options

from ..broker.harness import wait_until
from .frames import read_stream


def spark_cursors(client, stream: str) -> dict[str, int]:
    """The cursors of ``stream``'s partition 0 stored by queries without a ``consumerId``."""
    return {
        c["consumer"]: c["offset"]
        for c in client.status()["cursors"]
        if c["stream"] == stream and c["partition"] == 0 and c["consumer"].startswith("spark-")
    }


def test_each_query_stores_its_cursors_under_its_own_name_kept_across_restarts(
    spark, deployment, client, name, tmp_path
):
    client.create_stream(name, name)
    client.publish_batch(name, pa.table({"value": [b"%d" % i for i in range(4)]}))

    def drain(checkpoint: str) -> None:
        query = (
            read_stream(spark, deployment, stream=name, startingOffsets="earliest")
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None

    drain("first")
    (first,) = spark_cursors(client, name)
    assert spark_cursors(client, name) == {first: 4}
    client.publish_batch(name, pa.table({"value": [b"4", b"5", b"6"]}))
    drain("second")  # same options, another checkpoint: another query, with its own cursors
    cursors = spark_cursors(client, name)
    assert len(cursors) == 2 and cursors[first] == 4, cursors
    (second,) = set(cursors) - {first}
    assert cursors[second] == 7
    drain("first")  # restarted from its checkpoint: the same name, moved on
    assert spark_cursors(client, name) == {first: 7, second: 7}


def test_two_running_queries_storing_one_consumer_id_are_refused_in_one_line(
    spark, deployment, client, name, tmp_path
):
    client.create_stream(name, name)
    client.publish_batch(name, pa.table({"value": [b"%d" % i for i in range(200)]}))

    def start(checkpoint: str, **options: str):
        return (
            read_stream(
                spark, deployment, stream=name, startingOffsets="earliest", consumerId="shared", **options
            )
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .start()
        )

    first = start("first")
    second = None
    try:
        first.processAllAvailable()
        wait_until(lambda: client.fetch_cursor("shared", name, 0) == 200, message="the first query's cursor")
        # A second query with the same consumerId, one message per micro-batch: far behind the first.
        second = start("second", maxOffsetsPerTrigger="1")
        wait_until(lambda: client.fetch_cursor("shared", name, 0) < 200, message="the second query's cursor")
        client.publish(name, b"more")  # the first moves on, and finds its cursor moved by the other
        wait_until(lambda: first.exception() is not None, timeout=60, message="the first query to fail")
        message = str(first.exception())
        assert (
            f"consumerId 'shared': another query stores its cursors too ({name}/0 is at " in message
            and "this query stored 200); give each running query its own consumerId" in message
        ), message
        assert second.isActive and second.exception() is None
    finally:
        for query in (first, second):
            if query is not None:
                query.stop()


def test_the_consumer_name_travels_in_the_offsets_and_never_as_a_stream():
    offsets = {"orders": {"0": 5}}
    carried = with_consumer(offsets, "spark-abc")
    assert list(carried) == [CONSUMER_KEY, "orders"]  # first: equal positions serialize alike
    assert split_consumer(carried) == ("spark-abc", offsets)
    assert split_consumer(offsets) == (None, offsets)  # a checkpoint from before
    assert with_consumer(offsets, None) is offsets
    with pytest.raises(InvalidArgumentError, match="offsets hold '#consumer' = 7, not a consumer name"):
        split_consumer({CONSUMER_KEY: 7})


def test_cursors_moved_by_someone_else_are_found_and_gone_ones_are_not():
    stored = {"a": {"0": 5, "1": 7}}
    check_sole_writer("c", stored, lambda s, p: {0: 5, 1: 7}[p])
    check_sole_writer("c", stored, lambda s, p: None)  # deleted by hand: nobody else writes them
    with pytest.raises(
        InvalidArgumentError, match=r"^consumerId 'c': another query stores its cursors too \(a/1"
    ):
        check_sole_writer("c", stored, lambda s, p: {0: 5, 1: 9}[p])


def test_starting_from_cursors_needs_a_consumer_id_streaming_too():
    base = {"servers": "grpc://127.0.0.1:1", "stream": "s", "startingOffsets": "cursor"}
    for streaming in (True, False):
        with pytest.raises(
            InvalidArgumentError, match="^startingOffsets=cursor needs the option 'consumerId'"
        ):
            parse_source_options(base, streaming=streaming)
    assert parse_source_options({**base, "consumerId": "me"}, streaming=True).consumer_given
    assert not parse_source_options({**base, "startingOffsets": "earliest"}, streaming=True).consumer_given
