"""A real ZooKeeper for the coordination tests: one server per session, a chroot per test."""

from __future__ import annotations

import uuid

import pytest

from broker_node.coordination.zookeeper_config import ZooKeeperConfig
from broker_node.zookeeper_server import ZooKeeperServer


@pytest.fixture(scope="session")
def zookeeper():
    """Debian's ZooKeeper on a free port; the test fails (not skips) if it cannot start."""
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture
def zk_settings(zookeeper) -> ZooKeeperConfig:
    """Settings pointing at a fresh chroot of the shared server."""
    return ZooKeeperConfig(
        hosts=zookeeper.hosts,
        chroot=f"/test-{uuid.uuid4().hex[:12]}",
        session_timeout=2.0,
        connect_timeout=10,
    )
