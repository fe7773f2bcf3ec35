"""The controller's event loop: a failed reconciliation is remembered until one succeeds."""

from __future__ import annotations

import dataclasses

import pytest

from broker_node.coordination.base import PartitionState, StreamMetadata
from broker_node.coordination.controller import Controller
from broker_node.coordination.errors import CommitStateUnknownError
from pyspark_jetstream.protocol.streams import StreamConfig


class Store:
    """The controller's view of the metadata, in memory; the first ``failures`` writes fail."""

    def __init__(self, failures: int) -> None:
        config = StreamConfig(name="s", subject="s", replication_factor=2)
        state = PartitionState("b1", ("b1", "b2"), ("b1", "b2"), 1, 1)
        self.streams = [StreamMetadata(config, (state,), "id-1")]
        self.live = {"b2"}  # b1, the leader, is gone
        self.registered = {"b1": 1, "b2": 1}  # each broker's registration; a restart changes it
        self.failures = failures
        self.writes = 0

    def live_brokers(self):
        return sorted(self.live)

    def registrations(self):
        return {b: self.registered[b] for b in self.live}

    def read_streams(self):
        return self.streams

    def shutting_down(self):
        return set()

    def write_partitions(self, changes):
        if self.failures:
            self.failures -= 1
            raise CommitStateUnknownError("the connection was lost during the write")
        self.writes += 1
        for change in changes:
            metadata = self.streams[0]
            partitions = list(metadata.partitions)
            partitions[change.partition] = change.state
            self.streams[0] = dataclasses.replace(metadata, partitions=tuple(partitions))

    def write_new_stream(self, metadata):
        raise AssertionError("not expected")

    def write_deletion(self, metadata):
        raise AssertionError("not expected")


def test_a_failed_reconciliation_leaves_the_controller_dirty_until_one_succeeds():
    store = Store(failures=1)
    controller = Controller(store, "b2", epoch=1)
    controller.start()  # reconciles first: the write fails
    try:
        controller.submit(lambda: None).result(10)  # the start's reconcile has run
        assert controller.dirty and store.streams[0].partitions[0].leader == "b1"
        controller.submit(controller.reconcile).result(10)
        assert not controller.dirty
        assert store.streams[0].partitions[0].leader == "b2"
    finally:
        controller.stop()


def test_a_broker_that_registered_again_leaves_every_isr_and_leadership_once():
    """A restart quicker than the controller's reads (a crash may have cut what it had) is a death."""
    store = Store(failures=0)
    state = PartitionState("b1", ("b1", "b2", "b3"), ("b1", "b2", "b3"), 1, 1)
    store.streams[0] = dataclasses.replace(store.streams[0], partitions=(state,))
    store.live = {"b1", "b2", "b3"}
    store.registered = {"b1": 1, "b2": 1, "b3": 1}
    controller = Controller(store, "b3", epoch=1)
    assert controller.reconcile() == [] and store.writes == 0  # the registrations are learnt
    store.registered["b2"] = 2  # the follower restarted
    controller.reconcile()
    after = store.streams[0].partitions[0]
    assert (after.leader, after.isr, after.leader_epoch) == ("b1", ("b1", "b3"), 1)
    store.streams[0] = dataclasses.replace(store.streams[0], partitions=(state,))  # it caught up
    store.registered["b1"] = 2  # the leader restarted
    assert controller.reconcile() == ["s/0: b1 -> b2"]
    after = store.streams[0].partitions[0]
    assert (after.leader, after.isr, after.leader_epoch) == ("b2", ("b2", "b3"), 2)
    writes = store.writes
    assert controller.reconcile() == [] and store.writes == writes  # once only


def test_a_registration_that_fails_to_be_written_is_seen_again():
    store = Store(failures=0)
    state = PartitionState("b1", ("b1", "b2"), ("b1", "b2"), 1, 1)
    store.streams[0] = dataclasses.replace(store.streams[0], partitions=(state,))
    store.live = {"b1", "b2"}
    controller = Controller(store, "b1", epoch=1)
    controller.reconcile()
    store.registered["b2"] = 2
    store.failures = 1
    with pytest.raises(CommitStateUnknownError):
        controller.reconcile()
    controller.reconcile()
    assert store.streams[0].partitions[0].isr == ("b1",)
