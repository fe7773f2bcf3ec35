"""Spark benchmark: the jetstream source and sink against Spark's own file formats, same run.

With N messages (5,000,000; ``--quick``: 1,000,000), local[2]:

1. read: ``readStream.format("jetstream")`` with ``Trigger.AvailableNow`` into
   the ``noop`` sink, against the same rows (same Spark schema) read from a
   local Arrow IPC file through a minimal Python data source -- the ceiling of
   any Python source -- and against Spark's Parquet reader, both also as
   AvailableNow streams into ``noop``;
2. write: ``writeStream.format("jetstream")`` against Spark writing the same
   rows to Parquet, both from the same Parquet input;
3. Delta: ``readStream.format("jetstream")`` -> ``from_json`` of the orders ->
   ``writeStream.format("delta")`` (AvailableNow, a checkpoint, a new table
   each run), against the same pipeline reading the same rows from Parquet;
4. typed rows: batch ``df.write`` of the same orders into a typed stream
   (the orders' schema), as typed columns (a DataFrame of the fields: no JSON
   anywhere, the broker renders each row's value from them) against as JSON
   ``value`` s (which the broker parses), both read from Parquet, a new
   2-partition stream per run, the sides taking turns at going first
   (``typed_sink_ratio_to_json_sink``: above 1, typed rows are faster); and
   against the columns made JSON in Spark (``to_json(struct(...))``, what a
   pipeline holding columns does without typed rows:
   ``typed_sink_ratio_to_to_json_sink``);
5. typed reads: the orders-per-currency aggregation (``groupBy("currency")``,
   count and sum of ``amount``: the demo's orders per country on these
   orders) as batch reads of the same N orders from a typed stream (its
   columns, and with ``columns=currency,amount``) against ``from_json`` of
   the two fields it needs on a raw stream and on Spark's Kafka source (a
   2-partition topic written from the same values); an untimed run of each
   first, which also checks that the four answers agree, then the sides in
   turns (``typed_ratio_to_from_json``, ``typed_ratio_to_kafka_from_json``;
   above 1, typed is faster);
6. Kafka as the peer (``bench/kafka_peer.py`` starts a single-node KRaft
   Kafka 3.9 and stops it by pid): the same rows in a 4-partition stream and
   a 4-partition topic, read with ``readStream`` (AvailableNow) into ``noop``
   by each side's source; and batch ``df.write`` of the same rows by each
   side's sink into a new 4-partition stream or topic per run.  Kafka's
   producer is tuned (``kafka.linger.ms=5``, ``kafka.batch.size=262144``) and
   compresses with the streams' codec; its consumer has Spark's defaults.
   An untimed warm-up (a write and a read of 10,000 rows) runs for each side
   first, and the sides take turns at going first.  The ratios are ours over
   Kafka's rows/s: above 1, ours is faster.  Beside them, the same write into
   a Python sink that drops its rows (``discard``, defined here): what Spark's
   Python data source API costs before a sink does anything, and so the
   highest ``kafka_write_ratio`` any such sink could reach in the run
   (``python_floor_write_ratio_to_kafka``).

7. latency (``bench/spark_latency.py``): publish -> rows in the driver at a
   steady 2,000 and 10,000 messages/s, ours (NATS core publishes) against
   Kafka (a producer with ``linger.ms=0``) and a do-nothing Python streaming
   source (read in Spark tasks, and as a ``SimpleDataSourceStreamReader``
   read in the driver), ours also with ``readMode=driver``, with Spark's
   default trigger and ``processingTime="1 second"``;
   60 s a measure after 10 s of warm-up (``--smoke``: 2 s after 1 s, the
   sides at once), Kafka warmed up for 20 s first.  ``e2e_p50_ratio_to_kafka`` and
   ``e2e_p99_ratio_to_kafka`` (2,000/s, default trigger) are ours over
   Kafka's: below 1, ours is faster; ``read_job_ms`` and
   ``noop_python_source_read_job_ms`` are the mean ``addBatch`` of ours and
   of the do-nothing source there; ``e2e_p50_ratio_to_kafka_driver_mode``,
   ``e2e_p99_ratio_to_kafka_driver_mode`` and ``read_job_ms_driver_mode`` the
   same of ours with ``readMode=driver``, and
   ``noop_simple_python_source_read_job_ms`` the driver-read do-nothing
   source's.  ``--only latency`` runs these alone,
   ``--only throughput`` the others.

The messages are JSON orders of ~250 bytes generated from a fixed seed (the
same bytes every run), each row different, so that Parquet cannot
dictionary-encode them away; the stream and the Parquet and Arrow files hold
the same values.  ``--constant-values`` gives the earlier data instead: the
same 100 bytes in every message and one timestamp for every Parquet row.

Each figure is the median of 3 runs (``--smoke``: 20,000 messages, one
run), after an untimed read of each source.  The machine's CPU seconds per
million rows are measured beside each read and write (every process's:
Spark's JVM and Python workers, the broker, nats-server, Kafka), and Kafka
starts only after the measures 1-4 are done.  Prints a table; the last line
is one JSON object.

    python bench/spark_bench.py [--quick | --smoke] [--compression none|lz4|zstd] [--constant-values]
                                [--only throughput|latency]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema

from bench.kafka_peer import KAFKA_VERSION, KafkaAdmin, KafkaBroker, broker_jars, connector_jars
from bench.sizes import last_line, machine_cpu_seconds, parser, pick, size_of
from bench.spark_latency import PARTITIONS as LATENCY_PARTITIONS
from bench.spark_latency import measure_latency, print_latency
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.local import LocalBroker
from pyspark_jetstream.protocol.schema import COMPRESSIONS
from pyspark_jetstream.spark.delta import delta_conf, delta_session
from pyspark_jetstream.spark.range_reads import BASE_SCHEMA

RUNS = 3
CHUNK = 10_000
PEER_PARTITIONS = 4
KAFKA_PRODUCER = {"kafka.linger.ms": "5", "kafka.batch.size": "262144"}
"""The peer's tuned producer (kafka-clients 3.9's defaults: linger.ms=0, batch.size=16384)."""
PUBLISH_BYTES = 1_000_000  # values per published batch at most: framed, under NATS' 1 MiB max_payload
SEED = 20261124
CONSTANT_VALUE = b"x" * 100
CONSTANT_TIMESTAMP_US = 1_700_000_000_000_000
FIRST_ORDER_MS = 1_700_000_000_000
STATUSES = ["new", "paid", "shipped", "delivered", "cancelled"]
CURRENCIES = ["EUR", "USD", "GBP", "CHF"]
MAX_ITEMS = 4
ORDER_SCHEMA = (
    "order_id bigint, customer string, amount bigint, currency string, status string, "
    "items array<struct<sku:string,qty:int,price:bigint>>, ts bigint"
)
ITEM = {
    "type": "struct",
    "fields": [
        {"name": "sku", "type": "string"},
        {"name": "qty", "type": "int32"},
        {"name": "price", "type": "int64"},
    ],
}
TYPED_ORDERS = {
    "fields": [
        {"name": "order_id", "type": "int64", "nullable": False},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "int64"},
        {"name": "currency", "type": "string"},
        {"name": "status", "type": "string"},
        {"name": "items", "type": {"type": "list", "item": ITEM}},
        {"name": "ts", "type": "int64"},
    ]
}
"""The orders as a typed stream's schema (the same fields as ``ORDER_SCHEMA``)."""


class ArrowFileSource(DataSource):
    """A minimal Python data source: memory-maps Arrow IPC files and yields their batches."""

    @classmethod
    def name(cls) -> str:
        return "arrowfiles"

    def schema(self) -> str:
        return BASE_SCHEMA

    def streamReader(self, schema):  # noqa: N802 - Spark's API
        return ArrowFileStreamReader(self.options["path"], schema)


class ArrowFileStreamReader(DataSourceStreamReader):
    def __init__(self, path: str, schema) -> None:
        self.files = sorted(str(p) for p in Path(path).glob("*.arrow"))
        self.schema = schema

    def initialOffset(self) -> dict:  # noqa: N802
        return {"files": 0}

    def latestOffset(self, start: dict, limit) -> dict:  # noqa: N802
        return {"files": len(self.files)}

    def partitions(self, start: dict, end: dict):
        return [InputPartition(f) for f in self.files[start["files"] : end["files"]]]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        target = to_arrow_schema(self.schema, timezone="UTC")
        with pa.memory_map(partition.value) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i).cast(target)


class DiscardSink(DataSource):
    """A Python sink that takes Spark's Arrow batches and drops them: what any sink written with
    Spark's Python data source API costs before it does anything (the JVM's hand-off of the rows
    to the Python workers, and the workers)."""

    @classmethod
    def name(cls) -> str:
        return "discard"

    def writer(self, schema, overwrite):
        return DiscardWriter()


class DiscardWriter(DataSourceArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _batch in iterator:
            pass
        return WriterCommitMessage()


def _text(values: np.ndarray, width: int = 0) -> pa.Array:
    """Integers as decimal strings, zero-padded to ``width``."""
    text = pa.array(values).cast(pa.string())
    return pc.utf8_lpad(text, width, "0") if width else text


def orders(n: int, first_order: int, seed: int) -> tuple[pa.Array, pa.Array]:
    """``n`` JSON orders (binary, ~250 bytes, 1 to 4 items) and their times in milliseconds.

    Built column-wise by Arrow (a Python loop takes twice as long); the same
    ``seed`` gives the same bytes.  Order ids run from ``first_order``.
    """
    rng = np.random.default_rng(seed)
    ids = np.arange(first_order, first_order + n)
    items = None
    counts = rng.integers(1, MAX_ITEMS + 1, n)
    for i in range(MAX_ITEMS):
        item = pc.binary_join_element_wise(
            '{"sku": "sku-',
            _text(rng.integers(0, 100_000, n), 5),
            '", "qty": ',
            _text(rng.integers(1, 10, n)),
            ', "price": ',
            _text(rng.integers(99, 25_000, n)),
            "}",
            "",
        )
        if items is None:
            items = item
        else:
            longer = pc.binary_join_element_wise(items, item, ", ")
            items = pc.if_else(pa.array(counts > i), longer, items)
    times = FIRST_ORDER_MS + 2 * ids + rng.integers(0, 2, n)
    text = pc.binary_join_element_wise(
        '{"order_id": ',
        _text(ids),
        ', "customer": "c-',
        _text(rng.integers(0, 100_000_000, n), 8),
        '", "amount": ',
        _text(rng.integers(100, 100_000, n)),
        ', "currency": "',
        pa.array(np.array(CURRENCIES)[rng.integers(0, len(CURRENCIES), n)]),
        '", "status": "',
        pa.array(np.array(STATUSES)[rng.integers(0, len(STATUSES), n)]),
        '", "items": [',
        items,
        '], "ts": ',
        _text(times),
        "}",
        "",
    )
    return text.cast(pa.binary()), pa.array(times)


def partition_values(n: int, partition: int, constant: bool) -> tuple[pa.Array, pa.Array]:
    """Values and timestamps (µs, UTC) of one partition's ``n`` messages."""
    if constant:
        return (
            pa.array([CONSTANT_VALUE] * n, pa.binary()),
            pa.array([CONSTANT_TIMESTAMP_US] * n, pa.timestamp("us", tz="UTC")),
        )
    values, times = orders(n, partition * n, seed=SEED + partition)
    return values, pc.multiply(times, 1000).cast(pa.timestamp("us", tz="UTC"))


def rows_table(values: pa.Array, timestamps: pa.Array, partition: int) -> pa.Table:
    """The rows in the source's Spark shape, offsets from 0."""
    n = len(values)
    return pa.table(
        {
            "key": pa.nulls(n, pa.binary()),
            "value": values,
            "stream": pa.array(["bench"] * n),
            "subject": pa.array(["bench"] * n),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": timestamps,
        }
    )


def parse_orders(frame: DataFrame) -> DataFrame:
    """The Delta pipeline's transformation: each message's JSON order as columns."""
    order = sf.from_json(sf.col("value").cast("string"), ORDER_SCHEMA).alias("order")
    return frame.select("partition", "offset", order).select(
        "partition",
        "offset",
        "order.order_id",
        "order.customer",
        "order.amount",
        "order.currency",
        "order.status",
        "order.items",
        sf.timestamp_millis(sf.col("order.ts")).alias("ordered_at"),
    )


def publish(client: SyncClient, stream: str, values: pa.Array, partition: int, chunk: int) -> None:
    """``values`` into ``stream``'s ``partition``, ``chunk`` at a time."""
    for start in range(0, len(values), chunk):
        client.publish_batch(
            stream, pa.table({"value": values.slice(start, chunk)}), partition=partition, timeout=120
        )


def timed(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def timed_cpu(run: Callable[[], None], cpu: list[float]) -> float:
    """``timed(run)``, appending the machine's CPU seconds meanwhile to ``cpu``: everything a side
    uses (Spark's JVM and Python workers, the broker and nats-server, or Kafka) while the others idle."""
    before = machine_cpu_seconds()
    seconds = timed(run)
    cpu.append(machine_cpu_seconds() - before)
    return seconds


def cpu_per_million(cpu: dict[str, list[float]], n: int, suffix: str = "") -> dict[str, float]:
    """The median CPU seconds per million rows of each side of ``cpu``."""
    return {f"{key}{suffix}_cpu_s_per_m_rows": statistics.median(v) * 1e6 / n for key, v in cpu.items()}


def stream_into(
    df: DataFrame, sink_format: str, checkpoints: Path, name: str, **options: str
) -> Callable[[], None]:
    """A run of ``df`` into ``sink_format`` with Trigger.AvailableNow, a new checkpoint each time."""

    def run() -> None:
        writer = df.writeStream.format(sink_format).option(
            "checkpointLocation", str(checkpoints / f"{name}-{time.monotonic_ns()}")
        )
        for key, value in options.items():
            writer = writer.option(key, value)
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()

    return run


def measure(
    spark: SparkSession,
    client: SyncClient,
    broker: LocalBroker,
    work: Path,
    n: int,
    compression: str,
    constant: bool,
    runs: int = RUNS,
) -> dict[str, float]:
    """Every figure but the ratios, in rows per second: the medians of ``runs`` alternating runs."""
    parquet_schema = spark.read.parquet(str(work / "parquet")).schema
    checkpoints = work / "checkpoints"

    jetstream_source = (
        spark.readStream.format("jetstream")
        .option("servers", broker.flight)
        .option("stream", "bench")
        .option("startingOffsets", "earliest")
        .load()
    )
    arrow_source = spark.readStream.format("arrowfiles").option("path", str(work / "arrow")).load()
    parquet_source = spark.readStream.schema(parquet_schema).parquet(str(work / "parquet"))
    results: dict[str, float] = {}

    read = {
        "jetstream": stream_into(jetstream_source, "noop", checkpoints, "read-js"),
        "arrow_file_source": stream_into(arrow_source, "noop", checkpoints, "read-arrow"),
        "parquet": stream_into(parquet_source, "noop", checkpoints, "read-parquet"),
    }
    # Untimed first: the files just written reach the disk, and a read of each source starts
    # Spark's Python workers and loads its code, so that neither lands in one side's timed runs.
    os.sync()
    for run in read.values():
        run()
    samples: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for i in range(runs):
        for key, run in sorted(read.items(), reverse=i % 2 == 1):  # the sides take turns at going first
            samples.setdefault(key, []).append(timed_cpu(run, cpu.setdefault(key, [])))
    for key, values in samples.items():
        results[f"{key}_read_rows_per_s"] = n / statistics.median(values)
    results |= cpu_per_million(cpu, n, "_read")

    out = parquet_source.select("key", "value")
    write_samples: dict[str, list[float]] = {}
    write_cpu: dict[str, list[float]] = {}
    for i in range(runs):
        sink_stream = f"bench-out-{i}"
        client.create_stream(sink_stream, sink_stream, partitions=2, compression=compression)
        write_samples.setdefault("jetstream", []).append(
            timed_cpu(
                stream_into(
                    out,
                    "jetstream",
                    checkpoints,
                    f"write-js-{i}",
                    servers=broker.flight,
                    nats=str(broker.nats_url),
                    stream=sink_stream,
                ),
                write_cpu.setdefault("sink", []),
            )
        )
        stored = sum(p.high_watermark for p in client.describe_stream(sink_stream).partitions)
        if stored != n:
            raise SystemExit(f"the sink stored {stored} rows, not {n}")
        write_samples.setdefault("parquet", []).append(
            timed_cpu(
                stream_into(out, "parquet", checkpoints, f"write-pq-{i}", path=str(work / f"out-{i}")),
                write_cpu.setdefault("parquet_write", []),
            )
        )
    results["sink_rows_per_s"] = n / statistics.median(write_samples["jetstream"])
    results["parquet_write_rows_per_s"] = n / statistics.median(write_samples["parquet"])
    results |= cpu_per_million(write_cpu, n)

    delta = {
        "delta": parse_orders(jetstream_source),
        "parquet_delta": parse_orders(parquet_source),
    }
    # The first Delta query of a session loads Delta's code: an untimed one on
    # a few rows keeps that out of whichever side would run first, and the
    # sides take turns at going first.
    warm = str(work / "warm-up")
    spark.read.parquet(str(work / "parquet")).limit(CHUNK).write.parquet(warm)
    warm_source = spark.readStream.schema(parquet_schema).parquet(warm)
    stream_into(
        parse_orders(warm_source), "delta", checkpoints, "warm-up", path=str(work / "warm-up-delta")
    )()
    delta_samples: dict[str, list[float]] = {}
    for i in range(runs):
        for key, frame in sorted(delta.items(), reverse=i % 2 == 1):
            path = str(work / f"{key}-{i}")
            run = stream_into(frame, "delta", checkpoints, f"{key}-{i}", path=path)
            delta_samples.setdefault(key, []).append(timed(run))
            check_delta_table(path, n, constant)
    for key, values in delta_samples.items():
        results[f"{key}_rows_per_s"] = n / statistics.median(values)
    return results


def measure_typed_sink(
    spark: SparkSession, client: SyncClient, broker: LocalBroker, work: Path, n: int, runs: int = RUNS
) -> dict[str, float]:
    """Batch writes of ``n`` orders into a typed stream: as typed columns against as JSON values,
    in rows per second (medians of ``runs`` alternating runs).  Exits when a write stored another
    number of rows."""
    from pyspark_jetstream.protocol.typed_values import parse_json
    from pyspark_jetstream.protocol.value_schema import SchemaDocument, StreamSchema

    schema = StreamSchema.first(SchemaDocument.from_json(TYPED_ORDERS))
    (work / "typed-json").mkdir()
    (work / "typed-columns").mkdir()
    for p in range(2):
        values, _ = orders(n // 2, p * (n // 2), seed=SEED + p)
        pq.write_table(pa.table({"value": values}), work / "typed-json" / f"part-{p}.parquet")
        parsed = parse_json(values.to_pylist(), schema)  # the same rows as columns, untimed
        assert parsed.typed is not None and not parsed.refused
        pq.write_table(pa.table(parsed.typed.batch), work / "typed-columns" / f"part-{p}.parquet")
    columns = spark.read.parquet(str(work / "typed-columns"))
    frames = {
        "json": spark.read.parquet(str(work / "typed-json")),
        "typed": columns,
        # What a pipeline holding the columns does without typed rows: renders the JSON in Spark.
        "to_json": columns.select(sf.to_json(sf.struct(*columns.columns)).alias("value")),
    }
    options = {"servers": broker.flight, "nats": str(broker.nats_url)}
    samples: dict[str, list[float]] = {side: [] for side in frames}
    for i in range(runs):
        for side in sorted(frames, reverse=i % 2 == 1):  # the sides take turns at going first
            stream = f"typed-{side}-{i}"
            client.create_stream(stream, stream, partitions=2, schema=TYPED_ORDERS)
            writer = frames[side].write.format("jetstream").mode("append").options(**options, stream=stream)
            samples[side].append(timed(writer.save))
            stored = sum(p.high_watermark for p in client.describe_stream(stream).partitions)
            if stored != n:
                raise SystemExit(f"the {side} write stored {stored} rows in {stream}, not {n}")
    typed = n / statistics.median(samples["typed"])
    json_rows = n / statistics.median(samples["json"])
    to_json = n / statistics.median(samples["to_json"])
    return {
        "typed_sink_rows_per_s": typed,
        "json_sink_into_typed_rows_per_s": json_rows,
        "typed_sink_ratio_to_json_sink": typed / json_rows,
        "to_json_sink_into_typed_rows_per_s": to_json,
        "typed_sink_ratio_to_to_json_sink": typed / to_json,
    }


def measure_typed_reads(
    spark: SparkSession,
    client: SyncClient,
    broker: LocalBroker,
    kafka: KafkaBroker,
    work: Path,
    n: int,
    runs: int = RUNS,
) -> dict[str, float]:
    """The orders-per-currency aggregation (the demo's orders per country, on the bench's orders)
    over ``n`` published JSON orders, batch reads: a typed stream's columns against ``from_json``
    on a raw stream and on Spark's Kafka source reading the same values; rows/s, medians of
    ``runs`` rounds, the sides taking turns at going first.  Exits if the answers differ."""
    for name, schema in (("orders-typed", TYPED_ORDERS), ("orders-raw", None)):
        client.create_stream(name, name, partitions=2, schema=schema)
    (work / "typed-read").mkdir()
    for p in range(2):
        values, _ = orders(n // 2, p * (n // 2), seed=SEED + p)
        chunk = min(CHUNK, PUBLISH_BYTES // pc.max(pc.binary_length(values)).as_py())
        publish(client, "orders-typed", values, p, chunk)
        publish(client, "orders-raw", values, p, chunk)
        numbers = pa.array(np.full(len(values), p, np.int32))
        pq.write_table(
            pa.table({"value": values, "partition": numbers}), work / "typed-read" / f"{p}.parquet"
        )
    admin = KafkaAdmin(spark, kafka.bootstrap)
    try:
        admin.create_topic("orders-raw", 2)
        spark.read.parquet(str(work / "typed-read")).write.format("kafka").mode("append").options(
            **{"kafka.bootstrap.servers": kafka.bootstrap, **KAFKA_PRODUCER}, topic="orders-raw"
        ).save()
        if admin.end_offsets("orders-raw") != n:
            raise SystemExit(f"Kafka holds {admin.end_offsets('orders-raw')} orders, not {n}")
    finally:
        admin.close()

    def ours(stream: str, **options: str) -> DataFrame:
        return (
            spark.read.format("jetstream")
            .option("servers", broker.flight)
            .option("stream", stream)
            .options(**options)
            .load()
        )

    kafka_rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", "orders-raw")
        .load()
    )
    # The peers parse only the two fields the query needs: the least work from_json can do.
    needed = "currency string, amount bigint"

    def parsed(frame: DataFrame) -> DataFrame:
        return frame.select(sf.from_json(sf.col("value").cast("string"), needed).alias("o")).select("o.*")

    per_currency = {
        "typed": ours("orders-typed"),
        "typed_columns": ours("orders-typed", columns="currency,amount"),
        "from_json": parsed(ours("orders-raw")),
        "kafka_from_json": parsed(kafka_rows),
    }

    def query(frame: DataFrame) -> Callable[[], list[tuple[str, int, int]]]:
        # A new aggregation each run: collecting the same DataFrame again reuses its shuffle's
        # output (Spark skips the finished map stage), so nothing would be read a second time.
        return lambda: sorted(
            tuple(r) for r in frame.groupBy("currency").agg(sf.count("*"), sf.sum("amount")).collect()
        )

    runs_of = {side: query(frame) for side, frame in per_currency.items()}
    answers = {side: run() for side, run in runs_of.items()}  # untimed warm-up, and the answers
    if len({repr(a) for a in answers.values()}) != 1 or sum(a[1] for a in answers["typed"]) != n:
        raise SystemExit(f"the per-currency answers differ: {answers}")
    samples: dict[str, list[float]] = {side: [] for side in runs_of}
    for i in range(runs):
        for side in sorted(runs_of, reverse=i % 2 == 1):
            samples[side].append(timed(runs_of[side]))
    rates = {side: n / statistics.median(values) for side, values in samples.items()}
    return {
        "typed_query_rows_per_s": rates["typed"],
        "typed_columns_query_rows_per_s": rates["typed_columns"],
        "from_json_query_rows_per_s": rates["from_json"],
        "kafka_from_json_query_rows_per_s": rates["kafka_from_json"],
        "typed_ratio_to_from_json": rates["typed"] / rates["from_json"],
        "typed_ratio_to_kafka_from_json": rates["typed"] / rates["kafka_from_json"],
        "typed_columns_ratio_to_from_json": rates["typed_columns"] / rates["from_json"],
        "typed_columns_ratio_to_kafka_from_json": rates["typed_columns"] / rates["kafka_from_json"],
    }


def measure_kafka(
    spark: SparkSession,
    client: SyncClient,
    broker: LocalBroker,
    kafka: KafkaBroker,
    work: Path,
    n: int,
    compression: str,
    runs: int = RUNS,
) -> dict[str, float]:
    """Ours against Kafka, in rows per second: reads of the same rows (the stream ``peer`` and the
    topic ``peer``, both filled before) and batch writes of them; medians of ``runs`` alternating runs.

    Exits when a write did not store every row.
    """
    checkpoints = work / "checkpoints"
    jetstream = {"servers": broker.flight, "nats": str(broker.nats_url)}
    producer = {
        "kafka.bootstrap.servers": kafka.bootstrap,
        **KAFKA_PRODUCER,
        "kafka.compression.type": compression,
    }
    rows = spark.read.parquet(str(work / "peer"))
    admin = KafkaAdmin(spark, kafka.bootstrap)
    try:

        def write_jetstream(frame: DataFrame, stream: str) -> Callable[[], None]:
            client.create_stream(stream, stream, partitions=PEER_PARTITIONS, compression=compression)
            return lambda: (
                frame.write.format("jetstream").mode("append").options(**jetstream, stream=stream).save()
            )

        def write_kafka(frame: DataFrame, topic: str) -> Callable[[], None]:
            admin.create_topic(topic, PEER_PARTITIONS)
            return lambda: frame.write.format("kafka").mode("append").options(**producer, topic=topic).save()

        def check(side: str, name: str, count: int) -> None:
            if side == "kafka":
                stored = admin.end_offsets(name)
            else:
                stored = sum(p.high_watermark for p in client.describe_stream(name).partitions)
            if stored != count:
                raise SystemExit(f"the {side} sink stored {stored} rows in {name}, not {count}")

        def reads(stream: str, name: str) -> dict[str, Callable[[], None]]:
            ours = (
                spark.readStream.format("jetstream")
                .options(**jetstream, stream=stream, startingOffsets="earliest")
                .load()
            )
            theirs = (
                spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", kafka.bootstrap)
                .option("subscribe", stream)
                .option("startingOffsets", "earliest")
                .load()
            )
            return {
                "jetstream": stream_into(ours, "noop", checkpoints, f"{name}-js"),
                "kafka": stream_into(theirs, "noop", checkpoints, f"{name}-kafka"),
            }

        # The same rows as the stream, in the same partitions: Kafka's sink takes a 'partition' column.
        write_kafka(rows.select("value", "partition"), "peer")()
        check("kafka", "peer", n)
        # An untimed warm-up of each side's sink and source (the first Kafka query of a session
        # loads the connector's code and opens its producers and consumers).
        warm = rows.limit(CHUNK).select("value", "partition")
        write_jetstream(warm, "peer-warm-up")()
        write_kafka(warm, "peer-warm-up")()
        warm.write.format("discard").mode("append").save()
        for side in ("jetstream", "kafka"):
            check(side, "peer-warm-up", min(CHUNK, n))
        for run in reads("peer-warm-up", "warm-up").values():
            run()

        read = reads("peer", "peer-read")
        out = rows.select("value")
        samples: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        for i in range(runs):
            first = i % 2 == 1  # the sides take turns at going first
            writes = {
                "jetstream": write_jetstream(out, f"peer-out-{i}"),
                "kafka": write_kafka(out, f"peer-out-{i}"),
                "discard": lambda: out.write.format("discard").mode("append").save(),
            }
            for key, run in sorted(read.items(), reverse=first):
                name = f"{key}_read"
                samples.setdefault(name, []).append(timed_cpu(run, cpu.setdefault(name, [])))
            # Three writers: each goes first in turn (two would just alternate, as the reads do).
            order = sorted(writes)
            order = order[i % len(order) :] + order[: i % len(order)]
            for key, run in ((k, writes[k]) for k in order):
                name = f"{key}_write"
                samples.setdefault(name, []).append(timed_cpu(run, cpu.setdefault(name, [])))
                if key != "discard":
                    check(key, f"peer-out-{i}", n)
    finally:
        admin.close()
    medians = {key: n / statistics.median(values) for key, values in samples.items()}
    spent = cpu_per_million(cpu, n)
    return {
        "kafka_peer_jetstream_read_cpu_s_per_m_rows": spent["jetstream_read_cpu_s_per_m_rows"],
        "kafka_read_cpu_s_per_m_rows": spent["kafka_read_cpu_s_per_m_rows"],
        "kafka_peer_jetstream_write_cpu_s_per_m_rows": spent["jetstream_write_cpu_s_per_m_rows"],
        "kafka_write_cpu_s_per_m_rows": spent["kafka_write_cpu_s_per_m_rows"],
        "kafka_peer_jetstream_read_rows_per_s": medians["jetstream_read"],
        "kafka_read_rows_per_s": medians["kafka_read"],
        "kafka_peer_jetstream_write_rows_per_s": medians["jetstream_write"],
        "kafka_write_rows_per_s": medians["kafka_write"],
        "python_floor_write_rows_per_s": medians["discard_write"],
        "python_floor_write_cpu_s_per_m_rows": spent["discard_write_cpu_s_per_m_rows"],
    }


def check_delta_table(path: str, n: int, constant: bool) -> None:
    """Exit unless the Delta table at ``path`` holds ``n`` rows with order ids 0 to n - 1, none null.

    Read from the file statistics of the table's log (Delta's protocol: each
    ``add`` action's ``stats``), not with a Spark query: a count of a fresh
    table took 5-15 s on the loaded two-core machine.  Constant values are not
    JSON: their orders parse to nulls.
    """
    rows = nulls = 0
    low: list[int] = []
    high: list[int] = []
    for commit in sorted((Path(path) / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            add = json.loads(line).get("add")
            if add is None:
                continue
            stats = json.loads(add["stats"])
            rows += stats["numRecords"]
            nulls += stats["nullCount"]["order_id"]
            if stats["minValues"].get("order_id") is not None:  # absent or null when every id is null
                low.append(stats["minValues"]["order_id"])
                high.append(stats["maxValues"]["order_id"])
    found = (rows, nulls, min(low, default=None), max(high, default=None))
    want = (n, n, None, None) if constant else (n, 0, 0, n - 1)
    if found != want:
        raise SystemExit(
            f"the Delta table {path} holds (rows, null ids, lowest id, highest id) {found}, not {want}"
        )


def fill(client: SyncClient, work: Path, n: int, compression: str, constant: bool) -> int:
    """The throughput measures' data: the streams ``bench`` and ``peer``, and the same rows as
    Arrow and Parquet files; returns the values' bytes."""
    client.create_stream("bench", "bench", partitions=2, compression=compression)
    client.create_stream("peer", "peer", partitions=PEER_PARTITIONS, compression=compression)
    (work / "arrow").mkdir()
    (work / "parquet").mkdir()
    (work / "peer").mkdir()
    halves = PEER_PARTITIONS // 2
    per_partition = n // 2
    value_bytes = 0
    for p in range(2):
        values, timestamps = partition_values(per_partition, p, constant)
        lengths = pc.binary_length(values)
        value_bytes += pc.sum(lengths).as_py()
        chunk = min(CHUNK, PUBLISH_BYTES // pc.max(lengths).as_py())
        publish(client, "bench", values, p, chunk)
        # The Kafka comparison's rows: the same values, each partition's split in two.
        bounds = [per_partition * h // halves for h in range(halves + 1)]
        for h in range(halves):
            part = values.slice(bounds[h], bounds[h + 1] - bounds[h])
            q = p * halves + h
            publish(client, "peer", part, q, chunk)
            numbers = pa.array(np.full(len(part), q, np.int32))
            pq.write_table(
                pa.table({"value": part, "partition": numbers}), work / "peer" / f"part-{q}.parquet"
            )
        table = rows_table(values, timestamps, p)
        arrow_path = str(work / "arrow" / f"part-{p}.arrow")
        with pa.OSFile(arrow_path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=chunk)
        pq.write_table(table, work / "parquet" / f"part-{p}.parquet")
    return value_bytes


def latency(
    spark: SparkSession, client: SyncClient, broker: LocalBroker, kafka: KafkaBroker, work: Path, size: str
) -> dict[str, float]:
    """The latency measures (``bench/spark_latency.py``) at ``size``."""
    admin = KafkaAdmin(spark, kafka.bootstrap)

    def create_stream(name: str) -> None:
        client.create_stream(name, name, partitions=LATENCY_PARTITIONS)

    try:
        return measure_latency(
            spark,
            create_stream,
            lambda name: admin.create_topic(name, LATENCY_PARTITIONS),
            {"flight": broker.flight, "nats": str(broker.nats_url), "kafka": kafka.bootstrap},
            broker_jars(),
            work,
            seconds=pick(size, smoke=2.0, quick=60.0, full=60.0),
            warm_up=pick(size, smoke=1.0, quick=10.0, full=10.0),
            kafka_warm_up=pick(size, smoke=0.0, quick=20.0, full=20.0),
            together=size == "smoke",
        )
    finally:
        admin.close()


def main() -> None:
    arguments = parser(__doc__, quick_help="1,000,000 messages, latency 60 s a measure; about 25 minutes")
    arguments.add_argument(
        "--compression",
        choices=COMPRESSIONS,
        default="none",
        help="codec of the benchmark's streams (default: none, the streams' default)",
    )
    arguments.add_argument(
        "--constant-values",
        action="store_true",
        help="the earlier data: the same 100 bytes in every message, one timestamp in every Parquet row",
    )
    arguments.add_argument(
        "--only",
        choices=("throughput", "latency"),
        help="only the throughput measures (1-6) or only the latency ones (7)",
    )
    args = arguments.parse_args()
    size = size_of(args)
    n = pick(size, smoke=20_000, quick=1_000_000, full=5_000_000)
    runs = pick(size, smoke=1, quick=RUNS, full=RUNS)
    throughput = args.only != "latency"
    work = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    # One session for everything: a JVM keeps the class path it started with, so Kafka's
    # connector goes on spark.jars beside Delta's jars (or beside Spark fetching Delta's).
    jars = [j for j in delta_conf().get("spark.jars", "").split(",") if j]
    jars += [str(j) for j in connector_jars()]
    spark = delta_session(
        "spark-bench", **{"spark.sql.shuffle.partitions": "2", "spark.jars": ",".join(jars)}
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ArrowFileSource)
    spark.dataSource.register(DiscardSink)
    results: dict[str, float] = {}
    value_bytes = 0
    try:
        with (
            LocalBroker(work / "data", log_level="WARNING") as broker,
            SyncClient(nats_urls=broker.nats_url, broker=broker.flight, timeout=120) as client,
        ):
            if throughput:
                value_bytes = fill(client, work, n, args.compression, args.constant_values)
                results |= measure(
                    spark, client, broker, work, n, args.compression, args.constant_values, runs
                )
                results |= measure_typed_sink(spark, client, broker, work, n, runs)
            # Kafka starts only now: its JVM shares the 2 cores with what it is not measured against.
            with KafkaBroker(work / "kafka", partitions=PEER_PARTITIONS) as kafka:
                try:
                    if throughput:
                        results |= measure_kafka(
                            spark, client, broker, kafka, work, n, args.compression, runs
                        )
                        results |= measure_typed_reads(spark, client, broker, kafka, work, n, runs)
                    if args.only != "throughput":
                        results |= latency(spark, client, broker, kafka, work, size)
                except Exception:
                    print(f"the Kafka peer's log, last lines:\n{kafka.log_tail()}", file=sys.stderr)
                    raise
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    if throughput:
        print_throughput(results, n, value_bytes, runs, args.compression, args.constant_values)
    if args.only != "throughput":
        print_latency(results)
    print(last_line(results, 3))


def print_throughput(
    results: dict[str, float], n: int, value_bytes: int, runs: int, compression: str, constant: bool
) -> None:
    """The throughput ratios, added to ``results``, and their table."""
    mean_bytes = value_bytes / n
    results["value_bytes_mean"] = mean_bytes
    results["read_rows_per_s"] = results["jetstream_read_rows_per_s"]
    results["read_ratio_to_arrow_file_source"] = (
        results["read_rows_per_s"] / results["arrow_file_source_read_rows_per_s"]
    )
    results["read_ratio_to_parquet"] = results["read_rows_per_s"] / results["parquet_read_rows_per_s"]
    results["sink_ratio_to_parquet"] = results["sink_rows_per_s"] / results["parquet_write_rows_per_s"]
    results["delta_ratio"] = results["delta_rows_per_s"] / results["parquet_delta_rows_per_s"]
    results["kafka_read_ratio"] = (
        results["kafka_peer_jetstream_read_rows_per_s"] / results["kafka_read_rows_per_s"]
    )
    results["kafka_write_ratio"] = (
        results["kafka_peer_jetstream_write_rows_per_s"] / results["kafka_write_rows_per_s"]
    )
    # The highest kafka_write_ratio any Python sink reaches here: one that stores nothing.
    results["python_floor_write_ratio_to_kafka"] = (
        results["python_floor_write_rows_per_s"] / results["kafka_write_rows_per_s"]
    )
    data = f"JSON orders of {mean_bytes:.0f} bytes (mean)"
    if constant:
        data = "constant 100-byte values"
    print(f"{n:,} messages, {data}, local[2], compression {compression}, medians of {runs} runs")
    print(f"{'measure':<48} {'rows/s':>12} {'ratio':>7} {'target':>7}")
    table = [
        ("read: readStream jetstream -> noop", results["read_rows_per_s"], None, ""),
        (
            "read: Arrow IPC file, minimal Python source",
            results["arrow_file_source_read_rows_per_s"],
            results["read_ratio_to_arrow_file_source"],
            ">= 0.85",
        ),
        (
            "read: Spark Parquet reader",
            results["parquet_read_rows_per_s"],
            results["read_ratio_to_parquet"],
            "",
        ),
        ("write: writeStream jetstream", results["sink_rows_per_s"], None, ""),
        (
            "write: Spark Parquet writer",
            results["parquet_write_rows_per_s"],
            results["sink_ratio_to_parquet"],
            ">= 0.7",
        ),
        ("delta: jetstream -> from_json -> Delta", results["delta_rows_per_s"], None, ""),
        (
            "delta: Parquet -> from_json -> Delta",
            results["parquet_delta_rows_per_s"],
            results["delta_ratio"],
            "",
        ),
        ("typed: df.write typed rows into a typed stream", results["typed_sink_rows_per_s"], None, ""),
        (
            "typed: df.write JSON values into it",
            results["json_sink_into_typed_rows_per_s"],
            1 / results["typed_sink_ratio_to_json_sink"],
            "",
        ),
        (
            "typed: df.write to_json(struct(fields)) into it",
            results["to_json_sink_into_typed_rows_per_s"],
            1 / results["typed_sink_ratio_to_to_json_sink"],
            "",
        ),
        ("kafka: readStream jetstream -> noop", results["kafka_peer_jetstream_read_rows_per_s"], None, ""),
        (
            "kafka: readStream kafka -> noop",
            results["kafka_read_rows_per_s"],
            results["kafka_read_ratio"],
            ">= 1.5",
        ),
        ("kafka: df.write jetstream", results["kafka_peer_jetstream_write_rows_per_s"], None, ""),
        (
            "kafka: df.write kafka (tuned producer)",
            results["kafka_write_rows_per_s"],
            results["kafka_write_ratio"],
            ">= 1.5",
        ),
        (
            "kafka: df.write, rows dropped (ours / it)",
            results["python_floor_write_rows_per_s"],
            results["kafka_peer_jetstream_write_rows_per_s"] / results["python_floor_write_rows_per_s"],
            "",
        ),
        ("typed: orders per currency, typed stream", results["typed_query_rows_per_s"], None, ""),
        (
            "typed: the same, raw stream + from_json",
            results["from_json_query_rows_per_s"],
            results["typed_ratio_to_from_json"],
            ">= 2",
        ),
        (
            "typed: the same, Kafka source + from_json",
            results["kafka_from_json_query_rows_per_s"],
            results["typed_ratio_to_kafka_from_json"],
            ">= 3",
        ),
        (
            "typed: typed stream, columns=currency,amount",
            results["typed_columns_query_rows_per_s"],
            results["typed_columns_ratio_to_from_json"],
            "",
        ),
    ]
    for label, rate, ratio, target in table:
        shown = "" if ratio is None else f"{ratio:.2f}"
        print(f"{label:<48} {rate:>12,.0f} {shown:>7} {target:>7}")
    producer = ", ".join(f"{k}={v}" for k, v in KAFKA_PRODUCER.items())
    print(
        f"kafka: Kafka {KAFKA_VERSION} (KRaft, one node), {PEER_PARTITIONS}-partition stream and topics; "
        f"Kafka's producer: {producer}, compression.type={compression}"
    )
    print("CPU seconds per million rows, the whole machine (JVMs, Python workers, broker, nats-server):")
    cpu_rows = [
        ("read: jetstream / Arrow-file source", "jetstream_read", "arrow_file_source_read"),
        ("write: jetstream sink / Parquet writer", "sink", "parquet_write"),
        ("kafka read: jetstream / Kafka source", "kafka_peer_jetstream_read", "kafka_read"),
        ("kafka write: jetstream sink / Kafka sink", "kafka_peer_jetstream_write", "kafka_write"),
        ("kafka write: jetstream sink / rows dropped", "kafka_peer_jetstream_write", "python_floor_write"),
    ]
    for label, ours, peer in cpu_rows:
        mine, theirs = (results[f"{k}_cpu_s_per_m_rows"] for k in (ours, peer))
        print(f"  {label:<46} {mine:>6.2f} / {theirs:>5.2f}")


if __name__ == "__main__":
    main()
