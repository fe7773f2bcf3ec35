"""Mirrors between two single-broker deployments (each its own broker, nats-server and metadata):
the copy offset for offset, refused publishes and bad requests, promotion, cursors, typed streams,
the source's retention, the CLI and the metrics."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

from broker_node.zookeeper_server import free_port
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.local import LocalBroker
from pyspark_jetstream.protocol.errors import InvalidArgumentError, JetStreamError, UnknownStreamError
from pyspark_jetstream.protocol.streams import StreamConfig

from .harness import run_cli, scrape, wait_until
from .mirror_harness import assert_identical, partition_table, wait_caught_up

_names = itertools.count()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    with LocalBroker(
        tmp_path_factory.mktemp("source") / "data", broker_id="a-1", maintenance_interval=0.3
    ) as b:
        yield b


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    directory = tmp_path_factory.mktemp("mirror") / "data"
    # Fixed ports: the broker is restarted, and the module's client goes on with it.
    with LocalBroker(
        directory,
        broker_id="b-1",
        flight_port=free_port(),
        embedded_nats_port=free_port(),
        extra_config="[metrics]\nport = 0\n",
    ) as b:
        yield b


@pytest.fixture(scope="module")
def src(source):
    with SyncClient(nats_urls=source.nats_url, broker=source.flight, timeout=20) as client:
        yield client


@pytest.fixture(scope="module")
def dst(mirror):
    with SyncClient(nats_urls=mirror.nats_url, broker=mirror.flight, timeout=20) as client:
        yield client


@pytest.fixture
def name():
    return f"m{next(_names)}"


def fill(client: SyncClient, stream: str, partitions: int, count: int, start: int = 0) -> None:
    """``count`` keyed messages with headers and message ids, over every partition."""
    for i in range(start, start + count):
        client.publish(
            stream,
            f"v{i}".encode(),
            key=f"k{i % 5}".encode(),
            headers={"h": str(i).encode()},
            partition=i % partitions,
            message_id=f"id-{stream}-{i}",
        )


def test_a_mirror_holds_every_message_at_its_source_offset(source, mirror, src, dst, name):
    src.create_stream(name, f"{name}.in", partitions=2)
    fill(src, name, 2, 40)
    src.publish_batch(
        name, pa.table({"value": [b"b1", b"b2", b"b3"], "key": [b"x", None, b"z"]}), partition=1
    )
    info = dst.create_mirror(name, name, source.flight)
    config = StreamConfig.from_json(info.config)
    assert (config.partitions, config.subject, config.mirror.stream) == (2, f"{name}.in", name)
    wait_caught_up(dst, name, src)
    assert_identical(source.flight, name, mirror.flight, name, 2)
    fill(src, name, 2, 30, start=40)  # copied as they come
    wait_caught_up(dst, name, src)
    assert_identical(source.flight, name, mirror.flight, name, 2)
    assert dst.create_mirror(name, name, source.flight).config == info.config  # idempotent
    statuses = dst.mirror_status(name)
    assert [(s.partition, s.state, s.source_leader) for s in statuses] == [
        (0, "copying", source.flight),
        (1, "copying", source.flight),
    ]
    samples = scrape(mirror)
    labels = (("partition", "1"), ("source", f"'{name}' on {source.flight}"), ("stream", name))
    assert samples[("jetstream_mirror_lag_messages", labels)] == 0
    assert samples[("jetstream_mirror_up", labels)] == 1


def test_publishes_to_a_mirror_are_refused_with_one_line(source, src, dst, name):
    src.create_stream(name, name)
    dst.create_mirror(name, name, source.flight)
    refusal = f"stream '{name}' mirrors '{name}' on {source.flight}: publish to the source"
    with pytest.raises(InvalidArgumentError, match=refusal):
        dst.publish(name, b"x")
    with pytest.raises(JetStreamError, match=refusal):
        putter = dst.putter(f"producer-{name}")
        try:
            putter.send(name, 0, 0, pa.record_batch({"value": [b"y"]})).result(20)
        finally:
            putter.close()
    assert partition_table(dst.broker, name, 0).num_rows == 0
    with pytest.raises(
        InvalidArgumentError, match=f"stream '{name}' mirrors '{name}' on .*: add partitions on the source"
    ):
        dst.add_partitions(name, 3)


def test_bad_mirrors_are_refused_with_one_line(source, mirror, src, dst, name):
    with pytest.raises(
        UnknownStreamError, match=f"the source cluster at {source.flight} has no stream named 'nope'"
    ):
        dst.create_mirror(name, "nope", source.flight)
    src.create_stream(name, name, partitions=2)
    with pytest.raises(
        InvalidArgumentError, match=r"partitions=3, but the source .* has 2; a mirror has its source's"
    ):
        dst.create_mirror(name, name, source.flight, partitions=3)
    with pytest.raises(InvalidArgumentError, match="source server 'http://x:1' is not a Flight address"):
        dst.create_mirror(name, name, "http://x:1")
    # A loop: B copies A's stream; A's is then replaced by a mirror of B's, which would copy itself.
    dst.create_mirror(name, name, source.flight)
    src.delete_stream(name)
    with pytest.raises(
        InvalidArgumentError,
        match=rf"mirror loop: '{name}' here mirrors '{name}' on .* mirrors '{name}' here",
    ):
        src.create_mirror(name, name, mirror.flight)
    assert name not in {s.config["name"] for s in src.list_streams()}


def test_a_promoted_mirror_takes_publishes_and_stays_promoted_after_a_restart(source, mirror, src, dst, name):
    src.create_stream(name, name)
    fill(src, name, 1, 10)
    dst.create_mirror(name, name, source.flight)
    wait_caught_up(dst, name, src)
    info = dst.promote_stream(name)
    assert StreamConfig.from_json(info.config).mirror.promoted
    ack = dst.publish(name, b"after promotion")
    assert (ack.first_offset, ack.last_offset) == (10, 10)  # writable from its end offset
    assert [s.state for s in dst.mirror_status(name)] == ["promoted"]
    fill(src, name, 1, 5, start=10)
    mirror.stop()
    mirror.start()
    with SyncClient(nats_urls=mirror.nats_url, broker=mirror.flight, timeout=20) as again:
        assert StreamConfig.from_json(again.describe_stream(name).config).mirror.promoted
        again.publish(name, b"after restart")
        rows = partition_table(mirror.flight, name, 0)
    assert rows.column("value").to_pylist()[-2:] == [b"after promotion", b"after restart"]
    assert rows.num_rows == 12  # nothing of the source's later messages


def test_cursors_follow_the_mirror(source, src, dst, name):
    src.create_stream(name, name, partitions=2)
    fill(src, name, 2, 20)
    src.set_cursor("etl", name, 0, 7)
    src.set_cursor("etl", name, 1, 10)
    src.set_cursor("gone", name, 0, 3)
    dst.create_mirror(name, name, source.flight)
    # Each partition's copier copies that partition's cursors: no order between partitions.
    wait_until(lambda: dst.fetch_cursor("etl", name, 1) == 10, timeout=20, message="the cursor copied")
    wait_until(lambda: dst.fetch_cursor("etl", name, 0) == 7, timeout=20, message="the cursor copied")
    wait_until(lambda: dst.fetch_cursor("gone", name, 0) == 3, timeout=20, message="the cursor copied")
    src.set_cursor("etl", name, 0, 9)
    src.delete_cursor("gone", name, 0)
    wait_until(lambda: dst.fetch_cursor("etl", name, 0) == 9, timeout=20, message="the moved cursor copied")
    wait_until(lambda: dst.fetch_cursor("gone", name, 0) is None, timeout=20, message="the deletion copied")


def test_a_typed_stream_mirrors_with_its_schema(source, src, dst, name):
    schema = {
        "fields": [{"name": "n", "type": "int32", "nullable": False}, {"name": "label", "type": "string"}]
    }
    src.create_stream(name, name, schema=schema)
    for i in range(5):
        src.publish(name, f'{{"n": {i}, "label": "l{i}"}}'.encode())
    dst.create_mirror(name, name, source.flight)
    wait_caught_up(dst, name, src)
    ours = StreamConfig.from_json(dst.describe_stream(name).config).schema
    assert ours == StreamConfig.from_json(src.describe_stream(name).config).schema
    src.update_schema(name, {"fields": [*schema["fields"], {"name": "extra", "type": "int64"}]})
    src.publish(name, b'{"n": 5, "label": "l5", "extra": 50}')
    wait_caught_up(dst, name, src)
    typed = dst.fetch(name, columns=["offset", "n", "label", "extra"]).to_table()
    assert typed.column("n").to_pylist() == list(range(6))
    assert typed.column("extra").to_pylist() == [None] * 5 + [50]
    assert StreamConfig.from_json(dst.describe_stream(name).config).schema.version == 2


def test_the_mirror_starts_where_the_source_retention_left_off(source, src, dst, name):
    src.create_stream(name, name, segment_bytes=1024, retention_messages=10)
    for _ in range(6):
        src.publish_batch(name, pa.table({"value": [b"x" * 100] * 8}))
    start = wait_until(
        lambda: (s := src.describe_stream(name).partitions[0].log_start_offset) > 0 and s,
        message="the source's retention to delete a segment",
    )
    dst.create_mirror(name, name, source.flight)
    wait_caught_up(dst, name, src)
    mirrored = dst.describe_stream(name).partitions[0]
    assert mirrored.log_start_offset >= start and mirrored.log_end_offset == 48
    assert partition_table(dst.broker, name, 0).column("offset").to_pylist() == list(
        range(mirrored.log_start_offset, 48)
    )


def test_the_cli_creates_shows_and_promotes_a_mirror(source, mirror, src, dst, name):
    src.create_stream(name, name)
    fill(src, name, 1, 3)

    def cli(*args: str) -> str:
        result = run_cli("--nats", mirror.nats_url, *args)
        assert result.returncode == 0, result.stderr
        return result.stdout

    created = cli("stream", "create", name, "--mirror-of", name, "--source-servers", source.flight)
    assert f"stream {name} mirrors '{name}' on {source.flight} with 1 partition(s)" in created
    wait_caught_up(dst, name, src)
    info = cli("stream", "info", name)
    assert f"mirror of '{name}' on {source.flight}" in info and "copying" in info
    refused = run_cli(
        "--nats", mirror.nats_url, "stream", "create", name, "--mirror-of", name, "--compaction"
    )
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "jetstream: --mirror-of needs --source-servers: the source cluster's Flight addresses"
    ]
    refused = run_cli(
        "--nats",
        mirror.nats_url,
        "stream",
        "create",
        name,
        "--mirror-of",
        name,
        "--source-servers",
        source.flight,
        "--retention-age",
        "1d",
    )
    assert "a mirror takes --retention-age from its source" in refused.stderr
    assert "is promoted" in cli("stream", "promote", name)
    assert "promoted: once a mirror of" in cli("stream", "info", name)
