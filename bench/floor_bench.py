"""Floor benchmark: a bare Python broker on NATS beside ours and JetStream, in one run.

What would a broker reach if every hop of a message were a Python event loop
on NATS, with no log format, no checks and no threads?  This bench runs that
bare design beside ours and beside NATS JetStream, in the same run, at a
steady 1,000 messages/s of 100-byte values (as ``broker_bench`` and
``cluster_bench`` measure the live tail):

1. **one copy**: a *relay* process subscribes to the published subject,
   writes each message to a file (``write(2)``, no fsync) and publishes it on
   the tail's subject.  Beside it our RF=1 live tail (one broker) and a
   JetStream R1 file stream's ordered push consumer;
2. **three copies**: a *leader* process writes each message to its file and
   publishes it on a replication subject; two *follower* processes write
   what they receive to their files and publish their log end offset; the
   leader publishes a message on the tail's subject once both followers hold
   it (``ALL``).  Beside it our RF=3 ``ALL`` live tail (three brokers,
   ZooKeeper) and JetStream R3;
3. **one publish at a time**, each answer awaited before the next: NATS
   requests to the relay, which writes each and answers its offset; our
   ``publish`` (as ``broker_bench``'s ``sync_publish_ratio``); JetStream R1's
   ``js.publish``.

The bare processes run on uvloop, as our brokers do (asyncio's loop where
uvloop is not installed), with one nats-server of their own.  For each live
tail it prints p50 and p99 (ms) and the servers' CPU per message (µs of user and
system time, from ``/proc``: the bare processes or our brokers, with their
nats-server; JetStream's nats-servers).  The ratios say how far our design
is from the floor of a Python broker on NATS, and how far that floor is from
JetStream, which stores inside the server.  The figures of 2026-11-28 are in
bench/RESULTS.md.

Prints a table; the last line is one JSON object.

    python bench/floor_bench.py [--quick | --smoke]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.broker_bench import (
    VALUE,
    _latency,
    _percentile,
    _steady_publish,
    jetstream_latency,
    jetstream_publish,
    ours_latency,
    ours_sync,
    with_cpu,
)
from bench.cluster_bench import JetStreamCluster, js_latency
from bench.cluster_bench import ours_latency as ours_rf3_latency
from bench.sizes import last_line, parser, pick, size_of
from broker_node.nats_server import NatsServer
from pyspark_jetstream.client import Client
from pyspark_jetstream.local import LocalBroker, LocalCluster

FOLLOWERS = 2
FRAME = struct.Struct("<qI")
"""A bare frame's header: offset, value length."""
OFFSET = struct.Struct("<q")
"""The bare relay's answer to a request: the offset it stored it at."""
ACK = struct.Struct("<iq")
"""A follower's acknowledgement: its number, its log end offset."""


# ---- the bare processes (run with --role) ----------------------------------------------------


async def relay(nc: nats.NATS, fd: int, prefix: str) -> None:
    """Store each message, then publish it on the tail; store each request, then answer its offset."""
    offset = 0

    async def stored(message: Msg) -> None:
        nonlocal offset
        os.write(fd, FRAME.pack(offset, len(message.data)) + message.data)
        offset += 1
        await nc.publish(f"{prefix}.tail", message.data)

    async def answered(message: Msg) -> None:
        nonlocal offset
        os.write(fd, FRAME.pack(offset, len(message.data)) + message.data)
        await message.respond(OFFSET.pack(offset))
        offset += 1

    await nc.subscribe(f"{prefix}.in", cb=stored)
    await nc.subscribe(f"{prefix}.request", cb=answered)


async def leader(nc: nats.NATS, fd: int, prefix: str) -> None:
    """Store each message and send it to the followers; publish it on the tail once both hold it."""
    offset = 0
    waiting: deque[tuple[int, bytes]] = deque()
    held: dict[int, int] = {}

    async def stored(message: Msg) -> None:
        nonlocal offset
        frame = FRAME.pack(offset, len(message.data)) + message.data
        os.write(fd, frame)
        waiting.append((offset, message.data))
        offset += 1
        await nc.publish(f"{prefix}.replicate", frame)

    async def acknowledged(message: Msg) -> None:
        follower, end = ACK.unpack(message.data)
        held[follower] = max(held.get(follower, 0), end)
        if len(held) < FOLLOWERS:
            return
        committed = min(held.values())
        while waiting and waiting[0][0] < committed:
            await nc.publish(f"{prefix}.tail", waiting.popleft()[1])

    await nc.subscribe(f"{prefix}.in", cb=stored)
    await nc.subscribe(f"{prefix}.ack", cb=acknowledged)


async def follower(nc: nats.NATS, fd: int, prefix: str, number: int) -> None:
    """Store each replicated frame, then acknowledge the log end offset."""

    async def replicated(message: Msg) -> None:
        os.write(fd, message.data)
        offset, _ = FRAME.unpack_from(message.data)
        await nc.publish(f"{prefix}.ack", ACK.pack(number, offset + 1))

    await nc.subscribe(f"{prefix}.replicate", cb=replicated)


async def serve(role: str, url: str, path: str, prefix: str) -> None:
    nc = await nats.connect(url)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if role == "relay":
        await relay(nc, fd, prefix)
    elif role == "leader":
        await leader(nc, fd, prefix)
    else:
        await follower(nc, fd, prefix, int(role.removeprefix("follower")))
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes it
    await nc.close()


def run_role(role: str, url: str, path: str, prefix: str) -> None:
    try:
        import uvloop
    except ImportError:  # asyncio's loop, as the broker falls back to
        asyncio.run(serve(role, url, path, prefix))
    else:
        uvloop.run(serve(role, url, path, prefix))


# ---- the bench -----------------------------------------------------------------------------------


class Bare:
    """The bare processes of one design, started on ``url`` and stopped by closing their stdin."""

    def __init__(self, roles: list[str], url: str, workdir: Path, prefix: str) -> None:
        self.processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--role",
                    role,
                    url,
                    str(workdir / f"{prefix}-{role}.log"),
                    prefix,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for role in roles
        ]
        for role, process in zip(roles, self.processes, strict=True):
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                self.stop()
                raise RuntimeError(f"the bare {role} did not start (exit code {process.poll()})")

    @property
    def pids(self) -> list[int | None]:
        return [p.pid for p in self.processes]

    def stop(self) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.close()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def bare_latencies(nc: nats.NATS, prefix: str, seconds: float) -> list[float]:
    """Publish-to-tail latencies (ms) through bare processes at 1,000 msg/s."""
    latencies: list[float] = []

    async def received(message: Msg) -> None:
        latencies.append(_latency(message.data, time.perf_counter_ns()))

    subscription = await nc.subscribe(f"{prefix}.tail", cb=received)
    await nc.flush()
    sent = await _steady_publish(nc, f"{prefix}.in", seconds, 1000)
    for _ in range(200):  # up to 10 s for the last ones
        if len(latencies) >= sent:
            break
        await asyncio.sleep(0.05)
    await subscription.unsubscribe()
    if len(latencies) < sent:
        raise RuntimeError(f"{prefix}: {sent} published, {len(latencies)} reached the tail")
    return latencies


async def bare_awaited(nc: nats.NATS, prefix: str, n: int) -> float:
    """Requests to the bare relay, each answer awaited before the next (msg/s)."""
    payload = b"x" * VALUE
    start = time.perf_counter()
    for _ in range(n):
        await nc.request(f"{prefix}.request", payload, timeout=10)
    return n / (time.perf_counter() - start)


async def measured(
    results: dict[str, float],
    name: str,
    pids: list[int | None],
    measure: Callable[[], Awaitable[list[float]]],
) -> None:
    latencies, cpu, _ = await with_cpu(pids, measure())
    results[f"{name}_p50_ms"] = statistics.median(latencies)
    results[f"{name}_p99_ms"] = _percentile(latencies, 0.99)
    results[f"{name}_cpu_us_per_msg"] = cpu / len(latencies) * 1e6


async def one_copy(results: dict[str, float], workdir: Path, seconds: float, awaited: int) -> None:
    server = NatsServer().start()
    js_server = NatsServer(jetstream=True, store_dir=workdir / "js1").start()
    broker = LocalBroker(workdir / "ours1", nats_url=server.url, log_level="WARNING").start()
    bare = Bare(["relay"], server.url, workdir, "relay")
    try:
        nc = await nats.connect(server.url)
        await measured(
            results, "bare_rf1", [server.pid, *bare.pids], lambda: bare_latencies(nc, "relay", seconds)
        )
        results["bare_awaited_msgs_per_s"] = await bare_awaited(nc, "relay", awaited)
        await nc.close()
        js_nc = await nats.connect(js_server.url)
        js = js_nc.jetstream()
        results["js_awaited_msgs_per_s"] = await jetstream_publish(js, "AWAITED", awaited, awaited=True)
        await measured(
            results,
            "js_r1",
            [js_server.pid],
            lambda: jetstream_latency(js, js_nc, "FLOOR", seconds),
        )
        await js_nc.close()
        assert broker.process is not None
        client = await Client.connect(nats_urls=server.url, broker=broker.flight, timeout=60)
        our_nc = await nats.connect(server.url)
        results["ours_awaited_msgs_per_s"] = await ours_sync(client, "awaited", awaited)
        await measured(
            results,
            "ours_rf1",
            [broker.process.pid, server.pid],
            lambda: ours_latency(client, our_nc, "floor", seconds),
        )
        await our_nc.close()
        await client.close()
    finally:
        bare.stop()
        broker.stop()
        js_server.stop()
        server.stop()


async def three_copies(results: dict[str, float], workdir: Path, seconds: float) -> None:
    server = NatsServer().start()
    js_cluster = JetStreamCluster(workdir).start()
    cluster = LocalCluster(3, base_dir=workdir / "ours3", log_level="WARNING").start()
    bare = Bare(["leader", *(f"follower{n}" for n in range(FOLLOWERS))], server.url, workdir, "replicated")
    try:
        nc = await nats.connect(server.url)
        await measured(
            results, "bare_rf3", [server.pid, *bare.pids], lambda: bare_latencies(nc, "replicated", seconds)
        )
        await nc.close()
        js_nc = await nats.connect(servers=js_cluster.urls)
        await measured(
            results,
            "js_r3",
            [s.pid for s in js_cluster.servers],
            lambda: js_latency(js_nc.jetstream(), js_nc, "FLOOR3", seconds),
        )
        await js_nc.close()
        client = await Client.connect(
            nats_urls=cluster.nats_url, broker=",".join(cluster.flights), timeout=60
        )
        our_nc = await nats.connect(cluster.nats_url)
        await measured(
            results,
            "ours_rf3",
            [cluster.nats.pid, *(b.process.pid for b in cluster.brokers if b.process)],
            lambda: ours_rf3_latency(client, our_nc, "floor", seconds),
        )
        await our_nc.close()
        await client.close()
    finally:
        bare.stop()
        cluster.stop()
        js_cluster.stop()
        server.stop()


async def run(size: str) -> dict[str, float]:
    seconds = pick(size, smoke=0.5, quick=5.0, full=30.0)
    awaited = pick(size, smoke=200, quick=5_000, full=20_000)
    workdir = Path(tempfile.mkdtemp(prefix="floor-bench-"))
    results: dict[str, float] = {}
    try:
        await one_copy(results, workdir, seconds, awaited)
        await three_copies(results, workdir, seconds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for side in ("bare", "ours"):
        results[f"{side}_awaited_ratio_to_js"] = (
            results[f"{side}_awaited_msgs_per_s"] / results["js_awaited_msgs_per_s"]
        )
    for copies, peer in (("rf1", "js_r1"), ("rf3", "js_r3")):
        results[f"ours_{copies}_p99_ratio_to_bare"] = (
            results[f"ours_{copies}_p99_ms"] / results[f"bare_{copies}_p99_ms"]
        )
        results[f"bare_{copies}_p99_ratio_to_{peer}"] = (
            results[f"bare_{copies}_p99_ms"] / results[f"{peer}_p99_ms"]
        )
        results[f"ours_{copies}_p99_ratio_to_{peer}"] = (
            results[f"ours_{copies}_p99_ms"] / results[f"{peer}_p99_ms"]
        )
    return results


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--role":
        run_role(*sys.argv[2:])
        return
    args = parser(__doc__, quick_help="5 s per measure, finishes within 120 s").parse_args()
    r = asyncio.run(run(size_of(args)))
    print(f"{'live tail at 1,000 msg/s':<34}{'p50 ms':>9}{'p99 ms':>9}{'CPU µs/msg':>12}")
    for copies, peer, label in (("rf1", "js_r1", "one copy"), ("rf3", "js_r3", "three copies (ALL)")):
        print(label)
        for name, title in (
            (f"bare_{copies}", "bare event loops on NATS"),
            (f"ours_{copies}", "ours"),
            (peer, "JetStream"),
        ):
            p50, p99, cpu = (r[f"{name}_{figure}"] for figure in ("p50_ms", "p99_ms", "cpu_us_per_msg"))
            print(f"  {title:<32}{p50:>9.3f}{p99:>9.3f}{cpu:>12.0f}")
        ours, bare = r[f"ours_{copies}_p99_ratio_to_{peer}"], r[f"bare_{copies}_p99_ratio_to_{peer}"]
        print(f"  p99: ours / bare {r[f'ours_{copies}_p99_ratio_to_bare']:.2f}, ", end="")
        print(f"bare / JetStream {bare:.2f}, ours / JetStream {ours:.2f}")
    print("one publish at a time, each answer awaited (msg/s, one copy)")
    for name, title in (("bare", "bare event loops on NATS"), ("ours", "ours"), ("js", "JetStream")):
        ratio = "" if name == "js" else f"  ({r[f'{name}_awaited_ratio_to_js']:.2f} of JetStream's)"
        print(f"  {title:<32}{r[f'{name}_awaited_msgs_per_s']:>9,.0f}{ratio}")
    print(last_line(r))


if __name__ == "__main__":
    main()
