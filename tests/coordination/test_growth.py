"""Growing a stream through the ZooKeeper controller: spread, fencing, one atomic write, failover."""

from __future__ import annotations

import threading

import pytest
from kazoo.client import KazooClient

from broker_node.coordination import wire
from broker_node.coordination.errors import ConflictError, NotControllerError
from broker_node.coordination.zookeeper.znodes import CONTROLLER_EPOCH, STREAMS
from pyspark_jetstream.protocol.errors import JetStreamError
from pyspark_jetstream.protocol.streams import StreamConfig

from ..broker.harness import wait_until
from .test_zookeeper import cluster, controller_of

__all__ = ["cluster"]


@pytest.fixture
def kazoo(zk_settings):
    """A plain ZooKeeper client in the test's chroot, acting behind the coordinators' backs."""
    client = KazooClient(hosts=zk_settings.hosts)
    client.start()
    client.ensure_path(zk_settings.chroot)
    client.chroot = zk_settings.chroot
    yield client
    client.stop()
    client.close()


def three(cluster):
    coordinators = cluster(1, 2, 3)
    wait_until(lambda: all(len(c.brokers()) == 3 and c.controller() for c in coordinators))
    return coordinators, controller_of(coordinators)


def test_new_partitions_get_replicas_and_leaders_spread_like_a_new_streams(cluster):
    coordinators, controller = three(cluster)
    created = controller.create_stream(
        StreamConfig(name="g", subject="g", partitions=3, replication_factor=2)
    )
    grown = controller.add_partitions("g", 9)
    assert grown.partitions[:3] == created.partitions
    added = grown.partitions[3:]
    assert all(len(set(p.replicas)) == 2 and p.isr == p.replicas and p.leader == p.replicas[0] for p in added)
    assert sorted(p.leader for p in grown.partitions) == ["b1"] * 3 + ["b2"] * 3 + ["b3"] * 3
    for other in coordinators:  # every broker sees the grown stream, through its watches
        wait_until(lambda other=other: other.get_stream("g") == controller.get_stream("g"), timeout=10)
    with pytest.raises(NotControllerError):
        next(c for c in coordinators if c is not controller).add_partitions("g", 12)


def test_a_fenced_controller_cannot_grow_a_stream(cluster, kazoo):
    (coordinator,) = cluster(1)
    wait_until(lambda: coordinator.controller() == "b1")
    coordinator.create_stream(StreamConfig(name="f", subject="f", partitions=2))
    raw, stat = kazoo.get(CONTROLLER_EPOCH)  # another controller epoch begins behind its back
    kazoo.set(CONTROLLER_EPOCH, wire.epoch_to_bytes(wire.epoch_from_bytes(raw) + 1), version=stat.version)
    with pytest.raises(NotControllerError, match="fenced"):
        coordinator.add_partitions("f", 4)
    assert kazoo.get_children(f"{STREAMS}/f") == ["0", "1"]
    assert wire.stream_from_bytes(kazoo.get(f"{STREAMS}/f")[0])[0].partitions == 2


def test_growing_is_all_or_nothing(cluster, kazoo):
    (coordinator,) = cluster(1)
    wait_until(lambda: coordinator.controller() == "b1")
    coordinator.create_stream(StreamConfig(name="a", subject="a", partitions=2))
    kazoo.create(f"{STREAMS}/a/3", b"stray")  # the transaction's second create will fail
    with pytest.raises(ConflictError):
        coordinator.add_partitions("a", 4)
    assert sorted(kazoo.get_children(f"{STREAMS}/a")) == ["0", "1", "3"]  # partition 2 was not created
    assert wire.stream_from_bytes(kazoo.get(f"{STREAMS}/a")[0])[0].partitions == 2
    assert len(coordinator.get_stream("a").partitions) == 2


def test_a_reader_never_misses_a_growing_stream(cluster):
    coordinators, controller = three(cluster)
    reader = next(c for c in coordinators if c is not controller)
    controller.create_stream(StreamConfig(name="r", subject="r"))
    wait_until(lambda: any(m.config.name == "r" for m in reader.list_streams()))
    done = threading.Event()
    seen: list[int] = []
    missed: list[str] = []

    def read() -> None:
        while True:
            last = done.is_set()  # the growing is over: one more read, begun after the last change
            snapshot = {m.config.name: m for m in reader.read_streams()}  # a fresh read, as a reload does
            if "r" not in snapshot:
                missed.append("the stream was missing from a read")
            else:
                seen.append(len(snapshot["r"].partitions))
            if last:
                return
            done.wait(0.002)  # leave kazoo's threads the GIL, or the sessions' pings go unanswered

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for count in range(2, 16):
            controller.add_partitions("r", count)
    finally:
        done.set()
        thread.join(10)
    assert not thread.is_alive()
    assert not missed and seen == sorted(seen) and seen[-1] == 15


def test_growing_during_a_controller_failover_leaves_no_half_grown_stream(cluster):
    coordinators, controller = three(cluster)
    controller.create_stream(StreamConfig(name="fo", subject="fo", partitions=2, replication_factor=2))
    outcome: list[object] = []

    def grow() -> None:
        try:
            outcome.append(controller.add_partitions("fo", 8))
        except JetStreamError as exc:  # fenced or cut off mid-way: the write happened whole or not at all
            outcome.append(exc)

    thread = threading.Thread(target=grow)
    thread.start()
    controller.close()  # its session ends: another broker becomes controller
    thread.join(40)
    rest = [c for c in coordinators if c is not controller]
    gone = controller._broker.broker_id
    wait_until(lambda: {c.controller() for c in rest} - {None, gone}, timeout=20, message="a new controller")
    wait_until(lambda: len({c.controller() for c in rest}) == 1, timeout=20)
    successor = controller_of(rest)
    before = successor.get_stream("fo")
    assert len(before.partitions) in (2, 8), outcome  # either way, whole: one count, every partition
    grown = successor.add_partitions("fo", 8)  # asking again finishes it, or changes nothing
    assert grown.config.partitions == len(grown.partitions) == 8
    wait_until(
        lambda: all(p.leader and p.leader != gone for p in successor.get_stream("fo").partitions),
        timeout=20,
        message="every partition led by a live broker",
    )
