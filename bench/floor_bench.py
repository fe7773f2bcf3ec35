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
uvloop is not installed).  Each system runs alone, started just before its
measures and stopped after them, on a nats-server of its own, and each latency
measure follows an untimed warm-up of the same load (on a stream of its own
for ours and JetStream: their consumers read from the start).  For each live
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
import contextlib
import os
import select
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
from nats.js.api import StorageType, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.broker_bench import (
    VALUE,
    _all_received,
    _latency,
    _percentile,
    _steady_publish,
    jetstream_publish,
    ours_sync,
    push_latencies,
    tail_latencies,
    with_cpu,
)
from bench.cluster_bench import JetStreamCluster, js_ready
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


def _append(fd: int, offset: int, value: bytes) -> bytes:
    """Write ``value`` at ``offset`` to the bare log ``fd`` (one ``write(2)``); the frame written."""
    frame = FRAME.pack(offset, len(value)) + value
    os.write(fd, frame)
    return frame


async def relay(nc: nats.NATS, fd: int, prefix: str) -> None:
    """Store each message, then publish it on the tail; store each request, then answer its offset."""
    offset = 0

    async def stored(message: Msg) -> None:
        nonlocal offset
        _append(fd, offset, message.data)
        offset += 1
        await nc.publish(f"{prefix}.tail", message.data)

    async def answered(message: Msg) -> None:
        nonlocal offset
        _append(fd, offset, message.data)
        offset += 1
        await message.respond(OFFSET.pack(offset - 1))

    await nc.subscribe(f"{prefix}.in", cb=stored)
    await nc.subscribe(f"{prefix}.request", cb=answered)


async def leader(nc: nats.NATS, fd: int, prefix: str) -> None:
    """Store each message and send it to the followers; publish it on the tail once both hold it."""
    offset = 0
    waiting: deque[tuple[int, bytes]] = deque()
    held: dict[int, int] = {}

    async def stored(message: Msg) -> None:
        nonlocal offset
        frame = _append(fd, offset, message.data)
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
    """Store each replicated frame that follows the last one, then acknowledge the log end offset.

    A frame after a gap (one NATS did not deliver) is not stored and nothing
    more is acknowledged: the leader then holds back the tail and the bench
    fails, rather than count as replicated a message a follower never wrote.
    """
    end = 0

    async def replicated(message: Msg) -> None:
        nonlocal end
        offset, _ = FRAME.unpack_from(message.data)
        if offset != end:
            return
        os.write(fd, message.data)
        end = offset + 1
        await nc.publish(f"{prefix}.ack", ACK.pack(number, end))

    await nc.subscribe(f"{prefix}.replicate", cb=replicated)


async def serve(role: str, url: str, path: str, prefix: str) -> None:
    """Run one bare process until the bench closes its standard input."""
    nc = await nats.connect(url)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if role == "relay":
        await relay(nc, fd, prefix)
    elif role == "leader":
        await leader(nc, fd, prefix)
    else:
        await follower(nc, fd, prefix, int(role.removeprefix("follower")))
    await nc.flush()
    print(f"ready {type(asyncio.get_running_loop()).__module__.split('.')[0]}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await nc.close()


def run_role(role: str, url: str, path: str, prefix: str) -> None:
    """``--role``: one bare process, on uvloop (asyncio's loop where it is not installed)."""
    try:
        import uvloop
    except ImportError:  # as the broker falls back
        asyncio.run(serve(role, url, path, prefix))
    else:
        uvloop.run(serve(role, url, path, prefix))


# ---- the bench -----------------------------------------------------------------------------------

START_SECONDS = 30.0
"""How long a bare process may take to say it is ready."""


class Bare:
    """The bare processes of one design with a nats-server of their own; stopped by closing their
    standard input (a process whose bench died reads the end of it and exits)."""

    def __init__(self, roles: list[str], workdir: Path, prefix: str) -> None:
        self.server = NatsServer().start()
        self.processes: list[subprocess.Popen[str]] = []
        self.on_uvloop = True
        try:
            for role in roles:
                path = workdir / f"{prefix}-{role}.log"
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, __file__, "--role", role, self.server.url, str(path), prefix],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
            for role, process in zip(roles, self.processes, strict=True):
                line = _read_line(process, START_SECONDS)
                if not line.startswith("ready"):
                    raise RuntimeError(f"the bare {role} did not start (exit code {process.poll()})")
                self.on_uvloop &= line.split()[-1] == "uvloop"
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> list[int | None]:
        """The bare processes and their nats-server."""
        return [self.server.pid, *(p.pid for p in self.processes)]

    def stop(self) -> None:
        """Stop the processes (killed after 10 s) and their nats-server."""
        for process in self.processes:
            assert process.stdin is not None
            with contextlib.suppress(OSError):
                process.stdin.close()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.server.stop()


def _read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The next line ``process`` prints, or ``""`` if none comes within ``timeout`` seconds."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    return process.stdout.readline() if ready else ""


async def bare_latencies(nc: nats.NATS, prefix: str, seconds: float) -> list[float]:
    """Publish-to-tail latencies (ms) through bare processes at 1,000 msg/s."""
    latencies: list[float] = []

    async def received(message: Msg) -> None:
        latencies.append(_latency(message.data, time.perf_counter_ns()))

    subscription = await nc.subscribe(f"{prefix}.tail", cb=received)
    await nc.flush()
    await asyncio.sleep(0.2)  # as the helpers for ours and JetStream wait before publishing
    sent = await _steady_publish(nc, f"{prefix}.in", seconds, 1000)
    await _all_received(latencies, sent, prefix)
    await subscription.unsubscribe()
    return latencies


async def bare_awaited(nc: nats.NATS, prefix: str, n: int) -> float:
    """Requests to the bare relay, each answer awaited before the next (msg/s)."""
    payload = b"x" * VALUE
    start = time.perf_counter()
    for _ in range(n):
        await nc.request(f"{prefix}.request", payload, timeout=10)
    return n / (time.perf_counter() - start)


ROUNDS = ("warm", "timed")
"""Each latency measure runs twice: an untimed warm-up (``WARM_SECONDS``), then the one kept."""


async def measured(
    results: dict[str, float],
    name: str,
    pids: list[int | None],
    measure: Callable[[str, float], Awaitable[list[float]]],
    seconds: tuple[float, float],
) -> None:
    """Run a latency ``measure(round, seconds)`` untimed, then timed; keep the timed round's p50,
    p99 and the CPU per message of ``pids``."""
    warm, timed = seconds
    await measure(ROUNDS[0], warm)
    latencies, cpu, _ = await with_cpu(pids, measure(ROUNDS[1], timed))
    results[f"{name}_p50_ms"] = statistics.median(latencies)
    results[f"{name}_p99_ms"] = _percentile(latencies, 0.99)
    results[f"{name}_cpu_us_per_msg"] = cpu / len(latencies) * 1e6


async def bare(results: dict[str, float], workdir: Path, seconds: tuple[float, float], awaited: int) -> None:
    """The bare relay, then the bare leader and followers, each with its own nats-server."""
    relay = Bare(["relay"], workdir, "relay")
    try:
        nc = await nats.connect(relay.server.url)
        await measured(results, "bare_rf1", relay.pids, lambda _, s: bare_latencies(nc, "relay", s), seconds)
        results["bare_awaited_msgs_per_s"] = await bare_awaited(nc, "relay", awaited)
        await nc.close()
    finally:
        relay.stop()
    replicated = Bare(["leader", *(f"follower{n}" for n in range(FOLLOWERS))], workdir, "replicated")
    try:
        nc = await nats.connect(replicated.server.url)
        pids = replicated.pids
        await measured(results, "bare_rf3", pids, lambda _, s: bare_latencies(nc, "replicated", s), seconds)
        await nc.close()
    finally:
        replicated.stop()
    results["bare_on_uvloop"] = float(relay.on_uvloop and replicated.on_uvloop)


async def jetstream(
    results: dict[str, float], workdir: Path, seconds: tuple[float, float], awaited: int
) -> None:
    """JetStream R1 (one nats-server), then R3 (three clustered ones), file streams."""
    server = NatsServer(jetstream=True, store_dir=workdir / "js-r1").start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        results["js_awaited_msgs_per_s"] = await jetstream_publish(js, "AWAITED", awaited, awaited=True)
        for name in ROUNDS:
            await js.add_stream(
                StreamConfig(name=f"FLOOR_{name}", subjects=[f"js.FLOOR_{name}"], storage=StorageType.FILE)
            )
        await measured(
            results, "js_r1", [server.pid], lambda r, s: push_latencies(js, nc, f"FLOOR_{r}", s), seconds
        )
        await nc.close()
    finally:
        server.stop()
    cluster = JetStreamCluster(workdir / "js-r3").start()
    try:
        nc = await nats.connect(servers=cluster.urls)
        js = nc.jetstream()
        for name in ROUNDS:
            await js_ready(js, f"FLOOR3_{name}", f"js.FLOOR3_{name}")
        pids = [s.pid for s in cluster.servers]
        await measured(results, "js_r3", pids, lambda r, s: push_latencies(js, nc, f"FLOOR3_{r}", s), seconds)
        await nc.close()
    finally:
        cluster.stop()


async def ours(results: dict[str, float], workdir: Path, seconds: tuple[float, float], awaited: int) -> None:
    """One broker on a nats-server of its own, then three brokers with RF=3 (``LocalCluster``)."""
    server = NatsServer().start()
    broker = None
    try:
        broker = LocalBroker(workdir / "ours1", nats_url=server.url, log_level="WARNING").start()
        assert broker.process is not None
        client = await Client.connect(nats_urls=server.url, broker=broker.flight, timeout=60)
        nc = await nats.connect(server.url)
        results["ours_awaited_msgs_per_s"] = await ours_sync(client, "awaited", awaited)
        for name in ROUNDS:
            await client.create_stream(f"floor_{name}", f"bench.floor_{name}")
        pids = [broker.process.pid, server.pid]
        await measured(
            results, "ours_rf1", pids, lambda r, s: tail_latencies(client, nc, f"floor_{r}", s), seconds
        )
        await nc.close()
        await client.close()
    finally:
        if broker is not None:
            broker.stop()
        server.stop()
    cluster = LocalCluster(3, base_dir=workdir / "ours3", log_level="WARNING")
    try:
        cluster.start()
        client = await Client.connect(
            nats_urls=cluster.nats_url, broker=",".join(cluster.flights), timeout=60
        )
        nc = await nats.connect(cluster.nats_url)
        for name in ROUNDS:
            await client.create_stream(
                f"floor_{name}", f"bench.floor_{name}", replication_factor=3, min_insync_replicas=2
            )
        pids = [cluster.nats.pid, *(b.process.pid for b in cluster.brokers if b.process)]
        await measured(
            results, "ours_rf3", pids, lambda r, s: tail_latencies(client, nc, f"floor_{r}", s), seconds
        )
        await nc.close()
        await client.close()
    finally:
        cluster.stop()


async def run(size: str) -> dict[str, float]:
    """Every measure, each system started just before its own and stopped after it; ``seconds``:
    each latency measure's untimed warm-up and timed round."""
    seconds = pick(size, smoke=(0.2, 0.5), quick=(1.0, 5.0), full=(3.0, 30.0))
    awaited = pick(size, smoke=200, quick=5_000, full=20_000)
    workdir = Path(tempfile.mkdtemp(prefix="floor-bench-"))
    results: dict[str, float] = {}
    try:
        await bare(results, workdir, seconds, awaited)
        await jetstream(results, workdir, seconds, awaited)
        await ours(results, workdir, seconds, awaited)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for side in ("bare", "ours"):
        results[f"{side}_awaited_ratio_to_js"] = (
            results[f"{side}_awaited_msgs_per_s"] / results["js_awaited_msgs_per_s"]
        )
    results["ours_awaited_ratio_to_bare"] = (
        results["ours_awaited_msgs_per_s"] / results["bare_awaited_msgs_per_s"]
    )
    for copies, peer in (("rf1", "js_r1"), ("rf3", "js_r3")):
        for figure in ("p50", "p99"):
            results[f"ours_{copies}_{figure}_ratio_to_bare"] = (
                results[f"ours_{copies}_{figure}_ms"] / results[f"bare_{copies}_{figure}_ms"]
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
    args = parser(__doc__, quick_help="1 s of warm-up and 5 s per latency measure, within 120 s").parse_args()
    r = asyncio.run(run(size_of(args)))
    loop = "uvloop" if r["bare_on_uvloop"] else "asyncio's loop"
    print(f"{'live tail at 1,000 msg/s':<34}{'p50 ms':>9}{'p99 ms':>9}{'CPU µs/msg':>12}")
    for copies, peer, label in (("rf1", "js_r1", "one copy"), ("rf3", "js_r3", "three copies (ALL)")):
        print(label)
        for name, title in (
            (f"bare_{copies}", f"bare, {loop}"),
            (f"ours_{copies}", "ours"),
            (peer, "JetStream"),
        ):
            p50, p99, cpu = (r[f"{name}_{figure}"] for figure in ("p50_ms", "p99_ms", "cpu_us_per_msg"))
            print(f"  {title:<32}{p50:>9.3f}{p99:>9.3f}{cpu:>12.0f}")
        ours_ratio, bare_ratio = (
            r[f"ours_{copies}_p99_ratio_to_{peer}"],
            r[f"bare_{copies}_p99_ratio_to_{peer}"],
        )
        print(f"  p50: ours / bare {r[f'ours_{copies}_p50_ratio_to_bare']:.2f}; ", end="")
        print(f"p99: ours / bare {r[f'ours_{copies}_p99_ratio_to_bare']:.2f}, ", end="")
        print(f"bare / JetStream {bare_ratio:.2f}, ours / JetStream {ours_ratio:.2f}")
    print("one publish at a time, each answer awaited (msg/s, one copy)")
    for name, title in (("bare", f"bare, {loop}"), ("ours", "ours"), ("js", "JetStream")):
        ratio = "" if name == "js" else f"  ({r[f'{name}_awaited_ratio_to_js']:.2f} of JetStream's)"
        print(f"  {title:<32}{r[f'{name}_awaited_msgs_per_s']:>9,.0f}{ratio}")
    print(f"  ours / bare {r['ours_awaited_ratio_to_bare']:.2f}")
    print(last_line(r))


if __name__ == "__main__":
    main()
