"""Cluster benchmark: three brokers with RF=3 against NATS JetStream R3, measured in the same run.

Ours: a ZooKeeper (Debian's package), one nats-server and three broker
processes (``LocalCluster``, default settings: a 3 s ZooKeeper session
timeout).  JetStream: three clustered nats-servers from the same binary with
an R3 file stream.  100-byte values; the same nats-py client in this process
drives both.

1. single-message publishes, pipelined (at most 4,000 acks pending): ours
   with ``ALL`` acks on an RF=3 stream against JetStream R3 ``publish_async``;
2. 10,000-row Arrow batch publishes: ``ALL`` on RF=3 against our own RF=1
   ``LEADER`` (what replication costs);
3. failover: publishes acked one at a time (``ALL``, retried every 0.25 s);
   the partition leader gets SIGKILL; the time from the kill to the next
   ack.  JetStream: the same, killing the R3 stream's leader server;
4. publish-to-consumer latency at a steady 1,000 messages/s (plain NATS
   publishes with a send timestamp; consumers see only committed messages):
   our ``tail`` against a JetStream pull consumer, RF=3 / R3; with the
   CPU time the servers used meanwhile per message (our brokers and their
   nats-server against the three nats-servers), from ``/proc``;
5. the transport's floor under one replication turn: a bare Flight
   ``do_exchange`` between two Python processes, one message each way per
   turn, as the replication stream does (no log, no broker code);
6. reassignment: an RF=2 partition holding 1 GiB (64 MiB with ``--quick``)
   moved off its leader to the third broker at a replication throttle
   (``reassign_seconds``, beside the throttle's own floor, size / rate),
   while 10,000-row batches are published with ``ALL`` acks into a
   3-partition RF=2 stream led by every broker; their rows/s during the
   move against the same publishing just before it, for as long as the
   move's floor (``reassign_produce_ratio``).  Equal windows matter: the
   publishing writes about as fast as the disk takes, and a few seconds of
   it fit in the page cache where a longer window meets the disk's own rate.

Prints a table; the last line is one JSON object.

    python bench/cluster_bench.py [--quick | --smoke]
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats
import pyarrow as pa
from nats.js.api import StorageType, StreamConfig
from pyarrow import flight

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.broker_bench import _percentile, push_latencies, tail_latencies, with_cpu
from bench.sizes import last_line, parser, pick, size_of
from broker_node.nats_server import NatsServer
from broker_node.zookeeper_server import free_port
from pyspark_jetstream.client import AckPolicy, Client
from pyspark_jetstream.local import LocalCluster
from pyspark_jetstream.protocol.errors import JetStreamError

VALUE = 100
WINDOW = 4000
RETRY = 0.25


# ---- the transport's floor ---------------------------------------------------------------

EXCHANGE_SERVER = """
import sys
import pyarrow as pa
from pyarrow import flight

SCHEMA = pa.schema([("frame", pa.large_binary())])


class Turns(flight.FlightServerBase):
    def do_exchange(self, context, descriptor, reader, writer):
        writer.begin(SCHEMA)
        batch = pa.record_batch([pa.array([b"x" * 100], pa.large_binary())], schema=SCHEMA)
        while True:
            writer.write_with_metadata(batch, pa.py_buffer(b"{}"))
            try:
                reader.read_chunk()
            except StopIteration:
                return


server = Turns("grpc://127.0.0.1:0")
print(server.port, flush=True)
sys.stdin.read()
server.shutdown()
"""


def exchange_turn_us(turns: int) -> float:
    """Median microseconds of one turn of a bare Flight exchange with another process."""
    server = subprocess.Popen(
        [sys.executable, "-c", EXCHANGE_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        client = flight.connect(f"grpc://127.0.0.1:{server.stdout.readline().strip()}")
        writer, reader = client.do_exchange(flight.FlightDescriptor.for_command(b"turns"))
        samples = []
        for _ in range(turns):
            started = time.perf_counter()
            reader.read_chunk()
            writer.write_metadata(pa.py_buffer(b"{}"))
            samples.append((time.perf_counter() - started) * 1e6)
        writer.done_writing()
        with contextlib.suppress(StopIteration):
            while True:
                reader.read_chunk()
        writer.close()
        client.close()
        return statistics.median(samples)
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(10)


# ---- JetStream R3 ------------------------------------------------------------------------


class JetStreamCluster:
    """Three clustered nats-servers with JetStream."""

    def __init__(self, workdir: Path) -> None:
        self.routes = [free_port() for _ in range(3)]
        self.servers = []
        for n, route in enumerate(self.routes, start=1):
            others = ", ".join(f"nats-route://127.0.0.1:{r}" for r in self.routes if r != route)
            config = (
                f"server_name: n{n}\n"
                f'jetstream {{ store_dir: "{workdir / f"js{n}"}" }}\n'
                f"cluster {{ name: bench, listen: 127.0.0.1:{route}, routes: [{others}] }}\n"
            )
            self.servers.append(NatsServer(config=config))

    def start(self) -> JetStreamCluster:
        for server in self.servers:
            server.launch()
        for server in self.servers:
            server.wait_ready()
        return self

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers if s.running]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


async def js_ready(js: nats.js.JetStreamContext, name: str, subject: str) -> None:
    """Create an R3 file stream, waiting for the JetStream cluster to elect its meta leader."""
    deadline = time.monotonic() + 60
    while True:
        try:
            await js.add_stream(
                StreamConfig(name=name, subjects=[subject], storage=StorageType.FILE, num_replicas=3)
            )
            return
        except (nats.js.errors.Error, nats.errors.Error):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def js_single(js: nats.js.JetStreamContext, name: str, n: int) -> float:
    await js_ready(js, name, f"js.{name}")
    payload = b"x" * VALUE
    start = time.perf_counter()
    for _ in range(n):
        await js.publish_async(f"js.{name}", payload)
    await js.publish_async_completed()
    return n / (time.perf_counter() - start)


async def js_failover(js_cluster: JetStreamCluster, name: str) -> float:
    nc = await nats.connect(servers=js_cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    js = nc.jetstream()
    await js_ready(js, name, f"js.{name}")
    for _ in range(50):
        await js.publish(f"js.{name}", b"x" * VALUE)
    info = await js.stream_info(name)
    leader = info.cluster.leader if info.cluster else None
    victim = next(s for s in js_cluster.servers if leader == f"n{js_cluster.servers.index(s) + 1}")
    victim.kill()
    killed = time.perf_counter()
    while True:
        try:
            await js.publish(f"js.{name}", b"x" * VALUE, timeout=RETRY)
            break
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error):
            await asyncio.sleep(0)
    took = time.perf_counter() - killed
    await nc.close()
    return took


async def js_latency(js: nats.js.JetStreamContext, nc: nats.NATS, name: str, seconds: float) -> list[float]:
    await js_ready(js, name, f"js.{name}")
    return await push_latencies(js, nc, name, seconds)


# ---- ours ---------------------------------------------------------------------------------


async def ours_single(client: Client, name: str, n: int) -> float:
    await client.create_stream(name, f"bench.{name}", replication_factor=3, min_insync_replicas=2)
    payload = b"x" * VALUE
    start = time.perf_counter()
    futures = [await client.publish_async(name, payload, ack_policy=AckPolicy.ALL) for _ in range(n)]
    await asyncio.gather(*futures)
    return n / (time.perf_counter() - start)


async def ours_batches(client: Client, name: str, rows: int, factor: int, policy: AckPolicy) -> float:
    await client.create_stream(name, f"bench.{name}", replication_factor=factor)
    batch = pa.table({"value": pa.array([b"x" * VALUE] * 10_000, pa.binary())})
    start = time.perf_counter()
    for _ in range(rows // 10_000):
        await client.publish_batch(name, batch, ack_policy=policy, timeout=60)
    return rows / (time.perf_counter() - start)


async def ours_failover(cluster: LocalCluster, client: Client, name: str) -> float:
    await client.create_stream(name, f"bench.{name}", replication_factor=3, min_insync_replicas=2)
    sequence = 0
    for _ in range(50):
        await client.publish(name, b"x" * VALUE, ack_policy=AckPolicy.ALL, producer_id="f", sequence=sequence)
        sequence += 1
    leader = (await client.describe_stream(name)).partitions[0].leader
    cluster.broker(leader).kill()
    killed = time.perf_counter()
    while True:
        try:
            await client.publish(
                name,
                b"x" * VALUE,
                ack_policy=AckPolicy.ALL,
                producer_id="f",
                sequence=sequence,
                timeout=RETRY,
            )
            break
        except JetStreamError:
            await asyncio.sleep(0)
    return time.perf_counter() - killed


async def ours_latency(client: Client, nc: nats.NATS, name: str, seconds: float) -> list[float]:
    await client.create_stream(name, f"bench.{name}", replication_factor=3, min_insync_replicas=2)
    return await tail_latencies(client, nc, name, seconds)


async def produce_for(client: Client, name: str, partitions: int, stop: asyncio.Event | float) -> float:
    """Publish 10,000-row batches with ALL acks, partition after partition, until ``stop`` is set
    (or for ``stop`` seconds); rows/s."""
    batch = pa.table({"value": pa.array([b"x" * VALUE] * 10_000, pa.binary())})
    rows = 0
    start = time.perf_counter()
    while not (stop.is_set() if isinstance(stop, asyncio.Event) else time.perf_counter() - start >= stop):
        partition = (rows // batch.num_rows) % partitions
        await client.publish_batch(name, batch, partition=partition, ack_policy=AckPolicy.ALL, timeout=60)
        rows += batch.num_rows
    return rows / (time.perf_counter() - start)


async def ours_reassign(
    client: Client, name: str, size: int, throttle: int, baseline_s: float
) -> dict[str, float]:
    """Fill an RF=2 partition with ``size`` bytes, then move it off its leader while publishing
    into another stream led by every broker."""
    await client.create_stream(name, f"bench.{name}", replication_factor=2, segment_bytes=64 << 20)
    traffic = f"{name}-traffic"
    await client.create_stream(traffic, f"bench.{traffic}", partitions=3, replication_factor=2)
    filler = pa.table({"value": pa.array([b"f" * 1000] * 900, pa.binary())})  # under NATS's 1 MiB
    for _ in range(max(size // (1000 * 900), 1)):
        await client.publish_batch(name, filler, ack_policy=AckPolicy.ALL, timeout=120)
    # As long as the move's floor: a shorter window is faster only because it fits in the page cache.
    before = await produce_for(client, traffic, 3, max(baseline_s, size / throttle))
    state = (await client.describe_stream(name)).partitions[0]
    brokers = [b["broker_id"] for b in (await client.metadata())["brokers"]]
    spare = next(b for b in brokers if b not in state.replicas)
    target = [spare if b == state.leader else b for b in state.replicas]
    done = asyncio.Event()
    producing = asyncio.ensure_future(produce_for(client, traffic, 3, done))
    start = time.perf_counter()
    plan = {"partitions": [{"stream": name, "partition": 0, "replicas": target}]}
    await client.reassign(plan, throttle=throttle)
    deadline = start + 4 * size / throttle + 60
    while await client.reassignments():
        if time.perf_counter() > deadline:  # bounded: the publishing would fill the disk
            done.set()
            await producing
            await client.cancel_reassignment()
            raise RuntimeError(f"the move did not finish within {deadline - start:.0f} s")
        await asyncio.sleep(0.1)
    took = time.perf_counter() - start
    done.set()
    during = await producing
    return {
        "reassign_bytes": float(size),
        "reassign_throttle_bytes_per_s": float(throttle),
        "reassign_seconds": took,
        "reassign_floor_seconds": size / throttle,
        "produce_rows_per_s_before_move": before,
        "produce_rows_per_s_during_move": during,
        "reassign_produce_ratio": during / before,
    }


async def run(size: str) -> dict[str, float]:
    single_n = pick(size, smoke=500, quick=10_000, full=50_000)
    batch_rows = pick(size, smoke=20_000, quick=200_000, full=2_000_000)
    latency_s = pick(size, smoke=0.5, quick=5.0, full=30.0)
    turns = pick(size, smoke=200, quick=3000, full=20_000)
    move_bytes = pick(size, smoke=20 << 20, quick=64 << 20, full=1 << 30)
    throttle = pick(size, smoke=32 << 20, quick=32 << 20, full=64 << 20)
    baseline_s = pick(size, smoke=0.5, quick=2.0, full=5.0)
    workdir = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    results: dict[str, float] = {"flight_exchange_turn_us": exchange_turn_us(turns)}
    cluster = LocalCluster(3, base_dir=workdir / "ours", log_level="WARNING")
    js_cluster = JetStreamCluster(workdir)
    try:
        cluster.start()
        js_cluster.start()
        results["session_timeout_s"] = cluster.session_timeout
        client = await Client.connect(
            nats_urls=cluster.nats_url, broker=",".join(cluster.flights), timeout=60, max_pending=WINDOW
        )
        our_nc = await nats.connect(cluster.nats_url)
        js_nc = await nats.connect(servers=js_cluster.urls)
        js = js_nc.jetstream(publish_async_max_pending=WINDOW)

        results["js_r3_single_publish_msgs_per_s"] = await js_single(js, "JS_SINGLE", single_n)
        results["rf3_single_publish_msgs_per_s"] = await ours_single(client, "single", single_n)
        results["rf1_batch_rows_per_s"] = await ours_batches(client, "rf1", batch_rows, 1, AckPolicy.LEADER)
        results["rf3_batch_rows_per_s"] = await ours_batches(client, "rf3", batch_rows, 3, AckPolicy.ALL)
        js_pids = [s.pid for s in js_cluster.servers]
        our_pids = [cluster.nats.pid, *(b.process.pid for b in cluster.brokers if b.process)]
        js_lat, js_cpu, _ = await with_cpu(js_pids, js_latency(js, js_nc, "JS_LATENCY", latency_s))
        results["js_r3_cpu_us_per_msg"] = js_cpu / len(js_lat) * 1e6
        our_lat, our_cpu, _ = await with_cpu(our_pids, ours_latency(client, our_nc, "latency", latency_s))
        results["rf3_cpu_us_per_msg"] = our_cpu / len(our_lat) * 1e6
        results["js_r3_p99_latency_ms"] = _percentile(js_lat, 0.99)
        results["rf3_p99_latency_ms"] = _percentile(our_lat, 0.99)
        results["js_r3_p50_latency_ms"] = statistics.median(js_lat)
        results["rf3_p50_latency_ms"] = statistics.median(our_lat)
        results.update(await ours_reassign(client, "moving", move_bytes, throttle, baseline_s))
        await js_nc.close()
        results["js_r3_failover_s"] = await js_failover(js_cluster, "JS_FAILOVER")
        results["failover_s"] = await ours_failover(cluster, client, "failover")
        await our_nc.close()
        await client.close()
    finally:
        cluster.stop()
        js_cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    results["rf3_single_publish_ratio_to_js_r3"] = (
        results["rf3_single_publish_msgs_per_s"] / results["js_r3_single_publish_msgs_per_s"]
    )
    results["rf3_batch_ratio_to_rf1"] = results["rf3_batch_rows_per_s"] / results["rf1_batch_rows_per_s"]
    results["failover_ratio_to_js_r3"] = results["failover_s"] / results["js_r3_failover_s"]
    results["rf3_p99_latency_ratio_to_js_r3"] = (
        results["rf3_p99_latency_ms"] / results["js_r3_p99_latency_ms"]
    )
    return results


def main() -> None:
    args = parser(__doc__, quick_help="smaller runs, finishes within 180 s").parse_args()
    r = asyncio.run(run(size_of(args)))
    rows = [
        (
            "single publish, pipelined, RF3 ALL vs JS R3 (msg/s)",
            r["rf3_single_publish_msgs_per_s"],
            r["js_r3_single_publish_msgs_per_s"],
            r["rf3_single_publish_ratio_to_js_r3"],
            ">= 1.2",
        ),
        (
            "batch publish, RF3 ALL vs our RF1 LEADER (rows/s)",
            r["rf3_batch_rows_per_s"],
            r["rf1_batch_rows_per_s"],
            r["rf3_batch_ratio_to_rf1"],
            ">= 0.6",
        ),
        (
            "failover: kill to next ack (s)",
            r["failover_s"],
            r["js_r3_failover_s"],
            r["failover_ratio_to_js_r3"],
            "<= 0.7",
        ),
        (
            "latency p50 at 1,000 msg/s (ms)",
            r["rf3_p50_latency_ms"],
            r["js_r3_p50_latency_ms"],
            r["rf3_p50_latency_ms"] / r["js_r3_p50_latency_ms"],
            "",
        ),
        (
            "latency p99 at 1,000 msg/s (ms)",
            r["rf3_p99_latency_ms"],
            r["js_r3_p99_latency_ms"],
            r["rf3_p99_latency_ratio_to_js_r3"],
            "<= 1.5",
        ),
        (
            "  servers' CPU per message (µs)",
            r["rf3_cpu_us_per_msg"],
            r["js_r3_cpu_us_per_msg"],
            # NaN when JetStream's CPU time stayed below the clock's tick (at --smoke size)
            r["rf3_cpu_us_per_msg"] / r["js_r3_cpu_us_per_msg"] if r["js_r3_cpu_us_per_msg"] else math.nan,
            "",
        ),
        (
            "produce during a partition move vs before it (rows/s)",
            r["produce_rows_per_s_during_move"],
            r["produce_rows_per_s_before_move"],
            r["reassign_produce_ratio"],
            ">= 0.7",
        ),
        (
            "move time vs the throttle's floor (s)",
            r["reassign_seconds"],
            r["reassign_floor_seconds"],
            r["reassign_seconds"] / r["reassign_floor_seconds"],
            "",
        ),
    ]
    print(
        f"partition move: {r['reassign_bytes'] / (1 << 20):,.0f} MiB at a throttle of "
        f"{r['reassign_throttle_bytes_per_s'] / (1 << 20):,.0f} MiB/s"
    )
    print(f"ZooKeeper session timeout: {r['session_timeout_s']:g} s")
    print(
        f"transport floor: one turn of a bare Flight exchange between two processes "
        f"{r['flight_exchange_turn_us']:,.0f} µs (median)"
    )
    print(f"{'measure':<52} {'ours':>14} {'peer':>14} {'ratio':>8} {'target':>8}")
    for name, ours, theirs, ratio, target in rows:
        print(f"{name:<52} {ours:>14,.2f} {theirs:>14,.2f} {ratio:>8.2f} {target:>8}")
    print(last_line(r))


if __name__ == "__main__":
    main()
