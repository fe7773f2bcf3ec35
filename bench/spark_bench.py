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
   each run), against the same pipeline reading the same rows from Parquet.

The messages are JSON orders of ~250 bytes generated from a fixed seed (the
same bytes every run), each row different, so that Parquet cannot
dictionary-encode them away; the stream and the Parquet and Arrow files hold
the same values.  ``--constant-values`` gives the earlier data instead: the
same 100 bytes in every message and one timestamp for every Parquet row.

Each figure is the median of 3 runs.  Prints a table; the last line is one
JSON object.

    python bench/spark_bench.py [--quick | --smoke] [--compression none|lz4|zstd] [--constant-values]
"""

from __future__ import annotations

import json
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
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema

from bench.sizes import last_line, parser, pick, size_of
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.local import LocalBroker
from pyspark_jetstream.protocol.schema import COMPRESSIONS
from pyspark_jetstream.spark.delta import delta_session
from pyspark_jetstream.spark.reading import BASE_SCHEMA

RUNS = 3
CHUNK = 10_000
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


def timed(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


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

    def stream_into(df: DataFrame, sink_format: str, name: str, **options: str) -> Callable[[], None]:
        def run() -> None:
            writer = df.writeStream.format(sink_format).option(
                "checkpointLocation", str(work / "checkpoints" / f"{name}-{time.monotonic_ns()}")
            )
            for key, value in options.items():
                writer = writer.option(key, value)
            query = writer.trigger(availableNow=True).start()
            query.awaitTermination()

        return run

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
        "jetstream": stream_into(jetstream_source, "noop", "read-js"),
        "arrow_file_source": stream_into(arrow_source, "noop", "read-arrow"),
        "parquet": stream_into(parquet_source, "noop", "read-parquet"),
    }
    samples: dict[str, list[float]] = {}
    for _ in range(runs):
        for key, run in read.items():
            samples.setdefault(key, []).append(timed(run))
    for key, values in samples.items():
        results[f"{key}_read_rows_per_s"] = n / statistics.median(values)

    out = parquet_source.select("key", "value")
    write_samples: dict[str, list[float]] = {}
    for i in range(runs):
        sink_stream = f"bench-out-{i}"
        client.create_stream(sink_stream, sink_stream, partitions=2, compression=compression)
        write_samples.setdefault("jetstream", []).append(
            timed(
                stream_into(
                    out,
                    "jetstream",
                    f"write-js-{i}",
                    servers=broker.flight,
                    nats=str(broker.nats_url),
                    stream=sink_stream,
                )
            )
        )
        stored = sum(p.high_watermark for p in client.describe_stream(sink_stream).partitions)
        if stored != n:
            raise SystemExit(f"the sink stored {stored} rows, not {n}")
        write_samples.setdefault("parquet", []).append(
            timed(stream_into(out, "parquet", f"write-pq-{i}", path=str(work / f"out-{i}")))
        )
    results["sink_rows_per_s"] = n / statistics.median(write_samples["jetstream"])
    results["parquet_write_rows_per_s"] = n / statistics.median(write_samples["parquet"])

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
    stream_into(parse_orders(warm_source), "delta", "warm-up", path=str(work / "warm-up-delta"))()
    delta_samples: dict[str, list[float]] = {}
    for i in range(runs):
        for key, frame in sorted(delta.items(), reverse=i % 2 == 1):
            path = str(work / f"{key}-{i}")
            run = stream_into(frame, "delta", f"{key}-{i}", path=path)
            delta_samples.setdefault(key, []).append(timed(run))
            check_delta_table(path, n, constant)
    for key, values in delta_samples.items():
        results[f"{key}_rows_per_s"] = n / statistics.median(values)
    return results


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


def main() -> None:
    arguments = parser(__doc__, quick_help="1,000,000 messages; about 3 minutes")
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
    args = arguments.parse_args()
    size = size_of(args)
    n = pick(size, smoke=20_000, quick=1_000_000, full=5_000_000)
    runs = pick(size, smoke=1, quick=RUNS, full=RUNS)
    per_partition = n // 2
    work = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    spark = delta_session("spark-bench", **{"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ArrowFileSource)
    value_bytes = 0
    try:
        with (
            LocalBroker(work / "data", log_level="WARNING") as broker,
            SyncClient(nats_urls=broker.nats_url, broker=broker.flight, timeout=120) as client,
        ):
            client.create_stream("bench", "bench", partitions=2, compression=args.compression)
            (work / "arrow").mkdir()
            (work / "parquet").mkdir()
            for p in range(2):
                values, timestamps = partition_values(per_partition, p, args.constant_values)
                lengths = pc.binary_length(values)
                value_bytes += pc.sum(lengths).as_py()
                chunk = min(CHUNK, PUBLISH_BYTES // pc.max(lengths).as_py())
                for start in range(0, per_partition, chunk):
                    payload = pa.table({"value": values.slice(start, chunk)})
                    client.publish_batch("bench", payload, partition=p, timeout=120)
                table = rows_table(values, timestamps, p)
                arrow_path = str(work / "arrow" / f"part-{p}.arrow")
                with pa.OSFile(arrow_path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                    writer.write_table(table, max_chunksize=chunk)
                pq.write_table(table, work / "parquet" / f"part-{p}.parquet")
            results = measure(spark, client, broker, work, n, args.compression, args.constant_values, runs)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    mean_bytes = value_bytes / n
    results["value_bytes_mean"] = mean_bytes
    results["read_rows_per_s"] = results["jetstream_read_rows_per_s"]
    results["read_ratio_to_arrow_file_source"] = (
        results["read_rows_per_s"] / results["arrow_file_source_read_rows_per_s"]
    )
    results["read_ratio_to_parquet"] = results["read_rows_per_s"] / results["parquet_read_rows_per_s"]
    results["sink_ratio_to_parquet"] = results["sink_rows_per_s"] / results["parquet_write_rows_per_s"]
    results["delta_ratio"] = results["delta_rows_per_s"] / results["parquet_delta_rows_per_s"]
    data = f"JSON orders of {mean_bytes:.0f} bytes (mean)"
    if args.constant_values:
        data = "constant 100-byte values"
    print(f"{n:,} messages, {data}, local[2], compression {args.compression}, medians of {runs} runs")
    print(f"{'measure':<48} {'rows/s':>12} {'ratio':>7} {'target':>7}")
    table = [
        ("read: readStream jetstream -> noop", results["read_rows_per_s"], None, ""),
        (
            "read: Arrow IPC file, minimal Python source",
            results["arrow_file_source_read_rows_per_s"],
            results["read_ratio_to_arrow_file_source"],
            ">= 0.8",
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
            ">= 0.5",
        ),
        ("delta: jetstream -> from_json -> Delta", results["delta_rows_per_s"], None, ""),
        (
            "delta: Parquet -> from_json -> Delta",
            results["parquet_delta_rows_per_s"],
            results["delta_ratio"],
            "",
        ),
    ]
    for label, rate, ratio, target in table:
        shown = "" if ratio is None else f"{ratio:.2f}"
        print(f"{label:<48} {rate:>12,.0f} {shown:>7} {target:>7}")
    print(last_line(results, 3))


if __name__ == "__main__":
    main()
