"""Where a message's time goes: py-spy records the broker and this client on one path.

    .venv/bin/python bench/profile_paths.py sync [--seconds 12]   # one awaited publish at a time
    .venv/bin/python bench/profile_paths.py pipelined [--seconds 12]   # publish_async, acks awaited later
    .venv/bin/python bench/profile_paths.py tail [--seconds 9]    # live tail at 1,000 msg/s
    .venv/bin/python bench/profile_paths.py rf3 [--seconds 9]     # the same on an RF3 stream of 3 brokers

Starts nats-server and one broker (``rf3``: ZooKeeper and three brokers, the
partition's leader and followers recorded apart), runs the path, records them with
``py-spy record --nonblocking -f raw`` (py-spy must be installed: ``pip install
py-spy``), and prints each process's top functions by own and inclusive
samples.  The raw files stay in the printed directory for flame graphs.  The
figures of 2026-11-26 are in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from broker_bench import _percentile, tail_latencies

from broker_node.nats_server import NatsServer
from pyspark_jetstream.client import Client
from pyspark_jetstream.local import LocalBroker, LocalCluster


def record(pid: int, seconds: float, out: Path, *, gil: bool = False) -> subprocess.Popen[bytes]:
    """py-spy on ``pid``; ``gil``: only the thread holding the GIL (what the interpreter is busy with)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    command = [spy, "record", "--pid", str(pid), "-d", str(int(seconds)), "-f", "raw", "-o", str(out)]
    if gil:
        command.append("--gil")
    return subprocess.Popen([*command, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top(raw: Path, n: int = 20) -> str:
    """Own and inclusive shares of the functions in a py-spy raw (collapsed stacks) file."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        total += samples
        frames = stack.split(";")
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    lines = [f"{raw.name}: {total} samples", "  own:"]
    lines += [f"    {100 * c / total:5.1f}% {f[:120]}" for f, c in own.most_common(n)]
    lines += ["  inclusive:"]
    lines += [f"    {100 * c / total:5.1f}% {f[:120]}" for f, c in inclusive.most_common(n)]
    return "\n".join(lines)


async def run_rf3(seconds: float, out: Path, gil: bool) -> str:
    """The live tail at 1,000 msg/s on an RF3 stream: what commits a message, leader and followers."""
    cluster = LocalCluster(3, base_dir=out / "cluster", log_level="WARNING").start()
    client = await Client.connect(nats_urls=cluster.nats_url, broker=",".join(cluster.flights), timeout=60)
    nc = await nats.connect(cluster.nats_url)
    try:
        await client.create_stream("l", "bench.l", replication_factor=3, min_insync_replicas=2)
        state = (await client.describe_stream("l")).partitions[0]
        roles = {state.leader: "leader"} | {
            r: f"follower{n}" for n, r in enumerate(x for x in state.replicas if x != state.leader)
        }
        spies = []
        for broker_id, role in roles.items():
            process = cluster.broker(broker_id).process
            assert process is not None
            spies.append(record(process.pid, seconds, out / f"{role}_rf3.txt", gil=gil))
        latencies = await tail_latencies(client, nc, "l", seconds - 1)
        for spy in spies:
            spy.wait()
    finally:
        await nc.close()
        await client.close()
        cluster.stop()
    p50, p99 = statistics.median(latencies), _percentile(latencies, 0.99)
    return f"RF3 live tail p50 {p50:.3f} ms, p99 {p99:.3f} ms"


async def run(path: str, seconds: float, out: Path, gil: bool = False) -> str:
    if path == "rf3":
        return await run_rf3(seconds, out, gil)
    server = NatsServer(jetstream=True, store_dir=out / "jetstream").start()
    broker = LocalBroker(out / "data", nats_url=server.url, log_level="WARNING").start()
    assert broker.process is not None
    client = await Client.connect(nats_urls=server.url, broker=broker.flight, timeout=60)
    nc = await nats.connect(server.url)
    try:
        await client.create_stream("p", "bench.p")
        for _ in range(500):  # warm up
            await client.publish("p", b"x" * 100)
        spies = [
            record(broker.process.pid, seconds, out / f"broker_{path}.txt", gil=gil),
            record(os.getpid(), seconds, out / f"client_{path}.txt", gil=gil),
        ]
        if path == "sync":
            sent, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds - 1:
                await client.publish("p", b"x" * 100)
                sent += 1
            summary = f"{sent / (time.perf_counter() - start):,.0f} awaited publishes/s"
        elif path == "pipelined":  # as broker_bench's single publish: the client's window paces it
            sent, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds - 1:
                futures = [await client.publish_async("p", b"x" * 100) for _ in range(5_000)]
                await asyncio.gather(*futures)
                sent += len(futures)
            summary = f"{sent / (time.perf_counter() - start):,.0f} pipelined publishes/s"
        else:
            await client.create_stream("l", "bench.l")
            latencies = await tail_latencies(client, nc, "l", seconds - 1)
            p50, p99 = statistics.median(latencies), _percentile(latencies, 0.99)
            summary = f"live tail p50 {p50:.3f} ms, p99 {p99:.3f} ms"
        for spy in spies:
            spy.wait()
    finally:
        await nc.close()
        await client.close()
        broker.stop()
        server.stop()
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", choices=("sync", "pipelined", "tail", "rf3"))
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--gil", action="store_true", help="sample only the thread holding the GIL")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="profile-"))
    print(asyncio.run(run(args.path, args.seconds, out, args.gil)))
    sides = ("leader", "follower0", "follower1") if args.path == "rf3" else ("broker", "client")
    for side in sides:
        raw = out / f"{side}_{args.path}.txt"
        print(top(raw) if raw.exists() else f"{raw}: py-spy wrote nothing (is it installed?)")
    print(f"raw profiles in {out}")


if __name__ == "__main__":
    main()
