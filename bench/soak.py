"""``make soak HOURS=1``: a three-broker cluster held at 70% of its peak for hours.

Starts ZooKeeper, one nats-server and three brokers (``LocalCluster``), then:

1. measures the RF=3 pipelined publish rate of the producer the load uses
   (an idempotent producer id, ``ALL`` acks, at most 4,000 acks pending) twice:
   alone, on a stream of its own (recorded), then on the soak stream itself with
   the live tail and the Spark query below reading it, the first
   ``--peak-messages`` of the run.  The load is a share of the second: on two
   cores the readers take a third of the machine, and 70% of a peak measured
   without them is a load the cluster serves only with seconds of queueing.
   Not ``bench/cluster_bench.py``'s first row (no producer id): the broker
   batches plain messages per loop turn but stores an idempotent producer's one
   by one, so that rate is many times this one;
2. then publishes into that RF=3 stream (min ISR 2, 256 MiB retention in 16 MiB
   segments, so its log stops growing within the warm-up) at ``--load`` of
   that rate (:data:`LOAD`),
   each value unique, with an idempotent producer id and retries, every ack
   recorded (one byte per message: an hour holds tens of millions);
3. reads it meanwhile with one live tail (publish-to-consume latency of every
   message) and one Spark streaming query (``format("jetstream")`` into
   ``noop``, a micro-batch every second);
4. every ``--every`` seconds (10) records each broker's resident memory (all
   of it, and its anonymous part), threads and open files (``/proc``), what its Arrow
   memory pool holds (``jetstream_arrow_allocated_bytes``: recorded, not judged), the
   tail's p99 over that window and the query's lag (committed messages not yet in its last micro-batch);
5. at the end stops the load, lets the tail and the query catch up, stops the
   cluster and checks its files: every acked value retention has not
   deleted stored exactly once and in place, no gap, every replica byte for
   byte the same from their common start (the fault matrix's checker
   holds every value and frame in memory, too much for an hour of this), and
   the tail served every offset once, in order.

It fails (exit 1) on any of those, or when a broker's anonymous memory,
threads or open files grew by more than 10% from the end of the warm-up (``--warm-up``, the
first 10 minutes) to the end (memory: the median of the first tenth of the samples after the
warm-up against that of the last tenth; threads and files: the first sample against the last), or
the tail's p99 doubled (the median of the
last three windows against the median of the first three after warm-up).
Writes ``bench/results/soak-<UTC time>.json`` (every sample) and a plot
beside it (``.png``, matplotlib).  Not part of the suite.

    .venv/bin/python bench/soak.py --hours 1
    .venv/bin/python bench/soak.py --hours 0.1 --warm-up 120   # a short check
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import statistics
import struct
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker_node.log import Log  # noqa: E402
from pyspark_jetstream.client import Ack, AckPolicy, Client  # noqa: E402
from pyspark_jetstream.local import LocalBroker, LocalCluster  # noqa: E402
from pyspark_jetstream.protocol.errors import JetStreamError  # noqa: E402
from tests.broker.harness import scrape  # noqa: E402
from tests.faults.cluster import partition_dirs  # noqa: E402

STREAM = "soak"
PEAK_STREAM = "soak-peak"
RETENTION_BYTES = 256 * 2**20
SEGMENT_BYTES = 16 * 2**20
"""The soak stream's retention and segments: its log stops growing within the warm-up, so what
grows after it is the brokers' own (an hour without retention held ~3 GB of one-message batches,
and each broker's index of them and its mapped pages grew with the log: 290 -> 600 MB)."""
CHECKED = ("rss_anon_bytes", "threads", "open_files")
"""The figures whose growth after the warm-up fails the soak: anonymous memory, not all resident
memory, which counts the pages of the memory-mapped log the kernel may take back."""
SMOOTHED = ("rss_anon_bytes",)
"""The checked figures judged from a tenth of the samples at each end, not one sample."""
LOAD = 0.7
"""The share of the measured peak the soak publishes at (``--load``)."""
GROWTH = 0.10
"""How much a broker's memory, threads or open files may grow after the warm-up."""
RESULTS = ROOT / "bench" / "results"


@dataclass
class Sample:
    """One look at the cluster, ``at`` seconds into the load."""

    at: float
    brokers: dict[str, dict[str, int]]
    """broker -> rss_bytes, rss_anon_bytes, threads, open_files, arrow_allocated_bytes"""
    tail_p99_ms: float | None
    query_lag: int | None
    acked: int


@dataclass
class Run:
    """What a soak run saw."""

    peak_rate: float
    """Measured on the soak stream with its readers reading (the load is a share of it)."""
    peak_rate_alone: float
    """Measured on a stream of its own, nothing reading."""
    target_rate: float
    acked_before: int = 0
    """Acknowledged before the first sample (the peak's measurement on the soak stream)."""
    samples: list[Sample] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    """Publish failures by kind ("first ...": a pipelined publish's; the others: its retries')."""


def proc_figures(pid: int) -> dict[str, int]:
    """A process's resident memory (bytes: all of it, and its anonymous part), threads and open files,
    from ``/proc``."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return {
        "rss_bytes": int(status["VmRSS"].split()[0]) * 1024,
        "rss_anon_bytes": int(status["RssAnon"].split()[0]) * 1024,
        "threads": int(status["Threads"]),
        "open_files": len(os.listdir(f"/proc/{pid}/fd")),
    }


class Load:
    """The paced producer and the live tail, on their own event loop thread.

    At tens of thousands of messages a second an hour holds tens of millions: what is kept per
    message is one byte (acknowledged or not), not the value (the fault matrix's ``History``)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.rate: float | None = None
        """Messages a second once :meth:`pace` is called; until then as fast as 4,000 acks
        pending allow (the peak)."""
        self._paced_from = (0.0, 0)
        self.acked = bytearray()
        """1 at each sequence whose publish was acknowledged."""
        self.acked_count = 0
        self.started = 0.0
        self.sent = 0
        self.errors: dict[str, int] = {}
        self.latencies: list[float] = []
        self.tailed = 0
        """The next offset the tail expects (it checks each comes once, in order)."""
        self.tail_faults = 0
        self._stop = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="soak-load")
        self._tasks: list[asyncio.Future[None]] = []
        self.client: Client | None = None

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(120)

    async def _start(self) -> None:
        cluster = self.cluster
        self.client = await Client.connect(
            nats_urls=cluster.nats_url, broker=",".join(cluster.flights), timeout=10, max_pending=4000
        )
        self._tasks = [asyncio.ensure_future(self._produce()), asyncio.ensure_future(self._tail())]

    def pace(self, rate: float) -> None:
        """Publish at ``rate`` from now on (called from another thread)."""

        def paced() -> None:
            self.rate, self._paced_from = rate, (time.perf_counter(), self.sent)

        self._loop.call_soon_threadsafe(paced)

    def window(self) -> list[float]:
        """The tail's latencies (ms) since the last call."""
        taken, self.latencies = self.latencies, []
        return taken

    def stop_producing(self) -> None:
        """Stop publishing; returns once every publish has its answer."""
        self._stop.set()
        asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(asyncio.shield(self._tasks[0]), 300), self._loop
        ).result(310)

    def close(self) -> None:
        async def finish() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.client is not None:
                await self.client.close()

        asyncio.run_coroutine_threadsafe(finish(), self._loop).result(120)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    async def _produce(self) -> None:
        """Values stamped with their send time, at :attr:`rate`, ``ALL`` acks, pipelined (at most
        4,000 acks pending, as ``cluster_bench``'s peak); one that fails is published again, awaited."""
        assert self.client is not None
        self.started = time.perf_counter()
        pending: dict[asyncio.Future[Ack], int] = {}
        retries: set[asyncio.Future[None]] = set()
        while not self._stop.is_set() or pending:
            if self.rate is None:
                due = self.sent + 4000
            else:
                since, sent = self._paced_from
                due = sent + int((time.perf_counter() - since) * self.rate)
            while not self._stop.is_set() and self.sent < due and len(pending) < 4000:
                self.acked.append(0)
                future = await self.client.publish_async(
                    STREAM,
                    _value(self.sent),
                    ack_policy=AckPolicy.ALL,
                    producer_id="soak",
                    sequence=self.sent,
                )
                assert future is not None
                pending[future] = self.sent
                self.sent += 1
            for future in [f for f in pending if f.done()]:
                sequence = pending.pop(future)
                error = future.exception()
                if error is None:
                    self._ack(sequence)
                else:
                    name = f"first {type(error).__name__}"
                    self.errors[name] = self.errors.get(name, 0) + 1
                    retries.add(asyncio.ensure_future(self._publish(sequence)))
            await asyncio.sleep(0.002)
        await asyncio.gather(*retries, return_exceptions=True)

    async def _publish(self, sequence: int) -> None:
        """Publish ``sequence`` again until it is acked (or refused for good)."""
        assert self.client is not None
        for _ in range(100):
            try:
                await self.client.publish(
                    STREAM,
                    _value(sequence),
                    ack_policy=AckPolicy.ALL,
                    producer_id="soak",
                    sequence=sequence,
                    timeout=10,
                )
            except JetStreamError as exc:
                self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
                if not exc.retriable:
                    return
                await asyncio.sleep(0.1)
                continue
            self._ack(sequence)
            return

    def _ack(self, sequence: int) -> None:
        self.acked[sequence] = 1
        self.acked_count += 1

    def measure_peak(self, messages: int, timeout: float = 600) -> float:
        """The acknowledged rate (messages/s) over the first ``messages``, unpaced (called from
        another thread while the load runs unpaced)."""
        deadline = time.monotonic() + timeout
        while self.acked_count < messages:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.acked_count} of {messages} acknowledged in {timeout:g} s")
            time.sleep(0.01)
        return self.acked_count / (time.perf_counter() - self.started)

    async def _tail(self) -> None:
        assert self.client is not None
        async for batch in self.client.tail(STREAM, start="earliest", follow=5.0):
            now = time.perf_counter_ns()
            offsets, values = batch.column("offset").to_pylist(), batch.column("value").to_pylist()
            self.latencies.extend((now - struct.unpack_from("<q", v)[0]) / 1e6 for v in values)
            if offsets != list(range(self.tailed, self.tailed + len(offsets))):
                self.tail_faults += 1
            self.tailed = offsets[-1] + 1


def _value(sequence: int) -> bytes:
    """A unique value stamped with the time it is sent (the tail's latency)."""
    return struct.pack("<q", time.perf_counter_ns()) + b"soak/%d" % sequence


def check_files(cluster: LocalCluster, acked: bytearray) -> list[str]:
    """The stopped cluster's files against what was acknowledged: every acked sequence that
    retention has not deleted stored exactly once (the first replica read), offsets without gaps,
    every replica's frames from their common start byte for byte the same (their hashes).  One
    line per finding.

    The load is one idempotent producer whose sequences start at 0 on a new stream, so the
    message at offset ``o`` must be sequence ``o``: a message stored twice or out of place breaks
    that, and everything below the log start was deleted by retention (counted, not checked)."""
    seen = bytearray(len(acked))
    hashes: dict[str, str] = {}
    findings: list[str] = []
    with contextlib.ExitStack() as opened:
        logs = [opened.enter_context(Log.open(partition_dirs(b, STREAM)[0])) for b in cluster.brokers]
        common = max(log.log_start_offset for log in logs)
        end = min(log.log_end_offset for log in logs)
        for broker, log in zip(cluster.brokers, logs, strict=True):
            digest = hashlib.sha256()
            offset = common
            while offset < end:
                frames = log.read_frames(offset, max_bytes=16 * 2**20, upper_bound=end)
                for frame in frames:
                    digest.update(frame.data)
                offset = frames[-1].last_offset + 1
            hashes[broker.broker_id] = digest.hexdigest()
        first = logs[0]
        start = expected = offset = first.log_start_offset
        while offset < first.log_end_offset:
            # In reads of 16 MiB: an hour is millions of one-message batches, and a list of them
            # all (``Log.scan``) took the checker past 5 GB.
            batches = first.read(offset, max_bytes=16 * 2**20)
            if not batches:
                findings.append(
                    f"nothing readable from offset {offset} to the log end {first.log_end_offset}"
                )
                break
            for batch in batches:
                offsets = batch.column("offset").to_pylist()
                if offsets[0] != expected:
                    findings.append(f"a gap before offset {offsets[0]} (expected {expected})")
                expected = offsets[-1] + 1
                for at, value in zip(offsets, batch.column("value").to_pylist(), strict=True):
                    sequence = int(value[8:].split(b"/")[1])
                    if sequence != at:
                        findings.append(f"offset {at} holds sequence {sequence}")
                    if sequence < len(seen):
                        seen[sequence] = min(seen[sequence] + 1, 255)
            offset = expected
    retained = acked[start:]
    lost = sum(1 for a, s in zip(retained, seen[start:], strict=True) if a and not s)
    duplicates = sum(s - 1 for s in seen if s > 1)
    if lost:
        findings.append(f"{lost} acknowledged message(s) are not in the log")
    if duplicates:
        findings.append(f"{duplicates} message(s) are in the log more than once")
    if len(set(hashes.values())) != 1:
        findings.append(f"the replicas differ from offset {common} to {end}: {hashes}")
    same = "identical" if len(set(hashes.values())) == 1 else "DIFFER"
    print(
        f"soak: {sum(acked)} acknowledged of {len(acked)} sent; {sum(acked[:start])} deleted by retention "
        f"(the log starts at {start}); of the rest, stored {sum(1 for s in seen[start:] if s)}, lost {lost}, "
        f"duplicates {duplicates}; replicas from {common} to {end} {same}",
        flush=True,
    )
    return findings


def peak_rate(cluster: LocalCluster, messages: int) -> float:
    """The RF=3 pipelined publish rate (messages/s) of the load's kind of producer (idempotent,
    ``ALL`` acks, at most 4,000 acks pending) on a stream of its own."""

    async def measure() -> float:
        client = await Client.connect(
            nats_urls=cluster.nats_url, broker=cluster.flight, timeout=30, max_pending=4000
        )
        try:
            await client.create_stream(PEAK_STREAM, PEAK_STREAM, replication_factor=3, min_insync_replicas=2)
            pending: set[asyncio.Future[Ack]] = set()
            start = time.perf_counter()
            for sequence in range(messages):
                future = await client.publish_async(
                    PEAK_STREAM,
                    _value(sequence),
                    ack_policy=AckPolicy.ALL,
                    producer_id="peak",
                    sequence=sequence,
                )
                assert future is not None
                pending.add(future)
                if len(pending) >= 4000:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for each in done:
                        each.result()  # a failure here is a failed measurement
            for ack in await asyncio.gather(*pending):
                assert ack.ok, ack
            return messages / (time.perf_counter() - start)
        finally:
            await client.close()

    return asyncio.run(measure())


def query_lag(query: object, high_watermark: int) -> int | None:
    """Committed messages the query's last micro-batch had not reached."""
    progress = getattr(query, "lastProgress", None)
    if not progress or not progress.get("sources"):
        return None
    end = json.loads(progress["sources"][0]["endOffset"] or "{}").get(STREAM, {})
    return max(high_watermark - int(end.get("0", 0)), 0)


def verdict(run: Run, warm_up: float) -> list[str]:
    """What failed, one line each: growth after the warm-up, or the tail's p99 doubling."""
    after = [s for s in run.samples if s.at >= warm_up]
    if len(after) < 4:
        return [f"only {len(after)} samples after the {warm_up:g} s warm-up: run longer"]
    failures = []
    # Memory from a tenth of the samples at each end (their medians), not one sample: a broker's
    # moves ~5% between samples as reads come and go.  Threads and files are counts that do not
    # wander: one sample at each end, so a late step is seen.
    ends = max(1, len(after) // 10)
    first, last = after[:ends], after[-ends:]
    for broker in first[0].brokers:
        for name in CHECKED:
            if name in SMOOTHED:
                value = int(statistics.median(s.brokers[broker][name] for s in first))
                grown = int(statistics.median(s.brokers[broker][name] for s in last))
            else:
                value, grown = first[0].brokers[broker][name], last[-1].brokers[broker][name]
            if value and (grown - value) / value > GROWTH:
                failures.append(
                    f"{broker} {name} grew {100 * (grown - value) / value:.0f}%: {value} -> {grown}"
                )
    p99s = [s.tail_p99_ms for s in after if s.tail_p99_ms is not None]
    if len(p99s) >= 6:
        early, late = statistics.median(p99s[:3]), statistics.median(p99s[-3:])
        if late > 2 * early:
            failures.append(f"the tail's p99 doubled: {early:.1f} ms -> {late:.1f} ms")
    return failures


def plot(run: Run, path: Path) -> None:
    """Memory, threads, open files per broker, the tail's p99 and the query's lag over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s.at / 60 for s in run.samples]
    figure, axes = plt.subplots(5, 1, figsize=(9, 13), sharex=True)
    for broker in run.samples[0].brokers:
        for axis, name, scale in zip(
            axes[:3], ("rss_bytes", "threads", "open_files"), (2**20, 1, 1), strict=True
        ):
            axis.plot(minutes, [s.brokers[broker][name] / scale for s in run.samples], label=broker)
        anonymous = [s.brokers[broker]["rss_anon_bytes"] / 2**20 for s in run.samples]
        axes[0].plot(minutes, anonymous, linestyle="--", label=f"{broker}, anonymous")
        arrow = [s.brokers[broker].get("arrow_allocated_bytes", 0) / 2**20 for s in run.samples]
        axes[0].plot(minutes, arrow, linestyle=":", label=f"{broker}, Arrow's pool")
    for axis, title in zip(axes[:3], ("resident memory (MiB)", "threads", "open files"), strict=True):
        axis.set_ylabel(title)
        axis.legend(fontsize="small")
    axes[3].plot(minutes, [s.tail_p99_ms for s in run.samples])
    axes[3].set_ylabel("tail p99 (ms)")
    axes[4].plot(minutes, [s.query_lag for s in run.samples])
    axes[4].set_ylabel("query lag (messages)")
    axes[4].set_xlabel("minutes under load")
    share = run.target_rate / run.peak_rate
    figure.suptitle(f"soak at {run.target_rate:.0f} msg/s ({share:.0%} of {run.peak_rate:.0f}), RF=3")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def soak(
    hours: float, warm_up: float, every: float, peak_messages: int, base: Path, load_share: float = LOAD
) -> tuple[Run, list[str]]:
    """Run the soak (see the module docstring); what it saw and what failed."""
    from pyspark_jetstream.spark.delta import delta_session

    with LocalCluster(3, base_dir=base / "cluster", extra_config="[metrics]\nport = 0\n") as cluster:
        alone = peak_rate(cluster, peak_messages)
        print(f"soak: peak alone {alone:.0f} msg/s (RF=3, pipelined, nothing reading)", flush=True)
        admin = asyncio.run(_create(cluster))
        load = Load(cluster)
        spark = delta_session("pyspark-jetstream-soak", **{"spark.sql.shuffle.partitions": "2"})
        query = (
            spark.readStream.format("jetstream")
            .option("servers", ",".join(cluster.flights))
            .option("stream", STREAM)
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(base / "checkpoint"))
            .trigger(processingTime="1 second")
            .start()
        )
        load.start()  # once Spark's JVM is up: its start would weigh on the first samples
        peak = load.measure_peak(peak_messages)
        run = Run(peak, alone, load_share * peak)
        load.pace(run.target_rate)
        print(
            f"soak: peak {peak:.0f} msg/s with the tail and the query reading; "
            f"load {run.target_rate:.0f} msg/s",
            flush=True,
        )
        load.window()  # the peak's latencies are not the load's
        run.acked_before = load.acked_count
        started = time.monotonic()
        try:
            for k in range(1, int(hours * 3600 / every) + 1):
                time.sleep(max(0.0, started + k * every - time.monotonic()))
                run.samples.append(_sample(cluster, load, query, time.monotonic() - started, admin))
                last = run.samples[-1]
                print(
                    f"soak: {last.at / 60:5.1f} min  acked {last.acked}  p99 {last.tail_p99_ms} ms  "
                    f"lag {last.query_lag}  errors {load.errors}",
                    flush=True,
                )
                if query.exception() is not None:
                    raise RuntimeError(f"the Spark query failed: {query.exception()}")
            load.stop_producing()
            failures = _drain(load, query, admin)
            run.errors = dict(load.errors)
        finally:
            query.stop()
            spark.stop()
            load.close()
    if run.samples:
        reached = (run.samples[-1].acked - run.acked_before) / run.samples[-1].at
        print(
            f"soak: acknowledged {reached:.0f} msg/s on average of the {run.target_rate:.0f} asked",
            flush=True,
        )
        if reached < 0.9 * run.target_rate:
            failures.append(
                f"the load reached {reached:.0f} msg/s, not the {run.target_rate:.0f} asked: the machine "
                "could not keep up (is it shared?)"
            )
    failures += check_files(cluster, load.acked)
    if load.tail_faults:
        failures.append(f"the tail was served offsets out of order or twice {load.tail_faults} time(s)")
    return run, failures + verdict(run, warm_up)


async def _create(cluster: LocalCluster) -> dict[str, str]:
    client = await Client.connect(nats_urls=cluster.nats_url, broker=cluster.flight, timeout=30)
    try:
        await client.create_stream(
            STREAM,
            STREAM,
            replication_factor=3,
            min_insync_replicas=2,
            retention_bytes=RETENTION_BYTES,
            segment_bytes=SEGMENT_BYTES,
        )
    finally:
        await client.close()
    return {"nats": cluster.nats_url, "flight": cluster.flight}


def _high_watermark(admin: dict[str, str]) -> int:
    async def look() -> int:
        client = await Client.connect(nats_urls=admin["nats"], broker=admin["flight"], timeout=30)
        try:
            return (await client.describe_stream(STREAM)).partitions[0].high_watermark
        finally:
            await client.close()

    return asyncio.run(look())


def arrow_bytes(broker: LocalBroker) -> int:
    """What a broker's Arrow memory pool holds now (``jetstream_arrow_allocated_bytes``); -1 when
    its /metrics did not answer (a slow scrape must not end an hour's run)."""
    try:
        samples = scrape(broker)
    except OSError as exc:
        print(f"soak: {broker.metrics}/metrics did not answer: {exc}", flush=True)
        return -1
    return int(samples[("jetstream_arrow_allocated_bytes", ())])


def _sample(cluster: LocalCluster, load: Load, query: object, at: float, admin: dict[str, str]) -> Sample:
    latencies = load.window()
    p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 100 else None
    brokers = {
        b.broker_id: proc_figures(b.process.pid) | {"arrow_allocated_bytes": arrow_bytes(b)}
        for b in cluster.brokers
        if b.process is not None
    }
    return Sample(at, brokers, p99, query_lag(query, _high_watermark(admin)), load.acked_count)


def _drain(load: Load, query: object, admin: dict[str, str], timeout: float = 120) -> list[str]:
    """Wait for the tail and the query to reach the end; what did not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        end = _high_watermark(admin)
        if load.tailed >= end and query_lag(query, end) == 0:
            return []
        time.sleep(1)
    return [f"the tail or the query did not reach the end within {timeout:g} s after the load stopped"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=1.0, help="how long the load runs (default 1)")
    parser.add_argument("--warm-up", type=float, default=600.0, help="seconds before growth counts (600)")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples (10)")
    parser.add_argument(
        "--peak-messages", type=int, default=50_000, help="messages to measure the peak (50000)"
    )
    parser.add_argument(
        "--load", type=float, default=LOAD, help=f"the share of the peak to publish at ({LOAD})"
    )
    args = parser.parse_args(argv)
    if not 0 < args.load <= 1:
        parser.error(f"--load must be in (0, 1], not {args.load}")
    if args.hours <= 0 or args.every <= 0 or args.warm_up < 0 or args.warm_up >= args.hours * 3600:
        parser.error("--hours and --every must be positive, and --warm-up shorter than the run")
    base = Path(tempfile.mkdtemp(prefix="jetstream-soak-hours-"))
    run, failures = soak(args.hours, args.warm_up, args.every, args.peak_messages, base, args.load)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"soak-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    summary = {"hours": args.hours, "warm_up": args.warm_up, "load": args.load, "failures": failures}
    summary |= asdict(run)
    stem.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    plot(run, stem.with_suffix(".png"))
    print("\n".join(f"soak: FAILED: {f}" for f in failures) or "soak: passed", flush=True)
    print(f"soak: samples in {stem}.json, plot in {stem}.png")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
