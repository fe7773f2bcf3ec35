"""format("jetstream") as a batch and streaming source, on real Spark and a real broker."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThan, Not
from pyspark.sql.utils import AnalysisException

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.spark.options import parse_sink_options, parse_source_options
from pyspark_jetstream.spark.range_reads import limit_rows
from pyspark_jetstream.spark.source import JetStreamDataSource

from ..broker.harness import wait_until
from .frames import analysed, into_memory, read, read_stream


def fill(client, stream: str, partitions: int, rows: int) -> None:
    client.create_stream(stream, stream, partitions=partitions)
    for p in range(partitions):
        table = pa.table(
            {"key": [b"k%d" % i for i in range(rows)], "value": [b"%d-%d" % (p, i) for i in range(rows)]}
        )
        client.publish_batch(stream, table, partition=p)


@pytest.mark.connect
def test_batch_read_has_the_kafka_like_row_shape(spark, deployment, client, name):
    fill(client, name, 2, 20)
    df = read(spark, deployment, stream=name)
    assert [f.name for f in df.schema.fields] == [
        "key",
        "value",
        "stream",
        "subject",
        "partition",
        "offset",
        "timestamp",
    ]
    rows = df.orderBy("partition", "offset").collect()
    assert len(rows) == 40
    assert (rows[0].key, rows[0].value, rows[0].stream, rows[0].partition, rows[0].offset) == (
        b"k0",
        b"0-0",
        name,
        0,
        0,
    )
    assert rows[-1].value == b"1-19" and isinstance(rows[0].timestamp, datetime)


def test_headers_are_included_on_request(spark, deployment, client, name):
    client.create_stream(name, name)
    client.publish(name, b"v", headers={"trace": b"t1"})
    row = read(spark, deployment, stream=name, includeHeaders="true").collect()[0]
    assert [(h.key, h.value) for h in row.headers] == [("trace", b"t1")]


def test_starting_and_ending_offsets_and_timestamps(spark, deployment, client, name):
    fill(client, name, 2, 10)
    offsets = read(
        spark,
        deployment,
        stream=name,
        startingOffsets=json.dumps({name: {"0": 3, "1": -2}}),
        endingOffsets=json.dumps({name: {"0": 5, "1": 2}}),
    )
    assert sorted((r.partition, r.offset) for r in offsets.collect()) == [(0, 3), (0, 4), (1, 0), (1, 1)]
    future = datetime.now(UTC).isoformat()
    assert read(spark, deployment, stream=name, startingTimestamp=future).count() == 0
    assert read(spark, deployment, stream=name, startingTimestamp="0").count() == 20


def test_large_ranges_are_split_across_tasks(spark, deployment, client, name):
    fill(client, name, 1, 1000)
    df = read(spark, deployment, stream=name, maxRecordsPerPartition="300")
    assert df.rdd.getNumPartitions() == 4
    assert sorted(r.offset for r in df.collect()) == list(range(1000))


def test_streams_and_pattern(spark, deployment, client, name):
    fill(client, f"{name}-a", 1, 5)
    fill(client, f"{name}-b", 1, 7)
    both = read(spark, deployment, streams=f"{name}-a,{name}-b")
    assert both.count() == 12
    pattern = read(spark, deployment, streamPattern=f"{name}-.*")
    assert sorted({r.stream for r in pattern.collect()}) == [f"{name}-a", f"{name}-b"]


@pytest.mark.connect
def test_available_now_respects_the_read_limit_and_commits_cursors(spark, deployment, client, name, tmp_path):
    fill(client, name, 2, 50)
    limits = {"maxRecordsPerTrigger": "30", "consumerId": "limits"}
    frame = read_stream(spark, deployment, stream=name, startingOffsets="earliest", **limits)
    query = into_memory(frame, f"limits_{name.replace('-', '_')}", tmp_path / "ck", available_now=True)
    query.awaitTermination()
    # (As attributes: over Spark Connect, p["numInputRows"] is None.)
    assert [p.numInputRows for p in query.recentProgress if p.numInputRows] == [30, 30, 30, 10]
    assert spark.table(f"limits_{name.replace('-', '_')}").count() == 100
    # The cursors reach the end of the last micro-batch (Spark asks for the next one after it).
    assert (client.fetch_cursor("limits", name, 0), client.fetch_cursor("limits", name, 1)) == (50, 50)


def test_starting_from_the_cursor_resumes(spark, deployment, client, name, tmp_path):
    fill(client, name, 1, 10)
    client.set_cursor("resumer", name, 0, 6)
    df = read(spark, deployment, stream=name, startingOffsets="cursor", consumerId="resumer")
    assert [r.offset for r in df.orderBy("offset").collect()] == [6, 7, 8, 9]
    fresh = read(spark, deployment, stream=name, startingOffsets="cursor", consumerId="never-seen")
    assert fresh.count() == 10  # no cursor yet: from the beginning


def test_new_partitions_and_streams_are_picked_up(spark, deployment, client, name, tmp_path):
    fill(client, f"{name}-x", 1, 3)
    table = f"pattern_{name}"
    frame = read_stream(spark, deployment, streamPattern=f"{name}-.*", startingOffsets="earliest")
    query = into_memory(frame, table, tmp_path / "ck")
    try:
        query.processAllAvailable()
        fill(client, f"{name}-y", 2, 4)
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(
        (r.stream, r.partition) for r in spark.table(table).select("stream", "partition").distinct().collect()
    ) == [(f"{name}-x", 0), (f"{name}-y", 0), (f"{name}-y", 1)]
    assert spark.table(table).count() == 11


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of the options 'stream', 'streams'"),
        ({"stream": "a", "streams": "a,b"}, "exactly one of the options"),
        ({"stream": "bad name"}, "option 'stream': invalid stream name 'bad name'"),
        ({"stream": "a", "startingOffsets": "{not json"}, "option 'startingOffsets' is '{not json'"),
        ({"stream": "a", "startingOffsets": '{"a": {"0": "x"}}'}, "offset 'x' of a/0 must be an integer"),
        ({"stream": "a", "failOnDataLoss": "maybe"}, "option 'failOnDataLoss' must be true or false"),
        ({"stream": "a", "readFromReplicas": "yes"}, "option 'readFromReplicas' must be true or false"),
        (
            {"stream": "a", "maxRecordsPerTrigger": "0"},
            "option 'maxRecordsPerTrigger' must be a positive integer",
        ),
        ({"stream": "a", "startingTimestamp": "yesterday"}, "option 'startingTimestamp' is 'yesterday'"),
        ({"stream": "a", "servers": "localhost:1"}, "option 'servers' has 'localhost:1'"),
        (
            {"stream": "a", "startingOffset": "earliest"},
            "unknown option 'startingOffset'; did you mean 'startingOffsets'?",
        ),
        ({"stream": "a", "includeHeader": "true"}, "did you mean 'includeHeaders'?"),
        (
            {"stream": "a", "flavour": "blue"},
            r"unknown option 'flavour' \(known: assign, columns, consumerId,",
        ),
        (
            {"stream": "a", "kafka.bootstrap.servers": "k:9092"},
            "option 'kafka.bootstrap.servers' is Kafka's: use 'servers'",
        ),
        ({"stream": "a", "assign": '{"a": [0]}'}, "give exactly one of the options"),
        ({"assign": "[0]"}, "option 'assign' must map stream names to partition lists"),
        ({"assign": '{"a": []}'}, "'a' needs a non-empty list of partition numbers"),
        ({"assign": '{"a": [-1]}'}, "'a' needs a non-empty list of partition numbers"),
        ({"assign": '{"bad name": [0]}'}, "option 'assign': invalid stream name"),
        ({"assign": "{"}, "option 'assign' is '{'"),
        ({"streams": "a", "subscribe": "b"}, "options 'subscribe' and 'streams' mean the same here"),
        (
            {"stream": "a", "maxOffsetsPerTrigger": "5", "MAXRECORDSPERTRIGGER": "6"},
            "mean the same here",
        ),
    ],
)
def test_bad_options_name_the_option(options, message):
    with pytest.raises(Exception, match=message):
        parse_source_options({"servers": "grpc://127.0.0.1:1", **options}, streaming=True)


def test_there_is_no_default_address():
    with pytest.raises(
        InvalidArgumentError, match="give the option 'servers' .* or 'nats' .*no default address"
    ):
        parse_source_options({"stream": "a"}, streaming=True)


def test_read_from_replicas_is_off_unless_asked():
    base = {"servers": "grpc://127.0.0.1:1", "stream": "a"}
    assert not parse_source_options(base, streaming=True).read_from_replicas
    assert parse_source_options({**base, "readFromReplicas": "TRUE"}, streaming=True).read_from_replicas


def test_query_errors_reach_the_user(spark, deployment, client, name):
    with pytest.raises(
        (AnalysisException, PySparkException, Exception), match="no stream named 'missing-stream'"
    ):
        read(spark, deployment, stream="missing-stream").collect()
    with pytest.raises(Exception, match="broker at grpc://127.0.0.1:1 is unreachable"):
        # Retried for the query's timeout (a broker may be restarting): 2 s here, 30 s by default.
        spark.read.format("jetstream").option("servers", "grpc://127.0.0.1:1").option("timeout", "2").option(
            "stream", "x"
        ).load().collect()


def test_limit_rows_shares_the_budget_and_always_progresses():
    start = {"s": {"0": 0, "1": 0, "2": 5}}
    latest = {"s": {"0": 100, "1": 1, "2": 5}}
    limited = limit_rows(start, latest, 10)
    assert limited["s"]["2"] == 5 and limited["s"]["1"] == 1
    assert 1 <= limited["s"]["0"] <= 10
    assert sum(limited["s"][p] - start["s"][p] for p in "012") <= 11
    assert limit_rows(start, latest, 1000) == latest


def test_data_removed_by_retention_fails_clearly_or_is_skipped(spark, deployment, client, name):
    client.create_stream(name, name, retention_messages=20, segment_bytes=2_000)
    for i in range(40):
        client.publish(name, b"m%03d" % i + b"." * 100)

    def log_start() -> int:
        return client.describe_stream(name).partitions[0].log_start_offset

    # Retention runs on the broker's own schedule and may delete more segments
    # while the test runs, so every check is against the start seen around it.
    first_seen = wait_until(log_start, message="retention")
    from_zero = json.dumps({name: {"0": 0}})
    with pytest.raises(PySparkException) as failure:
        read(spark, deployment, stream=name, startingOffsets=from_zero).collect()
    pattern = r"offsets 0 to (\d+) were deleted by retention.*failOnDataLoss=false"
    named = re.search(pattern, str(failure.value))
    assert named, str(failure.value)
    assert first_seen <= int(named[1]) + 1 <= log_start()

    before = log_start()
    skipped = read(spark, deployment, stream=name, startingOffsets=from_zero, failOnDataLoss="false")
    offsets = [r.offset for r in skipped.orderBy("offset").collect()]
    assert offsets and before <= offsets[0] <= log_start()
    assert offsets == list(range(offsets[0], 40))


def test_spark_real_time_mode_refuses_python_sources_as_the_readme_says(
    spark, deployment, client, name, tmp_path
):
    """The live tail cannot reach Spark: real-time mode (``trigger(realTime=...)``) accepts only
    the JVM sources it knows, and says so when the query starts."""
    fill(client, name, 1, 1)
    query = (
        read_stream(spark, deployment, stream=name)
        .writeStream.format("console")
        .outputMode("update")
        .trigger(realTime="5 seconds")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    with pytest.raises(PySparkException, match="INPUT_STREAM_NOT_SUPPORTED"):
        query.processAllAvailable()
    query.stop()


def test_kafka_option_names_mean_the_same_here():
    options = parse_source_options(
        {"subscribe": "a,b", "maxOffsetsPerTrigger": "5", "servers": "grpc://127.0.0.1:1"}, streaming=True
    )
    assert (options.streams, options.max_records_per_trigger) == (("a", "b"), 5)
    pattern = parse_source_options(
        {"subscribePattern": "or.*", "servers": "grpc://127.0.0.1:1"}, streaming=True
    )
    assert pattern.stream_pattern == "or.*"
    sink = parse_sink_options(
        {
            "topic": "orders",
            "servers": "grpc://127.0.0.1:1",
            "nats": "nats://127.0.0.1:1",
            "checkpointLocation": "/x",
        }
    )
    assert sink.stream == "orders"
    with pytest.raises(InvalidArgumentError, match="unknown option 'topics'; did you mean 'topic'?"):
        parse_sink_options({"topics": "orders", "servers": "grpc://127.0.0.1:1"})
    with pytest.raises(InvalidArgumentError, match=r"option 'startingOffsets' is for reads \(spark.read"):
        parse_sink_options(
            {"stream": "orders", "startingOffsets": "earliest", "servers": "grpc://127.0.0.1:1"}
        )


def test_an_unknown_option_fails_the_query_before_any_task_runs(spark, deployment, client, name):
    fill(client, name, 1, 3)
    with pytest.raises(Exception, match="did you mean 'startingOffsets'"):
        read(spark, deployment, stream=name, startingOffset="earliest").collect()
    assert read(spark, deployment, subscribe=name).count() == 3  # Kafka's name for 'streams'


def test_assign_reads_only_the_chosen_partitions(spark, deployment, client, name):
    fill(client, name, 3, 4)
    rows = read(spark, deployment, assign=json.dumps({name: [2, 0]})).collect()
    assert sorted({r.partition for r in rows}) == [0, 2] and len(rows) == 8
    with pytest.raises(Exception, match=f"stream '{name}' has partitions 0 to 2, not 7"):
        read(spark, deployment, assign=json.dumps({name: [7]})).collect()


def test_partitions_added_to_a_stream_are_read_from_their_earliest(spark, deployment, client, name, tmp_path):
    fill(client, name, 2, 5)
    table = f"grown_{name}"

    def start():
        return (
            # New partitions still start at their earliest.
            read_stream(spark, deployment, stream=name, startingOffsets="latest", consumerId=table)
            .writeStream.format("parquet")  # a sink that resumes from its checkpoint (memory does not)
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "ck"))
            .start()
        )

    def rows():
        stored = spark.read.parquet(str(tmp_path / "out")).collect()
        return sorted((r.partition, r.offset, bytes(r.value)) for r in stored)

    query = start()
    try:
        query.processAllAvailable()
        client.publish(name, b"late", partition=0)
        query.processAllAvailable()
        assert rows() == [(0, 5, b"late")]
        client.add_partitions(name, 4)  # while the query runs
        client.publish_batch(name, pa.table({"value": [b"two-0", b"two-1", b"two-2"]}), partition=2)
        client.publish_batch(name, pa.table({"value": [b"three-0", b"three-1"]}), partition=3)
        query.processAllAvailable()
        assert rows() == [
            (0, 5, b"late"),
            (2, 0, b"two-0"),
            (2, 1, b"two-1"),
            (2, 2, b"two-2"),
            (3, 0, b"three-0"),
            (3, 1, b"three-1"),
        ]
        end = json.loads(query.lastProgress["sources"][0]["endOffset"])
        assert end[name] == {"0": 6, "1": 5, "2": 3, "3": 2}
        wait_until(lambda: client.fetch_cursor(table, name, 3) == 2, message="the new partition's cursor")
    finally:
        query.stop()
    # Restarted from its checkpoint, the query goes on where it was in every partition, new ones too.
    client.publish(name, b"three-2", partition=3)
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert rows()[-1] == (3, 2, b"three-2") and len(rows()) == 7


TYPED = {
    "fields": [
        {"name": "n", "type": "int32", "nullable": False},
        {"name": "label", "type": "string"},
        {"name": "at", "type": {"type": "timestamp", "unit": "ms", "tz": "UTC"}},
        {"name": "price", "type": {"type": "decimal128", "precision": 10, "scale": 2}},
        {"name": "tags", "type": {"type": "list", "item": "string"}},
    ]
}


def typed_values(count: int) -> list[bytes]:
    return [
        b'{"n": %d, "label": "%s", "at": "2026-01-02T03:04:05.%03dZ", "price": "%d.25", "tags": ["t%d"]}'
        % (i, b"even" if i % 2 == 0 else b"odd", i, i, i)
        for i in range(count)
    ]


@pytest.mark.connect
def test_a_typed_stream_reads_its_fields_as_columns_or_its_values_as_bytes(
    spark, deployment, client, name, tmp_path
):
    client.create_stream(name, name, schema=TYPED)
    values = typed_values(5)
    client.publish_batch(name, pa.table({"value": values}))
    df = read(spark, deployment, stream=name)
    assert df.schema.simpleString() == (
        "struct<key:binary,stream:string,subject:string,partition:int,offset:bigint,timestamp:timestamp,"
        "n:int,label:string,at:timestamp,price:decimal(10,2),tags:array<string>>"
    )
    rows = df.orderBy("offset").collect()
    assert [(r.n, r.label, r.price, r.tags) for r in rows[:2]] == [
        (0, "even", Decimal("0.25"), ["t0"]),
        (1, "odd", Decimal("1.25"), ["t1"]),
    ]
    assert rows[3].at == datetime(2026, 1, 2, 3, 4, 5, 3000, tzinfo=UTC).astimezone().replace(tzinfo=None)
    table = f"typed_{name.replace('-', '_')}"
    frame = read_stream(spark, deployment, stream=name, startingOffsets="earliest")
    query = into_memory(frame, table, tmp_path / "ck", available_now=True)
    query.awaitTermination()
    streamed = spark.table(table).orderBy("offset").collect()
    assert [(r.n, r.label, r.price) for r in streamed] == [(r.n, r.label, r.price) for r in rows]
    binary = read(spark, deployment, stream=name, valueFormat="binary").orderBy("offset")
    assert [r.value for r in binary.collect()] == values
    narrow = read(spark, deployment, stream=name, columns="label")
    assert narrow.columns[-2:] == ["timestamp", "label"] and narrow.filter("label = 'odd'").count() == 2
    with pytest.raises(Exception, match="option 'columns' names 'colour', which is not a field"):
        analysed(read(spark, deployment, stream=name, columns="colour"))
    with pytest.raises(Exception, match="the schema given .* is not this source's"):
        spark.read.format("jetstream").schema("key binary, value binary").option(
            "servers", deployment.flight
        ).option("stream", name).load().collect()


def test_filters_on_typed_fields_are_pushed_to_the_broker(spark, deployment, client, name):
    client.create_stream(name, name, schema=TYPED)
    client.publish_batch(name, pa.table({"value": typed_values(40)}))
    options = {"servers": deployment.flight, "stream": name, "pushfilters": "true"}
    source = JetStreamDataSource(options)
    schema = source.schema()
    pushed = [GreaterThanOrEqual(("n",), 30), EqualTo(("label",), "odd")]
    kept = [LessThan(("price",), 3), EqualTo(("n",), 2**40), Not(EqualTo(("n",), 1))]

    def rows_crossing(filters):
        reader = source.reader(schema)
        assert list(reader.pushFilters(filters)) == [f for f in filters if f in kept]
        return sum(b.num_rows for p in reader.partitions() for b in reader.read(p))

    assert rows_crossing([]) == 40
    assert rows_crossing(pushed + kept) == 5  # 31, 33, ..., 39: the rest never left the broker
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        df = read(spark, deployment, stream=name, pushFilters="true")
        found = df.filter("n >= 30 AND label = 'odd' AND n <> 33").orderBy("n").collect()
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")
    assert [r.n for r in found] == [31, 35, 37, 39]
    with pytest.raises(InvalidArgumentError, match="pushFilters is for batch reads"):
        parse_source_options({"servers": "grpc://x:1", "stream": name, "pushfilters": "true"}, streaming=True)
