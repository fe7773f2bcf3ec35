"""Message ids a partition remembers: the window, the cap, the rebuild from the log's tail alone,
and a follower that keeps them for when it leads."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from broker_node.coordination.base import PartitionState
from broker_node.log import Log, MemoryLog, Record
from broker_node.replication.message_ids import MessageIdTable
from broker_node.replication.partition import Partition
from broker_node.replication.partition_tables import PRODUCER_SNAPSHOT
from pyspark_jetstream.protocol.streams import StreamConfig

from ..log.helpers import FakeClock

REPLICAS = ("a", "b")


def _with_ids(*ids: str | None) -> list[Record]:
    return [
        Record(b"v", headers=[] if i is None else [("trace", b"t"), ("Nats-Msg-Id", i.encode())]) for i in ids
    ]


def _append(partition: Partition, *ids: str | None) -> range:
    """Append one message per id (``None``: none) as the ingestion does, the ids with them."""
    return partition.append(_with_ids(*ids), message_ids=[(i, k) for k, i in enumerate(ids) if i is not None])


def test_ids_are_forgotten_after_the_window():
    clock = FakeClock()
    table = MessageIdTable(10, 100, clock)
    table.remember([("a", 0), ("b", 1)])
    clock.advance(5)
    table.remember([("c", 2)])
    assert (table.offset_of("a"), table.offset_of("c")) == (0, 2)
    clock.advance(5.5)  # a and b are 10.5 s old, c 5.5 s
    assert table.offset_of("a") is None and table.offset_of("b") is None
    assert table.offset_of("c") == 2 and len(table) == 1


def test_the_cap_forgets_the_oldest_first():
    table = MessageIdTable(60, 3, FakeClock())
    table.remember([(f"id-{i}", i) for i in range(5)])
    assert [table.offset_of(f"id-{i}") for i in range(5)] == [None, None, 2, 3, 4]


def test_within_the_window_the_first_stays_the_original():
    clock = FakeClock()
    table = MessageIdTable(10, 100, clock)
    table.remember([("a", 0), ("a", 5)])  # a batch carrying an id twice
    assert table.offset_of("a") == 0
    clock.advance(11)
    table.remember([("a", 9)])  # stored again after its window: the new original
    assert table.offset_of("a") == 9


def test_a_zero_window_remembers_nothing():
    table = MessageIdTable(0, 100, FakeClock())
    table.remember([("a", 0)])
    assert table.offset_of("a") is None and not table.enabled


def test_learning_a_stored_batch_takes_the_ids_of_its_headers():
    clock = FakeClock()
    table = MessageIdTable(60, 100, clock)
    micros = int(clock() * 1_000_000)
    headers = [
        [{"key": "Nats-Msg-Id", "value": b"x"}],
        None,
        [{"key": "other", "value": b"y"}, {"key": "Nats-Msg-Id", "value": b"z"}],
        [{"key": "Nats-Msg-Id", "value": b""}],  # empty: no id, as in JetStream
        [{"key": "Nats-Msg-Id", "value": b"old"}],
    ]
    batch = pa.record_batch(
        {
            "offset": pa.array([10, 11, 12, 13, 14], pa.int64()),
            "timestamp": pa.array([micros] * 4 + [micros - 61_000_000], pa.timestamp("us", tz="UTC")),
            "headers": pa.array(headers, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        }
    )
    table.learn(batch)
    assert (table.offset_of("x"), table.offset_of("z"), table.offset_of("old")) == (10, 12, None)
    assert len(table) == 2


@pytest.fixture
def clock():
    return FakeClock()


def _open(tmp_path, clock, broker="a", window=120.0, *, in_memory=False) -> Partition:
    """A partition on a file log in ``tmp_path / broker`` (or on a memory log, which keeps nothing)."""
    config = StreamConfig(name="s", subject="s", replication_factor=2, duplicate_window=window)
    state = PartitionState("a", REPLICAS, REPLICAS, 1, version=1)
    log = MemoryLog(clock=clock) if in_memory else Log.open(tmp_path / broker, clock=clock)
    return Partition(config, 0, log, broker, state, wall_clock=clock)


def test_an_opening_partition_reads_only_the_window_of_the_log(tmp_path, clock, scans):
    partition = _open(tmp_path, clock)
    partition.become_leader(partition.state)
    for i in range(50):  # old: long out of the window
        _append(partition, f"old-{i}", None)
    clock.advance(3600)
    recent = _append(partition, "new-0", "new-1", None)
    clock.advance(60)
    _append(partition, "new-2")
    partition.close()  # writes the producer snapshot: producers need no scan either
    scans.clear()
    reopened = _open(tmp_path, clock)
    try:
        assert scans == [recent.start]  # the first message of the window, not the log start
        assert [reopened.message_id_offset(f"new-{i}") for i in range(3)] == [100, 101, 103]
        assert reopened.message_id_offset("old-49") is None and len(reopened.message_ids) == 3
    finally:
        reopened.close()


@pytest.fixture
def scans(monkeypatch):
    """The start offset of every log scan (rebuilds scan the log)."""
    starts: list[int | None] = []
    scan = Log.scan

    def recording_scan(self, **kwargs):
        starts.append(kwargs.get("start_offset"))
        return scan(self, **kwargs)

    monkeypatch.setattr(Log, "scan", recording_scan)
    return starts


def test_after_a_crash_ids_are_read_from_the_snapshots_oldest_id_on(tmp_path, clock, scans):
    partition = _open(tmp_path, clock)
    partition.become_leader(partition.state)
    for _ in range(20):
        _append(partition, None)  # no ids: nothing to read back for them
    first = _append(partition, "a", None)
    partition.maintain()  # writes the snapshot at offset 22, whose oldest id is at 20
    _append(partition, "b")
    partition.log.close()  # a crash: no snapshot at close
    scans.clear()
    reopened = _open(tmp_path, clock)
    try:
        assert scans == [first.start]
        assert (reopened.message_id_offset("a"), reopened.message_id_offset("b")) == (20, 22)
    finally:
        reopened.close()
    # A snapshot without the field (written before message ids) reads the whole window.
    path = tmp_path / "a" / PRODUCER_SNAPSHOT
    data = json.loads(path.read_bytes())
    assert data["message_ids_from"] == 20
    del data["message_ids_from"]
    path.write_text(json.dumps(data))
    scans.clear()
    _open(tmp_path, clock).close()
    assert scans == [0]


def test_a_follower_keeps_the_ids_it_replicates_and_uses_them_when_it_leads(tmp_path, clock):
    leader = _open(tmp_path, clock, "a", in_memory=True)
    leader.become_leader(leader.state)
    leader.append(_with_ids("m-1", "m-2"), message_ids=[("m-1", 0), ("m-2", 1)])
    assert leader.message_id_offset("m-2") == 1
    frames = [f.data for f in leader.log.read_frames(0)]
    follower = _open(tmp_path, clock, "b", in_memory=True)
    try:
        follower.become_follower(PartitionState("a", REPLICAS, REPLICAS, 1, version=1))
        follower.replica.append_replicated(frames, 2, leader_epoch=1)
        follower.become_leader(PartitionState("b", REPLICAS, ("b",), 2, version=2))
        assert (follower.message_id_offset("m-1"), follower.message_id_offset("m-2")) == (0, 1)
        # After a truncation the ids are read back from what is left.
        follower.become_follower(PartitionState("a", REPLICAS, REPLICAS, 3, version=3))
        follower.replica.truncate_to(1, leader_epoch=3)
        assert (follower.message_id_offset("m-1"), follower.message_id_offset("m-2")) == (0, None)
    finally:
        follower.close()
        leader.close()


def test_a_damaged_batch_at_the_window_start_costs_only_its_own_ids(tmp_path, clock):
    partition = _open(tmp_path, clock)
    partition.become_leader(partition.state)
    _append(partition, "before")
    clock.advance(3600)
    partition.log.roll()
    damaged = _append(partition, "lost", "lost-too")
    partition.log.roll()  # each in a closed segment of its own: damage there is not cut off as a torn tail
    _append(partition, "kept")
    segment = partition.log._segments[1]
    path, position = segment.path, segment.index.positions[0]
    partition.close()
    data = bytearray(path.read_bytes())
    data[position + 60] ^= 0x04
    path.write_bytes(bytes(data))
    reopened = _open(tmp_path, clock)
    try:
        assert reopened.log.damaged[0][1:3] == (damaged.start, damaged[-1])
        assert reopened.message_id_offset("kept") == 3
        assert reopened.message_id_offset("lost") is None and reopened.message_id_offset("before") is None
    finally:
        reopened.close()
