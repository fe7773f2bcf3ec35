"""One broker shared by the Spark tests of a module (the Spark session is the suite's: tests/conftest.py)."""

from __future__ import annotations

import itertools

import pytest

from broker_node.nats_server import NatsServer
from pyspark_jetstream.client import SyncClient

from ..broker.harness import BrokerProcess

_names = itertools.count()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    directory = tmp_path_factory.mktemp("spark") / "broker"
    metrics = "[metrics]\nport = 0\n"  # what tests read of the broker's counters
    with (
        NatsServer() as nats_server,
        BrokerProcess(directory, nats_url=nats_server.url, extra_config=metrics) as broker,
    ):
        yield broker


@pytest.fixture(scope="module")
def client(deployment):
    with SyncClient(nats_urls=deployment.nats_url, broker=deployment.flight) as client:
        yield client


@pytest.fixture
def name():
    """A fresh stream name per test (the broker is shared by the module)."""
    return f"s{next(_names)}"
