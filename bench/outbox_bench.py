"""Outbox benchmark: the harvester against the bare SQL of its algorithm, measured in the same run.

A real PostgreSQL (:class:`~pyspark_jetstream.local_postgres.LocalPostgres`,
fsync on) and one broker with an embedded nats-server
(:class:`~pyspark_jetstream.local.LocalBroker`) on this machine; the harvester
runs in this process on an event loop of its own thread, with the defaults of
``conf/outbox.toml`` (batches of 500, 1,000 in flight, ``ack_policy = "all"``,
``poll = 0.05`` s) except a 0.5 s takeover wait.  Rows carry 100-byte values
and keys from 1,000 distinct ones; each stream has one partition.

1. Harvest: with the harvester leading, one transaction commits N rows
   (100,000; ``--quick`` 50,000) into the outbox; rows/s from that commit until
   every row is acked and purged.  The stream is read back afterwards: N
   messages, each row once.  Three rounds of this and of 2., taking turns at
   going first (the harvester stopped between them); the medians are reported.
2. The peer, SQL only: the same N rows, then a loop of the store's own
   ``mark`` and ``purge`` (:mod:`pyspark_jetstream.outbox.outbox_table`, batches of
   500, one connection, each mark above the last one's rows as the harvester
   marks) until the outbox is empty, publishing nothing: the
   database's ceiling for mark-purge.  The target ratio is harvest / SQL only.
   A second ceiling, publish only, is the client alone publishing N messages
   as the harvester does (batches of 500 rows with their message ids, keys,
   ack policy and 1,000 rows in flight), with no database.
3. Commit to ack at 1,000 rows/s: writer threads in a process of their own
   (:data:`WRITERS`) commit one row per transaction, each row at its due time
   (row n at n / 1,000 s), and note its commit time (``time.time()`` once
   ``COMMIT`` returns) while the harvester runs.  The ack
   time is taken in the harvester when the broker's ack arrives (a subclass
   hooks the harvester's ack callback, the one place that sees it); the
   broker's append time (the stored message's ``timestamp``, matched to its row
   by the ``Nats-Msg-Id`` header) is reported beside it.  One machine, one
   clock.  Measured twice: with the default ``poll`` (an empty mark waits that
   long) and with 0.005 s.

Each measure is also run on SQLite (a file in WAL mode, ``synchronous=FULL``,
the store's own settings).  Prints a table; the last line is one JSON object.

    python bench/outbox_bench.py [--quick | --smoke]
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sizes import last_line, machine_cpu_seconds, parser, pick, size_of
from pyspark_jetstream.client import AckPolicy, Client, SyncClient
from pyspark_jetstream.local import LocalBroker
from pyspark_jetstream.local_postgres import LocalPostgres
from pyspark_jetstream.outbox import Harvester, HarvesterConfig, init_outbox, open_store
from pyspark_jetstream.outbox.marks import next_mark_after
from pyspark_jetstream.outbox.outbox_table import Store

VALUE = b"x" * 100
KEYS = 1000
TABLE = "outbox"
RATE = 1000
"""Rows per second the latency writer commits."""
FAST_POLL = 0.005
"""The latency is measured again with this ``poll`` (the default, 0.05 s, bounds it from below)."""
DEADLINE = 2.0
"""The harvesters' leadership deadline (seconds; the default is 5)."""


class AckTimedHarvester(Harvester):
    """A harvester that notes when each row's ack arrives (``time.time()`` by row id)."""

    def __init__(self, config: HarvesterConfig) -> None:
        super().__init__(config)
        self.acked_at: dict[int, float] = {}
        settle_later = self._in_flight._settle_later

        def noted(unit: Any, done: Any, error: Any) -> None:
            # The done-callback of a publish future (a batch of rows, or one) of the rows in
            # flight: the moment the broker's ack arrives.
            stored = done is not None and not done.cancelled() and done.exception() is None
            if error is None and stored and done.result().ok:
                now = time.time()
                for record in unit.records:
                    self.acked_at.setdefault(record.id, now)
            settle_later(unit, done, error)

        self._in_flight._settle_later = noted  # type: ignore[method-assign]


class Harvesting:
    """An :class:`AckTimedHarvester` on its own event loop in a thread, until :meth:`stop`."""

    def __init__(self, config: HarvesterConfig) -> None:
        self.harvester = AckTimedHarvester(config)
        self.error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, daemon=True, name="harvester")
        self._thread.start()
        deadline = time.monotonic() + 60
        while self.harvester.status.role != "leader":
            self.check()
            if time.monotonic() > deadline:
                status = self.harvester.status
                raise RuntimeError(
                    f"the harvester did not become leader within 60 s ({status.terms} terms begun, "
                    f"role {status.role}, last error: {status.last_error})"
                )
            time.sleep(0.01)

    def _main(self) -> None:
        try:
            self._loop.run_until_complete(self.harvester.run())
        except BaseException as exc:  # raised again by check() and stop()
            self.error = exc

    def check(self) -> None:
        """Raise what ended the harvester, if it died."""
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self.harvester.stop)
        self._thread.join(60)
        self._loop.close()
        self.check()


# ---- the database side ------------------------------------------------------------------


def insert_rows(database: str, stream: str, n: int) -> float:
    """Commit ``n`` rows in one transaction; returns the time (``perf_counter``) the commit returned."""
    rows = [(stream, b"k%d" % (i % KEYS), VALUE) for i in range(n)]
    if database.startswith("sqlite:"):
        db = sqlite3.connect(database.removeprefix("sqlite:///"), timeout=60, isolation_level=None)
        try:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(f"INSERT INTO {TABLE} (stream, key, value) VALUES (?, ?, ?)", rows)
            db.execute("COMMIT")
            return time.perf_counter()
        finally:
            db.close()
    with psycopg.connect(database) as db:
        with db.cursor().copy(f"COPY {TABLE} (stream, key, value) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        db.commit()
        return time.perf_counter()


def sql_only(database: str, n: int, batch_size: int) -> tuple[float, float]:
    """Rows/s of the store's mark and purge alone over ``n`` fresh rows, one batch at a time, and
    the machine's CPU seconds meanwhile."""
    insert_rows(database, "unused", n)
    store = open_store(database, TABLE)
    leader_id = uuid.uuid4().hex
    done = 0
    try:
        start, cpu = time.perf_counter(), machine_cpu_seconds()
        after, marks = 0, 0  # as the harvester marks: above the last row of a full mark, else from the first
        while records := store.mark(leader_id, batch_size, after):
            store.purge([r.id for r in records])
            done += len(records)
            marks += 1
            after = next_mark_after(records, batch_size, marks)
        elapsed, cpu = time.perf_counter() - start, machine_cpu_seconds() - cpu
    finally:
        store.close()
    assert done == n, f"marked and purged {done} of {n} rows"
    return n / elapsed, cpu


WRITERS = {"postgresql": 4, "sqlite": 1}
"""Connections the latency writer spreads its transactions over: on PostgreSQL one falls behind
1,000 commits/s here; SQLite has one writer at a time anyway, and more connections only queue
for its lock ahead of the harvester's marks (its busy handler sleeps up to 100 ms a try)."""


@dataclass
class Writer:
    """Commits one row per transaction at ``rate`` rows/s in all, noting each row's commit time by id."""

    database: str
    stream: str
    total: int
    rate: int = RATE
    committed: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0

    def run(self) -> Writer:
        """Write ``total`` rows from :data:`WRITERS` threads; return once all are committed."""
        start = time.perf_counter()
        count = WRITERS[self.database.split(":", 1)[0]]
        threads = [
            threading.Thread(target=self._write, args=(w, count, start), name=f"writer-{w}")
            for w in range(count)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.seconds = time.perf_counter() - start
        assert len(self.committed) == self.total, f"{len(self.committed)} of {self.total} rows committed"
        return self

    def _write(self, writer: int, writers: int, start: float) -> None:
        insert = f"INSERT INTO {TABLE} (stream, key, value) VALUES (%s, %s, %s) RETURNING id"
        lite = self.database.startswith("sqlite:")
        if lite:
            insert = insert.replace("%s", "?")
            db: Any = sqlite3.connect(
                self.database.removeprefix("sqlite:///"), timeout=60, isolation_level=None
            )
            db.execute("PRAGMA synchronous=FULL")
        else:
            db = psycopg.connect(self.database, autocommit=True)
        mine = range(writer, self.total, writers)  # row n is due at n / rate seconds
        try:
            for n in mine:
                wait = start + n / self.rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                db.execute("BEGIN IMMEDIATE" if lite else "BEGIN")
                row_id = db.execute(insert, (self.stream, b"k%d" % (n % KEYS), VALUE)).fetchone()[0]
                db.execute("COMMIT")
                self.committed[row_id] = time.time()
        finally:
            db.close()


# ---- the broker side --------------------------------------------------------------------


def read_stream(client: SyncClient, stream: str) -> list[tuple[int, float]]:
    """(row id, append time in epoch seconds) of every stored message, from the ``Nats-Msg-Id`` header."""
    out: list[tuple[int, float]] = []
    offset = 0
    while True:
        result = client.fetch(stream, 0, start=offset)
        if not result.num_rows:
            return out
        table = result.to_table()
        stamps = table.column("timestamp").cast("int64").to_pylist()
        for headers, stamp in zip(table.column("headers").to_pylist(), stamps, strict=True):
            message_id = next(h["value"] for h in headers if h["key"] == "Nats-Msg-Id")
            out.append((int(message_id.decode().rsplit(":", 1)[1]), stamp / 1e6))
        offset = result.next_offset


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1]


async def publish_only(
    nats_url: str, stream: str, n: int, in_flight: int, batch_rows: int
) -> tuple[float, float]:
    """Msg/s of the client alone publishing what the harvester would: the same rows (keys, message
    ids) in batches of ``batch_rows`` (the harvester's marks of one partition's stream), at most
    ``in_flight`` rows unacked; and the machine's CPU seconds meanwhile."""
    async with await Client.connect(nats_urls=[nats_url], timeout=30) as client:
        await client.create_stream(stream, stream)
        window = asyncio.Semaphore(max(in_flight // batch_rows, 1))
        start, cpu = time.perf_counter(), machine_cpu_seconds()

        async def one(first: int) -> Any:
            rows = range(first, min(first + batch_rows, n))
            batch = pa.record_batch(
                {
                    "key": pa.array([b"k%d" % (i % KEYS) for i in rows], pa.binary()),
                    "value": pa.array([VALUE] * len(rows), pa.binary()),
                }
            )
            try:
                return await client.publish_batch(
                    stream,
                    batch,
                    message_ids=[f"{TABLE}:{i}" for i in rows],
                    ack_policy=AckPolicy.ALL,
                    timeout=30,
                )
            finally:
                window.release()

        tasks = []
        for first in range(0, n, batch_rows):
            await window.acquire()
            tasks.append(asyncio.ensure_future(one(first)))
        acks = await asyncio.gather(*tasks)
        elapsed, cpu = time.perf_counter() - start, machine_cpu_seconds() - cpu
    assert all(a is not None and a.ok for a in acks)
    return n / elapsed, cpu


def harvest(harvesting: Harvesting, watch: Store, stream: str, n: int) -> tuple[float, float]:
    """Rows/s from the commit of ``n`` rows until all are acked and purged, and the machine's CPU
    seconds meanwhile."""
    status = harvesting.harvester.status
    published_before = status.published
    committed_at = insert_rows(harvesting.harvester.config.database, stream, n)
    cpu = machine_cpu_seconds()
    while status.published - published_before < n:  # then the purges: the outbox empty
        harvesting.check()
        time.sleep(0.01)
    while watch.backlog():
        time.sleep(0.005)
    return n / (time.perf_counter() - committed_at), machine_cpu_seconds() - cpu


def steady(
    harvesting: Harvesting, watch: Store, client: SyncClient, stream: str, seconds: float
) -> dict[str, float]:
    """Commit-to-ack and commit-to-append latencies (ms) of rows committed at :data:`RATE` per second."""
    status = harvesting.harvester.status
    published_before = status.published
    writer = Writer(harvesting.harvester.config.database, stream, int(seconds * RATE))
    # In a process of its own: threads here would wait for the GIL behind the harvester's thread.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        writer = pool.submit(writer.run).result()
    deadline = time.monotonic() + 60
    while status.published - published_before < writer.total or watch.backlog():
        harvesting.check()
        assert time.monotonic() < deadline, "the steady rows were not all harvested within 60 s"
        time.sleep(0.01)
    acked_at = harvesting.harvester.acked_at
    appended = dict(read_stream(client, stream))
    assert sorted(appended) == sorted(writer.committed), "each steady row stored once"
    to_ack = [(acked_at[i] - t) * 1000 for i, t in writer.committed.items()]
    to_append = [(appended[i] - t) * 1000 for i, t in writer.committed.items()]
    return {
        "writer_rows_per_s": writer.total / writer.seconds,
        "commit_to_ack_p50_ms": statistics.median(to_ack),
        "commit_to_ack_p99_ms": _percentile(to_ack, 0.99),
        "commit_to_append_p50_ms": statistics.median(to_append),
        "commit_to_append_p99_ms": _percentile(to_append, 0.99),
    }


def bulk_rates(
    name: str, config: HarvesterConfig, watch: Store, client: SyncClient, n: int, runs: int
) -> dict[str, float]:
    """Median harvest and SQL-only rows/s of ``runs`` rounds, the two taking turns at going first,
    and the machine's median CPU µs per row for each (all cores: the database, the harvester, the
    broker and nats-server).

    They alternate so that both meet the table in the same state (its dead rows, PostgreSQL's
    autovacuum), and the harvester stops between rounds: its marks would take the SQL loop's rows.
    """
    rates: dict[str, list[float]] = {"harvest": [], "sql_only": []}
    cpu: dict[str, list[float]] = {side: [] for side in rates}
    for i in range(runs):
        for side in sorted(rates, reverse=i % 2 == 1):
            if side == "sql_only":
                rate, spent = sql_only(config.database, n, config.batch_size)
            else:
                stream = f"{name}-bulk-{i}"
                client.create_stream(stream, stream)
                harvesting = Harvesting(config)
                try:
                    rate, spent = harvest(harvesting, watch, stream, n)
                finally:
                    harvesting.stop()
                stored = read_stream(client, stream)
                assert len(stored) == n == len({r for r, _ in stored}), f"{len(stored)} messages for {n} rows"
            rates[side].append(rate)
            cpu[side].append(spent / n * 1e6)
    return {f"{side}_rows_per_s": statistics.median(values) for side, values in rates.items()} | {
        f"{side}_cpu_us_per_row": statistics.median(values) for side, values in cpu.items()
    }


def measure(
    name: str, database: str, nats_url: str, client: SyncClient, n: int, latency_s: float, runs: int
) -> dict[str, float]:
    """Harvest rows/s, its two ceilings (SQL only, publish only) and commit-to-ack latency on one database."""
    # The deadline is only paid once per harvester start (the takeover wait, before any figure);
    # a leader must confirm its lock within half of it, so a shorter one loses its terms on a busy
    # machine (0.5 s did, with the test suite beside it).
    config = HarvesterConfig(database=database, nats=nats_url, deadline=DEADLINE, report_every=3600)
    for stream in (f"{name}-steady", f"{name}-steady-fast"):
        client.create_stream(stream, stream)
    results: dict[str, float] = {}
    watch = open_store(database, TABLE)  # counts the rows left
    try:
        results.update(bulk_rates(name, config, watch, client, n, runs))
        harvesting = Harvesting(config)
        try:
            results.update(steady(harvesting, watch, client, f"{name}-steady", latency_s))
        finally:
            harvesting.stop()
        harvesting = Harvesting(replace(config, poll=FAST_POLL))
        try:
            fast = steady(harvesting, watch, client, f"{name}-steady-fast", latency_s)
        finally:
            harvesting.stop()
    finally:
        watch.close()
    results.update({f"fast_poll_{k}": v for k, v in fast.items()})
    results["ratio_to_sql_only"] = results["harvest_rows_per_s"] / results["sql_only_rows_per_s"]
    rate, cpu = asyncio.run(
        publish_only(nats_url, f"{name}-publish", n, config.max_in_flight, config.batch_size)
    )
    results["publish_only_msgs_per_s"], results["publish_only_cpu_us_per_row"] = rate, cpu / n * 1e6
    results["ratio_to_publish_only"] = results["harvest_rows_per_s"] / results["publish_only_msgs_per_s"]
    return results


def run(size: str) -> dict[str, float]:
    n = pick(size, smoke=500, quick=50_000, full=100_000)
    runs = pick(size, smoke=1, quick=3, full=3)
    latency_s = pick(size, smoke=0.5, quick=5.0, full=30.0)
    workdir = Path(tempfile.mkdtemp(prefix="outbox-bench-"))
    results: dict[str, float] = {"rows": n, "load_1min_before": os.getloadavg()[0]}
    postgres = LocalPostgres().start()
    broker = LocalBroker(workdir / "data", log_level="WARNING").start()
    try:
        assert broker.nats_url is not None
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
            dsn = postgres.create_database("bench")
            init_outbox(dsn, TABLE)
            results.update(measure("pg", dsn, broker.nats_url, client, n, latency_s, runs))
            sqlite = f"sqlite:///{workdir / 'app.db'}"
            init_outbox(sqlite, TABLE)
            lite = measure("sqlite", sqlite, broker.nats_url, client, n, latency_s, runs)
            results.update({f"sqlite_{k}": v for k, v in lite.items()})
    finally:
        broker.stop()
        postgres.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    results["load_1min_after"] = os.getloadavg()[0]
    return results


def main() -> None:
    args = parser(__doc__, quick_help="50,000 rows three times and 5 s of latency, within 120 s").parse_args()
    started = time.monotonic()
    r = run(size_of(args))
    n = int(r["rows"])
    print(f"{n:,} rows of {len(VALUE)} bytes; latency at {RATE:,} rows/s, one row per transaction")
    print(f"{'measure':<44} {'PostgreSQL':>12} {'SQLite':>12} {'target':>8}")
    rows = [
        ("harvest (rows/s)", "harvest_rows_per_s", ""),
        ("SQL only: mark + purge (rows/s)", "sql_only_rows_per_s", ""),
        ("harvest / SQL only", "ratio_to_sql_only", ">= 0.7"),
        ("publish only: client + broker (msg/s)", "publish_only_msgs_per_s", ""),
        ("harvest / publish only", "ratio_to_publish_only", ""),
        ("machine CPU per row, harvest (µs, all cores)", "harvest_cpu_us_per_row", ""),
        ("  SQL only (µs)", "sql_only_cpu_us_per_row", ""),
        ("  publish only (µs)", "publish_only_cpu_us_per_row", ""),
    ]
    for prefix, poll in (("", 0.05), ("fast_poll_", FAST_POLL)):
        rows += [
            (f"poll {poll:g} s: writer's rate (rows/s)", f"{prefix}writer_rows_per_s", ""),
            (f"poll {poll:g} s: commit to ack p50 (ms)", f"{prefix}commit_to_ack_p50_ms", ""),
            (f"poll {poll:g} s: commit to ack p99 (ms)", f"{prefix}commit_to_ack_p99_ms", ""),
            (f"poll {poll:g} s: commit to append p50 (ms)", f"{prefix}commit_to_append_p50_ms", ""),
            (f"poll {poll:g} s: commit to append p99 (ms)", f"{prefix}commit_to_append_p99_ms", ""),
        ]
    for name, key, target in rows:
        print(f"{name:<44} {r[key]:>12,.2f} {r['sqlite_' + key]:>12,.2f} {target:>8}")
    print(
        f"load average (1 min) {r['load_1min_before']:.2f} before, {r['load_1min_after']:.2f} after; "
        f"{time.monotonic() - started:.0f} s in all"
    )
    print(last_line(r))


if __name__ == "__main__":
    main()
