"""The jetstream command line, run as a user would."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def jetstream(broker, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``jetstream`` against ``broker``."""
    result = subprocess.run(
        [sys.executable, "-m", "pyspark_jetstream.cli", "--nats", broker.nats_url, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_stream_publish_tail_cursor_status(broker):
    assert (
        "stream orders on orders with 2 partition(s)"
        in jetstream(
            broker,
            "stream",
            "create",
            "orders",
            "--subject",
            "orders",
            "--partitions",
            "2",
            "--compression",
            "lz4",
        ).stdout
    )
    out = jetstream(broker, "publish", "orders", "hello", "--partition", "1", "--header", "a=b").stdout
    assert "stored in orders/1 at offset 0" in out
    jetstream(broker, "publish", "orders", "world", "--partition", "1")
    lines = jetstream(broker, "tail", "orders", "--partition", "1", "--no-follow").stdout.splitlines()
    assert [line.split("\t")[0::3] for line in lines] == [["0", "hello"], ["1", "world"]]
    followed = jetstream(broker, "tail", "orders", "--partition", "1", "--from", "1", "--count", "1").stdout
    assert followed.split("\t")[-1].strip() == "world"
    jetstream(broker, "cursor", "set", "etl", "orders", "1", "--partition", "1")
    assert jetstream(broker, "cursor", "get", "etl", "orders", "--partition", "1").stdout.strip() == "1"
    status = jetstream(broker, "status").stdout
    assert "etl" in status and "lag" in status
    assert "orders" in jetstream(broker, "stream", "list").stdout
    described = jetstream(broker, "stream", "describe", "orders").stdout
    assert "high watermark" in described and re.search(r"^compression +lz4$", described, re.M)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stream", "create", "bad name", "--subject", "x"], "invalid stream name 'bad name'"),
        (["stream", "create", "ok", "--subject", "a..b"], "invalid subject 'a..b'"),
        (["stream", "describe", "nope"], "no stream named 'nope'"),
        (["tail", "nope", "--no-follow"], "no stream named 'nope'"),
        (["tail", "nope", "--from", "yesterday"], "--from 'yesterday' is not"),
        (["publish", "nope", "x", "--header", "novalue"], "must look like NAME=VALUE"),
        (["--broker", "grpc://127.0.0.1:1", "stream", "list"], "broker at grpc://127.0.0.1:1 is unreachable"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(broker, args, message):
    result = jetstream(broker, *args, check=False)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_no_nats_is_reported(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyspark_jetstream.cli",
            "--nats",
            "nats://127.0.0.1:1",
            "--timeout",
            "2",
            "status",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "cannot connect to NATS at nats://127.0.0.1:1" in result.stderr
