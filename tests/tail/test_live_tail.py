"""The live tail: committed batches published once on NATS, and consumers that never miss one.

Each test checks what a consumer saw offset by offset (every offset once, in
order) and, through the tail's ``stats``, that the path under test was really
taken: batches from NATS, gaps noticed and read over Flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
import pyarrow as pa
import pytest
from nats.errors import ConnectionClosedError
from nats.errors import TimeoutError as NatsTimeoutError

from broker_node.log.reads import ReplicaFrame
from broker_node.nats_server import NatsServer
from broker_node.tail.tail_publisher import TailPublisher
from broker_node.zookeeper_server import free_port
from pyspark_jetstream.client import AckPolicy, Client, live
from pyspark_jetstream.client.live import LiveTail
from pyspark_jetstream.protocol.flight import StartPosition
from pyspark_jetstream.protocol.tail import _HEADER, HEADER_BYTES, decode_delivery, tail_subject

from ..broker.harness import BrokerProcess, wait_until


def offsets_of(batches: list[pa.RecordBatch]) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


async def connect(broker: BrokerProcess) -> Client:
    return await Client.connect(nats_urls=broker.nats_url, broker=broker.flight, timeout=20)


async def publish_rows(client: Client, stream: str, first: int, count: int, per_batch: int = 1) -> None:
    """``count`` messages valued by their number, ``per_batch`` to a publish, each acked."""
    futures = []
    for start in range(first, first + count, per_batch):
        rows = [{"value": b"%06d" % i} for i in range(start, min(start + per_batch, first + count))]
        futures.append(await client.publish_batch_async(stream, rows, partition=0))
    for future in futures:
        await future


async def collect(tail, until: int, seen: list[pa.RecordBatch]) -> None:
    async for batch in tail:
        seen.append(batch)
        if batch.column("offset")[-1].as_py() >= until - 1:
            return


@contextlib.asynccontextmanager
async def consuming(tail, until: int, timeout: float, seen: list[pa.RecordBatch] | None = None):
    """Collects ``tail``'s batches (into ``seen``, which it yields) up to offset ``until`` while the
    block runs; on leaving, waits up to ``timeout`` seconds for the rest and closes the tail."""
    seen = [] if seen is None else seen
    consumer = asyncio.ensure_future(collect(tail, until, seen))
    try:
        yield seen
        await asyncio.wait_for(consumer, timeout)
    finally:
        consumer.cancel()
        await tail.aclose()


def test_exactly_once_across_the_switch_from_history_to_live(broker):
    """A publisher at full speed while the consumer starts: every offset once, in order."""
    total = 20_000

    async def main() -> tuple[list[pa.RecordBatch], LiveTail]:
        async with await connect(broker) as client:
            await client.create_stream("fast", "fast")
            publisher = asyncio.ensure_future(publish_rows(client, "fast", 0, total, per_batch=20))
            while (await client.describe_stream("fast")).partitions[0].high_watermark < total // 4:
                await asyncio.sleep(0.01)
            tail = client.tail("fast", start="earliest", max_records=500)
            seen: list[pa.RecordBatch] = []
            await asyncio.wait_for(collect(tail, total, seen), 120)
            await publisher
            await tail.aclose()
            return seen, tail

    seen, tail = asyncio.run(main())
    assert offsets_of(seen) == list(range(total))
    values = [v for b in seen for v in b.column("value").to_pylist()]
    assert values == [b"%06d" % i for i in range(total)]
    assert isinstance(tail, LiveTail)
    assert tail.stats.fetched_batches > 0, tail.stats  # history over Flight...
    assert tail.stats.live_batches > 0, tail.stats  # ...then the live tail
    assert not tail.stats.flight_only


def test_a_tail_running_when_its_client_closes_ends_quietly(broker, caplog):
    """Closing the client ends its tails: no fallback to Flight, no warning that NATS has no tail."""

    async def main() -> tuple[list[pa.RecordBatch], LiveTail]:
        client = await connect(broker)
        await client.create_stream("closing", "closing")
        tail = client.tail("closing", start="earliest")
        seen: list[pa.RecordBatch] = []

        async def consume() -> None:
            async for batch in tail:
                seen.append(batch)

        consumer = asyncio.ensure_future(consume())
        await publish_rows(client, "closing", 0, 3)
        while sum(b.num_rows for b in seen) < 3:
            await asyncio.sleep(0.01)
        await client.close()
        await asyncio.wait_for(consumer, 20)  # the iteration ends; it raised nothing
        return seen, tail

    seen, tail = asyncio.run(main())
    assert offsets_of(seen) == [0, 1, 2]
    assert not tail.stats.flight_only
    assert not [r for r in caplog.records if "no live tail" in r.getMessage()]


def test_a_slow_consumer_misses_deliveries_and_reads_them_over_flight(broker, caplog):
    """NATS drops what a consumer with tiny pending limits leaves unread; nothing is lost."""
    total = 3000

    async def main() -> tuple[list[int], LiveTail]:
        async with await connect(broker) as client:
            await client.create_stream("slow", "slow")
            tail = LiveTail(
                client,
                "slow",
                0,
                StartPosition("earliest"),
                max_records=50,
                max_bytes=None,
                flight_tail=lambda offset: client.tail("slow", start=offset, live=False),
                pending_messages=2,
            )
            got: list[int] = []
            published = asyncio.Event()

            async def consume() -> None:
                async for batch in tail:
                    got.extend(batch.column("offset").to_pylist())
                    if tail.stats.live_batches and not published.is_set():
                        await published.wait()  # stalls, deliveries pile up in NATS's buffer
                    if got[-1] >= total - 1:
                        return

            consumer = asyncio.ensure_future(consume())
            while tail.next_offset < 1:
                await asyncio.sleep(0.01)
            # Ten acknowledged waves (at least ten deliveries) while the consumer is stalled
            # on its first live batch: NATS keeps two pending and drops the rest.
            for wave in range(10):
                await publish_rows(client, "slow", 1 + wave * 300, 300 if wave < 9 else total - 1 - 2700)
            published.set()
            await asyncio.wait_for(consumer, 60)
            await tail.aclose()
            return got, tail

    async def seeded() -> None:
        async with await connect(broker) as client:
            await client.create_stream("slow", "slow")
            await client.publish("slow", b"%06d" % 0, ack_policy=AckPolicy.LEADER)

    asyncio.run(seeded())
    got, tail = asyncio.run(main())
    missing = sorted(set(range(total)) - set(got))[:10]
    assert got == list(range(total)), f"{len(got)} offsets for {total}; missing {missing}; {tail.stats}"
    assert tail.stats.gaps > 0, tail.stats  # NATS really dropped deliveries
    # One drop is one NATS error: they are summed up in a line every ten seconds, not a line each.
    lines = [r.getMessage() for r in caplog.records if "slow subscription" in r.getMessage()]
    assert 1 <= len(lines) <= 2, lines
    assert tail.stats.live_batches > 0, tail.stats


def test_a_broker_restart_leaves_no_gap_and_no_repeat(tmp_path, nats_server):
    port = free_port()
    with BrokerProcess(tmp_path / "b", nats_url=nats_server.url, flight_port=port) as broker:

        async def main() -> tuple[list[pa.RecordBatch], LiveTail]:
            async with await connect(broker) as client:
                await client.create_stream("restart", "restart")
                await publish_rows(client, "restart", 0, 100)
                tail = client.tail("restart", start="earliest")
                seen: list[pa.RecordBatch] = []
                await asyncio.wait_for(collect(tail, 100, seen), 30)
                async with consuming(tail, 300, 60, seen):
                    await publish_rows(client, "restart", 100, 100)
                    await asyncio.to_thread(broker.kill)
                    await asyncio.to_thread(broker.start)
                    await publish_rows(client, "restart", 200, 100)
                return seen, tail

        seen, tail = asyncio.run(main())
    assert offsets_of(seen) == list(range(300))
    assert tail.stats.live_batches > 0, tail.stats


def test_a_consumer_paused_with_sigstop_sees_everything_once(broker, tmp_path):
    """A consumer process frozen while the publisher goes on: NATS cuts it off as a slow
    consumer (or drops its deliveries); after SIGCONT it still sees every offset once."""
    out = tmp_path / "offsets.txt"
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from pyspark_jetstream.client import Client

        async def main():
            client = await Client.connect(nats_urls={broker.nats_url!r}, broker={broker.flight!r}, timeout=20)
            tail = client.tail("paused", start="earliest")
            with open({str(out)!r}, "w") as f:
                print("ready", flush=True)
                async for batch in tail:
                    f.write("".join(f"{{o}}\\n" for o in batch.column("offset").to_pylist()))
                    f.flush()
                    if batch.column("offset")[-1].as_py() >= 3999:
                        break
            print(tail.stats, flush=True)
            await client.close()

        asyncio.run(main())
        """
    )

    async def prepare() -> None:
        async with await connect(broker) as client:
            await client.create_stream("paused", "paused", max_message_bytes=64 * 1024)

    asyncio.run(prepare())
    consumer = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert consumer.stdout is not None
        assert consumer.stdout.readline().strip() == "ready", (
            consumer.stderr.read() if consumer.stderr else ""
        )

        async def publish(first: int, count: int) -> None:
            async with await connect(broker) as client:
                futures = [
                    await client.publish_batch_async(
                        "paused", [{"value": os.urandom(16 * 1024)} for _ in range(10)], partition=0
                    )
                    for _ in range(first, first + count, 10)
                ]
                for future in futures:
                    await future

        asyncio.run(publish(0, 1000))
        wait_until(lambda: out.exists() and out.read_text().count("\n") >= 1000, message="the first thousand")
        consumer.send_signal(signal.SIGSTOP)
        asyncio.run(publish(1000, 3000))  # 48 MB while it sleeps: every one acked before it wakes
        consumer.send_signal(signal.SIGCONT)
        stdout, stderr = consumer.communicate(timeout=90)
    finally:
        with contextlib.suppress(ProcessLookupError):
            consumer.send_signal(signal.SIGCONT)
        consumer.kill()
    assert consumer.returncode == 0, stderr[-3000:]
    assert [int(x) for x in out.read_text().split()] == list(range(4000))
    assert "live_batches=0," not in stdout, stdout


def test_deliveries_are_the_stored_frames_and_marks_carry_the_high_watermark(broker):
    """What a plain NATS subscriber sees on the subject: the stored batch, then marks when idle."""

    async def main() -> list[bytes]:
        async with await connect(broker) as client:
            await client.create_stream("wire", "wire", compression="zstd")
            subscription = await client.nc.subscribe(tail_subject("wire", 0))
            await client.nc.flush()
            await client.publish_batch("wire", [{"value": b"x" * 40_000} for _ in range(3)], partition=0)
            payloads = [(await subscription.next_msg(timeout=5)).data for _ in range(3)]
            await subscription.unsubscribe()
            return payloads

    payloads = asyncio.run(main())
    deliveries = [decode_delivery(p) for p in payloads]
    batch = next(d for d in deliveries if d.batch is not None)
    assert (batch.first_offset, batch.last_offset) == (0, 2)
    assert batch.batch is not None and batch.batch.column("value").to_pylist() == [b"x" * 40_000] * 3
    assert len(payloads[deliveries.index(batch)]) < 40_000  # stored compressed, sent as stored
    marks = [d for d in deliveries if d.batch is None]
    assert marks and all(m.high_watermark in (0, 3) for m in marks)


def test_a_thousand_tailers_cost_the_broker_no_threads(broker):
    """1,000 consumers tailing one partition: each gets every message; the broker's threads
    stay flat (a Flight follow read would hold one each)."""

    def threads_and_rss() -> tuple[int, int]:
        assert broker.process is not None
        status = Path(f"/proc/{broker.process.pid}/status").read_text().splitlines()
        fields = {line.split(":")[0]: line.split(":")[1].split() for line in status}
        return int(fields["Threads"][0]), int(fields["VmRSS"][0])

    async def main() -> tuple[list[list[int]], tuple[int, int], tuple[int, int]]:
        async with await connect(broker) as client:
            await client.create_stream("fan", "fan")
            await client.publish("fan", b"first", ack_policy=AckPolicy.LEADER)
            before = threads_and_rss()
            tails = [client.tail("fan", start="earliest") for _ in range(1000)]
            got: list[list[int]] = [[] for _ in tails]
            started = [asyncio.Event() for _ in tails]

            async def consume(i: int) -> None:
                async for batch in tails[i]:
                    got[i].extend(batch.column("offset").to_pylist())
                    started[i].set()
                    if got[i][-1] >= 100:
                        return

            consumers = [asyncio.ensure_future(consume(i)) for i in range(len(tails))]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
            for start in range(1, 101, 20):
                await client.publish_batch(
                    "fan", [{"value": b"%d" % i} for i in range(start, start + 20)], partition=0
                )
            await asyncio.wait_for(asyncio.gather(*consumers), 120)
            during = threads_and_rss()
            for tail in tails:
                await tail.aclose()
            return got, before, during

    got, (threads_before, rss_before), (threads_during, rss_during) = asyncio.run(main())
    assert all(g == list(range(101)) for g in got), [len(g) for g in got if g != list(range(101))][:5]
    print(f"broker threads {threads_before} -> {threads_during}, RSS {rss_before} -> {rss_during} KiB")
    assert threads_during <= threads_before + 16, (threads_before, threads_during)
    assert rss_during < rss_before + 200 * 1024, (rss_before, rss_during)


def test_off_in_the_broker_means_consumers_tail_over_flight(tmp_path, nats_server):
    config = "[ingest]\nlive_tail = false\n"
    with BrokerProcess(tmp_path / "b", nats_url=nats_server.url, extra_config=config) as broker:

        async def main() -> tuple[list[pa.RecordBatch], LiveTail]:
            async with await connect(broker) as client:
                await client.create_stream("off", "off")
                tail = client.tail("off", start="earliest")

                async def fallen_back() -> None:  # three silent checks, 3 s apart
                    while not tail.stats.flight_only:
                        await asyncio.sleep(0.1)

                async with consuming(tail, 10, 30) as seen:
                    await asyncio.wait_for(fallen_back(), 30)
                    await publish_rows(client, "off", 0, 10)
                return seen, tail

        seen, tail = asyncio.run(main())
    assert offsets_of(seen) == list(range(10))
    assert tail.stats.flight_only and tail.stats.live_batches == 0


@pytest.mark.parametrize("bad", [b"", b"PJT1", b"XXXX" + bytes(28), b"PJT1" + bytes(28) + b"not arrow"])
def test_garbage_on_the_tail_subject_is_ignored(broker, bad):
    """Anyone may publish on the subject (until permissions say otherwise): a consumer
    ignores what does not parse and reads over Flight instead."""

    async def main() -> tuple[list[pa.RecordBatch], LiveTail]:
        async with await connect(broker) as client:
            await client.create_stream("noise", "noise")
            tail = client.tail("noise", start="earliest")
            async with consuming(tail, 5, 30) as seen:
                await publish_rows(client, "noise", 0, 2)
                while tail.next_offset < 2:
                    await asyncio.sleep(0.01)
                await client.nc.publish(tail_subject("noise", 0), bad)
                await publish_rows(client, "noise", 2, 3)
            return seen, tail

    seen, tail = asyncio.run(main())
    assert offsets_of(seen) == list(range(5))
    assert tail.stats.malformed == 1


def _tailed(
    broker: BrokerProcess, stream: str, count: int, publish: Callable[[Client], Awaitable[None]]
) -> tuple[list[bytes], list[bytes], LiveTail]:
    """Tail ``stream`` (new, one partition) from the start while ``publish`` writes to it, until
    ``count`` values came; those values, every payload on the tail's NATS subject, and the tail."""

    async def main() -> tuple[list[bytes], list[bytes], LiveTail]:
        async with await connect(broker) as client:
            await client.create_stream(stream, stream)
            raw = await client.nc.subscribe(tail_subject(stream, 0))
            tail = client.tail(stream, start="earliest")
            values: list[bytes] = []

            async def consume() -> None:
                async for batch in tail:
                    values.extend(batch.column("value").to_pylist())
                    if len(values) == count:
                        return

            consumer = asyncio.ensure_future(consume())
            while tail.next_offset < 0:
                await asyncio.sleep(0.01)
            await publish(client)
            await asyncio.wait_for(consumer, 30)
            await tail.aclose()
            payloads = []
            with contextlib.suppress(Exception):
                while True:
                    payloads.append((await raw.next_msg(timeout=0.5)).data)
            return values, payloads, tail

    return asyncio.run(main())


def test_a_batch_too_large_for_nats_reaches_consumers_over_flight(tmp_path):
    """A stored batch larger than the server's max_payload is announced by a mark naming it."""

    async def publish(client: Client) -> None:
        await client.publish("big", b"small", partition=0)
        # Fits in a publish, but not once stored with its offsets and metadata.
        await client.publish("big", os.urandom(65_000), partition=0)

    with NatsServer(config="max_payload: 65536") as server:
        broker = BrokerProcess(tmp_path / "b", nats_url=server.url).start()
        try:
            values, payloads, tail = _tailed(broker, "big", 2, publish)
        finally:
            broker.stop()
    assert [len(v) for v in values] == [5, 65_000]
    deliveries = [decode_delivery(p) for p in payloads]
    assert any(d.batch is None and (d.first_offset, d.last_offset) == (1, 1) for d in deliveries), deliveries
    assert not any(d.batch is not None and d.first_offset == 1 for d in deliveries)
    assert tail.stats.gaps >= 1, tail.stats


def test_a_bulk_batch_is_announced_by_a_mark_and_read_over_flight(broker):
    """A stored batch over the tail's 256 KiB (a bulk write: the Spark sink's chunks) is not
    published, though NATS would take it: a mark names it, and the consumer reads it over Flight;
    a small batch after it is published as ever."""

    async def publish(client: Client) -> None:
        bulk = pa.table({"value": [os.urandom(3_000) for _ in range(100)]})  # 300 KB stored
        await client.publish_batch("bulk", bulk, partition=0)
        await client.publish("bulk", b"small", partition=0)

    values, payloads, tail = _tailed(broker, "bulk", 101, publish)
    assert [len(v) for v in values] == [3_000] * 100 + [5]
    deliveries = [decode_delivery(p) for p in payloads]
    assert any(d.batch is None and (d.first_offset, d.last_offset) == (0, 99) for d in deliveries), deliveries
    assert not any(d.batch is not None and d.first_offset == 0 for d in deliveries)
    assert any(d.batch is not None and d.first_offset == 100 for d in deliveries)  # the small one
    assert tail.stats.gaps >= 1, tail.stats


class _Growing:
    """A partition whose high watermark moves on between the publisher's look and its read, as
    a leader's does under a steady publisher: batch n is offsets 2n and 2n + 1."""

    stream, number, leader_epoch = "grow", 0, 3

    def __init__(self) -> None:
        self.looks = 0
        self.listener = None

    @property
    def high_watermark(self) -> int:
        self.looks += 1
        return 2 * min(self.looks, 10)  # one more batch committed at every look, ten in all

    def on_commit(self, listener):
        self.listener = listener
        return lambda: None

    def committed_frames(self, offset: int, max_bytes: int):
        upper = self.high_watermark  # the read goes up to the high watermark of its moment
        return [ReplicaFrame(o, o + 1, 3, pa.py_buffer(b"f")) for o in range(offset, upper, 2)]

    try_committed_frames = committed_frames


class _Sent:
    max_payload = 1 << 20

    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    async def publish(self, subject: str, payload: bytes) -> None:
        self.payloads.append(payload)


def test_a_delivery_never_names_a_high_watermark_its_batch_is_not_below():
    async def run() -> list[bytes]:
        sent = _Sent()
        publisher = TailPublisher(_Growing(), lambda: sent)
        await publisher._publish()
        await publisher.close()
        return sent.payloads

    headers = [_HEADER.unpack_from(p)[1:] for p in asyncio.run(run()) if len(p) > HEADER_BYTES]
    assert headers
    for first, last, _, hw in headers:
        assert last < hw, (first, last, hw)


def test_deliveries_are_handed_over_in_order_and_a_wait_ends_on_idle_and_on_close(nats_server, monkeypatch):
    """The tail's hand-over from its subscription: what arrives while the consumer is busy waits
    in the subscription and comes in order; a wait with nothing ends after IDLE_SECONDS, and at
    once (within one watch) when the connection closes."""
    monkeypatch.setattr(live, "IDLE_SECONDS", 0.5)
    monkeypatch.setattr(live, "WATCH_SECONDS", 0.05)

    async def main() -> tuple[list[bytes], float, float]:
        nc = await nats.connect(nats_server.url)
        deliveries = live._Deliveries(nc)
        try:
            await nc.subscribe("handed", cb=deliveries.received)
            # Published on the subscribing connection: the server handles one connection's SUB
            # before its PUBs, where another connection's first PUBs can race the new interest.
            for i in range(5):  # nobody is taking them yet
                await nc.publish("handed", b"%d" % i)
            await nc.flush()
            deadline = time.monotonic() + 10
            while deliveries._held is None and time.monotonic() < deadline:  # the first is held
                await asyncio.sleep(0.01)
            assert deliveries._held is not None
            got = [await deliveries.next() for _ in range(5)]
            began = time.monotonic()
            with pytest.raises(NatsTimeoutError):
                await deliveries.next()
            idle = time.monotonic() - began
            waiting = asyncio.ensure_future(deliveries.next())
            await asyncio.sleep(0.1)
            began = time.monotonic()
            await nc.close()
            with pytest.raises(ConnectionClosedError):
                await waiting
            closed = time.monotonic() - began
        finally:
            deliveries.close()
            await nc.close()
        return got, idle, closed

    got, idle, closed = asyncio.run(main())
    assert got == [b"0", b"1", b"2", b"3", b"4"]
    assert 0.5 <= idle < 5, idle
    assert closed < live.IDLE_SECONDS, closed  # noticed by a watch, not by the idle timeout
