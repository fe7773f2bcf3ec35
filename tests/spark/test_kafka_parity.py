"""What users of Spark's Kafka source rely on: per-partition times, trigger sizes, task counts, lag."""

from __future__ import annotations

import json

import pytest
from pyspark.errors import PySparkException
from pyspark.sql.streaming.datasource import ReadAllAvailable

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.spark import offsets_behind
from pyspark_jetstream.spark.options import parse_source_options
from pyspark_jetstream.spark.planning import plan_source
from pyspark_jetstream.spark.source import JetStreamStreamReader

from .frames import read, read_stream


def publish_each(client, stream: str, partition: int, count: int, first: int = 0) -> None:
    for i in range(first, first + count):
        client.publish(stream, b"%d-%d" % (partition, i), partition=partition)


def times(spark, deployment, stream: str) -> dict[tuple[int, int], float]:
    rows = read(spark, deployment, stream=stream)
    return {(r.partition, r.offset): r.timestamp.timestamp() * 1000 for r in rows.collect()}


def first_at(stamps: dict[tuple[int, int], float], partition: int, millis: int) -> int:
    return min(o for (p, o), t in stamps.items() if p == partition and t >= millis)


def test_starting_and_ending_offsets_by_timestamp_are_per_partition(spark, deployment, client, name):
    client.create_stream(name, name, partitions=2)
    publish_each(client, name, 0, 12)
    publish_each(client, name, 1, 12)
    stamps = times(spark, deployment, name)
    start_ms = {0: int(stamps[(0, 3)]), 1: int(stamps[(1, 8)])}
    end_ms = {0: int(stamps[(0, 9)]), 1: int(stamps[(1, 11)])}
    rows = read(
        spark,
        deployment,
        stream=name,
        startingOffsetsByTimestamp=json.dumps({name: {str(p): t for p, t in start_ms.items()}}),
        endingOffsetsByTimestamp=json.dumps({name: {str(p): t for p, t in end_ms.items()}}),
    ).collect()
    got = {p: sorted(r.offset for r in rows if r.partition == p) for p in (0, 1)}
    for p in (0, 1):
        expected = list(range(first_at(stamps, p, start_ms[p]), first_at(stamps, p, end_ms[p])))
        assert got[p] == expected and expected


def test_a_time_past_the_newest_message_fails_or_starts_at_the_end_as_chosen(spark, deployment, client, name):
    client.create_stream(name, name, partitions=2)
    publish_each(client, name, 0, 3)
    publish_each(client, name, 1, 3)
    future = json.dumps({name: {"0": 0, "1": 32_503_680_000_000}})  # year 3000 for partition 1

    def read(**extra):
        reader = spark.read.format("jetstream").option("servers", deployment.flight).option("stream", name)
        return reader.option("startingOffsetsByTimestamp", future).options(**extra).load().collect()

    with pytest.raises(PySparkException, match=rf"{name}/1 has no message at or after 32503680000000 ms"):
        read()
    rows = read(startingOffsetsByTimestampStrategy="latest")
    assert sorted((r.partition, r.offset) for r in rows) == [(0, 0), (0, 1), (0, 2)]


def test_offsets_json_must_name_every_partition_as_in_kafka(spark, deployment, client, name):
    client.create_stream(name, name, partitions=2)
    publish_each(client, name, 0, 2)
    for option in ("startingOffsets", "endingOffsets"):
        with pytest.raises(PySparkException, match=rf"option '{option}' has no entry for {name}/1"):
            spark.read.format("jetstream").option("servers", deployment.flight).option("stream", name).option(
                option, json.dumps({name: {"0": 1}})
            ).load().collect()
    with pytest.raises(PySparkException, match=rf"'startingOffsetsByTimestamp' has no entry for {name}/0"):
        spark.read.format("jetstream").option("servers", deployment.flight).option("stream", name).option(
            "startingOffsetsByTimestamp", json.dumps({name: {"1": 0}})
        ).load().collect()


def test_min_partitions_splits_ranges_over_more_tasks(spark, deployment, client, name):
    client.create_stream(name, name, partitions=2)
    publish_each(client, name, 0, 30)
    publish_each(client, name, 1, 5)
    loaded = read(spark, deployment, stream=name, minPartitions="7")
    assert loaded.rdd.getNumPartitions() == 7
    assert sorted((r.partition, r.offset) for r in loaded.collect()) == sorted(
        [(0, i) for i in range(30)] + [(1, i) for i in range(5)]
    )
    unsplit = read(spark, deployment, stream=name, minPartitions="1")
    assert unsplit.rdd.getNumPartitions() == 2


def test_min_offsets_per_trigger_waits_for_enough_messages_or_the_delay(deployment, client, name):
    client.create_stream(name, name, partitions=1)
    publish_each(client, name, 0, 10)

    def reader(**extra) -> JetStreamStreamReader:
        options = {"servers": deployment.flight, "stream": name, "minOffsetsPerTrigger": "25", **extra}
        return JetStreamStreamReader(plan_source(parse_source_options(options, streaming=True)), None)

    patient = reader(maxTriggerDelay="1h")
    start = {name: {"0": 0}}
    first = patient.latestOffset(start, ReadAllAvailable())
    assert first == {name: {"0": 10}}  # the first micro-batch is never held back, as in Kafka
    publish_each(client, name, 0, 20, first=10)
    assert patient.latestOffset(first, ReadAllAvailable()) == first  # 20 < 25: no batch yet
    publish_each(client, name, 0, 5, first=30)
    assert patient.latestOffset(first, ReadAllAvailable()) == {name: {"0": 35}}

    hurried = reader(maxTriggerDelay="0s")
    hurried.latestOffset(start, ReadAllAvailable())
    publish_each(client, name, 0, 1, first=35)
    assert hurried.latestOffset({name: {"0": 35}}, ReadAllAvailable()) == {name: {"0": 36}}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"maxTriggerDelay": "5m"}, "maxTriggerDelay goes with minOffsetsPerTrigger"),
        ({"minOffsetsPerTrigger": "10", "maxTriggerDelay": "soon"}, "maxTriggerDelay' is 'soon'"),
        (
            {"minOffsetsPerTrigger": "100", "maxOffsetsPerTrigger": "10"},
            r"minOffsetsPerTrigger \(100\) is more",
        ),
        ({"startingOffsetsByTimestamp": "{}"}, "map each stream to"),
        ({"startingOffsetsByTimestamp": '{"s": {"0": -5}}'}, "milliseconds since the epoch, 0 to"),
        ({"startingOffsetsByTimestamp": '{"s": {"0": 5}}', "startingOffsets": "earliest"}, "give one of"),
        ({"startingOffsetsByTimestampStrategy": "closest"}, "must be error or latest"),
        ({"minPartitions": "0"}, "minPartitions' must be"),
    ],
)
def test_kafka_options_are_checked(options, message):
    with pytest.raises(InvalidArgumentError, match=message):
        parse_source_options({"servers": "grpc://127.0.0.1:1", "stream": "s", **options}, streaming=True)


def test_batch_only_and_stream_only_options_are_refused_on_the_other_side():
    base = {"servers": "grpc://127.0.0.1:1", "stream": "s"}
    with pytest.raises(InvalidArgumentError, match="endingOffsetsByTimestamp is for batch reads"):
        parse_source_options({**base, "endingOffsetsByTimestamp": '{"s": {"0": 1}}'}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="minOffsetsPerTrigger applies to streaming reads only"):
        parse_source_options({**base, "minOffsetsPerTrigger": "5"}, streaming=False)


def test_caught_up_queries_leave_cursors_at_the_end_and_progress_shows_how_far_behind(
    spark, deployment, client, name, tmp_path
):
    client.create_stream(name, name, partitions=2)
    publish_each(client, name, 0, 40)
    publish_each(client, name, 1, 20)

    def drain(consumer: str, checkpoint: str, **limits: str):
        """An AvailableNow query from the earliest offsets into ``noop``, as ``consumer``."""
        return (
            read_stream(
                spark, deployment, stream=name, startingOffsets="earliest", **limits, consumerId=consumer
            )
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    query = drain("caught-up", "ck", maxOffsetsPerTrigger="20")
    query.awaitTermination()
    status = client.status()
    lags = {
        (c["stream"], c["partition"]): c["lag"] for c in status["cursors"] if c["consumer"] == "caught-up"
    }
    assert lags == {(name, 0): 0, (name, 1): 0}

    batches = [p for p in query.recentProgress if p["numInputRows"]]
    first = offsets_behind(batches[0])
    assert first is not None
    # The first micro-batch took at most 20 of 60 (shared by backlog, 40:20); the rest was behind.
    assert first["avgOffsetsBehindLatest"] * 2 == 60 - batches[0]["numInputRows"]
    assert 0 < first["minOffsetsBehindLatest"] <= first["maxOffsetsBehindLatest"] <= 40
    assert offsets_behind(batches[-1]) == {
        "minOffsetsBehindLatest": 0.0,
        "maxOffsetsBehindLatest": 0.0,
        "avgOffsetsBehindLatest": 0.0,
    }

    once = drain("single-batch", "once")
    once.awaitTermination()
    assert [p["numInputRows"] for p in once.recentProgress if p["numInputRows"]] == [60]
    stored = (client.fetch_cursor("single-batch", name, 0), client.fetch_cursor("single-batch", name, 1))
    assert stored == (40, 20)
