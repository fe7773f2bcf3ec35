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


def waits_for_zookeeper(coordinator, broker, saying: str) -> str:
    """Start ``coordinator`` in a thread, wait until it says (its ``waiting`` line) that it waits for
    ZooKeeper with ``saying`` in the line, then close it: its start ends as stopped.  The line."""
    import re
    import threading

    from broker_node.coordination.errors import CoordinationError

    from ..broker.harness import wait_until

    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            coordinator.start(broker)
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    line = wait_until(
        lambda: (coordinator.waiting or "") if re.search(saying, coordinator.waiting or "") else "",
        timeout=30,
        message=f"the coordinator to say it waits for ZooKeeper ({saying})",
    )
    assert thread.is_alive(), outcome
    coordinator.close()
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(outcome[0], CoordinationError) and "stopped while waiting" in str(outcome[0])
    return line
