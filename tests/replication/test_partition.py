"""A partition's replication state machine: commits, the ISR, role changes.

The cluster tests run these paths between processes; here each race the
cluster can only hit by chance is set up step by step, on memory-backed logs
(the log's own contract tests hold them to the file log's behaviour); the
test of partitions the replica manager opens runs on file logs.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker_node.coordination.base import BrokerInfo, PartitionState
from broker_node.coordination.local import LocalCoordinator
from broker_node.log import LogConfig, MemoryLog
from broker_node.replication.manager import ReplicaManager
from broker_node.replication.partition import Partition
from broker_node.replication.producers import WINDOW
from broker_node.replication.replication_config import ReplicationConfig
from pyspark_jetstream.protocol.ack import ErrorCode
from pyspark_jetstream.protocol.errors import NotLeaderError
from pyspark_jetstream.protocol.streams import StreamConfig

from ..log.helpers import held_elsewhere, values

CONFIG = StreamConfig(name="orders", subject="orders", replication_factor=3, min_insync_replicas=1)
REPLICAS = ("a", "b", "c")


@pytest.fixture
def open_partition():
    opened: list[Partition] = []

    def open_(broker: str, state: PartitionState) -> Partition:
        partition = Partition(CONFIG, 0, MemoryLog(), broker, state)
        opened.append(partition)
        return partition

    yield open_
    for partition in opened:
        partition.close()


def leading(open_partition, isr=REPLICAS, epoch=1) -> Partition:
    state = PartitionState("a", REPLICAS, tuple(isr), epoch, version=1)
    leader = open_partition("a", state)
    leader.become_leader(state)
    return leader


def committed(partition: Partition, last_offset: int) -> list:
    seen: list = []
    partition.when_committed(last_offset, seen.append)
    return seen


def test_an_ack_waits_for_every_in_sync_follower(open_partition):
    leader = leading(open_partition)
    offsets = leader.append(values(1))
    seen = committed(leader, offsets[-1])
    leader.followers.record_fetch("b", 1)
    assert seen == []  # c has not fetched past it
    leader.followers.record_fetch("c", 1)
    assert seen == [None] and leader.high_watermark == 1


def test_a_duplicate_too_old_to_know_its_offsets_is_acked_only_once_committed(open_partition):
    leader = leading(open_partition)
    for sequence in range(WINDOW + 2):
        leader.append_idempotent(values(1, start=sequence), "p", 0, sequence)
    ack = leader.append_idempotent(values(1), "p", 0, 0)  # a resend of the first
    assert ack.error is ErrorCode.DUPLICATE and ack.last_offset == -1
    seen = committed(leader, ack.last_offset)
    assert seen == []  # acked at once before the fix, with nothing replicated
    leader.followers.record_fetch("b", WINDOW + 2)
    leader.followers.record_fetch("c", WINDOW + 2)
    assert seen == [None]


def test_a_replica_being_added_to_the_isr_counts_before_the_change_is_stored(open_partition):
    leader = leading(open_partition, isr=("a", "b"))
    leader.append(values(1))
    leader.followers.record_fetch("b", 1)
    assert leader.followers.record_fetch("c", 1)  # c caught up: it asks to join
    proposal = leader.followers.propose_isr(leader.followers.expansion("c"))
    assert proposal.isr == REPLICAS
    offsets = leader.append(values(1, start=1))
    seen = committed(leader, offsets[-1])
    leader.followers.record_fetch("b", 2)
    # The coordinator may already list c in sync (and elect it): c must have the message too.
    assert seen == []
    leader.followers.record_fetch("c", 2)
    assert seen == [None]


def test_a_follower_that_caught_up_holds_the_high_watermark_until_written_into_the_isr(open_partition):
    # Between catching up and the ISR write, a busy partition moves on: the high watermark waits
    # for the joining follower (so it never lacks anything acknowledged), instead of overtaking
    # it and turning the write down (it could then never join while writes go on).
    leader = leading(open_partition, isr=("a", "b"))
    leader.append(values(1))
    leader.followers.record_fetch("b", 1)
    assert leader.followers.record_fetch("c", 1)
    leader.append(values(3, start=1))
    leader.followers.record_fetch("b", 4)
    assert leader.log.high_watermark == 1  # c has not fetched past 1
    assert leader.followers.expansion("c") == REPLICAS
    leader.followers.record_fetch("c", 4)
    assert leader.log.high_watermark == 4


def test_a_joining_follower_that_falls_behind_is_judged_again():
    now = [0.0]
    state = PartitionState("a", REPLICAS, ("a", "b"), 1, version=1)
    leader = Partition(CONFIG, 0, MemoryLog(), "a", state, clock=lambda: now[0])
    try:
        leader.become_leader(state)
        leader.append(values(1))
        leader.followers.record_fetch("b", 1)
        assert leader.followers.record_fetch("c", 1)
        leader.append(values(3, start=1))
        now[0] = 10.0
        leader.followers.record_fetch("b", 4)
        assert leader.log.high_watermark == 1
        # c stalls past replica_max_lag: it stops holding the high watermark, and must catch up again.
        assert leader.followers.lagging_replicas(max_lag=2.0) is None  # nothing stored to shrink
        assert leader.log.high_watermark == 4
        assert leader.followers.expansion("c") is None
        leader.followers.record_fetch("c", 4)
        assert leader.followers.expansion("c") == REPLICAS
    finally:
        leader.close()


def test_an_older_state_than_the_one_held_is_ignored(open_partition):
    leader = leading(open_partition, isr=("a", "b"))
    leader.update_state(PartitionState("a", REPLICAS, ("a",), 1, version=3))
    leader.update_state(PartitionState("a", REPLICAS, REPLICAS, 1, version=2))  # read before v3
    assert leader.state.isr == ("a",) and leader.state.version == 3


def test_a_fetcher_of_an_earlier_leadership_cannot_write(open_partition):
    leader = leading(open_partition)
    leader.append(values(2))
    frames = [f.data for f in leader.log.read_frames(0)]
    follower = open_partition("b", PartitionState("a", REPLICAS, REPLICAS, 1, version=1))
    follower.become_follower(PartitionState("a", REPLICAS, REPLICAS, 1, version=1))
    follower.become_follower(PartitionState("c", REPLICAS, REPLICAS, 2, version=2))  # a new leader
    for write in (
        lambda: follower.replica.append_replicated(frames, 2, leader_epoch=1),
        lambda: follower.replica.truncate_to(0, leader_epoch=1),
        lambda: follower.replica.reset_to(5, leader_epoch=1),
    ):
        with pytest.raises(NotLeaderError, match="no longer follows"):
            write()
    assert follower.log.log_end_offset == 0
    follower.replica.append_replicated(frames, 2, leader_epoch=2)
    assert follower.log.log_end_offset == 2


def test_a_leader_that_became_a_follower_refuses_appends(open_partition):
    leader = leading(open_partition)
    leader.become_follower(PartitionState("b", REPLICAS, REPLICAS, 2, version=2))
    with pytest.raises(NotLeaderError):
        leader.append(values(1))
    assert leader.log.log_end_offset == 0


def test_a_stream_deleted_and_created_again_between_two_applies_starts_empty(tmp_path):
    coordinator = LocalCoordinator(tmp_path)
    coordinator.start(BrokerInfo("a", "grpc://127.0.0.1:1", ()))
    manager = ReplicaManager("a", tmp_path, coordinator, ReplicationConfig(), lambda config: LogConfig())
    config = StreamConfig(name="audit", subject="audit")
    coordinator.create_stream(config)
    manager.apply()
    manager.get("audit", 0).append(values(3))
    coordinator.delete_stream("audit")
    coordinator.create_stream(config)  # no apply in between: the manager never saw it gone
    manager.apply()
    try:
        partition = manager.get("audit", 0)
        assert partition.log.log_end_offset == 0  # the old incarnation's 3 messages are gone
        partition.append(values(1))
    finally:
        manager.close()
        coordinator.close()


def test_the_answer_to_an_isr_write_does_not_roll_back_a_newer_state(open_partition):
    # The write that brings d in sync lets the controller complete a move (c dropped, v7); the
    # metadata may bring v7 before the ISR thread hears its own write (v6) was stored.
    moving = PartitionState("a", ("a", "b", "d", "c"), ("a", "b", "c"), 1, 5, ("d",), ("c",), 0, REPLICAS)
    leader = open_partition("a", moving)
    leader.become_leader(moving)
    leader.append(values(2))
    proposal = leader.followers.propose_isr(("a", "b", "c", "d"))
    assert proposal is not None
    done = PartitionState("a", ("a", "b", "d"), ("a", "b", "d"), 1, 7)
    leader.update_state(done)
    leader.followers.isr_written(replace(proposal, version=6))
    assert leader.state == done
    leader.followers.record_fetch("b", 2)
    leader.followers.record_fetch("d", 2)
    assert leader.log.high_watermark == 2  # c, gone, is not waited for


def test_an_in_sync_follower_that_fetches_below_the_high_watermark_leaves_the_isr(open_partition):
    # c crashed, its unsynced tail was cut, and it came back before leaving the ISR: it now lacks
    # acknowledged messages and must not stay electable.
    leader = leading(open_partition)
    leader.append(values(4))
    leader.followers.record_fetch("b", 4)
    leader.followers.record_fetch("c", 4)
    assert leader.log.high_watermark == 4
    leader.followers.record_fetch("c", 2)
    assert leader.followers.lagging_replicas(max_lag=60.0) == ("a", "b")
    assert leader.log.high_watermark == 4  # never backwards


def test_an_idempotent_append_that_may_not_wait_stores_nothing_while_another_append_runs(open_partition):
    leader = leading(open_partition)
    leader.append_idempotent(values(1), "p", 0, 0)
    with held_elsewhere(leader._append_lock):  # an append in a worker thread, taking its time
        assert leader.append_idempotent(values(1, start=1), "p", 0, 1, wait=False) is None
        assert leader.log.log_end_offset == 1  # nothing stored, and the sequence still expected:
    ack = leader.append_idempotent(values(1, start=1), "p", 0, 1, wait=False)
    assert ack is not None and ack.ok and (ack.first_offset, ack.last_offset) == (1, 1)
    again = leader.append_idempotent(values(1, start=1), "p", 0, 1, wait=False)
    assert again is not None and again.error is ErrorCode.DUPLICATE and again.last_offset == 1


def test_a_mirror_leader_copies_only_in_the_epoch_it_was_asked_for(open_partition):
    """The mirror copier appends as leader in an epoch it read when it started: after a newer epoch
    (this broker led again, or another did in between) its copies and resets are refused."""
    source = MemoryLog()
    source.assign_leader_epoch(2)
    source.append(values(2))
    frames = [f.data for f in source.read_frames(0)]
    batches = source.read(0)
    leader = leading(open_partition, epoch=2)
    with pytest.raises(NotLeaderError):
        leader.append_mirrored(frames, batches, leader_epoch=1)
    with pytest.raises(NotLeaderError):
        leader.reset_mirror(5, leader_epoch=1)
    assert leader.log.log_end_offset == 0
    assert leader.append_mirrored(frames, batches, leader_epoch=2) == range(0, 2)
