"""Fixtures: a real nats-server and a real broker process per test."""

from __future__ import annotations

import pytest

from broker_node.nats_server import NatsServer
from pyspark_jetstream.client import SyncClient

from .harness import BrokerProcess


@pytest.fixture
def nats_server():
    with NatsServer() as server:
        yield server


@pytest.fixture
def broker(tmp_path, nats_server):
    process = BrokerProcess(tmp_path / "broker", nats_url=nats_server.url).start()
    yield process
    process.stop()


@pytest.fixture
def client(broker):
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        yield client
