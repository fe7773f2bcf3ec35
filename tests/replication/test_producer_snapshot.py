"""The producer snapshot: an open reads only the log after it, and never trusts one that no longer fits."""

from __future__ import annotations

import logging
import shutil

import pytest

from broker_node.coordination.base import PartitionState
from broker_node.log import Log, MemoryLog, Record
from broker_node.replication.partition import Partition
from broker_node.replication.partition_tables import PRODUCER_SNAPSHOT
from broker_node.replication.producers import ProducerTable
from pyspark_jetstream.protocol.ack import Ack, ErrorCode
from pyspark_jetstream.protocol.envelope import producer_position
from pyspark_jetstream.protocol.streams import StreamConfig

from ..log.helpers import values

CONFIG = StreamConfig(name="orders", subject="orders")
STATE = PartitionState("a", ("a",), ("a",), 1, version=1)


def open_leader(directory, epoch: int = 1) -> Partition:
    state = PartitionState("a", ("a",), ("a",), epoch, version=1)
    partition = Partition(CONFIG, 0, Log.open(directory), "a", state)
    partition.become_leader(state)
    return partition


def stamped(producer: str, sequence: int) -> list[Record]:
    """One message of ``producer`` with ``sequence`` (epoch 0), as ingestion stores it."""
    record = values(1, start=sequence)[0]
    return [record._replace(producer_id=producer, sequence=producer_position(0, sequence))]


def send(partition: Partition, producer: str, sequence: int) -> Ack:
    return partition.append_idempotent(stamped(producer, sequence), producer, 0, sequence)


def publish(partition: Partition, first: int, count: int, producer: str = "p") -> None:
    for sequence in range(first, first + count):
        ack = send(partition, producer, sequence)
        assert ack.error is ErrorCode.OK, ack


@pytest.fixture
def scans(monkeypatch):
    """Where each log scan started, and how many batches it read."""
    seen: list[list[int]] = []
    original = Log.scan

    def scan(self, **kwargs):
        record = [max(self.log_start_offset, kwargs.get("start_offset") or 0), 0]
        seen.append(record)
        for batch in original(self, **kwargs):
            record[1] += 1
            yield batch

    monkeypatch.setattr(Log, "scan", scan)
    return seen


def test_an_open_reads_only_the_log_after_the_snapshot(tmp_path, scans):
    partition = open_leader(tmp_path / "p")
    publish(partition, 0, 20)
    partition.close()  # writes the snapshot
    assert (tmp_path / "p" / PRODUCER_SNAPSHOT).exists()
    scans.clear()
    partition = open_leader(tmp_path / "p")
    assert scans == [[20, 0]]  # nothing before offset 20 was read
    # ...and the table is the one the log would give.
    assert send(partition, "p", 19).first_offset == 19  # duplicate, offsets known
    assert send(partition, "p", 19).error is ErrorCode.DUPLICATE
    assert send(partition, "p", 3).error is ErrorCode.DUPLICATE
    assert send(partition, "p", 21).error is ErrorCode.OUT_OF_ORDER_SEQUENCE
    assert send(partition, "p", 20).error is ErrorCode.OK
    partition.close()


def test_what_was_stored_after_the_snapshot_is_read_from_the_log(tmp_path, scans):
    partition = open_leader(tmp_path / "p")
    publish(partition, 0, 10)
    partition.maintain()  # a maintenance pass writes the snapshot at offset 10
    publish(partition, 10, 5)
    publish(partition, 0, 2, producer="q")
    partition.log.close()  # a crash: no snapshot at close
    scans.clear()
    partition = open_leader(tmp_path / "p")
    assert scans == [[10, 7]]
    ack = send(partition, "p", 14)
    assert (ack.error, ack.first_offset) == (ErrorCode.DUPLICATE, 14)
    assert send(partition, "q", 2).error is ErrorCode.OK
    partition.close()


def test_a_snapshot_past_the_log_end_is_not_trusted(tmp_path, scans):
    """The log lost its tail (unsynced pages after a power cut): the snapshot remembers sequences
    that are gone, and trusting it would ack a resend of them as duplicates, never stored."""
    partition = open_leader(tmp_path / "p")
    publish(partition, 0, 20)
    partition.close()
    with Log.open(tmp_path / "p") as log:
        log.truncate_to(12)
    scans.clear()
    partition = open_leader(tmp_path / "p")
    assert scans == [[0, 12]]
    assert send(partition, "p", 12).error is ErrorCode.OK  # stored again
    partition.close()


def test_a_snapshot_from_another_leader_epoch_is_not_trusted(tmp_path, scans):
    partition = open_leader(tmp_path / "p")
    publish(partition, 0, 10)
    partition.close()
    with Log.open(tmp_path / "p") as log:  # replaced by another leader's history of the same length
        log.truncate_to(5)
        log.assign_leader_epoch(7)
        log.append(values(5, start=100))
    scans.clear()
    partition = open_leader(tmp_path / "p", epoch=8)
    assert scans[0][0] == 0
    assert send(partition, "p", 5).error is ErrorCode.OK
    partition.close()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{",
        b"[]",
        b'{"version": 99}',
        b'{"version": 1, "end_offset": -4, "epoch": null, "producers": {}}',
        b'{"version": 1, "end_offset": 3, "epoch": null, "producers": {"p": [[1, 2]]}}',
        b"[" * 100_000,
    ],
)
def test_a_damaged_snapshot_is_ignored_with_a_warning(tmp_path, scans, caplog, content):
    partition = open_leader(tmp_path / "p")
    publish(partition, 0, 5)
    partition.close()
    (tmp_path / "p" / PRODUCER_SNAPSHOT).write_bytes(content)
    scans.clear()
    with caplog.at_level(logging.WARNING):
        partition = open_leader(tmp_path / "p")
    assert scans == [[0, 5]]
    (ignored,) = [r for r in caplog.records if PRODUCER_SNAPSHOT in r.getMessage()]
    assert ignored.getMessage().startswith("orders/0: ")
    assert (ignored.stream, ignored.partition) == ("orders", 0)  # fields of the JSON log format
    assert send(partition, "p", 4).error is ErrorCode.DUPLICATE
    assert send(partition, "p", 5).error is ErrorCode.OK
    partition.close()


def test_a_truncation_removes_the_snapshot_first(tmp_path):
    partition = open_leader(tmp_path / "p")
    publish(partition, 0, 10)
    partition.snapshot_producers()
    follower_state = PartitionState("b", ("a", "b"), ("a", "b"), 2, version=2)
    partition.become_follower(follower_state)
    partition.replica.truncate_to(4, leader_epoch=2)
    assert not (tmp_path / "p" / PRODUCER_SNAPSHOT).exists()
    partition.log.close()
    partition = open_leader(tmp_path / "p")
    assert send(partition, "p", 4).error is ErrorCode.OK
    partition.close()


def test_a_snapshot_racing_a_delete_of_its_partition_is_dropped_quietly(tmp_path, monkeypatch, caplog):
    """The maintenance pass writes outside the partition's locks: a delete may close the partition
    and remove its directory meanwhile (on another thread). Nothing is warned about."""
    import threading

    from broker_node.replication import partition_tables as module

    partition = open_leader(tmp_path / "log")
    publish(partition, 0, 3)
    original = module.atomic_write
    deleting = []

    def delete() -> None:
        partition.close()
        shutil.rmtree(tmp_path / "log")

    def deleted_meanwhile(path, data):
        monkeypatch.setattr(module, "atomic_write", original)  # the close writes its own snapshot
        deleting.append(threading.Thread(target=delete))
        deleting[0].start()
        deleting[0].join(0.5)  # the close waits for this write to end, or it is done already
        original(path, data)

    monkeypatch.setattr(module, "atomic_write", deleted_meanwhile)
    with caplog.at_level(logging.WARNING):
        partition.snapshot_producers()
        deleting[0].join()
    assert not (tmp_path / "log").exists()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records


def test_a_snapshot_that_cannot_be_written_while_open_is_warned_about(tmp_path, monkeypatch, caplog):
    from broker_node.replication import partition_tables as module

    partition = open_leader(tmp_path / "log")
    publish(partition, 0, 3)

    def full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module, "atomic_write", full)
    with caplog.at_level(logging.WARNING):
        partition.snapshot_producers()
    assert any("cannot write" in r.getMessage() and "No space left" in r.getMessage() for r in caplog.records)
    partition.close()


def test_a_partition_on_a_log_without_files_keeps_its_producers_in_memory_only():
    partition = Partition(CONFIG, 0, MemoryLog(), "a", STATE)
    try:
        partition.become_leader(STATE)
        publish(partition, 0, 3)
        partition.maintain()  # where a partition on a file log writes its snapshot
        assert send(partition, "p", 2).error is ErrorCode.DUPLICATE
        replicas = ("a", "b")
        partition.become_follower(PartitionState("b", replicas, replicas, 2, version=2))
        partition.replica.truncate_to(2, leader_epoch=2)  # the table is rebuilt from what is left
        partition.become_leader(PartitionState("a", replicas, ("a",), 3, version=3))
        assert send(partition, "p", 2).error is ErrorCode.OK
    finally:
        partition.close()


def test_two_snapshots_at_once_are_written_one_after_the_other(tmp_path, monkeypatch, caplog):
    """The maintenance thread's snapshot and the one at close share a temporary file name: run
    together, one's rename found the other's file gone and logged a warning."""
    import threading

    import broker_node.replication.partition_tables as partition_module

    partition = open_leader(tmp_path / "p")
    publish(partition, 0, 3)
    real_write = partition_module.atomic_write
    inside = threading.Lock()
    second_entered = threading.Event()
    overlaps = []

    def write(path, data):
        if not inside.acquire(blocking=False):
            overlaps.append(path)
            second_entered.set()
            return real_write(path, data)
        try:
            if not second_entered.is_set() and threading.current_thread() is first:
                other = threading.Thread(target=partition.snapshot_producers)
                started.append(other)
                other.start()
                # Without the ordering the other writer arrives here at once; with it, it waits.
                second_entered.wait(1.0)
            real_write(path, data)
        finally:
            inside.release()

    started: list[threading.Thread] = []
    monkeypatch.setattr(partition_module, "atomic_write", write)
    first = threading.current_thread()
    with caplog.at_level(logging.WARNING, logger="broker_node.replication.partition"):
        partition.snapshot_producers()
        for thread in started:
            thread.join()
    assert started and overlaps == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert (tmp_path / "p" / PRODUCER_SNAPSHOT).exists()
    partition.close()


def test_a_rebuild_learns_many_stored_batches_at_once_and_knows_every_producer(tmp_path, monkeypatch):
    """A restarted broker rebuilds its producers from a log of one-message batches (one publish
    each) in a few groupings, not one a batch: that took ~1 ms a batch, and a chaos run's
    restarted broker spent 20 s opening a partition of 11,000 of them."""
    partition = open_leader(tmp_path / "p")
    for sequence in range(200):
        for producer in ("p", "q", "r"):
            assert send(partition, producer, sequence).error is ErrorCode.OK
    before = partition.producers.snapshot()
    partition.close()
    (tmp_path / "p" / PRODUCER_SNAPSHOT).unlink()  # as after a kill -9 before the next snapshot
    calls = []
    original = ProducerTable.learn_many

    def learn_many(self, batches):
        calls.append(len(batches))
        return original(self, batches)

    monkeypatch.setattr(ProducerTable, "learn_many", learn_many)
    partition = open_leader(tmp_path / "p")
    assert calls == [600]  # every stored batch in one call
    assert partition.producers.snapshot() == before
    again = send(partition, "q", 199)  # within the producer's window: acked with its offset
    assert again.error is ErrorCode.DUPLICATE and again.first_offset == 199 * 3 + 1
    assert send(partition, "r", 200).error is ErrorCode.OK
    partition.close()
