"""Prometheus /metrics and /healthz on a real broker, and the Grafana dashboard that uses them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pyspark_jetstream.client import AckPolicy, SyncClient
from pyspark_jetstream.protocol.errors import OutOfOrderSequenceError, ProducerFencedError, UnknownStreamError

from .harness import BrokerProcess, scrape, wait_until

DASHBOARD = Path(__file__).resolve().parents[2] / "conf" / "grafana" / "jetstream.json"


def healthz(broker) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(broker.metrics + "/healthz", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def measured(tmp_path, nats_server):
    process = BrokerProcess(
        tmp_path / "b", nats_url=nats_server.url, extra_config="[metrics]\nport = 0\n"
    ).start()
    yield process
    process.stop()


def test_metrics_describe_partitions_cursors_requests_and_the_live_tail(measured):
    with SyncClient(nats_urls=measured.nats_url, broker=measured.flight) as client:
        client.create_stream("metered", "metered", partitions=2)
        for i in range(5):
            client.publish("metered", b"%d" % i, partition=1)
        client.set_cursor("app", "metered", 1, 2)
        with pytest.raises(UnknownStreamError):
            client.describe_stream("nope")
        samples = wait_until(
            lambda: (
                (s := scrape(measured)).get(
                    ("jetstream_live_tail_batches_total", (("partition", "1"), ("stream", "metered"))), 0
                )
                and s
            ),
            message="live-tail batches counted",
        )
    one = (("partition", "1"), ("stream", "metered"))
    assert samples[("jetstream_partition_high_watermark", one)] == 5
    assert samples[("jetstream_partition_log_end_offset", one)] == 5
    assert samples[("jetstream_partition_log_start_offset", one)] == 0
    assert samples[("jetstream_partition_leader", one)] == 1
    assert samples[("jetstream_partition_segments", one)] == 1
    assert samples[("jetstream_partition_size_bytes", one)] > 0
    assert samples[("jetstream_partition_under_replicated", one)] == 0
    cursor = (("consumer", "app"), ("partition", "1"), ("stream", "metered"))
    assert samples[("jetstream_cursor_offset", cursor)] == 2
    assert samples[("jetstream_cursor_lag", cursor)] == 3
    assert samples[("jetstream_nats_connected", ())] == 1
    assert samples[("jetstream_healthy", ())] == 1
    assert samples[("jetstream_arrow_allocated_bytes", ())] >= 0
    assert samples[("jetstream_flight_requests_total", (("code", "ok"), ("kind", "create_stream")))] == 1
    assert (
        samples[
            ("jetstream_flight_requests_total", (("code", "unknown_stream"), ("kind", "describe_stream")))
        ]
        >= 1
    )
    assert healthz(measured) == (200, {"ok": True, "problems": []})


def test_the_broker_hands_freed_memory_back_every_maintenance_interval(measured):
    """The harness's brokers run their maintenance every 0.2 s; each pass hands memory back."""
    wait_until(
        lambda: scrape(measured).get(("jetstream_memory_releases_total", ()), 0) >= 3,
        message="three memory releases counted",
    )
    assert scrape(measured)[("jetstream_memory_released_bytes_total", ())] >= 0


def test_ack_latency_counts_every_ack_and_messages_in_every_append(measured):
    with SyncClient(nats_urls=measured.nats_url, broker=measured.flight) as client:
        client.create_stream("timed", "timed", partitions=2)
        acks = [client.publish("timed", b"%d" % i, partition=0) for i in range(5)]
        acks += [client.publish("timed", b"all", partition=1, ack_policy=AckPolicy.ALL) for _ in range(3)]
        client.publish("timed", b"unacked", partition=1, ack_policy=AckPolicy.NONE)
        assert all(ack is not None and ack.ok for ack in acks)
        stream = (("stream", "timed"),)
        # The broker counts an ack just after sending it: the last one may trail the client by a hair.
        samples = wait_until(
            lambda: (
                (s := scrape(measured)).get(("jetstream_ack_latency_seconds_count", stream)) == len(acks)
                and s
            ),
            message="every ack counted",
        )
        wait_until(
            lambda: (
                scrape(measured).get(
                    ("jetstream_partition_messages_in_total", (("partition", "1"), ("stream", "timed")))
                )
                == 4
            ),
            message="the unacked message counted in",
        )
    assert samples[("jetstream_partition_messages_in_total", (("partition", "0"), ("stream", "timed")))] == 5
    buckets = {
        float(dict(labels)["le"]): value
        for (name, labels), value in samples.items()
        if name == "jetstream_ack_latency_seconds_bucket" and dict(labels)["stream"] == "timed"
    }
    assert buckets[float("inf")] == len(acks)
    assert list(buckets.values()) == sorted(buckets.values()), "cumulative"
    assert 0 < samples[("jetstream_ack_latency_seconds_sum", stream)] < 10


def test_producer_envelopes_that_stored_nothing_are_counted_by_verdict(measured):
    with SyncClient(nats_urls=measured.nats_url, broker=measured.flight) as client:
        client.create_stream("produced", "produced", partitions=2)
        send = dict(partition=1, producer_id="p")
        client.publish("produced", b"0", producer_epoch=1, sequence=0, **send)
        assert client.publish("produced", b"0", producer_epoch=1, sequence=0, **send).duplicate
        with pytest.raises(OutOfOrderSequenceError):
            client.publish("produced", b"2", producer_epoch=1, sequence=2, **send)
        with pytest.raises(ProducerFencedError):
            client.publish("produced", b"0", producer_epoch=0, sequence=0, **send)
        samples = scrape(measured)
    labels = (("partition", "1"), ("stream", "produced"))
    assert {
        dict(sample_labels)["verdict"]: value
        for (metric, sample_labels), value in samples.items()
        if metric == "jetstream_producer_not_stored_total" and sample_labels[:2] == labels
    } == {"duplicate": 1, "out_of_order": 1, "fenced": 1}


def test_healthz_answers_503_with_the_problem_when_nats_is_gone(measured, nats_server):
    assert healthz(measured)[0] == 200
    nats_server.stop()
    _, body = wait_until(lambda: (h := healthz(measured))[0] == 503 and h, message="an unhealthy answer")
    assert not body["ok"] and any("NATS" in problem for problem in body["problems"]), body
    assert scrape(measured)[("jetstream_nats_connected", ())] == 0


def test_every_metric_the_dashboard_uses_exists(measured):
    with SyncClient(nats_urls=measured.nats_url, broker=measured.flight) as client:
        client.create_stream("dash", "dash")
        client.publish("dash", b"x")
        client.set_cursor("app", "dash", 0, 1)
        client.fetch("dash", 0)
    exposed = {name for name, _ in scrape(measured)}
    dashboard = json.loads(DASHBOARD.read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bjetstream_[a-z_]+", target["expr"])
    }
    assert len(used) >= 12
    assert used <= exposed, sorted(used - exposed)


def test_metrics_are_off_unless_configured(tmp_path, nats_server):
    process = BrokerProcess(tmp_path / "off", nats_url=nats_server.url).start()
    try:
        assert process.metrics is None
    finally:
        process.stop()


def test_log_format_json_writes_one_object_per_line(tmp_path, nats_server):
    config = BrokerProcess(tmp_path / "json", nats_url=nats_server.url).config_path
    process = subprocess.Popen(
        [sys.executable, "-m", "broker_node", "--config", str(config), "--log-format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = []
        while not any("serving Flight" in line for line in lines):
            line = process.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
    finally:
        process.terminate()
        process.communicate(timeout=30)
    records = [json.loads(line) for line in lines]
    assert {"time", "level", "logger", "message"} <= set(records[-1])
    assert records[-1]["level"] == "INFO" and "serving Flight" in records[-1]["message"]
