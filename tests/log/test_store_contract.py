"""The log's contract, run against both implementations: the file ``Log`` and ``MemoryLog``.

Each test below runs once per implementation and states what any log must do.
The property test at the end runs the same random operations on a file log and
a memory log side by side and requires the same answers and the same state
after every step -- reads, frames byte for byte, offsets, high watermark,
leader epochs, truncation, retention and compaction -- with a file log whose
every batch is a segment of its own (``segment_bytes`` at its floor: a segment
header and the smallest frame already exceed it), which is what a memory log
behaves as; and it feeds each kind's follower from the other kind's leader.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker_node.log import (
    UNDEFINED,
    EpochEndOffset,
    InvalidRecordsError,
    Log,
    LogClosedError,
    LogConfig,
    LogError,
    LogStore,
    MemoryLog,
    OffsetOutOfRangeError,
    Record,
    RecordTooLargeError,
)
from broker_node.log.segment import header_bytes

from .helpers import FakeClock, held_elsewhere, machine_settings, rows, values

KINDS = ("file", "memory")
ONE_BATCH_PER_SEGMENT = LogConfig(segment_bytes=1024, tombstone_retention=50.0)
"""A file log that rolls before every batch: a segment header and the smallest frame exceed it."""

Opener = Callable[..., LogStore]


def open_log(kind: str, directory: Path, config: LogConfig | None, clock: FakeClock) -> LogStore:
    if kind == "file":
        return Log.open(directory, config, clock=clock)
    return MemoryLog(config, clock=clock)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=KINDS)
def new_log(request, tmp_path, clock) -> Iterator[Opener]:
    """Opens logs of one kind (the test runs once per kind); closes them after the test."""
    opened: list[LogStore] = []

    def open_(config: LogConfig | None = None, name: str = "log", kind: str = request.param) -> LogStore:
        log = open_log(kind, tmp_path / name, config, clock)
        opened.append(log)
        return log

    yield open_
    for log in opened:
        log.close()


def frames(log: LogStore, start: int | None = None) -> list[tuple[int, int, int, bytes]]:
    got = log.read_frames(log.log_start_offset if start is None else start)
    return [(f.base_offset, f.last_offset, f.leader_epoch, f.data.to_pybytes()) for f in got]


def test_a_file_log_at_the_segment_floor_holds_one_batch_per_segment():
    # What the side-by-side test below relies on to compare retention and compaction exactly.
    smallest = MemoryLog()
    smallest.append([Record(None)])
    assert len(header_bytes(0)) + smallest.read_frames(0)[0].data.size > ONE_BATCH_PER_SEGMENT.segment_bytes


def test_appends_take_consecutive_offsets_and_read_back_in_order(new_log):
    log = new_log()
    assert log.append(values(3)) == range(0, 3)
    assert log.append(values(2, start=3)) == range(3, 5)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (0, 5, 0)
    assert [r[2] for r in rows(log)] == [v.value for v in values(5)]
    assert [r[0] for r in rows(log, 1, max_records=3)] == [1, 2, 3]
    assert [r[0] for r in rows(log, 2, upper_bound=4)] == [2, 3]
    assert [r[0] for r in rows(log, 0, max_bytes=1)] == [0, 1, 2]  # at least one batch
    assert log.read(5) == [] and log.read(1, upper_bound=1) == []
    for outside in (6, -1):
        with pytest.raises(OffsetOutOfRangeError):
            log.read(outside)
    with pytest.raises(ValueError, match="max_records"):
        log.read(0, max_records=0)


def test_bad_appends_change_nothing(new_log):
    log = new_log(LogConfig(max_message_bytes=10))
    with pytest.raises(RecordTooLargeError, match="max_message_bytes=10"):
        log.append([Record(b"x" * 11)])
    with pytest.raises(InvalidRecordsError):
        log.append([])
    assert log.log_end_offset == 0 and log.read(0) == []


def test_timestamps_come_from_the_clock_and_never_go_back(new_log, clock):
    log = new_log()
    log.append(values(1))
    clock.advance(-30)
    log.append(values(1))
    clock.advance(60)
    log.append(values(1))
    stamps = pa.Table.from_batches(log.read(0)).column("timestamp").cast(pa.int64()).to_pylist()
    first = int((clock.now - 30) * 1_000_000)
    assert stamps == [first, first, int(clock.now * 1_000_000)]
    assert log.offset_for_timestamp(clock.now - 1) == 2
    assert log.offset_for_timestamp(clock.now - 30) == 0
    assert log.offset_for_timestamp(clock.now + 1) == 3


def test_after_a_truncation_timestamps_need_only_follow_what_is_left(new_log, clock):
    log = new_log()
    log.append(values(1))
    clock.advance(60)
    log.append(values(1))
    clock.advance(-40)  # between the two
    log.truncate_to(1)
    log.append(values(1))
    stamps = pa.Table.from_batches(log.read(0)).column("timestamp").cast(pa.int64()).to_pylist()
    assert stamps[1] == int(clock.now * 1_000_000)


def test_a_follower_that_leads_next_stamps_no_earlier_than_what_it_replicated(new_log, clock):
    ahead = MemoryLog(clock=lambda: clock.now + 100)  # a leader whose clock runs ahead
    ahead.append(values(1))
    log = new_log()
    log.append_replicated(f.data for f in ahead.read_frames(0))
    log.append(values(1))
    stamps = pa.Table.from_batches(log.read(0)).column("timestamp").cast(pa.int64()).to_pylist()
    assert stamps == [int((clock.now + 100) * 1_000_000)] * 2


def test_the_high_watermark_stays_within_the_log_and_follows_truncation(new_log):
    log = new_log()
    log.append(values(4))
    log.high_watermark = 3
    assert log.high_watermark == 3
    with pytest.raises(ValueError, match="past the log end offset 4"):
        log.high_watermark = 5
    log.truncate_to(2)
    assert (log.high_watermark, log.log_end_offset) == (2, 2)


def test_leader_epochs_stamp_appends_and_answer_where_each_ends(new_log):
    log = new_log()
    log.append(values(2))  # no epoch assigned: epoch 0
    log.assign_leader_epoch(3)
    log.append(values(2, start=2))
    assert log.leader_epochs == ((0, 0), (3, 2)) and log.leader_epoch == 3
    assert pa.Table.from_batches(log.read(0)).column("leader_epoch").to_pylist() == [0, 0, 3, 3]
    assert log.end_offset_for_epoch(0) == EpochEndOffset(0, 2)
    assert log.end_offset_for_epoch(2) == EpochEndOffset(0, 2)
    assert log.end_offset_for_epoch(3) == EpochEndOffset(3, 4)
    assert log.end_offset_for_epoch(9) == EpochEndOffset(3, 4)
    with pytest.raises(LogError, match="newer"):
        log.assign_leader_epoch(2)  # epoch 3 holds data
    log.assign_leader_epoch(5)
    log.assign_leader_epoch(4)  # 5 holds nothing: forgotten
    assert log.leader_epochs == ((0, 0), (3, 2), (4, 4))


def test_an_epoch_older_than_the_first_is_undefined(new_log):
    log = new_log()
    log.assign_leader_epoch(2)
    log.append(values(1))
    assert log.end_offset_for_epoch(1) == EpochEndOffset(UNDEFINED, UNDEFINED)


def test_truncation_inside_a_batch_at_a_batch_and_past_the_end(new_log):
    log = new_log()
    log.append(values(3))
    log.assign_leader_epoch(1)
    log.append(values(3, start=3))
    log.truncate_to(9)  # past the end: nothing
    assert log.log_end_offset == 6
    log.truncate_to(5)  # inside the second batch
    assert [r[0] for r in rows(log)] == [0, 1, 2, 3, 4]
    assert [(f[0], f[1]) for f in frames(log)] == [(0, 2), (3, 4)]
    log.truncate_to(3)  # at the start of the epoch-1 batch: the epoch goes with it
    assert log.log_end_offset == 3 and log.leader_epochs == ((0, 0),)
    assert log.append(values(1)) == range(3, 4)


def test_truncation_at_the_end_forgets_only_epochs_without_data(new_log):
    log = new_log()
    log.append(values(2))
    log.assign_leader_epoch(4)
    log.truncate_to(2)
    assert log.leader_epochs == ((0, 0),) and log.log_end_offset == 2


def test_truncation_below_the_start_is_refused(new_log):
    log = new_log()
    log.reset_to(10)
    log.append(values(2))
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate_to(5)


def test_reset_starts_empty_at_the_offset(new_log):
    log = new_log()
    log.assign_leader_epoch(2)
    log.append(values(3))
    log.high_watermark = 2
    log.reset_to(7)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (7, 7, 7)
    assert log.leader_epochs == () and log.read(7) == []
    assert log.append(values(1)) == range(7, 8)


def test_a_waiter_for_the_end_sees_an_append_and_a_close(new_log):
    log = new_log()
    assert log.wait_for_end(0, 0) is False
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(log.wait_for_end(0, 30)))
    waiter.start()
    log.append(values(1))
    waiter.join(30)
    assert done == [True]
    log.close()
    assert log.wait_for_end(5, 30) is False  # at once: closed


def test_a_busy_log_answers_a_try_at_once_appending_and_reading_nothing(new_log):
    log = new_log()
    log.append(values(1))
    with held_elsewhere(log._lock):  # type: ignore[attr-defined]
        assert log.try_append(values(1)) is None
        assert log.try_append(values(3)) is None  # the batch path as well as the one-message one
        assert log.try_read_frames(0) is None
        assert log.log_end_offset == 1
    assert log.try_append(values(1)) == range(1, 2)
    assert [f.base_offset for f in log.try_read_frames(0) or []] == [0, 1]


def test_a_closed_log_refuses_work_and_closes_twice(new_log):
    log = new_log()
    log.append(values(1))
    log.close()
    log.close()
    for call in (lambda: log.append(values(1)), lambda: log.read(0), lambda: log.truncate_to(0)):
        with pytest.raises(LogClosedError):
            call()


def test_a_log_without_damage_refuses_repairs(new_log):
    log = new_log()
    log.append(values(2))
    assert log.damaged == [] and log.verify(1 << 20) >= 0
    with pytest.raises(InvalidRecordsError):
        log.repair(log.read(0))


def test_retention_keeps_the_configured_messages_below_the_high_watermark(new_log):
    log = new_log(LogConfig(segment_bytes=1024, retention_messages=2))
    for i in range(5):
        log.append(values(1, start=i))
    assert log.enforce_retention() == 0  # nothing committed yet
    log.high_watermark = 5
    assert log.enforce_retention() == 3
    assert log.log_start_offset == 3 and log.segment_base_offsets == [3, 4]
    assert [r[0] for r in rows(log)] == [3, 4]


def test_compaction_keeps_the_newest_committed_value_of_each_key(new_log, clock):
    log = new_log(ONE_BATCH_PER_SEGMENT)
    for key, value in ((b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (None, b"4"), (b"b", None), (b"a", b"5")):
        log.append([Record(value, key=key)])
    log.high_watermark = 5  # offset 5 is not committed: a's newest committed value is at 2
    assert log.compact() == 2  # offsets 0 and 1; the tombstone at 4 is younger than its retention
    assert [r[0] for r in rows(log)] == [2, 3, 4, 5]
    clock.advance(60)
    log.high_watermark = 6
    assert log.compact() == 2  # a's 3 (superseded at 5) and b's tombstone (expired)
    assert [(r[0], r[2]) for r in rows(log)] == [(3, b"4"), (5, b"5")]
    assert log.read(0)[0].column(0)[0].as_py() == 3  # a read from the gap starts after it


@pytest.mark.parametrize("leader_kind", KINDS)
def test_a_follower_of_either_kind_takes_the_frames_of_a_leader_of_either_kind(new_log, leader_kind):
    leader = new_log(name="leader", kind=leader_kind)
    follower = new_log(name="follower")
    leader.append(values(2))
    leader.assign_leader_epoch(2)
    leader.append([Record(b"v", key=b"k", headers=[("h", b"1")], subject="s")])
    sent = leader.read_frames(0)
    assert follower.append_replicated(f.data for f in sent) == range(0, 3)
    assert frames(follower) == frames(leader)  # byte for byte
    assert follower.leader_epochs == leader.leader_epochs
    with pytest.raises(InvalidRecordsError, match="following offset 2"):
        follower.append_replicated([sent[-1].data])  # an overlap
    older = MemoryLog()
    older.reset_to(3)
    older.append(values(1))  # epoch 0, older than the follower's 2
    with pytest.raises(InvalidRecordsError, match="older than this log's 2"):
        follower.append_replicated([older.read_frames(3)[0].data])
    assert follower.append_replicated(leader.read(0)[:0]) == range(3, 3)
    assert follower.log_end_offset == 3


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_a_follower_keeps_its_own_copy_of_what_it_replicated(kind, tmp_path, clock):
    with Log.open(tmp_path / "leader") as leader:
        leader.append(values(2))
        leader.append(values(2, start=2))
    follower = open_log(kind, tmp_path / "follower", None, clock)
    try:
        with Log.open(tmp_path / "leader") as leader:  # reopened: its frames map its files now
            follower.append_replicated(f.data for f in leader.read_frames(0))
            expected = frames(follower)
            leader.reset_to(0)  # cuts the segment file at 0 in place
            leader.append(values(1, start=7))
        assert frames(follower) == expected
        assert [r[2] for r in rows(follower)] == [v.value for v in values(4)]
    finally:
        follower.close()


def test_frames_cut_by_the_range_are_encoded_afresh(new_log):
    log = new_log()
    log.append(values(4))
    cut = log.read_frames(1, upper_bound=3)
    assert [(f.base_offset, f.last_offset) for f in cut] == [(1, 2)]
    follower = MemoryLog()
    follower.reset_to(1)
    follower.append_replicated([cut[0].data])
    assert [r[0] for r in rows(follower)] == [1, 2]


# ---- the two side by side -------------------------------------------------------------

KEYS = st.one_of(st.none(), st.sampled_from([b"a", b"b"]))
VALUES = st.one_of(st.none(), st.binary(max_size=200))
"""Few keys and many tombstones, so that compaction has work."""


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """What a call returned, or the class of what it raised (messages name files, so differ)."""
    try:
        return "returned", call()
    except (LogError, ValueError, TypeError) as exc:
        return "raised", type(exc)


def state(log: LogStore) -> dict[str, Any]:
    return {
        "start": log.log_start_offset,
        "end": log.log_end_offset,
        "high watermark": log.high_watermark,
        "epochs": log.leader_epochs,
        "epoch": log.leader_epoch,
        "segments": log.segment_base_offsets,
        "ends of epochs": [log.end_offset_for_epoch(e) for e in range(-1, 8)],
        "frames": frames(log),
    }


class SideBySide(RuleBasedStateMachine):
    """A file log and a memory log given the same operations, and a follower of each kind fed
    by the other kind's leader; the pairs must answer alike and hold the same state."""

    @initialize(
        compression=st.sampled_from(["none", "lz4"]),
        retention_messages=st.one_of(st.none(), st.integers(0, 8)),
        retention_age=st.one_of(st.none(), st.floats(10, 300)),
    )
    def open_logs(self, compression, retention_messages, retention_age):
        self.dir = Path(tempfile.mkdtemp(prefix="log-contract-"))
        self.clock = FakeClock()
        config = LogConfig(
            segment_bytes=1024,
            compression=compression,
            retention_messages=retention_messages,
            retention_age=retention_age,
            tombstone_retention=50.0,
            high_watermark_checkpoint_interval=3600.0,
        )
        self.leaders = (
            Log.open(self.dir / "leader", config, clock=self.clock),
            MemoryLog(config, clock=self.clock),
        )
        self.followers = (
            Log.open(self.dir / "follower", config, clock=self.clock),
            MemoryLog(config, clock=self.clock),
        )
        self.next_epoch = 1

    def teardown(self):
        for log in (*self.leaders, *self.followers):
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def alike(self, logs: tuple[LogStore, LogStore], call: Callable[[LogStore], Any]) -> Any:
        file, memory = (outcome(lambda log=log: call(log)) for log in logs)
        assert file == memory
        return file

    @property
    def end(self) -> int:
        return self.leaders[1].log_end_offset

    @rule(batch=st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=4))
    def append(self, batch):
        self.alike(self.leaders, lambda log: log.append([Record(v, key=k) for k, v in batch]))

    @rule(seconds=st.floats(-20, 100))
    def tick(self, seconds):
        self.clock.advance(seconds)

    @rule(older=st.booleans(), data=st.data())
    def assign_epoch(self, older, data):
        epoch = data.draw(st.integers(0, self.next_epoch)) if older else self.next_epoch
        self.alike(self.leaders, lambda log: log.assign_leader_epoch(epoch))
        self.next_epoch += not older

    @rule()
    def commit(self):
        end = self.end
        self.alike(self.leaders, lambda log: setattr(log, "high_watermark", end))

    @rule(data=st.data())
    def set_high_watermark(self, data):
        offset = data.draw(st.integers(0, self.end + 1))
        self.alike(self.leaders, lambda log: setattr(log, "high_watermark", offset))

    @rule(data=st.data())
    def truncate(self, data):
        offset = data.draw(st.integers(max(0, self.leaders[1].log_start_offset - 1), self.end + 2))
        self.alike(self.leaders, lambda log: log.truncate_to(offset))

    @rule(data=st.data())
    def reset(self, data):
        offset = data.draw(st.integers(0, self.end + 5))
        self.alike(self.leaders, lambda log: log.reset_to(offset))

    @rule()
    def retention(self):
        self.alike(self.leaders, lambda log: log.enforce_retention())

    @rule()
    def compact(self):
        self.alike(self.leaders, lambda log: log.compact())

    @rule(data=st.data())
    def read(self, data):
        start = data.draw(st.integers(self.leaders[1].log_start_offset - 1, self.end + 1))
        max_records = data.draw(st.one_of(st.none(), st.integers(1, 10)))
        max_bytes = data.draw(st.one_of(st.none(), st.integers(1, 5000)))
        upper = data.draw(st.one_of(st.none(), st.integers(0, self.end + 2)))

        def read(log: LogStore) -> list[pa.Table]:
            got = log.read(start, max_records=max_records, max_bytes=max_bytes, upper_bound=upper)
            return [pa.Table.from_batches([b]) for b in got]  # batch by batch: boundaries count

        self.alike(self.leaders, read)

    @rule(data=st.data())
    def read_frames(self, data):
        start = data.draw(st.integers(self.leaders[1].log_start_offset, self.end))
        max_bytes = data.draw(st.one_of(st.none(), st.integers(1, 5000)))
        upper = data.draw(st.one_of(st.none(), st.integers(0, self.end + 2)))
        self.alike(
            self.leaders,
            lambda log: [
                (f.base_offset, f.last_offset, f.leader_epoch, f.data.to_pybytes())
                for f in log.read_frames(start, max_bytes=max_bytes, upper_bound=upper)
            ],
        )

    @rule(data=st.data())
    def offset_for_timestamp(self, data):
        seconds = self.clock.now + data.draw(st.floats(-400, 50))
        self.alike(self.leaders, lambda log: log.offset_for_timestamp(seconds))

    @rule(data=st.data())
    def replicate(self, data):
        max_bytes = data.draw(st.one_of(st.none(), st.integers(1, 5000)))
        file_leader, memory_leader = self.leaders
        for follower, leader in zip(self.followers, (memory_leader, file_leader), strict=True):
            if not leader.log_start_offset <= follower.log_end_offset <= leader.log_end_offset:
                follower.reset_to(leader.log_start_offset)

        def fetch(follower: LogStore) -> range:
            leader = memory_leader if follower is self.followers[0] else file_leader
            sent = leader.read_frames(follower.log_end_offset, max_bytes=max_bytes)
            got = follower.append_replicated(f.data for f in sent)
            follower.high_watermark = min(leader.high_watermark, follower.log_end_offset)
            return got

        self.alike(self.followers, fetch)

    @precondition(lambda self: self.followers[1].log_end_offset > 0)
    @rule(data=st.data())
    def truncate_followers(self, data):
        offset = data.draw(st.integers(self.followers[1].log_start_offset, self.followers[1].log_end_offset))
        self.alike(self.followers, lambda log: log.truncate_to(offset))

    @invariant()
    def the_same_state(self):
        for pair in (self.leaders, self.followers):
            assert state(pair[0]) == state(pair[1])
            assert [b.to_pydict() for b in pair[0].scan()] == [b.to_pydict() for b in pair[1].scan()]


SideBySide.TestCase.settings = machine_settings("LOG_CONTRACT_EXAMPLES", examples=100, steps=50)
TestSideBySide = SideBySide.TestCase
