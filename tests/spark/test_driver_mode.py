"""``readMode=driver``: micro-batches read in the driver's Python process (PySpark's
``SimpleDataSourceStreamReader`` path), on real Spark and a real broker.

Exactly once across a micro-batch that failed and the query's restart (the
batch is read again from the checkpoint's offsets, in a task), the row cap of a
catch-up, typed streams, headers, ``streamPattern``, ``startingOffsets``,
``failOnDataLoss``, cursors, and the options the mode refuses.
"""

from __future__ import annotations

import json
import re
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.errors import PySparkException
from pyspark.sql.pandas.types import to_arrow_schema

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.spark.consumers import CONSUMER_KEY
from pyspark_jetstream.spark.driver_reader import (
    DRIVER_MAX_ROWS,
    DriverReadWrapper,
    DriverStreamReader,
    driver_cap,
)
from pyspark_jetstream.spark.options import parse_source_options
from pyspark_jetstream.spark.planning import plan_source
from pyspark_jetstream.spark.source import JetStreamStreamReader
from pyspark_jetstream.spark.typed_source import spark_struct

from ..broker.harness import wait_until
from .frames import read, read_stream
from .test_consumers import spark_cursors
from .test_source import TYPED, fill, typed_values


def drained(spark, frame, checkpoint, table: str | None = None):
    """``frame`` run with ``Trigger.AvailableNow`` into the memory table ``table`` (or nowhere) until
    it stops; the query."""
    writer = (
        frame.writeStream.format("memory").queryName(table) if table else frame.writeStream.format("noop")
    )
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination()
    return query


def sizes(query) -> list[int]:
    """The row counts of ``query``'s micro-batches that had rows."""
    return [p.numInputRows for p in query.recentProgress if p.numInputRows]


def test_read_returns_the_rows_from_start_in_sparks_arrow_schema_and_where_they_end(deployment, client, name):
    fill(client, name, 2, 30)
    options = {
        "servers": deployment.flight,
        "stream": name,
        "readMode": "driver",
        "startingOffsets": "earliest",
    }
    plan = plan_source(parse_source_options({**options, "maxRecordsPerTrigger": "40"}, streaming=True))
    schema = spark_struct(False, None)
    reader = DriverStreamReader(JetStreamStreamReader(plan, schema))
    wrapper = DriverReadWrapper(reader)  # what Spark's runner calls
    try:
        start = reader.initialOffset()
        assert start[CONSUMER_KEY].startswith("spark-") and start[name] == {"0": 0, "1": 0}
        batches, end = reader.read(start)
        assert end == {CONSUMER_KEY: start[CONSUMER_KEY], name: {"0": 20, "1": 20}}  # the cap, shared
        rows = pa.Table.from_batches(list(batches))
        assert rows.schema == to_arrow_schema(schema, timezone="UTC")
        assert sorted(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True)) == [
            (p, o) for p in range(2) for o in range(20)
        ]
        assert rows.filter(pc.equal(rows["offset"], 3))["value"].to_pylist() == [b"0-3", b"1-3"]
        again = pa.Table.from_batches(list(reader.readBetweenOffsets(start, end)))
        assert again.sort_by("offset").equals(rows.sort_by("offset"))
        rest, last = reader.read(end)
        assert last[name] == {"0": 30, "1": 30} and sum(b.num_rows for b in rest) == 20
        nothing, same = reader.read(last)
        assert same == last and list(nothing) == []
        wrapper.commit(last)
    finally:
        wrapper.stop()  # stores the last position before it returns
    assert client.fetch_cursor(start[CONSUMER_KEY], name, 1) == 30


def test_rows_come_exactly_once_across_a_failed_micro_batch_and_a_restart(
    spark, deployment, client, name, tmp_path
):
    fill(client, name, 2, 300)
    attempts: list[tuple[int, list[tuple[int, int]]]] = []
    """Every run of a micro-batch: its id and its rows (partition, offset)."""
    done: dict[int, list[tuple[int, int]]] = {}
    """The rows of each micro-batch that went through."""

    def sink(frame, batch_id: int) -> None:
        rows = sorted((r.partition, r.offset) for r in frame.select("partition", "offset").collect())
        attempts.append((batch_id, rows))
        if batch_id == 2 and sum(1 for b, _ in attempts if b == 2) == 1:
            raise RuntimeError("injected failure of micro-batch 2")
        done[batch_id] = rows

    def run():
        frame = read_stream(
            spark,
            deployment,
            stream=name,
            startingOffsets="earliest",
            readMode="driver",
            maxRecordsPerTrigger="100",
        )
        writer = frame.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
        return writer.trigger(availableNow=True).start()

    first = run()
    with pytest.raises(Exception, match="injected failure of micro-batch 2"):
        first.awaitTermination()
    second = run()  # from the checkpoint: micro-batch 2's offsets are logged, its commit is not
    second.awaitTermination()
    assert second.exception() is None
    rows = sorted(r for batch in done.values() for r in batch)
    assert rows == [(p, o) for p in range(2) for o in range(300)]  # no gap, no duplicate
    assert all(len(batch) == 100 for batch in done.values()) and sorted(done) == list(range(6))
    runs_of_2 = [batch for b, batch in attempts if b == 2]
    assert len(runs_of_2) == 2 and runs_of_2[0] == runs_of_2[1]  # read again: the same rows
    # Both runs store their cursors under the one name the checkpoint's offsets carry.
    wait_until(lambda: list(spark_cursors(client, name).values()) == [300], message="the cursors at the end")


def test_the_cap_bounds_a_catch_up_micro_batch(spark, deployment, client, name, tmp_path):
    per_partition = DRIVER_MAX_ROWS // 2 + 10_000
    client.create_stream(name, name, partitions=2)
    for p in range(2):
        client.publish_batch(name, pa.table({"value": [b"v"] * per_partition}), partition=p)
    frame = read_stream(spark, deployment, stream=name, startingOffsets="earliest", readMode="driver")
    query = drained(spark, frame, tmp_path / "default")
    assert sizes(query) == [DRIVER_MAX_ROWS, 2 * per_partition - DRIVER_MAX_ROWS]
    limited = read_stream(
        spark,
        deployment,
        stream=name,
        readMode="driver",
        startingOffsets=json.dumps({name: {"0": per_partition - 35, "1": per_partition - 35}}),
        maxRecordsPerTrigger="30",
    )
    assert sizes(drained(spark, limited, tmp_path / "limited")) == [30, 30, 10]


def test_a_typed_stream_reads_its_fields_in_driver_mode(spark, deployment, client, name, tmp_path):
    client.create_stream(name, name, schema=TYPED)
    client.publish_batch(name, pa.table({"value": typed_values(7)}))
    table = f"driver_typed_{name}"
    frame = read_stream(spark, deployment, stream=name, startingOffsets="earliest", readMode="driver")
    drained(spark, frame, tmp_path / "typed", table)
    streamed = spark.table(table).orderBy("offset")
    batch = read(spark, deployment, stream=name).orderBy("offset")
    assert streamed.schema.simpleString() == batch.schema.simpleString()
    assert [tuple(r) for r in streamed.collect()] == [tuple(r) for r in batch.collect()]
    narrow = read_stream(
        spark, deployment, stream=name, readMode="driver", columns="label", startingOffsets="earliest"
    )
    drained(spark, narrow, tmp_path / "narrow", f"{table}_narrow")
    narrowed = spark.table(f"{table}_narrow").orderBy("offset")
    assert narrowed.columns[-2:] == ["timestamp", "label"]
    assert [r.label for r in narrowed.collect()] == ["even", "odd"] * 3 + ["even"]


def test_headers_a_pattern_and_starting_offsets_as_in_task_mode(spark, deployment, client, name, tmp_path):
    for suffix in ("a", "b"):
        client.create_stream(f"{name}-{suffix}", f"{name}-{suffix}")
        for i in range(4):
            client.publish(f"{name}-{suffix}", b"%d" % i, headers={"trace": b"t%d" % i})
    options = {"streamPattern": f"{name}-[ab]", "includeHeaders": "true", "startingOffsets": "earliest"}
    results = {}
    for mode in ("tasks", "driver"):
        table = f"headers_{mode}_{name}"
        drained(spark, read_stream(spark, deployment, readMode=mode, **options), tmp_path / mode, table)
        results[mode] = sorted(
            (r.stream, r.offset, r.value, [(h.key, h.value) for h in r.headers])
            for r in spark.table(table).collect()
        )
    assert len(results["driver"]) == 8 and results["driver"] == results["tasks"]
    assert results["driver"][1] == (f"{name}-a", 1, b"1", [("trace", b"t1")])
    late = json.dumps({f"{name}-a": {"0": 3}, f"{name}-b": {"0": -1}})
    table = f"late_{name}"
    frame = read_stream(
        spark, deployment, streams=f"{name}-a,{name}-b", startingOffsets=late, readMode="driver"
    )
    drained(spark, frame, tmp_path / "late", table)
    assert [(r.stream, r.offset) for r in spark.table(table).collect()] == [(f"{name}-a", 3)]


def test_data_removed_by_retention_fails_clearly_or_is_skipped_in_driver_mode(
    spark, deployment, client, name, tmp_path
):
    client.create_stream(name, name, retention_messages=20, segment_bytes=2_000)
    for i in range(40):
        client.publish(name, b"m%03d" % i + b"." * 100)
    wait_until(lambda: client.describe_stream(name).partitions[0].log_start_offset, message="retention")
    from_zero = json.dumps({name: {"0": 0}})
    failing = read_stream(spark, deployment, stream=name, startingOffsets=from_zero, readMode="driver")
    with pytest.raises(PySparkException) as failure:
        drained(spark, failing, tmp_path / "fails")
    assert re.search(r"offsets 0 to \d+ were deleted by retention.*failOnDataLoss=false", str(failure.value))
    skipping = read_stream(
        spark, deployment, stream=name, startingOffsets=from_zero, readMode="driver", failOnDataLoss="false"
    )
    table = f"skipped_{name}"
    drained(spark, skipping, tmp_path / "skips", table)
    offsets = sorted(r.offset for r in spark.table(table).collect())
    assert offsets and offsets == list(range(offsets[0], 40)) and offsets[0] > 0


def test_a_running_query_stores_its_cursors_as_it_goes(spark, deployment, client, name, tmp_path):
    client.create_stream(name, name)
    seen: list[int] = []
    consumer = f"driver-{name}"
    query = (
        read_stream(spark, deployment, stream=name, readMode="driver", consumerId=consumer)
        .writeStream.foreachBatch(lambda frame, _: seen.extend(r.offset for r in frame.collect()))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    stored = partial(client.fetch_cursor, consumer, name, 0)
    try:
        wait_until(
            lambda: query.lastProgress is not None, timeout=120, message="the query's first micro-batch"
        )
        for total in (25, 30):
            client.publish_batch(name, pa.table({"value": [b"v"] * (total - len(seen))}))
            wait_until(lambda n=total: len(seen) == n, timeout=60, message=f"{total} rows")
            # Caught up: the next micro-batch's start is stored, and waited for.
            wait_until(lambda n=total: stored() == n, message=f"the cursor at {total}")
    finally:
        query.stop()
    assert query.exception() is None
    assert sorted(seen) == list(range(30))


# ---- options ---------------------------------------------------------------------------------------

WHERE = {"servers": "grpc://h:1", "stream": "s"}


def test_read_mode_is_tasks_unless_driver_is_asked_and_the_cap_defaults():
    assert parse_source_options(WHERE, streaming=True).read_mode == "tasks"
    driver = parse_source_options({**WHERE, "readMode": " Driver "}, streaming=True)
    assert driver.read_mode == "driver" and driver_cap(driver) == DRIVER_MAX_ROWS
    capped = parse_source_options(
        {**WHERE, "readMode": "driver", "maxOffsetsPerTrigger": "500"}, streaming=True
    )
    assert driver_cap(capped) == 500


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        (
            {"readMode": "executors"},
            True,
            r"option 'readMode' must be tasks .* or driver .*, got 'executors'",
        ),
        ({"readMode": "driver"}, False, r"^readMode applies to streaming reads only$"),
        (
            {"readMode": "driver", "minOffsetsPerTrigger": "10"},
            True,
            r"readMode=driver .*minOffsetsPerTrigger cannot hold it back there; leave minOffsetsPerTrigger "
            r"out, or use readMode=tasks",
        ),
        (
            {"readMode": "driver", "minPartitions": "4"},
            True,
            r"readMode=driver .*minPartitions does not apply; leave it out, or use readMode=tasks",
        ),
    ],
)
def test_a_bad_read_mode_or_what_driver_mode_refuses_is_one_line(options, streaming, message):
    with pytest.raises(InvalidArgumentError, match=message) as refused:
        parse_source_options({**WHERE, **options}, streaming=streaming)
    assert "\n" not in str(refused.value)


def test_a_refused_combination_fails_the_query_at_load_naming_it(spark, deployment, client, name):
    client.create_stream(name, name)
    with pytest.raises(PySparkException, match="minOffsetsPerTrigger cannot hold it back there"):
        read_stream(spark, deployment, stream=name, readMode="driver", minOffsetsPerTrigger="10")
