"""Real servers for broker tests: broker processes on free ports, and polling with deadlines."""

from __future__ import annotations

import functools
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from pyspark_jetstream.local import LocalBroker

# Retention and compaction run every 0.2 s in tests, so their effects show quickly.
BrokerProcess = functools.partial(LocalBroker, maintenance_interval=0.2, log_level="DEBUG")


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
