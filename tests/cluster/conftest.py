"""A real cluster per test: Debian's ZooKeeper, one nats-server, three broker processes.

Followers leave the ISR after 2 s without catching up (``replica_max_lag``),
and sessions expire after 3 s, so faults show within seconds.  A cluster that
cannot start fails the test.
"""

from __future__ import annotations

import pytest

from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.local import LocalCluster

FAST = "[replication]\nreplica_max_lag = 2.0\n"


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(3, base_dir=tmp_path / "cluster", extra_config=FAST, log_level="DEBUG") as running:
        yield running


@pytest.fixture
def client(cluster):
    with SyncClient(nats_urls=cluster.nats_url, broker=cluster.flight, timeout=20) as connected:
        yield connected
