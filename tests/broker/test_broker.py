"""Reads over Flight, long-polling, restarts, cursors, admin errors, the embedded default."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from pyarrow import flight

from broker_node.broker import RUNTIME_FILE
from broker_node.log import Log, Record
from pyspark_jetstream.client import Client, ClusterConnection, SyncClient
from pyspark_jetstream.protocol.envelope import decode
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    OffsetOutOfRangeError,
    RequestTimeoutError,
    StreamExistsError,
    UnavailableError,
    UnknownStreamError,
)
from pyspark_jetstream.protocol.flight import ReadRequest, StartPosition
from pyspark_jetstream.protocol.schema import LOG_SCHEMA

from .harness import BrokerProcess, scrape, wait_until


def test_fetch_from_offsets_timestamps_and_limits(client):
    client.create_stream("r", "r")
    for i in range(10):
        client.publish("r", b"%d" % i)
    middle = datetime.now(UTC)
    time.sleep(0.01)  # the gap between two timestamps is what a start by time is tested on
    for i in range(10, 15):
        client.publish("r", b"%d" % i)
    assert [r["value"] for r in client.fetch("r", start=12).to_table().to_pylist()] == [b"12", b"13", b"14"]
    first = client.fetch("r", start=middle).to_table().column("offset")[0].as_py()
    assert first == 10
    limited = client.fetch("r", start="earliest", max_records=4)
    assert (limited.num_rows, limited.next_offset, limited.high_watermark) == (4, 4, 15)
    assert client.fetch("r", start="latest").num_rows == 0
    assert client.fetch("r", start="latest").next_offset == 15


def test_reads_can_ask_for_some_columns_only(client, broker):
    client.create_stream("narrow", "narrow")
    client.publish("narrow", b"v", key=b"k")
    raw = flight.connect(broker.flight)
    ticket = flight.Ticket(ReadRequest("narrow", columns=("value",)).to_ticket())
    table = raw.do_get(ticket).read_all()
    assert table.schema.names == ["offset", "value"]
    assert table.to_pylist() == [{"offset": 0, "value": b"v"}]
    raw.close()


def test_long_poll_wakes_on_new_data(deployment):
    """(The module's ``deployment`` serves metrics: they show when the reader is parked.)"""
    waiting = ("jetstream_flight_waiting_readers", ())
    result: dict = {}
    with SyncClient(nats_urls=deployment.nats_url, broker=deployment.flight) as client:
        client.create_stream("lp", "lp")

        def wait() -> None:
            started = time.monotonic()
            # From offset 0 (the empty stream's end), not "latest": that would be
            # resolved when the request arrives, which may be after the publish.
            result["fetch"] = client.fetch("lp", start=0, max_wait=60)
            result["waited"] = time.monotonic() - started

        parked = scrape(deployment)[waiting] + 1
        waiter = threading.Thread(target=wait)
        waiter.start()
        wait_until(lambda: scrape(deployment)[waiting] == parked, message="the reader to park")
        client.publish("lp", b"wake up")
        waiter.join(60)
    assert [r["value"] for r in result["fetch"].to_table().to_pylist()] == [b"wake up"]
    assert result["waited"] < 30  # woken by the commit, not by the 60 s deadline


def test_subscribe_follows_new_messages(client):
    client.create_stream("sub", "sub")
    client.publish("sub", b"before")
    seen = []

    def consume() -> None:
        for message in client.subscribe("sub", start="earliest", follow=5):
            seen.append((message.offset, message.value, message.timestamp.tzinfo is not None))
            if len(seen) == 3:
                return

    consumer = threading.Thread(target=consume)
    consumer.start()
    client.publish("sub", b"during 1")
    client.publish("sub", b"during 2")
    consumer.join(30)
    assert seen == [(0, b"before", True), (1, b"during 1", True), (2, b"during 2", True)]


def test_tail_survives_stream_renewals_without_gaps(client):
    """A short follow window forces reconnects: nothing published between them is lost."""
    client.create_stream("tail", "tail")
    existing = client.publish("tail", b"existing")
    got: list[bytes] = []

    async def consume() -> None:
        async for batch in client._client.tail(
            "tail", start=existing.last_offset + 1, follow=0.3, live=False
        ):
            got.extend(batch.column("value").to_pylist())
            if len(got) == 5:
                return

    future = asyncio.run_coroutine_threadsafe(consume(), client._loop)
    for i in range(5):
        time.sleep(0.2)  # paced: each publish comes after the 0.3 s follow window closed and reopened
        client.publish("tail", b"%d" % i)
    future.result(30)
    assert got == [b"0", b"1", b"2", b"3", b"4"]


def test_follow_ticket_from_a_generic_flight_client(client, broker):
    client.create_stream("pushed", "pushed")
    raw = flight.connect(broker.flight)
    ticket = flight.Ticket(ReadRequest("pushed", follow=30).to_ticket())
    reader = raw.do_get(ticket)
    client.publish("pushed", b"a")
    assert reader.read_chunk().data.column("value").to_pylist() == [b"a"]
    client.publish("pushed", b"b")
    assert reader.read_chunk().data.column("value").to_pylist() == [b"b"]  # same call, pushed
    reader.cancel()
    raw.close()


def test_any_flight_client_can_read_and_list(client, broker):
    client.create_stream("generic", "generic", partitions=2)
    client.publish("generic", b"x", partition=1)
    raw = flight.connect(broker.flight)
    flights = {tuple(p.decode() for p in f.descriptor.path): f for f in raw.list_flights()}
    assert ("generic", "1") in flights and ("__cursors", "0") in flights
    info = raw.get_flight_info(flight.FlightDescriptor.for_path("generic", "1"))
    assert info.schema.equals(LOG_SCHEMA) and info.total_records == 1
    table = raw.do_get(info.endpoints[0].ticket).read_all()
    assert table.column("value").to_pylist() == [b"x"]
    actions = {a.type for a in raw.list_actions()}
    assert {"create_stream", "describe_stream", "set_cursor", "fetch_cursor", "status"} <= actions
    raw.close()


def test_compressed_streams_store_less_and_read_the_same(client, broker):
    values = [b'{"sensor":"s-%03d","temp":%d}' % (i % 100, i % 40) for i in range(5_000)]
    tables = {}
    for codec in ("none", "lz4", "zstd"):
        client.create_stream(f"c-{codec}", f"c-{codec}", compression=codec)
        assert client.describe_stream(f"c-{codec}").config["compression"] == codec
        client.publish_batch(f"c-{codec}", pa.table({"value": values}))
        client.publish(f"c-{codec}", b"one more")
        tables[codec] = client.fetch(f"c-{codec}").to_table()
    for codec, table in tables.items():
        assert table.column("offset").to_pylist() == list(range(5_001))
        assert table.column("value").to_pylist() == [*values, b"one more"]
        assert set(table.column("subject").to_pylist()) == {f"c-{codec}"}

    def stored(codec: str) -> int:
        return sum(f.stat().st_size for f in (broker.data_dir / "streams" / f"c-{codec}").rglob("*.arrows"))

    assert stored("zstd") < stored("lz4") < stored("none") / 3


def test_creation_is_idempotent_and_conflicts_say_what_differs(client):
    first = client.create_stream("idem-create", "x", partitions=2)
    again = client.create_stream("idem-create", "x", partitions=2)
    assert first.config == again.config
    with pytest.raises(StreamExistsError, match="partitions: 3 != 2"):
        client.create_stream("idem-create", "x", partitions=3)
    with pytest.raises(Exception, match="replication factor 3 needs as many brokers, but 1 broker"):
        client.create_stream("replicated", "y", replication_factor=3)


def test_delete_list_describe(client):
    client.create_stream("doomed", "doomed")
    client.publish("doomed", b"x")
    names = [s.config["name"] for s in client.list_streams()]
    assert "doomed" in names and "__cursors" in names
    partition = client.describe_stream("doomed").partitions[0]
    assert (partition.leader, partition.isr, partition.log_end_offset, partition.high_watermark) == (
        "broker-1",
        ("broker-1",),
        1,
        1,
    )
    client.delete_stream("doomed")
    with pytest.raises(UnknownStreamError, match="no stream named 'doomed'"):
        client.describe_stream("doomed")
    client.create_stream("doomed", "doomed")  # a new stream of the same name starts empty
    assert client.fetch("doomed").num_rows == 0


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda c: c.create_stream("bad name", "s"), InvalidArgumentError, "invalid stream name 'bad name'"),
        (lambda c: c.create_stream("ok", "a..b"), InvalidArgumentError, "invalid subject 'a..b'"),
        (lambda c: c.create_stream("__mine", "a"), InvalidArgumentError, "invalid stream name '__mine'"),
        (lambda c: c.create_stream("ok", "a", partitions=0), InvalidArgumentError, "partitions must be"),
        (lambda c: c.create_stream("ok", "a", colour=1), InvalidArgumentError, "colour"),
        (lambda c: c.fetch("missing"), UnknownStreamError, "no stream named 'missing'"),
        (lambda c: c.fetch("known", 5), UnknownStreamError, "partitions 0 to 0, not 5"),
        (lambda c: c.fetch("known", start=99), OffsetOutOfRangeError, "offset 99 is out of range.*0 to 1"),
        (lambda c: c.fetch("known", start=-1), InvalidArgumentError, "invalid start -1"),
        (lambda c: c.delete_stream("__cursors"), InvalidArgumentError, "internal"),
        (lambda c: c.set_cursor("a/b", "known", 0, 1), InvalidArgumentError, "without '/'"),
        (lambda c: c.set_cursor("c", "known", 0, -1), InvalidArgumentError, "must not be negative"),
        (lambda c: c.publish("known", b"x", partition=3), InvalidArgumentError, "partitions 0 to 0, not 3"),
    ],
)
def test_bad_requests_get_clear_errors_and_the_broker_keeps_serving(client, call, error, message):
    client.create_stream("known", "known")
    client.publish("known", b"x")
    with pytest.raises(error, match=message):
        call(client)
    assert client.publish("known", b"y").first_offset == 1


def test_wildcard_stream_needs_a_concrete_subject_to_publish(client):
    client.create_stream("wild", "w.*")
    with pytest.raises(InvalidArgumentError, match="pass subject="):
        client.publish("wild", b"x")
    assert client.publish("wild", b"x", subject="w.one").ok


def test_cursors(client):
    client.create_stream("c", "c", partitions=2)
    assert client.fetch_cursor("app", "c", 1) is None
    client.set_cursor("app", "c", 1, 5)
    client.set_cursor("app", "c", 1, 7)
    client.set_cursor("other", "c", 0, 1)
    assert client.fetch_cursor("app", "c", 1) == 7
    assert client.fetch_cursor("other", "c", 0) == 1
    status = client.status()
    assert {(c["consumer"], c["partition"], c["offset"]) for c in status["cursors"]} == {
        ("app", 1, 7),
        ("other", 0, 1),
    }


@pytest.mark.parametrize("stop", ["graceful", "crash"])
def test_restart_keeps_streams_data_cursors_and_producer_state(tmp_path, nats_server, stop):
    broker = BrokerProcess(tmp_path / "b", nats_url=nats_server.url).start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        client.create_stream("durable", "durable", partitions=2, compaction=True)
        for i in range(20):
            client.publish("durable", b"%d" % i, key=b"k%d" % (i % 4), partition=i % 2)
        client.publish_batch(
            "durable",
            pa.table({"value": [b"a", b"b"]}),
            producer_id="spark-q1-p0",
            producer_epoch=41,
            sequence=0,
        )
        client.set_cursor("job", "durable", 1, 6)
        before = client.fetch("durable", 0).to_table()
    if stop == "graceful":
        assert broker.stop(signal.SIGTERM) == 0
        assert not (broker.data_dir / RUNTIME_FILE).exists()
    else:
        broker.kill()
    broker.start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        assert client.describe_stream("durable").config["compaction"] is True
        assert client.fetch("durable", 0).to_table().equals(before)
        assert client.fetch_cursor("job", "durable", 1) == 6
        again = client.publish_batch(
            "durable",
            pa.table({"value": [b"a", b"b"]}),
            producer_id="spark-q1-p0",
            producer_epoch=41,
            sequence=0,
        )
        assert again.duplicate and (again.first_offset, again.last_offset) == (10, 11)
        assert client.publish("durable", b"new", partition=0).first_offset == 12
    assert broker.stop() == 0


def test_interval_fsync_reaches_the_end_of_a_burst(tmp_path, nats_server):
    broker = BrokerProcess(
        tmp_path / "b",
        nats_url=nats_server.url,
        extra_config='[log]\nfsync = "interval"\nfsync_interval = 0.2\n',
    ).start()
    try:
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
            client.create_stream("synced", "synced")
            client.publish("synced", b"last of a burst")
        partition_dir = broker.data_dir / "streams" / "synced" / "0"
        wait_until(
            lambda: f"interval fsync of {partition_dir}" in broker.log_path.read_text(), message="fsync"
        )
    finally:
        assert broker.stop() == 0


def test_sigterm_stores_pending_messages_and_exits_cleanly(tmp_path, nats_server):
    broker = BrokerProcess(tmp_path / "b", nats_url=nats_server.url).start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        client.create_stream("flush", "flush")
        acks = [client.publish("flush", b"%d" % i) for i in range(100)]
        assert [a.first_offset for a in acks] == list(range(100))
    assert broker.stop(signal.SIGINT) == 0
    broker.start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        assert client.fetch("flush").num_rows == 100
    broker.stop()


def test_embedded_nats_by_default_and_discovery(tmp_path):
    broker = BrokerProcess(tmp_path / "embedded", nats_url=None).start()
    try:
        with SyncClient(nats_urls=broker.nats_url) as client:  # broker found through NATS
            assert client.broker == broker.flight
            client.create_stream("e", "e")
            assert client.publish("e", b"x").ok
    finally:
        assert broker.stop() == 0


def test_retention_runs_in_the_background(client):
    client.create_stream("short", "short", retention_messages=10, segment_bytes=2000)
    for i in range(60):
        client.publish("short", b"m%03d" % i + b"." * 100)
    wait_until(
        lambda: client.describe_stream("short").partitions[0].log_start_offset > 0, message="retention"
    )
    partition = client.describe_stream("short").partitions[0]
    assert partition.high_watermark - partition.log_start_offset >= 10
    with pytest.raises(OffsetOutOfRangeError, match="out of range"):
        client.fetch("short", start=0)


def test_a_read_below_the_log_start_fails_at_once_instead_of_retrying(client, broker, caplog):
    """Deleted offsets never come back: the read is not retried until its timeout (it was, 30 s)."""
    client.create_stream("gone", "gone", retention_messages=10, segment_bytes=2000)
    for i in range(60):
        client.publish("gone", b"m%03d" % i + b"." * 100)
    wait_until(lambda: client.describe_stream("gone").partitions[0].log_start_offset > 0, message="retention")
    connection = ClusterConnection(broker.flight, timeout=30)
    try:
        with (
            caplog.at_level("DEBUG", logger="pyspark_jetstream.client.cluster"),
            pytest.raises(OffsetOutOfRangeError) as refused,
        ):
            connection.read(ReadRequest("gone", 0, StartPosition("offset", 0)))
    finally:
        connection.close()
    assert refused.value.fields["offset"] == 0 and refused.value.fields["log_start_offset"] > 0
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


def test_a_hung_broker_first_in_the_list_does_not_stop_lookups(client, broker):
    """A broker that accepts connections and never answers (paused, or a black hole) is given up
    in time to ask the next one; the one that answered is asked first from then on."""
    client.create_stream("hung", "hung")
    with socket.socket() as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen()  # connections complete in the kernel; nothing ever reads them
        hung = f"grpc://127.0.0.1:{black_hole.getsockname()[1]}"
        connection = ClusterConnection([hung, broker.flight], timeout=6)
        started = time.monotonic()
        try:
            assert connection.describe("hung").config["name"] == "hung"
            assert connection.leadership("hung").config["name"] == "hung"
            assert [s.config["name"] for s in connection.list_streams()].count("hung") == 1
        finally:
            connection.close()
    # The contract, not a benchmark: the hung broker costs half a timeout once (it was three
    # timeouts per lookup: a lookup waited past its own deadline).
    assert time.monotonic() - started < 6


def test_unreachable_servers_are_named():
    with pytest.raises(UnavailableError, match="nats://127.0.0.1:1"):
        SyncClient(nats_urls="nats://127.0.0.1:1", timeout=2)


def test_broker_and_blocking_client_run_on_uvloop_where_it_is_installed(client):
    """The broker extra installs uvloop (not on Windows): the broker serves on its loop, and so
    does the blocking client's thread."""
    assert client.status()["event_loop"] == "uvloop"
    assert type(client._loop).__module__.startswith("uvloop")


def test_runtime_file_names_the_addresses(broker):
    info = json.loads((broker.data_dir / RUNTIME_FILE).read_text())
    assert info["flight"] == broker.flight and info["nats"] == [broker.nats_url]


def test_a_delete_interrupted_by_a_crash_leaves_no_data_behind(tmp_path, nats_server):
    broker = BrokerProcess(tmp_path / "b", nats_url=nats_server.url).start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        client.create_stream("gone", "gone")
        client.publish("gone", b"old data")
    broker.stop()
    # The crash: the metadata change (stream gone, its id a tombstone) is on disk,
    # the data directory is not yet removed.
    metadata_path = broker.data_dir / "metadata.json"
    metadata = json.loads(metadata_path.read_text())
    metadata["deleted"].append(metadata["streams"].pop("gone")["id"])
    metadata_path.write_text(json.dumps(metadata))
    assert (broker.data_dir / "streams" / "gone" / "0").exists()
    broker.start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        assert not (broker.data_dir / "streams" / "gone").exists()
        client.create_stream("gone", "gone")
        assert client.fetch("gone").num_rows == 0
    broker.stop()


def test_unacked_publishes_expire_and_free_the_window(broker):
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as admin:
        admin.create_stream("after", "after")
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight, timeout=1.0, max_pending=1) as client:
        for _ in range(2):  # nobody listens on this subject: no ack will come
            with pytest.raises(RequestTimeoutError, match="no ack .* within 1s"):
                client.publish(None, b"x", subject="nobody.listens")
        assert client.publish("after", b"ok", timeout=30).ok


def test_a_publish_waits_as_long_as_its_own_timeout(broker):
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight, timeout=1.0) as client:
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError, match="within 2.5s"):
            client.publish(None, b"x", subject="nobody.listens", timeout=2.5)
        assert time.monotonic() - started >= 2.5  # not cut short by the client's 1 s default
        # A later, shorter deadline is not held up by an earlier, longer one.
        slow = client._run(client._client.publish_async(None, b"slow", subject="nobody.listens", timeout=60))
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError, match="within 0.5s"):
            client.publish(None, b"fast", subject="nobody.listens", timeout=0.5)
        assert time.monotonic() - started < 30
        assert not slow.done()
    assert isinstance(slow.exception(), UnavailableError)  # closing the client ends it


def test_publishes_started_together_leave_in_the_order_they_were_called(broker):
    """A client's first publishes to a stream wait for its description; those called meanwhile
    queue behind them instead of overtaking, so a producer's pipelined sequences arrive in order
    and none is refused (issue 18, item 2: a new sink task's first chunks were resent)."""
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as admin:
        admin.create_stream("ordered", "ordered", partitions=2)

    async def main() -> tuple[list[int], list[int]]:
        async with await Client.connect(nats_urls=broker.nats_url, broker=broker.flight) as client:
            sent: list[int] = []
            publish = client.nc.publish

            async def spy(subject: str, payload: bytes, *args: object, **kwargs: object) -> None:
                sent.append(decode(payload).sequence)
                await publish(subject, payload, *args, **kwargs)

            client.nc.publish = spy  # type: ignore[method-assign]
            futures = await asyncio.gather(
                *(
                    client.publish_batch_async(
                        "ordered", [{"value": b"%d" % n}], partition=1, producer_id="p", sequence=n
                    )
                    for n in range(12)
                )
            )
            acks = [await f for f in futures if f is not None]
            return sent, [a.first_offset for a in acks if a.ok and not a.duplicate]

    sent, offsets = asyncio.run(main())
    assert sent == list(range(12))
    assert offsets == list(range(12))


def test_unencodable_publishes_do_not_leak_the_window(broker):
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight, max_pending=1) as client:
        client.create_stream("enc", "enc")
        for _ in range(3):
            with pytest.raises(ValueError, match="header name is 70000 bytes"):
                client.publish("enc", b"x", headers={"h" * 70_000: b"v"})
        assert client.publish("enc", b"fine").first_offset == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_open_follow_reads_at_once(tmp_path, nats_server, sig):
    """An open follow read (60 s) must not hold up a graceful stop until it expires."""
    broker = BrokerProcess(tmp_path / "b", nats_url=nats_server.url).start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        client.create_stream("tailed", "tailed")
        client.publish("tailed", b"x")
    raw = flight.connect(broker.flight)
    readers = [raw.do_get(flight.Ticket(ReadRequest("tailed", follow=60).to_ticket())) for _ in range(3)]
    for reader in readers:
        assert reader.read_chunk().data.num_rows == 1  # the read is open and parked
    started = time.monotonic()
    assert broker.stop(sig, timeout=60) == 0
    assert time.monotonic() - started < 10
    raw.close()


def test_records_in_the_cursor_stream_that_are_not_cursors_are_skipped_at_start(tmp_path, nats_server):
    broker = BrokerProcess(tmp_path / "b", nats_url=nats_server.url).start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        client.create_stream("c", "c")
        client.set_cursor("app", "c", 0, 5)
        client.set_cursor("other", "c", 0, 2)
    assert broker.stop() == 0
    # Well-checksummed records that are not cursors, as a stray writer could leave them.
    with Log.open(broker.data_dir / "streams" / "__cursors" / "0") as log:
        log.append(
            [
                Record(b"not a number", key=b"app/c/0"),
                Record(b"9" * 30, key=b"other/c/0"),  # past int64
                Record(b"-3", key=b"other/c/0"),
                Record(b"4", key=None),
            ]
        )
    broker.start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        assert client.fetch_cursor("app", "c", 0) == 5
        assert client.fetch_cursor("other", "c", 0) == 2
        client.set_cursor("app", "c", 0, 6)
        assert client.fetch_cursor("app", "c", 0) == 6
    assert "not a cursor" in broker.log_path.read_text()
    assert broker.stop() == 0
