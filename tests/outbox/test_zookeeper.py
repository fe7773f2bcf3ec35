"""Leader election through ZooKeeper (kazoo's Election recipe), on a real ZooKeeper server."""

from __future__ import annotations

import pytest

from broker_node.zookeeper_server import ZooKeeperServer
from pyspark_jetstream.outbox import init_outbox, open_store

from ..broker.harness import wait_until
from .conftest import Running, config_for, wait_for_empty
from .test_harvester import check_exactly_once_in_order


@pytest.fixture
def zookeeper():
    server = ZooKeeperServer(tick_time=0.2).start()
    yield server
    server.close()


def test_one_leader_at_a_time_and_the_standby_takes_over(deployment, client, name, zookeeper, tmp_path):
    client.create_stream(name, name, partitions=2)
    database = f"sqlite:///{tmp_path / 'app.db'}"
    init_outbox(database)
    config = config_for(deployment, database, zookeeper=zookeeper.hosts, deadline=1.0, batch_size=50)
    store = open_store(database)
    store.insert({"stream": name, "key": f"k{i % 4}".encode(), "value": f"v{i}".encode()} for i in range(500))
    first = Running(config, identifier="first")
    wait_until(lambda: first.harvester.status.role == "leader", message="a leader")
    second = Running(config, identifier="second")
    try:
        wait_for_empty(config, running=first)
        assert second.harvester.status.role == "standby" and second.harvester.status.published == 0
        assert "ZooKeeper election" in first.harvester.status.election
        first.stop()
        store.insert(
            {"stream": name, "key": f"k{i % 4}".encode(), "value": f"v{i}".encode()} for i in range(500, 800)
        )
        wait_until(lambda: second.harvester.status.role == "leader", message="the standby to lead")
        wait_for_empty(config, running=second)
        assert second.harvester.status.published == 300
    finally:
        second.stop()
    store.close()
    check_exactly_once_in_order(client, name, [(i + 1, f"k{i % 4}", f"v{i}") for i in range(800)])


def test_a_leader_that_loses_zookeeper_stops_publishing(deployment, client, name, zookeeper, tmp_path):
    client.create_stream(name, name)
    database = f"sqlite:///{tmp_path / 'app.db'}"
    init_outbox(database)
    config = config_for(
        deployment, database, zookeeper=zookeeper.hosts, deadline=1.0, batch_size=20, report_every=0.05
    )
    store = open_store(database)
    running = Running(config, identifier="only")
    try:
        wait_until(lambda: running.harvester.status.role == "leader", message="a leader")
        zookeeper.pause()  # the session is suspended: the leader cannot confirm it leads
        try:
            status = running.harvester.status
            wait_until(lambda: status.role == "standby", message="the leader to step down")
            published = status.published
            store.insert([{"stream": name, "value": b"while ZooKeeper is away"}])
            # The harvester's own report counts the row waiting: it has seen it, and it does not lead.
            wait_until(lambda: status.backlog == 1, message="the harvester to report the row as waiting")
            assert status.published == published
            assert status.role == "standby"
        finally:
            zookeeper.resume()
        wait_for_empty(config, running=running, timeout=60)
    finally:
        running.stop()
    store.close()
