"""Delta Lake with delta-spark: stream into a table and out of one, exactly once, and the archive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_jetstream.protocol.errors import InvalidArgumentError, JetStreamError
from pyspark_jetstream.spark.delta import (
    archive,
    cached_jars,
    delta_coordinates,
    fetch_jars,
    read_with_archive,
)

from ..broker.harness import wait_until
from . import delta_pipeline

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow(seconds=420)  # the longest start first (tests/conftest.py)


def publish_orders(client, stream: str, first: int, count: int, partitions: int = 2) -> None:
    for p in range(partitions):
        numbers = [n for n in range(first, first + count) if n % partitions == p]
        table = pa.table(
            {
                "key": [b"customer-%d" % (n % 7) for n in numbers],
                "value": [json.dumps({"order": n, "amount": n % 97}).encode() for n in numbers],
            }
        )
        for chunk in table.to_batches(max_chunksize=10):  # small batches, so retention can act
            client.publish_batch(stream, chunk, partition=p)


def run_script(body: str, log: Path, *args: str) -> subprocess.Popen:
    """``body`` in a new Python process (and process group) whose output goes to ``log``."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(body), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_a_stream_lands_in_delta_exactly_once_across_a_kill(spark, deployment, client, name, tmp_path):
    client.create_stream(name, name, partitions=2)
    publish_orders(client, name, 0, 750)  # five batches of 150: killed after two
    table, checkpoint = tmp_path / "orders", tmp_path / "checkpoint"
    args = (deployment.flight, name, str(table), str(checkpoint))

    # The first run in its own driver, to be killed; the second in this session.
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen(
            [sys.executable, "-m", "tests.spark.delta_pipeline", *args, "forever"],
            cwd=ROOT,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # Kill the driver and its JVM with SIGKILL once the table has a commit and more are coming.
        wait_until(
            lambda: len(list((table / "_delta_log").glob("*.json"))) >= 2 or first.poll() is not None,
            timeout=240,
            message="two Delta commits",
        )
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    killed_at = len(list((table / "_delta_log").glob("*.json")))
    publish_orders(client, name, 750, 250)

    second = delta_pipeline.start(spark, *args, "available-now")
    second.awaitTermination()
    assert second.exception() is None

    rows = spark.read.format("delta").load(str(table))
    assert rows.count() == 1_000
    assert rows.select("partition", "offset").distinct().count() == 1_000
    assert sorted(r.order for r in rows.select("order").collect()) == list(range(1_000))
    assert len(list((table / "_delta_log").glob("*.json"))) > killed_at


def test_a_delta_table_streams_into_a_stream_exactly_once(spark, deployment, client, name, tmp_path):
    client.create_stream(name, name, partitions=2)
    source, checkpoint = str(tmp_path / "source"), str(tmp_path / "checkpoint")
    spark.createDataFrame(
        [(f"k{i % 5}", f"event {i}") for i in range(100)], "key string, value string"
    ).write.format("delta").save(source)

    def run() -> None:
        query = (
            spark.readStream.format("delta")
            .load(source)
            .writeStream.format("jetstream")
            .option("servers", deployment.flight)
            .option("topic", name)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None

    run()
    spark.createDataFrame(
        [(f"k{i % 5}", f"event {i}") for i in range(100, 150)], "key string, value string"
    ).write.format("delta").mode("append").save(source)
    run()
    run()  # nothing new: nothing written

    stored = spark.read.format("jetstream").option("servers", deployment.flight).option("stream", name).load()
    values = sorted(bytes(r.value).decode() for r in stored.collect())
    assert values == sorted(f"event {i}" for i in range(150))
    by_key = {(bytes(r.key).decode(), r.partition) for r in stored.collect()}
    assert len({key for key, _ in by_key}) == len(by_key)  # a key always goes to one partition


def test_the_archive_holds_history_once_and_reads_back_with_the_log(
    spark, deployment, client, name, tmp_path
):
    client.create_stream(name, name, partitions=1, retention_messages=60, segment_bytes=2_000)
    publish_orders(client, name, 0, 50, partitions=1)
    path = str(tmp_path / "archive")
    servers = {"servers": deployment.flight}

    first = archive(spark, name, path, below=30, options=servers)
    assert (first.start, first.end, first.rows, first.written) == ({"0": 0}, {"0": 30}, 30, True)
    again = archive(spark, name, path, below=30, options=servers)
    assert (again.rows, again.written) == (0, False)
    rest = archive(spark, name, path, options=servers)
    assert (rest.start, rest.end, rest.rows) == ({"0": 30}, {"0": 50}, 20)
    stored = spark.read.format("delta").load(path)
    assert sorted(r.offset for r in stored.select("offset").collect()) == list(range(50))
    assert {c.name for c in stored.schema.fields} >= {"stream", "partition", "offset", "timestamp", "date"}

    publish_orders(client, name, 50, 50, partitions=1)  # retention keeps about the last 60
    log_start = wait_until(
        lambda: client.describe_stream(name).partitions[0].log_start_offset or None,
        timeout=60,
        message="retention",
    )
    assert 0 < log_start <= 50
    whole = read_with_archive(spark, path, {**servers, "stream": name})
    offsets = sorted(r.offset for r in whole.select("offset").collect())
    assert offsets == list(range(100))
    orders = sorted(json.loads(bytes(r.value))["order"] for r in whole.select("value").collect())
    assert orders == list(range(100))


def test_the_archive_refuses_to_leave_a_gap(spark, deployment, client, name, tmp_path):
    client.create_stream(name, name, partitions=1, retention_messages=20, segment_bytes=2_000)
    publish_orders(client, name, 0, 10, partitions=1)
    path = str(tmp_path / "archive")
    archive(spark, name, path, options={"servers": deployment.flight})
    publish_orders(client, name, 10, 100, partitions=1)
    wait_until(
        lambda: client.describe_stream(name).partitions[0].log_start_offset > 10,
        timeout=60,
        message="retention",
    )
    with pytest.raises(
        InvalidArgumentError, match=r"partition 0 starts at offset \d+ but its archive .* ends at 10:"
    ):
        archive(spark, name, path, options={"servers": deployment.flight})
    assert spark.read.format("delta").load(path).count() == 10


def test_delta_jars_match_the_installed_versions_and_a_failing_maven_is_named(tmp_path):
    import pyspark

    spark_line = ".".join(pyspark.__version__.split(".")[:2])
    from importlib import metadata

    assert delta_coordinates() == [
        f"io.delta:delta-spark_{spark_line}_2.13:{metadata.version('delta-spark')}",
        f"io.delta:delta-storage:{metadata.version('delta-spark')}",
    ]
    assert cached_jars(tmp_path) is None
    broken = tmp_path / "mvn"
    broken.write_text("#!/bin/sh\necho 'Could not resolve artifact' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(JetStreamError, match=r"mvn could not fetch io\.delta:delta-spark.*Could not resolve"):
        fetch_jars(tmp_path / "cache", mvn=str(broken))
    assert not list((tmp_path / "cache").glob("*.jar"))


def test_the_session_uses_the_cached_jars(spark):
    jars = cached_jars()
    assert jars is not None, "the set-up (make) fetches the Delta jars into the cache"
    assert {Path(p).name for p in spark.conf.get("spark.jars").split(",")} >= {p.name for p in jars}


def test_a_delta_session_after_a_jvm_started_without_delta_says_why(tmp_path):
    """A JVM keeps the class path it started with: Delta's session after a plain one is refused, named."""
    script = """
        from pyspark_jetstream.spark import jetstream_session
        from pyspark_jetstream.spark.delta import delta_session
        jetstream_session("plain", "local[1]").stop()
        try:
            delta_session("too-late", "local[1]")
        except ValueError as exc:
            print("REFUSED", exc)
    """
    run = run_script(script, tmp_path / "late.log")
    assert run.wait(timeout=180) == 0, (tmp_path / "late.log").read_text()[-3000:]
    log = (tmp_path / "late.log").read_text()
    assert "REFUSED" in log and "already started Spark's JVM without Delta Lake's jars" in log, log[-3000:]
