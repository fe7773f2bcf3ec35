"""Fixtures: a real nats-server and a real broker process per test (defined in tests/broker/harness.py)."""

from __future__ import annotations

from ..broker.harness import broker, client, nats_server  # noqa: F401 - the fixtures
