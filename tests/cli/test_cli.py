"""The jetstream command line, run as a user would."""

from __future__ import annotations

import json
import re
import socket
import subprocess

import pytest

from ..broker.harness import run_cli


def jetstream(broker, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``jetstream`` against ``broker``."""
    result = run_cli("--nats", broker.nats_url, *args)
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
        (
            ["--broker", "grpc://127.0.0.1:1", "--timeout", "2", "stream", "list"],
            "broker at grpc://127.0.0.1:1 is unreachable",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_1(broker, args, message):
    result = jetstream(broker, *args, check=False)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_no_nats_is_reported(tmp_path):
    result = run_cli("--nats", "nats://127.0.0.1:1", "--timeout", "2", "status")
    assert result.returncode == 1 and "cannot connect to NATS at nats://127.0.0.1:1" in result.stderr


# ---- every failure is one line on stderr: 1 for errors, 2 for usage ------------------------------


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line on stderr; fails showing all of stderr if there is anything else."""
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), result.stderr
    line = result.stderr.rstrip("\n")
    assert line.startswith("jetstream: ") and "Traceback" not in line, line
    return line


@pytest.fixture
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_nats_is_one_line(free_port):
    result = run_cli("--nats", f"nats://127.0.0.1:{free_port}", "--timeout", "1", "stream", "list")
    line = one_line(result)
    assert result.returncode == 1
    assert f"cannot connect to NATS at nats://127.0.0.1:{free_port}" in line
    assert "is a broker or nats-server running there?" in line


@pytest.mark.parametrize(
    "address",
    ["nonsense", "grpc://host:notaport", "grpc://127.0.0.1:99999", "grpc://ho^st:1", "http://host:1"],
)
def test_malformed_broker_address_is_one_line(nats_server, address):
    result = run_cli("--nats", nats_server.url, "--broker", address, "stream", "list")
    line = one_line(result)
    assert result.returncode == 1
    assert f"invalid broker address {address!r}" in line and "use grpc://host:port" in line


def test_unreachable_broker_is_one_line(nats_server, free_port):
    result = run_cli(
        "--nats",
        nats_server.url,
        "--broker",
        f"grpc://127.0.0.1:{free_port}",
        "--timeout",
        "2",
        "stream",
        "list",
    )
    line = one_line(result)
    assert result.returncode == 1
    assert f"broker at grpc://127.0.0.1:{free_port} is unreachable" in line
    assert "is a broker running there?" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stream", "describe", "nope"], "no stream named 'nope'"),
        (["tail", "nope", "--no-follow"], "no stream named 'nope'"),
        (["publish", "nope", "x"], "no stream named 'nope'"),
        (["cursor", "get", "c", "nope"], "no stream named 'nope'"),
        (["tail", "s", "--from", "yesterday"], "--from 'yesterday' is not earliest, latest"),
        (["tail", "s", "--from", "-5"], "--from '-5' is not earliest, latest"),
        (["cursor", "set", "c", "s", str(2**63)], "offset must be an integer from 0 to 9223372036854775807"),
        (["stream", "create", "t", "--subject", "t", "--segment-bytes", "1"], "segment_bytes must be"),
        (["stream", "create", "t", "--subject", "_INBOX.>"], "reserved"),
    ],
)
def test_errors_are_one_line_and_exit_1(broker, args, message):
    result = run_cli("--nats", broker.nats_url, "--broker", broker.flight, *args)
    line = one_line(result)
    assert result.returncode == 1 and message in line, line


def test_unknown_stream_says_how_to_find_the_streams(broker):
    line = one_line(run_cli("--nats", broker.nats_url, "stream", "describe", "nope"))
    assert "there are no streams yet; create one with `jetstream stream create nope --subject" in line
    jetstream(broker, "stream", "create", "unrelated", "--subject", "unrelated")
    line = one_line(run_cli("--nats", broker.nats_url, "stream", "describe", "nope"))
    assert "(streams: unrelated; list them with `jetstream stream list`" in line
    assert "did you mean" not in line


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["frobnicate"],
        ["stream", "create"],
        ["stream", "create", "t"],
        ["--timeout", "x", "status"],
        ["--timeout", "0", "status"],
        ["--timeout", "-1", "status"],
        ["--timeout", "nan", "status"],
        ["tail", "s", "--partition", "x"],
        ["cursor", "set", "c", "s", "x"],
        ["status", "--colour"],
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args):
    result = run_cli(*args)
    line = one_line(result)
    assert result.returncode == 2
    assert "--help" in line


def test_tail_covers_every_partition_and_publish_reads_stdin(broker):
    jetstream(broker, "stream", "create", "keyed", "--subject", "keyed", "--partitions", "3")
    result = run_cli("--nats", broker.nats_url, "publish", "keyed", "-", input="one\ntwo\nthree\n")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3 and "stored in keyed/" in result.stdout
    jetstream(broker, "publish", "keyed", "by-key", "--key", "order-17")
    # Without --partition, every partition: lines start with partition/offset.
    lines = jetstream(broker, "tail", "keyed", "--no-follow").stdout.splitlines()
    assert sorted(line.split("\t")[-1] for line in lines) == ["by-key", "one", "three", "two"]
    assert all(re.fullmatch(r"[0-2]/\d+", line.split("\t")[0]) for line in lines)
    followed = jetstream(broker, "tail", "keyed", "--count", "4").stdout.splitlines()
    assert sorted(line.split("\t")[-1] for line in followed) == ["by-key", "one", "three", "two"]


def test_listings_hide_internal_streams_and_speak_json(broker):
    jetstream(broker, "stream", "create", "visible", "--subject", "visible")
    jetstream(broker, "cursor", "set", "app", "visible", "0")  # makes sure __cursors exists
    listed = jetstream(broker, "stream", "list").stdout
    assert "visible" in listed and "__cursors" not in listed
    assert "__cursors" in jetstream(broker, "stream", "list", "--all").stdout
    rows = [json.loads(line) for line in jetstream(broker, "stream", "list", "--json").stdout.splitlines()]
    assert [r["config"]["name"] for r in rows] == ["visible"]
    assert rows[0]["partitions"][0]["high_watermark"] == 0
    version = jetstream(broker, "--version").stdout
    assert re.fullmatch(r"jetstream \d+\.\d+\.\d+\S*\n", version), version


def test_sizes_and_durations_take_units_and_broker_start_help_lists_its_options(broker):
    jetstream(
        broker,
        "stream",
        "create",
        "units",
        "--subject",
        "units",
        "--retention-age",
        "7d",
        "--retention-bytes",
        "10GiB",
        "--segment-bytes",
        "64MB",
        "--max-message-bytes",
        "512KiB",
        "--duplicate-window",
        "2m",
        "--duplicate-max-ids",
        "5000",
    )
    described = jetstream(broker, "stream", "describe", "units").stdout
    assert re.search(r"^duplicate_window +120\.0$", described, re.M), described
    assert re.search(r"^duplicate_max_ids +5000$", described, re.M), described
    assert re.search(r"^retention_age +604800\.0$", described, re.M), described
    assert re.search(r"^retention_bytes +10737418240$", described, re.M)
    assert re.search(r"^segment_bytes +64000000$", described, re.M)
    assert re.search(r"^max_message_bytes +524288$", described, re.M)
    bad = jetstream(
        broker, "stream", "create", "x", "--subject", "x", "--segment-bytes", "64 parsecs", check=False
    )
    assert bad.returncode == 2 and "KB, MB, GB" in bad.stderr
    bad = jetstream(broker, "stream", "create", "x", "--subject", "x", "--retention-age", "soon", check=False)
    assert bad.returncode == 2 and "s, m, h, d or w" in bad.stderr
    help_text = jetstream(broker, "broker", "start", "--help").stdout
    assert "--config" in help_text and "--data-dir" in help_text


def test_cursor_list_reset_and_delete_like_kafka_consumer_groups(broker):
    jetstream(broker, "stream", "create", "lagging", "--subject", "lagging", "--partitions", "2")
    for i in range(5):
        jetstream(broker, "publish", "lagging", f"m{i}", "--partition", "0")
    jetstream(broker, "publish", "lagging", "only", "--partition", "1")
    jetstream(broker, "cursor", "set", "app", "lagging", "2", "--partition", "0")
    listed = jetstream(broker, "cursor", "list").stdout.splitlines()
    assert listed[0].split() == ["CONSUMER", "STREAM", "PARTITION", "CURRENT", "LOG-END", "LAG"]
    assert listed[1].split() == ["app", "lagging", "0", "2", "5", "3"]
    rows = [json.loads(line) for line in jetstream(broker, "cursor", "list", "--json").stdout.splitlines()]
    assert rows == [
        {"consumer": "app", "stream": "lagging", "partition": 0, "current": 2, "log_end": 5, "lag": 3}
    ]

    dry = jetstream(broker, "cursor", "reset", "app", "lagging", "--to-latest", "--dry-run").stdout
    assert [line.split() for line in dry.splitlines()[1:]] == [
        ["app", "lagging", "0", "2", "5"],
        ["app", "lagging", "1", "-", "1"],
    ]
    assert (
        jetstream(broker, "cursor", "get", "app", "lagging").stdout.strip() == "2"
    )  # a dry run stores nothing
    jetstream(broker, "cursor", "reset", "app", "lagging", "--partition", "0", "--shift-by", "-10")
    assert jetstream(broker, "cursor", "get", "app", "lagging").stdout.strip() == "0"  # kept within the log
    jetstream(broker, "cursor", "reset", "app", "lagging", "--to-latest")
    assert jetstream(broker, "cursor", "list").stdout.splitlines()[1].split()[-1] == "0"  # caught up
    jetstream(
        broker,
        "cursor",
        "reset",
        "app",
        "lagging",
        "--partition",
        "0",
        "--to-datetime",
        "2000-01-01T00:00:00+00:00",
    )
    assert jetstream(broker, "cursor", "get", "app", "lagging").stdout.strip() == "0"
    bad = jetstream(broker, "cursor", "reset", "app", "lagging", "--to-datetime", "tomorrow", check=False)
    assert bad.returncode == 1 and "must be an ISO time with a zone" in bad.stderr

    jetstream(broker, "cursor", "delete", "app", "lagging")
    assert jetstream(broker, "cursor", "get", "app", "lagging").stdout.strip() == "(none)"
    assert jetstream(broker, "cursor", "list").stdout.strip().endswith("(none)")
    # Forgotten across a restart too: the tombstone is in the log.
    broker.stop()
    broker.start()
    assert jetstream(broker, "cursor", "get", "app", "lagging", "--partition", "1").stdout.strip() == "(none)"


def test_help_says_how_tail_ends_and_what_each_cursor_command_does(broker):
    tail_help = jetstream(broker, "tail", "--help").stdout
    assert "until Ctrl-C" in tail_help and "--no-follow stops at the end" in tail_help
    assert "lines then start with the offset" in " ".join(tail_help.split())
    cursor_help = jetstream(broker, "cursor", "--help").stdout
    for command in ("get", "set", "list", "delete", "reset"):
        line = next(line for line in cursor_help.splitlines() if line.strip().startswith(command + " "))
        assert len(line.split()) > 2, f"'cursor {command}' has no description: {cursor_help}"


TIMEOUT_1 = ("--timeout", "1", "stream", "list")


def test_a_given_broker_with_no_nats_says_that_nats_is_needed_too(broker):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nowhere = f"nats://127.0.0.1:{unused.getsockname()[1]}"
    result = run_cli("--nats", nowhere, "--broker", broker.flight, *TIMEOUT_1)
    assert result.returncode == 1
    assert f"cannot connect to NATS at {nowhere}" in result.stderr
    assert f"as well as to the broker at {broker.flight}: give --nats URL" in result.stderr


def test_a_misspelt_stream_gets_the_closest_name_as_sparks_source_gives_it(broker):
    jetstream(broker, "stream", "create", "orders", "--subject", "orders")
    for args in (
        ["stream", "describe", "ordres"],
        ["tail", "ordres", "--no-follow"],
        ["publish", "ordres", "x"],
    ):
        result = run_cli("--nats", broker.nats_url, *args)
        line = one_line(result)
        assert result.returncode == 1, line
        assert line.startswith(
            "jetstream: no stream named 'ordres'; did you mean 'orders'? (streams: orders;"
        ), line
        assert "`jetstream stream list`" in line and "`jetstream stream create ordres --subject" in line, line


def test_an_empty_environment_variable_counts_as_unset(monkeypatch):
    from pyspark_jetstream.cli.command import build_parser

    for name in ("JETSTREAM_NATS", "JETSTREAM_BROKER", "JETSTREAM_CREDENTIALS", "JETSTREAM_TOKEN"):
        monkeypatch.setenv(name, "")
    args = build_parser().parse_args(["status"])
    assert args.nats == "nats://127.0.0.1:4222"
    assert (args.broker, args.credentials, args.token) == (None, None, None)
    monkeypatch.setenv("JETSTREAM_NATS", "nats://elsewhere:4222")
    assert build_parser().parse_args(["status"]).nats == "nats://elsewhere:4222"
