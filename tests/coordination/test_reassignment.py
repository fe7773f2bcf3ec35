"""Reassignment plans and the partition states they go through (pure functions, no cluster)."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import replace

import pytest

from broker_node.coordination import reassignment, wire
from broker_node.coordination.assignment import elect_leader
from broker_node.coordination.base import Move, PartitionState, StreamMetadata
from broker_node.coordination.local import LocalCoordinator
from broker_node.replication.throttle import Throttle
from pyspark_jetstream.protocol.errors import InvalidArgumentError, UnknownStreamError
from pyspark_jetstream.protocol.streams import StreamConfig

LIVE = ("b1", "b2", "b3", "b4")


def stream(name: str, *replicas: tuple[str, ...], min_insync: int = 1) -> StreamMetadata:
    factor = len(replicas[0])
    config = StreamConfig(
        name=name,
        subject=name,
        partitions=len(replicas),
        replication_factor=factor,
        min_insync_replicas=min(min_insync, factor),
    )
    return StreamMetadata(config, tuple(PartitionState(r[0], r, r, 3, 7) for r in replicas), f"id-{name}")


def plan(*entries: tuple[str, int, list[str]]) -> list[Move]:
    return reassignment.parse_plan(
        {"partitions": [{"stream": s, "partition": p, "replicas": r} for s, p, r in entries]}
    )


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({}, "at least one entry"),
        ({"partitions": []}, "at least one entry"),
        ([{"stream": "s", "partition": 0}], "exactly 'stream', 'partition' and 'replicas'"),
        ([{"stream": "s", "partition": -1, "replicas": ["b1"]}], "'partition' must be a partition number"),
        ([{"stream": "s", "partition": True, "replicas": ["b1"]}], "'partition' must be a partition number"),
        ([{"stream": "", "partition": 0, "replicas": ["b1"]}], "'stream' must be a stream name"),
        ([{"stream": "s", "partition": 0, "replicas": []}], "non-empty list of broker ids"),
        ([{"stream": "s", "partition": 0, "replicas": ["b1", 2]}], "non-empty list of broker ids"),
        ([{"stream": "s", "partition": 0, "replicas": ["b1", "b1"]}], "names broker(s) b1 more than once"),
    ],
)
def test_a_malformed_plan_is_refused_in_one_line_naming_the_entry(bad, words):
    with pytest.raises(InvalidArgumentError) as refused:
        reassignment.parse_plan(bad)
    assert words in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("entries", "error", "words"),
    [
        ([("nope", 0, ["b1", "b2"])], UnknownStreamError, "there is no stream 'nope'"),
        ([("s", 2, ["b1", "b2"])], UnknownStreamError, "has partitions 0 to 1"),
        ([("s", 0, ["b1", "b9"])], InvalidArgumentError, "broker(s) b9, which are not live"),
        ([("s", 0, ["b3", "b4"]), ("s", 0, ["b3", "b2"])], InvalidArgumentError, "names s/0 twice"),
        ([("s", 0, ["b3"])], InvalidArgumentError, "fewer than its stream's min_insync_replicas (2)"),
        ([("s", 0, ["b1", "b2", "b3"])], InvalidArgumentError, "replication factor is 2"),
    ],
)
def test_a_plan_that_does_not_fit_the_cluster_is_refused_before_anything_moves(entries, error, words):
    streams = [stream("s", ("b1", "b2"), ("b2", "b3"), min_insync=2)]
    with pytest.raises(error) as refused:
        reassignment.checked_plan(plan(*entries), streams, LIVE)
    assert words in str(refused.value)


def test_a_new_plan_replaces_a_move_under_way():
    first = reassignment.started(PartitionState("b1", ("b1", "b2"), ("b1", "b2")), ("b3", "b4"), 0)
    assert first is not None and first.replicas == ("b3", "b4", "b1", "b2")
    metadata = StreamMetadata(stream("s", ("b1", "b2")).config, (first,), "id")
    assert reassignment.checked_plan(plan(("s", 0, ["b2", "b4"])), [metadata], LIVE)
    second = reassignment.started(first, ("b2", "b4"), 5000)
    # b3 (added by the first move) is dropped with b1; b4 is still added; a cancel goes back to b1, b2.
    assert second == replace(
        first, replicas=("b2", "b4", "b3", "b1"), removing=("b3", "b1"), adding=("b4",), throttle=5000
    )
    assert second.original == ("b1", "b2")
    # Back to the replicas from before: the added ones are dropped once those are in sync.
    back = reassignment.started(second, ("b1", "b2"), 0)
    assert back is not None and back.adding == () and back.removing == ("b4", "b3")
    # The same target again changes nothing (nor does it restart anything).
    assert reassignment.started(second, ("b2", "b4"), 5000) is None


def test_a_move_whose_original_replicas_are_all_lost_can_still_be_sent_elsewhere():
    # {b1, b2} -> {b3, b4}: b3 caught up, then b4, b1 and b2 died for good, and b3 leads.
    moving = PartitionState(
        "b3", ("b3", "b4", "b1", "b2"), ("b3",), 2, 9, ("b3", "b4"), ("b1", "b2"), 0, ("b1", "b2")
    )
    live = {"b3", "b5"}
    with pytest.raises(InvalidArgumentError, match="cannot cancel"):
        reassignment.cancelled(moving, live)
    again = reassignment.started(moving, ("b3", "b5"), 0)
    assert again is not None and again.adding == ("b3", "b5") and set(again.removing) == {"b4", "b1", "b2"}
    in_sync = replace(again, isr=("b3", "b5"))
    assert reassignment.completed(in_sync, live) == PartitionState("b3", ("b3", "b5"), ("b3", "b5"), 2, 9)


def test_a_move_adds_the_target_replicas_then_drops_the_others_and_moves_leadership_off_them():
    before = PartitionState("b1", ("b1", "b2"), ("b1", "b2"), leader_epoch=4, version=9)
    moving = reassignment.started(before, ("b3", "b2"), 1000)
    assert moving == PartitionState(
        "b1", ("b3", "b2", "b1"), ("b1", "b2"), 4, 9, ("b3",), ("b1",), throttle=1000, previous=("b1", "b2")
    )
    assert moving.target == ("b3", "b2") and moving.original == ("b1", "b2")
    # Not done while b3 is not in sync.
    assert reassignment.completed(moving, LIVE) is None
    in_sync = PartitionState("b1", moving.replicas, ("b1", "b2", "b3"), 4, 10, ("b3",), ("b1",), 1000)
    done = reassignment.completed(in_sync, LIVE)
    # b1 leads no more: the first target replica takes over in a new epoch.
    assert done == PartitionState("b3", ("b3", "b2"), ("b3", "b2"), 5, 10)
    # A leader that stays keeps its epoch.
    staying = PartitionState("b2", moving.replicas, ("b1", "b2", "b3"), 4, 10, ("b3",), ("b1",), 0)
    assert reassignment.completed(staying, LIVE) == PartitionState("b2", ("b3", "b2"), ("b3", "b2"), 4, 10)
    # Nobody live in the target to lead: wait.
    assert reassignment.completed(in_sync, {"b1"}) is None


def test_a_same_set_of_brokers_only_changes_the_preferred_order():
    before = PartitionState("b1", ("b1", "b2"), ("b1", "b2"))
    assert reassignment.started(before, ("b2", "b1"), 0) == PartitionState("b1", ("b2", "b1"), ("b1", "b2"))
    assert reassignment.started(before, ("b1", "b2"), 0) is None


def test_a_cancel_goes_back_to_the_original_replicas_in_their_order():
    replicas, before = ("b3", "b2", "b1"), ("b1", "b2")
    moving = PartitionState("b1", replicas, ("b1", "b2", "b3"), 4, 10, ("b3",), ("b1",), 1000, before)
    assert reassignment.cancelled(moving, LIVE) == PartitionState("b1", before, before, 4, 10)
    # The leader was one of the added replicas (a failover during the move): an original one takes over.
    led_by_new = PartitionState("b3", replicas, ("b3", "b2"), 5, 11, ("b3",), ("b1",), 0, before)
    assert reassignment.cancelled(led_by_new, LIVE) == PartitionState("b2", before, ("b2",), 6, 11)
    lost = PartitionState("b3", replicas, ("b3",), 5, 11, ("b3",), ("b1",), 0, before)
    with pytest.raises(InvalidArgumentError, match="none of the original replicas b1, b2 is live"):
        reassignment.cancelled(lost, LIVE)


def test_the_stored_form_keeps_a_reassignment_and_reads_older_states():
    moving = PartitionState("b1", ("b3", "b2", "b1"), ("b1", "b2"), 4, 0, ("b3",), ("b1",), 1000)
    assert wire.partition_from_bytes(wire.partition_to_bytes(moving), 0) == moving
    plain = PartitionState("b1", ("b1",), ("b1",), 2)
    assert b"adding" not in wire.partition_to_bytes(plain)
    assert wire.partition_from_bytes(wire.partition_to_bytes(plain), 0) == plain
    assert PartitionState.from_json(moving.to_json()) == moving
    assert PartitionState.from_json(plain.to_json()) == plain
    half = wire.dumps(
        {"leader": "b1", "replicas": ["b1"], "isr": ["b1"], "leader_epoch": 1, "adding": ["b2"]}
    )
    with pytest.raises(wire.WireError, match="but not all of"):
        wire.partition_from_bytes(half, 0)


def test_a_drain_replaces_the_broker_by_the_least_loaded_one_in_its_place_and_another_rack():
    streams = [stream("s", ("b1", "b2"), ("b2", "b3"), ("b3", "b1"))]
    moves = reassignment.drain_plan("b1", streams, LIVE)
    # b4 holds nothing: it takes both of b1's replicas, in b1's place (preferred stays first).
    assert moves == [Move("s", 0, ("b4", "b2")), Move("s", 2, ("b3", "b4"))]
    racks = {"b1": "r1", "b2": "r2", "b3": "r1", "b4": "r2"}
    assert reassignment.drain_plan("b1", streams, LIVE, racks)[0] == Move("s", 0, ("b3", "b2"))
    with pytest.raises(InvalidArgumentError, match="holds no replica"):
        reassignment.drain_plan("b9", streams, LIVE)
    with pytest.raises(InvalidArgumentError, match="cannot drain b1"):
        reassignment.drain_plan("b1", streams, ("b1", "b2"))


def test_a_generated_plan_spreads_replicas_and_leaders_and_alternates_racks():
    streams = [stream("a", *[("b1", "b2")] * 4), stream("c", *[("b1", "b2")] * 2)]
    moves = reassignment.generated_plan(["b1", "b2", "b3", "b4"], streams)
    final = {(m.config.name, n): p.replicas for m in streams for n, p in enumerate(m.partitions)}
    final.update({(m.stream, m.partition): m.replicas for m in moves})
    # Partitions already where they would go (a/0 and c/0 on b1,b2) are left out of the plan.
    assert {(m.stream, m.partition) for m in moves} == {("a", 1), ("a", 2), ("a", 3), ("c", 1)}
    replicas = Counter(b for r in final.values() for b in r)
    leaders = Counter(r[0] for r in final.values())
    assert max(replicas.values()) - min(replicas.values()) <= 1 and set(replicas) == set(LIVE)
    assert max(leaders.values()) - min(leaders.values()) <= 1 and set(leaders) == set(LIVE)
    racks = {"b1": "east", "b2": "east", "b3": "west", "b4": "west"}
    for move in reassignment.generated_plan(["b1", "b2", "b3", "b4"], streams, racks):
        assert {racks[b] for b in move.replicas} == {"east", "west"}, move
    with pytest.raises(InvalidArgumentError, match="replication factor 2, more than the 1 broker"):
        reassignment.generated_plan(["b1"], streams)


def test_the_throttle_holds_every_fetch_of_a_broker_to_its_rate():
    now = [0.0]
    throttle = Throttle(clock=lambda: now[0])
    assert throttle.delay(0) == 0
    throttle.add(500_000, 1_000_000)
    throttle.add(500_000, 1_000_000)
    # A million bytes owed at 1 MB/s: wait until a quarter second's worth is left.
    assert throttle.delay(1_000_000) == pytest.approx(0.75)
    now[0] = 0.5
    assert throttle.delay(1_000_000) == pytest.approx(0.25)
    # A new rate applies at once to what is owed (a move started again at 50 MB/s).
    assert throttle.delay(50_000_000) == pytest.approx(0.0)
    assert Throttle.chunk(0, 8 << 20) == 8 << 20
    assert Throttle.chunk(1_000_000, 8 << 20) == 250_000
    assert Throttle.chunk(65_536, 8 << 20) == 64 * 1024


def test_a_throttled_wait_ends_when_the_partition_is_no_longer_throttled():
    throttle = Throttle()
    throttle.add(10_000_000, 65_536)  # about 150 s owed at 64 KiB/s
    rates = iter([65_536, 0])
    started = time.monotonic()
    throttle.wait(lambda: next(rates), threading.Event())  # the move was cancelled: rate 0
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("bad", [-1, 50, 65_535, 1 << 41, 1.5, True, "50MB"])
def test_a_throttle_outside_its_range_is_refused_naming_it(bad):
    with pytest.raises(InvalidArgumentError, match=f"throttle must be 0 .* got {re.escape(repr(bad))}"):
        reassignment.check_throttle(bad)


def test_one_broker_says_moving_partitions_needs_a_cluster(tmp_path):
    coordinator = LocalCoordinator(tmp_path)
    with pytest.raises(InvalidArgumentError, match="moving partitions needs a cluster"):
        coordinator.reassign([Move("s", 0, ("b1",))], 0)


def test_an_unclean_election_during_a_move_prefers_the_replicas_not_being_added():
    # a and b (in sync) are dead; c is being dropped but holds nearly everything, d was just added.
    moving = PartitionState("a", ("a", "b", "d", "c"), ("a", "b"), 3, 4, ("d",), ("c",), 0, ("a", "b", "c"))
    assert elect_leader(moving, {"c", "d"}, unclean=True) == ("c", ("c",))
