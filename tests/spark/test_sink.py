"""format("jetstream") as a sink: batch and streaming, exactly once across a failure and restart."""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import re
import time
import zlib

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.functions import col, udf
from pyspark.sql.types import BinaryType

from pyspark_jetstream.client.connection import BrokerConnection
from pyspark_jetstream.protocol.errors import RequestTimeoutError
from pyspark_jetstream.spark.sink import Chunker, _Window

from ..broker.harness import scrape


def values_of(client, stream: str, partitions: int = 1) -> list[bytes]:
    out = []
    for p in range(partitions):
        out += client.fetch(stream, p).to_table().column("value").to_pylist()
    return out


@pytest.mark.connect
def test_batch_write_with_keys_partitions_and_headers(spark, deployment, client, name):
    client.create_stream(name, name, partitions=2)
    df = spark.createDataFrame(
        [("k1", "a", 0), ("k2", "b", 1), ("k3", "c", 1)], "key string, value string, partition int"
    )
    df.write.format("jetstream").mode("append").option("servers", deployment.flight).option(
        "nats", deployment.nats_url
    ).option("stream", name).save()
    first = client.fetch(name, 0).to_table()
    second = client.fetch(name, 1).to_table()
    assert first.column("value").to_pylist() == [b"a"]
    assert sorted(second.column("value").to_pylist()) == [b"b", b"c"]
    assert second.column("producer_id")[0].as_py().startswith("spark-write-")


def test_eight_tasks_into_four_partitions_send_each_chunk_once_in_order(spark, deployment, client, name):
    """Issue 18, item 2: each task's chunks reach the broker in the order of their sequences,
    its first ones included, so on a healthy broker no chunk is refused as out of order, none
    is resent, and none arrives twice (the broker counts every envelope that stored nothing)."""
    client.create_stream(name, name, partitions=4)
    rows = 16_000
    df = spark.range(rows, numPartitions=8).selectExpr(
        "concat(cast(id AS string), repeat('x', 200)) AS value"
    )
    df.write.format("jetstream").mode("append").option("servers", deployment.flight).option(
        "nats", deployment.nats_url
    ).option("stream", name).option("maxBatchBytes", 32 * 1024).save()  # ~15 chunks per task
    stored = client.fetch(name, 0).to_table()
    assert sum(client.fetch(name, p).to_table().num_rows for p in range(4)) == rows
    assert len(set(stored.column("producer_id").to_pylist())) == 2  # two tasks in each partition
    not_stored = {
        labels: value
        for (metric, labels), value in scrape(deployment).items()
        if metric == "jetstream_producer_not_stored_total" and ("stream", name) in labels and value
    }
    assert not_stored == {}


def test_a_message_id_column_becomes_each_rows_nats_msg_id(spark, deployment, client, name):
    client.create_stream(name, name)
    df = spark.createDataFrame([("o-1", "a"), ("o-2", "b")], "messageId string, value string")
    df.write.format("jetstream").mode("append").option("servers", deployment.flight).option(
        "nats", deployment.nats_url
    ).option("stream", name).save()
    stored = client.fetch(name).to_table()
    assert sorted(
        (row["value"], row["headers"]) for row in stored.select(["value", "headers"]).to_pylist()
    ) == [
        (b"a", [{"key": "Nats-Msg-Id", "value": b"o-1"}]),
        (b"b", [{"key": "Nats-Msg-Id", "value": b"o-2"}]),
    ]
    # The broker remembers them: another publisher's repeat is a duplicate of the row.
    original = next(r["offset"] for r in stored.to_pylist() if r["value"] == b"a")
    again = client.publish(name, b"a again", message_id="o-1")
    assert (again.duplicate, again.first_offset) == (True, original)
    nulls = spark.createDataFrame([("o-3", "c"), (None, "d")], "messageId string, value string")
    with pytest.raises(Exception, match="column 'messageId' has a null at row 1"):
        nulls.coalesce(1).write.format("jetstream").mode("append").option(
            "servers", deployment.flight
        ).option("nats", deployment.nats_url).option("stream", name).save()


def test_rows_with_a_null_key_spread_as_rows_without_a_key_column(spark, deployment, client, name):
    client.create_stream(name, name, partitions=2)
    rows = [(None, v) for v in "abcd"] + [("k", "keyed")]
    df = spark.createDataFrame(rows, "key string, value string").repartition(2)
    tasks = df.rdd.glom().map(lambda part: sorted(r["value"] for r in part)).collect()
    df.write.format("jetstream").mode("append").option("servers", deployment.flight).option(
        "nats", deployment.nats_url
    ).option("stream", name).save()
    stored = [sorted(client.fetch(name, p).to_table().column("value").to_pylist()) for p in range(2)]
    # Task n's null-keyed rows in partition n (n modulo 2), the keyed row where its key hashes.
    expected = [[v.encode() for v in tasks[p] if v != "keyed"] for p in range(2)]
    expected[zlib.crc32(b"k") % 2] = sorted([*expected[zlib.crc32(b"k") % 2], b"keyed"])
    assert stored == expected, (tasks, stored)


def test_rows_can_pick_their_subject(spark, deployment, client, name):
    client.create_stream(name, f"{name}.*")
    df = spark.createDataFrame([(f"{name}.eu", b"1"), (f"{name}.us", b"2")], "subject string, value binary")
    df.write.format("jetstream").mode("append").option("servers", deployment.flight).option(
        "nats", deployment.nats_url
    ).save()
    table = client.fetch(name).to_table()
    assert sorted(
        zip(table.column("subject").to_pylist(), table.column("value").to_pylist(), strict=True)
    ) == [
        (f"{name}.eu", b"1"),
        (f"{name}.us", b"2"),
    ]


@pytest.mark.parametrize(
    ("frame", "options", "message"),
    [
        ("key string, subject string", {}, "needs a 'value' column"),
        ("value int", {"stream": "x"}, "column 'value' is int"),
        ("value string, messageId int", {"stream": "x"}, "column 'messageId' is int"),
        ("value string", {}, "set the option 'stream' or give a 'subject' column"),
        ("value string", {"stream": "no-such-stream"}, "no stream named 'no-such-stream'"),
    ],
)
def test_bad_sink_input_is_named(spark, deployment, frame, options, message):
    df = spark.createDataFrame([], frame)
    writer = df.write.format("jetstream").mode("append").option("servers", deployment.flight)
    for key, value in options.items():
        writer = writer.option(key, value)
    with pytest.raises(Exception, match=message):
        writer.save()


@pytest.mark.connect
def test_stream_to_stream_exactly_once_across_a_failure_and_restart(
    spark, deployment, client, name, tmp_path
):
    """A micro-batch fails after one of its tasks stored its rows; the restarted query stores the rest, once.

    Micro-batches take 40 rows per partition.  In the second one, the task of
    partition 1 meets the poison row and, on the first run only, waits until
    the task of partition 0 has stored its 40 rows before failing.  The query
    is then restarted from its checkpoint, runs that micro-batch again, and
    the output must hold every input row exactly once.
    """
    source, sink = f"{name}-in", f"{name}-out"
    client.create_stream(source, source, partitions=2)
    client.create_stream(sink, sink)
    expected = []
    for p in range(2):
        values = [b"p%d-%03d" % (p, i) for i in range(100)]
        if p == 1:
            values[45] = b"poison"
        client.publish_batch(source, pa.table({"value": values}), partition=p)
        expected += [v.upper() for v in values]

    armed = str(tmp_path / "armed")
    open(armed, "w").close()
    broker = deployment.flight

    def shout(value: bytes) -> bytes:
        if value == b"poison" and os.path.exists(armed):
            os.remove(armed)
            connection = BrokerConnection(broker)
            deadline = time.monotonic() + 120
            # 80 rows of the first micro-batch and 40 of this one's other task.
            while connection.describe(sink).partitions[0].high_watermark < 120:
                if time.monotonic() > deadline:
                    raise TimeoutError("the other task never stored its rows")
                time.sleep(0.05)
            raise RuntimeError("injected failure in the middle of a micro-batch")
        return value.upper()

    shout_udf = udf(shout, BinaryType(), useArrow=False)

    def start():
        return (
            spark.readStream.format("jetstream")
            .option("servers", broker)
            .option("stream", source)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", "80")
            .option("minPartitions", "2")  # a task per partition (80 rows would be one task)
            .load()
            .select(shout_udf(col("value")).alias("value"))
            .writeStream.format("jetstream")
            .option("servers", broker)
            .option("nats", deployment.nats_url)
            .option("stream", sink)
            .option("maxBatchBytes", "64")  # several chunks per task, so chunk numbering matters
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    first = start()
    with pytest.raises(Exception, match="injected failure"):
        first.awaitTermination()
    partial = values_of(client, sink)
    assert len(partial) >= 120  # part of the failed micro-batch was stored

    second = start()  # same checkpoint: the failed micro-batch runs again
    second.awaitTermination()
    stored = values_of(client, sink)
    assert len(stored) == len(expected), f"{len(stored) - len(expected)} rows too many"
    assert sorted(stored) == sorted(expected)


@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=80),
    cuts=st.lists(st.integers(1, 80), max_size=10),
    limit=st.integers(1, 1000),
)
def test_chunks_depend_only_on_the_rows(sizes, cuts, limit):
    batch = pa.record_batch({"value": pa.array([b"x" * n for n in sizes], pa.binary())})

    def chunked(pieces):
        chunker = Chunker(limit)
        out = [c for piece in pieces for c in chunker.add(piece)] + list(chunker.flush())
        return [c.column("value").to_pylist() for c in out]

    bounds = sorted({0, *(c for c in cuts if c < batch.num_rows), batch.num_rows})
    pieces = [batch.slice(a, b - a) for a, b in itertools.pairwise(bounds)]
    whole = chunked([batch])
    assert chunked(pieces) == whole
    assert [v for chunk in whole for v in chunk] == batch.column("value").to_pylist()
    assert all(len(chunk) == 1 or sum(len(v) + 16 for v in chunk) <= limit for chunk in whole)


@pytest.mark.parametrize("way", ["put", "nats"])
def test_a_chunk_lost_in_flight_is_resent_in_order_with_those_after_it(deployment, client, name, way):
    """Chunk 3 of 10 never reaches the broker the first time: the broker refuses 4 to 7 as out of
    order (nothing stored past the gap), and the task resends 3 onward, so each chunk is stored
    exactly once and in order -- put to the leader over Flight (a chunk for one of the stream's
    partitions) or published on NATS (one for another subject)."""
    client.create_stream(name, name)
    chunks = [pa.record_batch({"value": [b"%d" % i]}) for i in range(10)]
    lost = []

    def lose(sequence):
        lost.append(sequence)
        failed = concurrent.futures.Future()
        failed.set_exception(RequestTimeoutError("no ack for chunk 3 (dropped on purpose)"))
        return failed

    class LosingPutter:
        """A real putter whose first put of chunk 3 is lost on the way (its ack times out)."""

        def __init__(self, putter):
            self.putter = putter

        def send(self, stream, partition, sequence, chunk):
            if sequence == 3 and not lost:
                return lose(sequence)
            return self.putter.send(stream, partition, sequence, chunk)

        def __getattr__(self, attribute):
            return getattr(self.putter, attribute)

    class LosingClient:
        """A real client whose first publish of chunk 3 is lost on the way (its ack times out)."""

        def publish_batch_nowait(self, stream, chunk, **options):
            if options["sequence"] == 3 and not lost:
                return lose(3)
            return client.publish_batch_nowait(stream, chunk, **options)

        def putter(self, *arguments):
            return LosingPutter(client.putter(*arguments))

    partitions = {name: 0} if way == "put" else {}
    window = _Window(LosingClient(), name, "producer-lost-chunk", 7, partitions=partitions, timeout=10)
    for sequence, chunk in enumerate(chunks):
        window.send(name, sequence, chunk)
    window.close()
    assert lost == [3]
    assert values_of(client, name) == [b"%d" % i for i in range(10)]
    # The whole task running again (a Spark retry) stores nothing twice.
    again = _Window(client, name, "producer-lost-chunk", 7, partitions=partitions, timeout=10)
    for sequence, chunk in enumerate(chunks):
        again.send(name, sequence, chunk)
    again.close()
    assert values_of(client, name) == [b"%d" % i for i in range(10)]


def test_the_sink_takes_the_sources_address_options_and_refuses_what_it_cannot_do(
    spark, deployment, client, name
):
    client.create_stream(name, name)

    def writer(df):
        return df.write.format("jetstream").mode("append").option("stream", name)

    df = spark.createDataFrame([("a",), ("b",)], "value string")
    # 'servers' alone: the NATS address is learnt from the brokers.
    writer(df).option("servers", deployment.flight).save()
    assert sorted(values_of(client, name)) == [b"a", b"b"]  # two Spark tasks: either order
    with pytest.raises(Exception, match="there is no default address"):
        writer(df).save()
    with pytest.raises(Exception, match=r"mode\('overwrite'\) cannot replace"):
        df.write.format("jetstream").mode("overwrite").option("servers", deployment.flight).option(
            "stream", name
        ).save()
    # A partition the stream does not have is an error, also for a one-partition stream.
    wrong = spark.createDataFrame([("c", 3)], "value string, partition int")
    with pytest.raises(Exception, match="column 'partition' has values outside 0..0"):
        writer(wrong).option("servers", deployment.flight).save()
    assert sorted(values_of(client, name)) == [b"a", b"b"]


TYPED_ORDERS = {
    "fields": [
        {"name": "order_id", "type": "int32", "nullable": False},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": {"type": "decimal128", "precision": 12, "scale": 2}},
        {"name": "ordered_at", "type": {"type": "timestamp", "unit": "ms", "tz": "UTC"}},
        {
            "name": "items",
            "type": {
                "type": "list",
                "item": {
                    "type": "struct",
                    "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int32"}],
                },
            },
        },
    ]
}


def test_typed_rows_are_written_as_typed_columns_and_read_back(spark, deployment, client, name):
    from ..ingest.test_typed_ingest import stored_typed

    client.create_stream(name, name, partitions=2, schema=TYPED_ORDERS)
    df = spark.sql(
        "SELECT CAST(id AS BIGINT) AS order_id, IF(id % 3 = 0, NULL, CONCAT('c-', id)) AS customer, "
        "CAST(id * 1.25 AS DECIMAL(10, 2)) AS amount, "
        "TIMESTAMP_MILLIS(1700000000000 + id) AS ordered_at, "
        "ARRAY(NAMED_STRUCT('sku', CONCAT('s', id), 'qty', CAST(id % 5 AS INT))) AS items, "
        "CAST(id AS STRING) AS key FROM RANGE(200)"
    ).repartition(2)
    df.write.format("jetstream").mode("append").options(
        servers=deployment.flight, nats=deployment.nats_url, stream=name
    ).save()
    typed, values = [], []
    for partition in range(2):
        stored = stored_typed(deployment, name, partition)
        assert all(t is not None and t.version == 1 for _, t in stored)  # every batch typed as sent
        typed += [row for _, t in stored for row in t.batch.to_pylist()]
        values += client.fetch(name, partition).to_table().column("value").to_pylist()
    assert sorted(row["order_id"] for row in typed) == list(range(200))
    first = next(row for row in typed if row["order_id"] == 7)
    assert first["customer"] == "c-7" and str(first["amount"]) == "8.75"
    assert first["ordered_at"].timestamp() == 1700000000.007
    assert first["items"] == [{"sku": "s7", "qty": 2}]
    # Each row's value is the JSON of its fields, which a plain client can read.
    assert json.loads(next(v for v in values if v.startswith(b'{"order_id":7,'))) == {
        "order_id": 7,
        "customer": "c-7",
        "amount": 8.75,
        "ordered_at": "2023-11-14T22:13:20.007Z",
        "items": [{"sku": "s7", "qty": 2}],
    }


def test_a_typed_stream_streams_into_another_as_typed_rows_exactly_once(
    spark, deployment, client, name, tmp_path
):
    # Typed columns in (the source's fields), typed rows out (the sink's): no JSON on the way,
    # and a second run from the checkpoint with new input stores only the new rows.
    from ..ingest.test_typed_ingest import stored_typed

    schema = {
        "fields": [{"name": "n", "type": "int64", "nullable": False}, {"name": "label", "type": "string"}]
    }
    source, sink = f"{name}-in", f"{name}-out"
    client.create_stream(source, source, partitions=2, schema=schema)
    client.create_stream(sink, sink, schema=schema)

    def publish(numbers: range) -> None:
        for p in range(2):
            values = [b'{"n": %d, "label": "l%d"}' % (n, n) for n in numbers if n % 2 == p]
            client.publish_batch(source, pa.table({"value": values}), partition=p)

    def run() -> None:
        (
            spark.readStream.format("jetstream")
            .options(servers=deployment.flight, stream=source, startingOffsets="earliest")
            .load()
            .select(col("n") * 10, "label")
            .toDF("n", "label")
            .writeStream.format("jetstream")
            .options(servers=deployment.flight, nats=deployment.nats_url, stream=sink)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
            .awaitTermination()
        )

    publish(range(40))
    run()
    publish(range(40, 60))
    run()
    stored = stored_typed(deployment, sink)
    assert all(t is not None and t.version == 1 for _, t in stored)  # typed rows, as sent
    rows = [row for _, t in stored for row in t.batch.to_pylist()]
    assert sorted(r["n"] for r in rows) == [10 * n for n in range(60)]  # each once
    values = client.fetch(sink, 0).to_table().column("value").to_pylist()
    assert json.loads(next(v for v in values if v.startswith(b'{"n":70,'))) == {"n": 70, "label": "l7"}


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ("order_id int, coupon string", "column 'coupon' is not a field of the stream's schema version 1"),
        ("customer string", "column 'order_id' is missing, but the schema (version 1) says it is not"),
        ("order_id string", "column 'order_id' is string, but the schema says int32"),
        ("order_id int, amount double", "column 'amount' is double, but the schema says decimal128"),
        ("order_id int, value string", "column 'value' beside the fields order_id of typed stream"),
    ],
)
def test_typed_rows_that_cannot_be_written_fail_at_planning_naming_the_column(
    spark, deployment, client, frame, message
):
    if "typed-planning" not in {s.config["name"] for s in client.list_streams()}:
        client.create_stream("typed-planning", "typed-planning", schema=TYPED_ORDERS)
    writer = spark.createDataFrame([], frame).write.format("jetstream").mode("append")
    with pytest.raises(Exception, match=re.escape(message)):  # Spark wraps the error
        writer.options(servers=deployment.flight, stream="typed-planning").save()


def test_a_value_that_does_not_fit_fails_the_task_naming_the_column(spark, deployment, client, name):
    client.create_stream(name, name, schema=TYPED_ORDERS)
    df = spark.sql("SELECT (id + 1) * 10000000000 AS order_id FROM RANGE(3)")  # no row fits
    with pytest.raises(Exception, match="column 'order_id': a value does not fit int32"):
        df.write.format("jetstream").mode("append").options(
            servers=deployment.flight, nats=deployment.nats_url, stream=name
        ).save()
    assert client.describe_stream(name).partitions[0].log_end_offset == 0


def test_rows_reach_every_stream_on_the_subject_as_on_nats(spark, deployment, client, name):
    """A put reaches only the partition's leader; while another stream listens on the stream's
    subject, the sink publishes on NATS so that the other stream stores its copy too; once it is
    gone, the rows are put again, and stored once."""
    client.create_stream(name, name)
    client.create_stream(f"{name}-copy", name)  # the same subject: each stores its own copy
    df = spark.createDataFrame([("a",), ("b",)], "value string").coalesce(1)
    df.write.format("jetstream").mode("append").option("servers", deployment.flight).option(
        "stream", name
    ).save()
    assert values_of(client, name) == [b"a", b"b"]
    assert values_of(client, f"{name}-copy") == [b"a", b"b"]
    client.delete_stream(f"{name}-copy")
    df.write.format("jetstream").mode("append").option("servers", deployment.flight).option(
        "stream", name
    ).save()
    assert values_of(client, name) == [b"a", b"b", b"a", b"b"]
