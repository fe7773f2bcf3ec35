"""Spark benchmark: the jetstream source and sink against Spark's own file formats, same run.

With N messages of 100 bytes (5,000,000; ``--quick``: 1,000,000), local[2]:

1. read: ``readStream.format("jetstream")`` with ``Trigger.AvailableNow`` into
   the ``noop`` sink, against the same rows (same Spark schema) read from a
   local Arrow IPC file through a minimal Python data source -- the ceiling of
   any Python source -- and against Spark's Parquet reader, both also as
   AvailableNow streams into ``noop``;
2. write: ``writeStream.format("jetstream")`` against Spark writing the same
   rows to Parquet, both from the same Parquet input.

Each figure is the median of 3 runs.  Prints a table; the last line is one
JSON object.

    python bench/spark_bench.py [--quick] [--compression none|lz4|zstd]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema

from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.local import LocalBroker
from pyspark_jetstream.protocol.schema import COMPRESSIONS
from pyspark_jetstream.spark import jetstream_session
from pyspark_jetstream.spark.reading import BASE_SCHEMA

RUNS = 3
CHUNK = 10_000


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


def rows_table(n: int, partition: int, start: int) -> pa.Table:
    """``n`` rows in the source's Spark shape, 100-byte values."""
    value = b"x" * 100
    return pa.table(
        {
            "key": pa.nulls(n, pa.binary()),
            "value": pa.array([value] * n, pa.binary()),
            "stream": pa.array(["bench"] * n),
            "subject": pa.array(["bench"] * n),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(start, start + n), pa.int64()),
            "timestamp": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
        }
    )


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1,000,000 messages; finishes within 180 s")
    parser.add_argument(
        "--compression",
        choices=COMPRESSIONS,
        default="none",
        help="codec of the benchmark's streams (default: none, the streams' default)",
    )
    args = parser.parse_args()
    n = 1_000_000 if args.quick else 5_000_000
    per_partition = n // 2
    work = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    broker = LocalBroker(work / "data", log_level="WARNING").start()
    spark = jetstream_session("spark-bench", **{"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(ArrowFileSource)
    results: dict[str, float] = {}
    try:
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight, timeout=120) as client:
            client.create_stream("bench", "bench", partitions=2, compression=args.compression)
            payload = pa.table({"value": pa.array([b"x" * 100] * CHUNK, pa.binary())})
            for p in range(2):
                for _ in range(per_partition // CHUNK):
                    client.publish_batch("bench", payload, partition=p, timeout=120)
            (work / "arrow").mkdir()
            (work / "parquet").mkdir()
            for p in range(2):
                table = rows_table(per_partition, p, 0)
                arrow_path = str(work / "arrow" / f"part-{p}.arrow")
                with pa.OSFile(arrow_path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                    writer.write_table(table, max_chunksize=CHUNK)
                pq.write_table(table, work / "parquet" / f"part-{p}.parquet")
            parquet_schema = spark.read.parquet(str(work / "parquet")).schema

            def stream_into(df, sink_format: str, name: str, **options: str):
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

            read = {
                "jetstream": stream_into(jetstream_source, "noop", "read-js"),
                "arrow_file_source": stream_into(arrow_source, "noop", "read-arrow"),
                "parquet": stream_into(parquet_source, "noop", "read-parquet"),
            }
            samples: dict[str, list[float]] = {}
            for _ in range(RUNS):
                for key, run in read.items():
                    samples.setdefault(key, []).append(timed(run))
            for key, values in samples.items():
                results[f"{key}_read_rows_per_s"] = n / statistics.median(values)

            out = parquet_source.select("key", "value")
            write_samples: dict[str, list[float]] = {}
            for i in range(RUNS):
                sink_stream = f"bench-out-{i}"
                client.create_stream(sink_stream, sink_stream, partitions=2, compression=args.compression)
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
    finally:
        spark.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)

    results["read_rows_per_s"] = results["jetstream_read_rows_per_s"]
    results["read_ratio_to_arrow_file_source"] = (
        results["read_rows_per_s"] / results["arrow_file_source_read_rows_per_s"]
    )
    results["read_ratio_to_parquet"] = results["read_rows_per_s"] / results["parquet_read_rows_per_s"]
    results["sink_ratio_to_parquet"] = results["sink_rows_per_s"] / results["parquet_write_rows_per_s"]
    print(f"{n:,} messages of 100 bytes, local[2], compression {args.compression}, medians of {RUNS} runs")
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
    ]
    for label, rate, ratio, target in table:
        shown = "" if ratio is None else f"{ratio:.2f}"
        print(f"{label:<48} {rate:>12,.0f} {shown:>7} {target:>7}")
    print(json.dumps({k: round(v, 3) for k, v in sorted(results.items())}))


if __name__ == "__main__":
    main()
