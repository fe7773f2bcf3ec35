"""Lifecycle events are logged once each, naming their stream and partition.

Stream creation and deletion, retention, compaction, recovery at open and
Flight calls refused for the client's mistake: a real broker writes JSON log
lines (``--log-format json``), and each event must appear exactly once, with
``stream`` and ``partition`` as fields and ``stream/partition:`` leading the
message.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker_node.__main__ import JsonFormatter
from broker_node.broker import RUNTIME_FILE
from broker_node.log.logging_labels import Labels
from broker_node.log.segment import SEGMENT_SUFFIX
from broker_node.replication.partition_tables import PRODUCER_SNAPSHOT
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.protocol.errors import InvalidArgumentError, UnknownStreamError

from .harness import BrokerProcess, wait_until


class JsonBroker:
    """A broker process (maintenance every 0.2 s) logging JSON lines at INFO to a file."""

    def __init__(self, directory: Path, nats_url: str) -> None:
        settings = BrokerProcess(directory / "b", nats_url=nats_url)
        self.config_path = settings.config_path
        self.data_dir = settings.data_dir
        self.log_path = directory / "broker.jsonl"
        self.process: subprocess.Popen[bytes] | None = None
        self.flight = ""
        self.nats_url = nats_url

    def start(self) -> JsonBroker:
        runtime = self.data_dir / RUNTIME_FILE
        runtime.unlink(missing_ok=True)
        command = [sys.executable, "-m", "broker_node", "--config", str(self.config_path)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*command, "--log-format", "json", "--log-level", "INFO"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(lambda: runtime.exists() or self.process.poll() is not None, 30, message="the broker")
        assert self.process.poll() is None, self.log_path.read_text()[-3000:]
        self.flight = json.loads(runtime.read_text())["flight"]
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.send_signal(sig)
            process.wait(30)

    def client(self) -> SyncClient:
        return SyncClient(nats_urls=self.nats_url, broker=self.flight)

    def records(self) -> list[dict]:
        """Every JSON line logged so far (other output, if any, is skipped)."""
        lines = self.log_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def lines(self, pattern: str, stream: str, partition: int | None = None) -> list[dict]:
        """Records whose message matches ``pattern``, about ``stream`` (and ``partition``)."""
        return [
            r
            for r in self.records()
            if re.search(pattern, r["message"])
            and r.get("stream") == stream
            and (partition is None or r.get("partition") == partition)
        ]


@pytest.fixture
def json_broker(tmp_path, nats_server):
    broker = JsonBroker(tmp_path, nats_server.url).start()
    yield broker
    broker.stop()


def one(broker: JsonBroker, pattern: str, stream: str, partition: int | None = None) -> dict:
    """The one record matching; fails naming how many there were."""
    found = broker.lines(pattern, stream, partition)
    assert len(found) == 1, (pattern, stream, partition, found)
    record = found[0]
    prefix = f"{stream}/{partition}: " if partition is not None else ""
    assert record["message"].startswith(prefix), record
    return record


def test_creation_deletion_and_refused_calls_are_logged_once(json_broker):
    with json_broker.client() as client:
        client.create_stream("life", "life", partitions=2)
        client.create_stream("life", "life", partitions=2)  # the same again: nothing new happens
        for i in range(4):
            client.publish("life", b"%d" % i, partition=i % 2)
        with pytest.raises(UnknownStreamError):
            client.describe_stream("nope")
        with pytest.raises(UnknownStreamError):
            client.fetch("life", 5)
        with pytest.raises(InvalidArgumentError):
            client.set_cursor("app", "life", 1, -1)
        client.delete_stream("life")
    wait_until(lambda: json_broker.lines("its stream was deleted", "life"), message="the directories removed")

    assert "2 partition(s)" in one(json_broker, r"^created stream life\b", "life")["message"]
    assert "2 partition(s)" in one(json_broker, r"^deleted stream life\b", "life")["message"]
    for partition in (0, 1):
        one(json_broker, "created here, replicas broker-1", "life", partition)
        one(json_broker, "removing .*: its stream was deleted", "life", partition)
        one(json_broker, "closed here", "life", partition)

    refused = one(json_broker, r"refused a describe_stream call \(unknown_stream\)", "nope")
    assert "partition" not in refused and refused["level"] == "INFO"
    assert refused["action"] == "describe_stream" and refused["code"] == "unknown_stream"
    one(json_broker, r"refused a read call \(unknown_stream\): .*not 5", "life", 5)
    one(json_broker, r"refused a set_cursor call \(invalid_argument\): .*must not be negative", "life", 1)
    assert not [r for r in json_broker.records() if r.get("stream") == "life" and r["level"] != "INFO"]


RETENTION = re.compile(
    r"retention deleted (\d+) segment\(s\), offsets (\d+) to (\d+) \(\d+ bytes\); the log starts at (\d+) now"
)
COMPACTION = re.compile(
    r"compaction removed (\d+) message\(s\) from \d+ segment\(s\): (\d+) bytes before, (\d+)"
)


def test_retention_and_compaction_are_logged_once_per_change(json_broker):
    with json_broker.client() as client:
        client.create_stream("short", "short", retention_messages=10, segment_bytes=2000)
        client.create_stream("kv", "kv", compaction=True, segment_bytes=2000)
        for i in range(60):
            client.publish("short", b"m%03d" % i + b"." * 100)
            client.publish("kv", b"v%03d" % i + b"." * 100, key=b"k%d" % (i % 3))

        def retained() -> list[dict]:
            """The retention lines, once they account for everything retention deleted."""
            start = client.describe_stream("short").partitions[0].log_start_offset
            found = json_broker.lines("retention deleted", "short", 0)
            last = RETENTION.search(found[-1]["message"]) if found else None
            return found if start > 0 and last is not None and int(last[4]) == start else []

        def compacted() -> list[dict]:
            """The compaction lines, once they account for every message compaction removed."""
            kept = client.fetch("kv", 0).num_rows
            found = json_broker.lines("compaction removed", "kv", 0)
            removed = sum(int(COMPACTION.search(r["message"])[1]) for r in found)
            return found if found and removed == 60 - kept else []

        retention = wait_until(retained, message="retention logged")
        compaction = wait_until(compacted, message="compaction logged")
    # One line per pass that deleted something, each taking up where the one before ended.
    start = 0
    for record in retention:
        segments, first, last, new_start = map(int, RETENTION.search(record["message"]).groups())
        assert segments >= 1 and first == start and last == new_start - 1, retention
        assert record["message"].startswith("short/0: ") and record["level"] == "INFO"
        start = new_start
    for record in compaction:
        removed, before, after = map(int, COMPACTION.search(record["message"]).groups())
        assert removed >= 1 and after < before, compaction
        assert record["message"].startswith("kv/0: ")
    assert not json_broker.lines("retention deleted", "kv") and not json_broker.lines("compaction", "short")


def test_recovery_at_open_is_logged_once_with_its_partition(json_broker):
    with json_broker.client() as client:
        client.create_stream("rec", "rec")
        for i in range(3):
            client.publish("rec", b"%d" % i)
    directory = json_broker.data_dir / "streams" / "rec" / "0"
    snapshot = directory / PRODUCER_SNAPSHOT
    wait_until(
        lambda: snapshot.exists() and json.loads(snapshot.read_text())["end_offset"] == 3,
        message="a producer snapshot",
    )
    json_broker.stop(signal.SIGKILL)
    with open(directory / ("0" * 20 + SEGMENT_SUFFIX), "ab") as segment:
        segment.write(b"\x00torn tail" * 10)
    snapshot.write_bytes(b"{")
    json_broker.start()
    with json_broker.client() as client:
        assert client.publish("rec", b"after").first_offset == 3

    truncated = one(json_broker, r"truncating active segment .* \(100 bytes of torn", "rec", 0)
    assert truncated["level"] == "WARNING" and truncated["logger"] == "broker_node.log.segment"
    ignored = one(json_broker, f"ignoring .*{PRODUCER_SNAPSHOT}.*reading the whole log", "rec", 0)
    assert ignored["logger"] == "broker_node.replication.partition"


def test_json_lines_carry_the_fields_a_line_was_logged_with():
    logger = logging.getLogger("jetstream.test")
    record = logger.makeRecord(
        logger.name, logging.INFO, __file__, 1, "retention ran", (), None, extra=Labels("s", 3).fields
    )
    entry = json.loads(JsonFormatter().format(record))
    assert entry["stream"] == "s" and entry["partition"] == 3 and entry["message"] == "retention ran"
    plain = json.loads(
        JsonFormatter().format(logger.makeRecord(logger.name, logging.INFO, "", 1, "x", (), None))
    )
    assert set(plain) == {"time", "level", "logger", "message"}


def test_labels_put_the_partition_first_and_keep_percent_signs_literal(caplog):
    logger = logging.getLogger("jetstream.test")
    with caplog.at_level(logging.INFO, logger.name):
        Labels("a%b", 2).bind(logger).info("moved %d offsets", 7)
        Labels("a").bind(logger).info("deleted", extra={"code": "x"})
    first, second = caplog.records
    assert first.getMessage() == "a%b/2: moved 7 offsets"
    assert (first.stream, first.partition) == ("a%b", 2)
    assert second.getMessage() == "a: deleted" and second.code == "x" and not hasattr(second, "partition")


def test_an_unnamed_log_logs_as_before(tmp_path, caplog):
    from broker_node.log import Log

    with caplog.at_level(logging.INFO, "broker_node.log"):
        log = Log.open(tmp_path / "p")
        log.close()
        with open(tmp_path / "p" / ("0" * 20 + SEGMENT_SUFFIX), "ab") as segment:
            segment.write(b"junk")
        Log.open(tmp_path / "p").close()
    assert [r.getMessage().startswith("truncating active segment") for r in caplog.records] == [True]
    assert not hasattr(caplog.records[0], "stream")
