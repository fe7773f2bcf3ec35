"""The Spark bench's latency measures: publish -> rows in the driver, ours against Kafka.

A steady publisher (``RATES``: 2,000 and 10,000 messages/s, taken in turn
over ``PARTITIONS`` partitions) runs in a process of its own: plain NATS core
publishes for ours (:func:`publish_nats`, this module run as a script), a
Kafka producer with kafka-clients' defaults (``linger.ms=0``) for Kafka
(``bench/SteadyProducer.java``).  Each message's value is the time it was
sent (microseconds since the epoch, in decimal, padded to ``PAYLOAD_BYTES``).
One query per side reads it with ``readStream`` -> ``foreachBatch``, which
takes the rows with ``toArrow()`` and notes, per row, the driver's clock
minus the value: publish -> rows in the driver.  Both triggers are measured:
Spark's default (the next micro-batch as soon as one ends) and
``processingTime="1 second"``.

The floor is a do-nothing Python streaming source (``noopstream``, defined
here) in the same pipeline: its offsets advance with the clock at the same
rate, over the same number of partitions, and its rows (same columns as
ours) are made in the read from the offsets alone.  What its micro-batch's
read job (``addBatch``) costs is what PySpark costs any Python source that
reads in Spark tasks (a ``DataSourceStreamReader``).  Beside it, the same
source as a ``SimpleDataSourceStreamReader`` (``noopsimple``, side
``noop_simple``): PySpark calls its ``read`` in the driver's Python process
when it asks for the next offsets and hands the rows to the micro-batch's
task in the JVM, so no task runs Python.  Ours on that path is the side
``jetstream_driver`` (the option ``readMode=driver``).

A measure's rows are those published in ``seconds``, from ``warm_up``
seconds after the first rows came (the first micro-batches of a query start
its workers); each micro-batch of the window is split as
Spark's progress reports it (``latestOffset``, ``addBatch``, ``walCommit``,
``commitOffsets``, and the whole ``triggerExecution``), means in ms.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming import StreamingQuery

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD_BYTES = 100
PARTITIONS = 4
RATES = (2_000, 10_000)
TRIGGERS = {"default": None, "1s": "1 second"}
"""Trigger names in the figures' keys, and ``processingTime`` (``None``: Spark's default trigger)."""
SIDES = ("jetstream", "jetstream_driver", "kafka", "noop", "noop_simple")
"""The sides of a measure, in the order of the first turn (the next turn reverses it)."""
PROGRESS = {
    "latestOffset": "latest_offset_ms",
    "addBatch": "add_batch_ms",
    "walCommit": "wal_commit_ms",
    "commitOffsets": "commit_offsets_ms",
    "triggerExecution": "batch_ms",
}
"""Spark's ``durationMs`` parts of a micro-batch, and their names in the figures."""
START_TIMEOUT = 120.0
"""Seconds a query may take to start, and then to deliver its first rows."""
DRAIN_TIMEOUT = 60.0
"""Seconds a query may take, past its window's end, to deliver the window's last rows."""
STOP_TIMEOUT = 30.0
PUBLISH_LIMIT = 3600.0
"""Seconds a publisher runs at most (it is stopped once its query's window is done)."""


def micros(values: pa.Array) -> np.ndarray:
    """The publish times (µs) that padded decimal ``values`` carry."""
    text = pc.utf8_trim_whitespace(values.cast(pa.string()))
    return np.asarray(text.cast(pa.int64()))


def padded_times(times_us: np.ndarray) -> pa.Array:
    """``times_us`` as the publishers' values: decimal, padded with spaces to ``PAYLOAD_BYTES``."""
    text = pc.utf8_rpad(pa.array(times_us).cast(pa.string()), PAYLOAD_BYTES, " ")
    return text.cast(pa.binary())


class NoopStreamSource(DataSource):
    """A Python streaming source that does nothing but make rows (options ``rate``, ``start``,
    ``rows``): offset ``i`` is "published" at ``start + i / rate``, up to ``rows``; a query starts
    at the offset of its start's time."""

    @classmethod
    def name(cls) -> str:
        return "noopstream"

    def schema(self) -> str:
        from pyspark_jetstream.spark.range_reads import BASE_SCHEMA

        return BASE_SCHEMA

    def streamReader(self, schema):  # noqa: N802 - Spark's API
        return NoopStreamReader(self.options, schema)


class NoopStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str], schema) -> None:
        self.rate = float(options["rate"])
        self.start = float(options["start"])
        self.rows = int(options["rows"])
        self.schema = schema

    def initialOffset(self) -> dict:  # noqa: N802
        # Where the clock is when the query starts (as ours starts at the latest offset): the
        # offsets "published" while the other sides ran are not read in one first micro-batch.
        return self.latestOffset()

    def latestOffset(self) -> dict:  # noqa: N802
        return {"n": min(max(int((time.time() - self.start) * self.rate), 0), self.rows)}

    def partitions(self, start: dict, end: dict):
        lo, hi = start["n"], end["n"]
        bounds = [lo + (hi - lo) * k // PARTITIONS for k in range(PARTITIONS + 1)]
        return [InputPartition((p, bounds[p], bounds[p + 1])) for p in range(PARTITIONS)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        _, lo, hi = partition.value
        if hi > lo:
            yield noop_rows(lo, hi, self.start, self.rate, self.schema)


def noop_rows(lo: int, hi: int, start: float, rate: float, schema) -> pa.RecordBatch:
    """The do-nothing sources' rows of offsets ``[lo, hi)``, in Spark's Arrow form of ``schema``."""
    n = hi - lo
    offsets = np.arange(lo, hi, dtype=np.int64)
    published = (start * 1e6 + offsets * 1e6 / rate).astype(np.int64)
    target = to_arrow_schema(schema, timezone="UTC")
    columns = {
        "key": pa.nulls(n, pa.binary()),
        "value": padded_times(published),
        "stream": pa.array(["noop"] * n),
        "subject": pa.array(["noop"] * n),
        "partition": pa.array(np.zeros(n, np.int32)),  # one sequence of offsets, split in tasks
        "offset": pa.array(offsets),
        "timestamp": pa.array(published).cast(pa.timestamp("us", tz="UTC")),
    }
    return pa.RecordBatch.from_arrays([columns[f.name] for f in target], schema=target)


class NoopSimpleSource(NoopStreamSource):
    """:class:`NoopStreamSource` as a ``SimpleDataSourceStreamReader``: rows made in the driver."""

    @classmethod
    def name(cls) -> str:
        return "noopsimple"

    def streamReader(self, schema):  # noqa: N802 - Spark's API
        return DataSource.streamReader(self, schema)  # not implemented: PySpark takes the simple one

    def simpleStreamReader(self, schema):  # noqa: N802 - Spark's API
        return NoopSimpleReader(self.options, schema)


class NoopSimpleReader(SimpleDataSourceStreamReader):
    def __init__(self, options: dict[str, str], schema) -> None:
        self.noop = NoopStreamReader(options, schema)

    def initialOffset(self) -> dict:  # noqa: N802
        return self.noop.initialOffset()

    def read(self, start: dict) -> tuple[Iterator[pa.RecordBatch], dict]:
        end = self.noop.latestOffset()
        return self.readBetweenOffsets(start, end), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[pa.RecordBatch]:  # noqa: N802
        noop = self.noop
        lo, hi = start["n"], end["n"]
        return iter([noop_rows(lo, hi, noop.start, noop.rate, noop.schema)] if hi > lo else [])


@dataclass
class Probe:
    """The ``foreachBatch`` function: each row's publish time and the driver's clock when it came."""

    published: list[np.ndarray] = field(default_factory=list)
    arrived: list[np.ndarray] = field(default_factory=list)
    positions: list[pa.Table] = field(default_factory=list)
    """Each micro-batch's partitions and offsets."""
    newest: int = 0
    """The newest publish time seen (µs)."""
    first_arrival: int | None = None
    """The driver's clock (µs) when the first rows came."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: bool = False
    """Set: micro-batches are let through unread (a query stopped during a read job fails it)."""
    calls: int = 0

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        self.calls += 1
        if self.stopping:
            return
        table = frame.select("value", "partition", "offset").toArrow()
        now = time.time_ns() // 1000
        if not table.num_rows:
            return
        sent = micros(table.column("value").combine_chunks())
        with self.lock:
            self.positions.append(table.select(["partition", "offset"]))
            self.published.append(sent)
            self.arrived.append(np.full(len(sent), now, np.int64))
            self.newest = max(self.newest, int(sent.max()))
            if self.first_arrival is None:
                self.first_arrival = now

    def quiesce(self, query: StreamingQuery, timeout: float = 30.0) -> None:
        """Let micro-batches through unread and return once one went through (or ``timeout``):
        ``query`` can then be stopped with no read job of this probe running."""
        self.stopping = True
        seen = self.calls
        deadline = time.monotonic() + timeout
        while self.calls == seen and query.isActive and time.monotonic() < deadline:
            time.sleep(0.02)

    def gaps(self) -> list[str]:
        """Partitions whose offsets came with gaps or twice: rows lost or repeated."""
        with self.lock:
            table = pa.concat_tables(self.positions) if self.positions else None
        if table is None:
            return []
        found = []
        for partition in pc.unique(table.column("partition")).to_pylist():
            offsets = np.sort(
                np.asarray(table.filter(pc.equal(table.column("partition"), partition))["offset"])
            )
            if len(offsets) != offsets[-1] - offsets[0] + 1 or len(np.unique(offsets)) != len(offsets):
                found.append(
                    f"partition {partition}: {len(offsets)} rows for offsets {offsets[0]} to {offsets[-1]}"
                )
        return found

    def delays_ms(self, lo: int, hi: int) -> np.ndarray:
        """Publish -> driver (ms) of the rows published in ``[lo, hi)`` µs."""
        with self.lock:
            if not self.published:
                return np.empty(0)
            sent, came = np.concatenate(self.published), np.concatenate(self.arrived)
        inside = (sent >= lo) & (sent < hi)
        return (came[inside] - sent[inside]) / 1000.0


@dataclass(frozen=True, slots=True)
class Measured:
    """One side's figures at one rate and trigger."""

    e2e_p50_ms: float
    e2e_p99_ms: float
    rows: int
    """Rows published in the window (all of them came: :meth:`Probe.gaps`)."""
    batches: int
    durations_ms: dict[str, float]
    """Means over the window's micro-batches, by :data:`PROGRESS`'s names."""
    published_per_s: float
    """The rate the publisher kept in the window (one short of CPU falls behind the one asked)."""

    def figures(self, prefix: str) -> dict[str, float]:
        """The figures under ``prefix``."""
        return {
            f"{prefix}_e2e_p50_ms": self.e2e_p50_ms,
            f"{prefix}_e2e_p99_ms": self.e2e_p99_ms,
            f"{prefix}_rows_per_batch": self.rows / max(self.batches, 1),
            f"{prefix}_published_per_s": self.published_per_s,
            **{f"{prefix}_{name}": value for name, value in self.durations_ms.items()},
        }


def _progress_means(query, lo: int, hi: int) -> tuple[int, dict[str, float]]:
    """The number of micro-batches with rows that started in ``[lo, hi)`` µs, and their mean parts."""
    parts: dict[str, list[float]] = {name: [] for name in PROGRESS.values()}
    for progress in query.recentProgress:
        started = datetime.datetime.fromisoformat(progress.timestamp).timestamp() * 1e6
        if not lo <= started < hi or not progress.numInputRows:
            continue
        for spark_name, name in PROGRESS.items():
            parts[name].append(float(progress.durationMs.get(spark_name, 0)))
    batches = len(parts["batch_ms"])
    return batches, {name: (sum(v) / len(v) if v else 0.0) for name, v in parts.items()}


class Measure:
    """One side's query at one rate and trigger: :meth:`start` it, then :meth:`finish` for its
    figures (several may run at once: ``--smoke`` does, its figures mean nothing)."""

    def __init__(
        self,
        frame: DataFrame,
        publisher: list[str] | None,
        *,
        rate: int,
        trigger: str | None,
        seconds: float,
        warm_up: float,
        checkpoint: Path,
        what: str,
    ) -> None:
        """``frame`` runs into a :class:`Probe` with ``trigger`` while ``publisher`` (a command that
        publishes until stopped; ``None``: the source makes its own rows) publishes.  Measured: the
        rows published in ``seconds`` from ``warm_up`` seconds after the first rows came (the first
        micro-batches of a query start its workers)."""
        self.frame, self.publisher, self.rate, self.trigger = frame, publisher, rate, trigger
        self.seconds, self.warm_up, self.checkpoint, self.what = seconds, warm_up, checkpoint, what
        self.probe = Probe()
        self.query: StreamingQuery | None = None
        self.running: subprocess.Popen[bytes] | None = None

    def _wait(self, until: Callable[[], bool], timeout: float, failure: str) -> None:
        """Return once ``until()``; exit when the query or the publisher failed, or after ``timeout``."""
        assert self.query is not None
        deadline = time.monotonic() + timeout
        while not until():
            if self.query.exception() is not None:
                raise SystemExit(f"{self.what}: the query failed: {self.query.exception()}")
            if self.running is not None and self.running.poll() not in (None, 0):
                raise SystemExit(f"{self.what}: the publisher exited with {self.running.returncode}")
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.what}: {failure} within {timeout:.0f} s")
            time.sleep(0.05)

    def start(self) -> None:
        """:meth:`start_query`, then :meth:`start_publishing`."""
        self.start_query()
        self.start_publishing()

    def start_query(self) -> None:
        """Start the query and wait for its first (empty) micro-batch: it fixes the start offsets
        and starts the query's workers."""
        writer = self.frame.writeStream.foreachBatch(self.probe)
        writer = writer.option("checkpointLocation", str(self.checkpoint))
        if self.trigger is not None:
            writer = writer.trigger(processingTime=self.trigger)
        self.query = writer.start()
        query = self.query
        self._wait(lambda: query.lastProgress is not None, START_TIMEOUT, "the query did not start")

    def start_publishing(self) -> None:
        """Start the publisher (a source that makes its own rows has none)."""
        if self.publisher is not None:
            self.running = subprocess.Popen(self.publisher, cwd=ROOT, stdout=subprocess.DEVNULL)

    def finish(self) -> Measured:
        """Wait for the window's rows, then stop the publisher and the query; the window's figures.
        Exits when the query fails, or rows were lost or repeated."""
        probe, query = self.probe, self.query
        assert query is not None
        try:
            self._wait(lambda: probe.first_arrival is not None, START_TIMEOUT, "no row came")
            assert probe.first_arrival is not None
            lo = probe.first_arrival + int(self.warm_up * 1e6)
            hi = lo + int(self.seconds * 1e6)
            limit = self.warm_up + self.seconds + DRAIN_TIMEOUT
            self._wait(lambda: probe.newest >= hi, limit, "the window's last rows did not come")
            delays = probe.delays_ms(lo, hi)
            if probe.gaps():
                raise SystemExit(f"{self.what}: rows lost or repeated: {'; '.join(probe.gaps())}")
            published = len(delays) / self.seconds
            if published < 0.95 * self.rate:  # a publisher short of CPU falls behind: said, not hidden
                print(
                    f"latency: {self.what}: {published:,.0f} rows/s published, not {self.rate:,}", flush=True
                )
            batches, durations = _progress_means(query, lo, hi)
        finally:
            self.stop()
        return Measured(
            float(np.percentile(delays, 50)),
            float(np.percentile(delays, 99)),
            len(delays),
            batches,
            durations,
            published,
        )

    def stop(self) -> None:
        """Stop the publisher and the query (again: nothing)."""
        running, self.running = self.running, None
        if running is not None:
            running.terminate()
            running.wait(STOP_TIMEOUT)
        if self.query is not None and self.query.isActive:
            self.probe.quiesce(self.query)
            self.query.stop()


def nats_publisher(url: str, subject: str, rate: int, seconds: float) -> list[str]:
    """The command of :func:`publish_nats`."""
    return [sys.executable, "-m", "bench.spark_latency", url, subject, str(rate), str(seconds)]


def kafka_publisher(jars: Path, bootstrap: str, topic: str, rate: int, seconds: float) -> list[str]:
    """The command of ``bench/SteadyProducer.java`` (Java runs a one-file program from its source)."""
    return [
        "java",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        f"{jars}/*",
        str(ROOT / "bench" / "SteadyProducer.java"),
        bootstrap,
        topic,
        str(PARTITIONS),
        str(rate),
        str(seconds),
        str(PAYLOAD_BYTES),
    ]


async def publish_nats(url: str, subject: str, rate: int, seconds: float) -> int:
    """Publish ``rate`` messages a second for ``seconds`` on ``subject``'s ``PARTITIONS`` partition
    subjects in turn (plain NATS core publishes), each carrying its send time; the count sent (the
    bench stops it sooner)."""
    import nats

    from pyspark_jetstream.protocol.streams import partition_subject

    subjects = [partition_subject(subject, p) for p in range(PARTITIONS)]
    connection = await nats.connect(url)
    total = int(rate * seconds)
    sent = 0
    start = time.monotonic()
    try:
        while sent < total:
            due = min(int((time.monotonic() - start) * rate) + 1, total)
            while sent < due:
                now = time.time_ns() // 1000
                await connection.publish(subjects[sent % PARTITIONS], str(now).ljust(PAYLOAD_BYTES).encode())
                sent += 1
            await asyncio.sleep(0.001)
        await connection.flush()
    finally:
        await connection.close()
    return sent


def measure_latency(
    spark: SparkSession,
    create_stream: Callable[[str], None],
    create_topic: Callable[[str], None],
    servers: dict[str, str],
    kafka_jars: Path,
    work: Path,
    *,
    seconds: float,
    warm_up: float,
    kafka_warm_up: float,
    together: bool = False,
) -> dict[str, float]:
    """Every side at every rate and trigger (see the module docstring), the sides taking turns
    at going first (``together``: running at once, for ``--smoke``); ``servers``: ``flight``,
    ``nats`` (ours) and ``kafka`` (bootstrap)."""
    # Executors load the noop source from this module, sent with it (bench/ is not on their path).
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(NoopStreamSource)
    spark.dataSource.register(NoopSimpleSource)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
    checkpoints = work / "latency-checkpoints"
    counter = iter(range(1_000_000))

    def measure(side: str, rate: int, trigger: str | None, length: float, pause: float) -> Measure:
        name = f"latency-{next(counter)}"
        rows = spark.readStream
        if side in ("jetstream", "jetstream_driver"):
            create_stream(name)
            mode = "driver" if side == "jetstream_driver" else "tasks"
            frame = (
                rows.format("jetstream").options(servers=servers["flight"], stream=name, readMode=mode).load()
            )
            publisher = nats_publisher(servers["nats"], name, rate, PUBLISH_LIMIT)
        elif side == "kafka":
            create_topic(name)
            kafka = {"kafka.bootstrap.servers": servers["kafka"], "subscribe": name}
            frame = rows.format("kafka").options(**kafka).load()
            publisher = kafka_publisher(kafka_jars, servers["kafka"], name, rate, PUBLISH_LIMIT)
        else:
            options = {"rate": str(rate), "start": str(time.time()), "rows": str(int(rate * PUBLISH_LIMIT))}
            source = "noopsimple" if side == "noop_simple" else "noopstream"
            frame, publisher = rows.format(source).options(**options).load(), None
        what = f"{side} at {rate}/s, trigger {trigger or 'default'}"
        return Measure(
            frame,
            publisher,
            rate=rate,
            trigger=trigger,
            seconds=length,
            warm_up=pause,
            checkpoint=checkpoints / name,
            what=what,
        )

    def run(
        sides: tuple[str, ...], rate: int, trigger: str | None, length: float, pause: float
    ) -> dict[str, Measured]:
        """``sides`` one after the other (``together``: at once)."""
        began = time.monotonic()
        measures = {side: measure(side, rate, trigger, length, pause) for side in sides}
        done: dict[str, Measured] = {}
        try:
            if together:
                # Every query starts before any publishing: a query's start spawns its source's
                # Python process in the driver, which Spark (hard-coded) gives 10 s to connect
                # back, and the other sides' live pipelines on a busy machine can starve it.
                for each in measures.values():
                    each.start_query()
                for each in measures.values():
                    each.start_publishing()
            for side, each in measures.items():
                if not together:
                    each.start()
                done[side] = each.finish()
                print(
                    f"latency: {each.what}: p50 {done[side].e2e_p50_ms:,.0f} ms, "
                    f"p99 {done[side].e2e_p99_ms:,.0f} ms ({time.monotonic() - began:.0f} s)",
                    flush=True,
                )
        finally:
            for each in measures.values():
                each.stop()
        return done

    if kafka_warm_up:  # a fresh Kafka JVM delivers late for its first seconds: not in any figure
        run(("kafka",), RATES[0], None, kafka_warm_up, 1.0)
    results: dict[str, float] = {}
    turn = 0
    for rate in RATES:
        for trigger_name, trigger in TRIGGERS.items():
            sides = SIDES if turn % 2 == 0 else SIDES[::-1]
            turn += 1
            measured = run(sides, rate, trigger, seconds, warm_up)
            for side in sides:
                results |= measured[side].figures(f"latency_{rate}_{trigger_name}_{side}")
            prefix = f"latency_{rate}_{trigger_name}"
            theirs = measured["kafka"]
            for side, suffix in (("jetstream", ""), ("jetstream_driver", "_driver_mode")):
                ours = measured[side]
                results[f"{prefix}_e2e_p50_ratio_to_kafka{suffix}"] = ours.e2e_p50_ms / theirs.e2e_p50_ms
                results[f"{prefix}_e2e_p99_ratio_to_kafka{suffix}"] = ours.e2e_p99_ms / theirs.e2e_p99_ms
    head = f"latency_{RATES[0]}_default"
    for suffix in ("", "_driver_mode"):
        for key in ("e2e_p50_ratio_to_kafka", "e2e_p99_ratio_to_kafka"):
            results[key + suffix] = results[f"{head}_{key}{suffix}"]
    results["read_job_ms"] = results[f"{head}_jetstream_add_batch_ms"]
    results["read_job_ms_driver_mode"] = results[f"{head}_jetstream_driver_add_batch_ms"]
    results["noop_python_source_read_job_ms"] = results[f"{head}_noop_add_batch_ms"]
    results["noop_simple_python_source_read_job_ms"] = results[f"{head}_noop_simple_add_batch_ms"]
    return results


def print_latency(results: dict[str, float]) -> None:
    """The latency figures as a table."""
    print("latency: publish -> rows in the driver (ms), and the mean micro-batch's parts (ms)")
    header = ["p50", "p99", "rows/batch", *PROGRESS.values()]
    print(f"{'rate, trigger, side':<36}" + "".join(f"{h.removesuffix('_ms'):>16}" for h in header))
    for rate in RATES:
        for trigger in TRIGGERS:
            for side in SIDES:
                prefix = f"latency_{rate}_{trigger}_{side}"
                cells = [
                    results[f"{prefix}_e2e_p50_ms"],
                    results[f"{prefix}_e2e_p99_ms"],
                    results[f"{prefix}_rows_per_batch"],
                    *(results[f"{prefix}_{name}"] for name in PROGRESS.values()),
                ]
                print(f"{f'{rate}/s, {trigger}, {side}':<36}" + "".join(f"{c:>16,.0f}" for c in cells))
    keys = (
        "e2e_p50_ratio_to_kafka",
        "e2e_p99_ratio_to_kafka",
        "e2e_p50_ratio_to_kafka_driver_mode",
        "e2e_p99_ratio_to_kafka_driver_mode",
        "read_job_ms",
        "read_job_ms_driver_mode",
        "noop_python_source_read_job_ms",
        "noop_simple_python_source_read_job_ms",
    )
    print("latency: " + json.dumps({k: round(results[k], 3) for k in keys}))


if __name__ == "__main__":
    print(asyncio.run(publish_nats(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))))
