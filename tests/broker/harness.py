"""Real servers for tests that need a broker: broker processes on free ports, the per-test
``nats_server``, ``broker`` and ``client`` fixtures (each room's conftest.py imports them, so they are
defined once), and polling with deadlines."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker_node.nats_server import NatsServer
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.local import LocalBroker

ROOT = Path(__file__).resolve().parents[2]

# Retention and compaction run every 0.2 s in tests, so their effects show quickly.
BrokerProcess = functools.partial(LocalBroker, maintenance_interval=0.2, log_level="DEBUG")


@pytest.fixture
def nats_server():
    """A nats-server of the test's own."""
    with NatsServer() as server:
        yield server


@pytest.fixture
def broker(tmp_path, nats_server):
    """A broker process of the test's own on ``nats_server``."""
    process = BrokerProcess(tmp_path / "broker", nats_url=nats_server.url).start()
    yield process
    process.stop()


@pytest.fixture
def client(broker):
    """A client of the test's ``broker`` (this overrides the suite's module-wide ``client``)."""
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as connected:
        yield connected


def wait_until(condition, timeout: float = 15.0, interval: float = 0.02, message: str = "condition"):
    """Poll ``condition`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def scrape(broker: LocalBroker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the broker's /metrics (``[metrics] port`` set): (name, sorted labels) -> value."""
    assert broker.metrics is not None, "the broker serves no metrics: set [metrics] port"
    with urllib.request.urlopen(broker.metrics + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def with_jetstream(url: str, work):
    """Run ``work(js)`` with nats-py's JetStream context on a fresh connection; its result."""

    async def run():
        nc = await nats.connect(url)
        try:
            return await work(nc.jetstream(timeout=5))
        finally:
            await nc.close()

    return asyncio.run(run())


def publish_plain(url: str, messages: Iterable[tuple[str, bytes, dict[str, str] | None]]) -> None:
    """Publish ``(subject, payload, headers)`` with a bare NATS client, as any NATS publisher would."""

    async def run() -> None:
        nc = await nats.connect(url)
        for subject, payload, headers in messages:
            await nc.publish(subject, payload, headers=headers)
        await nc.flush()
        await nc.close()

    asyncio.run(run())


def rebuild_metadata(broker: LocalBroker) -> subprocess.CompletedProcess[str]:
    """Run ``--rebuild-metadata`` with ``broker``'s configuration (stopped), as an operator would."""
    return subprocess.run(
        [sys.executable, "-m", "broker_node", "--config", str(broker.config_path), "--rebuild-metadata"],
        capture_output=True,
        text=True,
        check=False,
    )


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real ``jetstream`` CLI from this checkout with ``args`` (and ``input`` on stdin);
    ``env``: the whole environment (default: this process's, without a deployment named by
    ``JETSTREAM_NATS`` or ``JETSTREAM_BROKER``)."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if k not in ("JETSTREAM_NATS", "JETSTREAM_BROKER")}
    return subprocess.run(
        [sys.executable, "-m", "pyspark_jetstream.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        cwd=ROOT,
        env=dict(env),
    )
