"""The replica side of the log: frames out byte for byte, a leader's batches in, truncation, reset."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time

import pyarrow as pa
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from broker_node.log import InvalidRecordsError, Log, LogConfig, OffsetOutOfRangeError, Record
from broker_node.log.frames import SMALL_BATCH, parse_frame, replicated_entry
from broker_node.log.segment import encode_frame
from broker_node.replication.truncation import truncation_offset
from pyspark_jetstream.protocol.schema import LOG_SCHEMA, TIMESTAMP_TYPE

from .helpers import FakeClock, values


@pytest.fixture
def open_log(tmp_path):
    """Open logs under ``tmp_path`` by name; every one is closed at the end."""
    opened: list[Log] = []

    def open_(name: str, config: LogConfig | None = None, **kwargs) -> Log:
        log = Log.open(tmp_path / name, config, **kwargs)
        opened.append(log)
        return log

    yield open_
    for log in opened:
        log.close()


def everything(log: Log) -> pa.Table:
    """Every stored row, every column (offsets, timestamps, epochs included)."""
    batches = log.read(log.log_start_offset)
    return pa.Table.from_batches(batches) if batches else pa.table({})


def replicate(leader: Log, follower: Log, max_bytes: int | None = None) -> int:
    """One fetch: append to ``follower`` what ``leader`` has past its end; return frames moved."""
    frames = leader.read_frames(follower.log_end_offset, max_bytes=max_bytes)
    follower.append_replicated(f.data for f in frames)
    return len(frames)


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_a_follower_stores_the_leaders_batches_byte_for_byte(open_log, compression):
    config = LogConfig(segment_bytes=64 * 1024, compression=compression)
    clock = FakeClock()
    leader = open_log("leader", config, clock=clock)
    follower = open_log("follower", config)
    for epoch in (0, 3, 7):
        leader.assign_leader_epoch(epoch)
        for i in range(20):
            clock.advance(0.5)
            leader.append(values(1 + i * 7, size=64, start=i * 1000))
    while replicate(leader, follower, max_bytes=50_000):
        pass
    assert follower.log_end_offset == leader.log_end_offset
    assert everything(follower).equals(everything(leader))
    assert follower.leader_epochs == leader.leader_epochs
    theirs = [f.data.to_pybytes() for f in leader.read_frames(0)]
    ours = [f.data.to_pybytes() for f in follower.read_frames(0)]
    assert theirs == ours  # checksums and compression unchanged
    follower.close()
    again = open_log("follower", config)
    assert everything(again).equals(everything(leader)) and again.leader_epochs == leader.leader_epochs


def test_a_fetch_inside_a_batch_gets_the_rest_of_it(open_log):
    leader = open_log("leader")
    leader.append(values(10))
    frames = leader.read_frames(4)
    assert [(f.base_offset, f.last_offset) for f in frames] == [(4, 9)]
    follower = open_log("follower")
    follower.reset_to(4)
    follower.append_replicated([frames[0].data])
    assert everything(follower).equals(everything(leader).slice(4))
    with pytest.raises(OffsetOutOfRangeError):
        leader.read_frames(11)


def test_replicated_appends_refuse_what_does_not_follow(open_log):
    leader = open_log("leader")
    leader.assign_leader_epoch(5)
    leader.append(values(3))
    follower = open_log("follower")
    frame = leader.read_frames(0)[0].data
    follower.append_replicated([frame])
    with pytest.raises(InvalidRecordsError, match="not one sound batch following offset 2"):
        follower.append_replicated([frame])  # an overlap
    with pytest.raises(InvalidRecordsError, match="not one sound batch"):
        follower.append_replicated([pa.py_buffer(b"\xff\xff\xff\xffgarbage")])
    with pytest.raises(InvalidRecordsError, match="not one sound batch"):
        follower.append_replicated([pa.py_buffer(frame.to_pybytes() + b"\0" * 8)])  # trailing bytes
    old = open_log("old")
    old.assign_leader_epoch(2)
    old.append(values(5))
    with pytest.raises(InvalidRecordsError, match="leader epoch 2, older than this log's 5"):
        follower.append_replicated([old.read_frames(3)[0].data])
    assert follower.log_end_offset == 3


def test_record_batches_can_be_replicated_too_and_gaps_are_kept(open_log):
    leader = open_log("leader", LogConfig(segment_bytes=2048))
    for i in range(30):
        leader.append([Record(b"v%d" % i, key=b"k%d" % (i % 3))])
    leader.high_watermark = leader.log_end_offset
    leader.compact()  # leaves gaps in closed segments
    follower = open_log("follower")
    follower.append_replicated(leader.read(0))
    assert everything(follower).equals(everything(leader))
    assert follower.log_end_offset == leader.log_end_offset


def test_truncation_at_a_batch_boundary_cuts_the_files(open_log):
    log = open_log("log")
    for i in range(5):
        log.append(values(10, start=i * 10))
    segment = log.directory / "00000000000000000000.arrows"
    before = segment.stat().st_size
    log.truncate_to(30)
    assert log.log_end_offset == 30 and segment.stat().st_size < before
    log.append(values(2, start=99))
    assert everything(log).column("offset").to_pylist() == list(range(32))
    log.close()
    reopened = open_log("log")
    assert everything(reopened).column("offset").to_pylist() == list(range(32))


def test_an_epoch_that_wrote_nothing_is_forgotten_by_a_truncation_to_the_end(open_log):
    # A follower led epoch 7 briefly and wrote nothing; the next leader has more of epoch 6.
    leader, follower = open_log("leader"), open_log("follower")
    for log in (leader, follower):
        log.assign_leader_epoch(6)
        log.append(values(1))
    leader.append(values(2, start=1))
    follower.assign_leader_epoch(7)
    cut = truncation_offset(
        follower.leader_epoch,
        follower.log_start_offset,
        leader.end_offset_for_epoch,
        follower.end_offset_for_epoch,
    )
    assert cut == 1
    follower.truncate_to(cut)
    assert follower.leader_epochs == ((6, 0),)
    replicate(leader, follower)  # refused as "older than epoch 7" without the fix
    assert pa.Table.from_batches(follower.read(1)) == pa.Table.from_batches(leader.read(1))
    assert follower.leader_epochs == leader.leader_epochs


def test_reset_starts_the_log_over_at_an_offset(open_log):
    log = open_log("log", LogConfig(segment_bytes=2048))
    log.assign_leader_epoch(1)
    for i in range(40):
        log.append(values(2, start=i))
    log.reset_to(500)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (500, 500, 0 + 500)
    assert log.leader_epochs == ()
    log.assign_leader_epoch(4)
    assert log.append(values(3)) == range(500, 503)
    log.close()
    reopened = open_log("log")
    assert everything(reopened).column("offset").to_pylist() == [500, 501, 502]
    assert reopened.leader_epochs == ((4, 500),)


def test_waiting_for_the_log_end_wakes_on_an_append_and_on_close(open_log):
    log = open_log("log")
    assert not log.wait_for_end(0, 0.05)  # nothing yet: times out
    woke = {}
    # ``unless`` is first checked under the log's lock just before the wait: once it has been called
    # the waiter is parked, and an append (which takes that lock) can only come after.
    parked = threading.Event()

    def park() -> bool:
        parked.set()
        return False

    def wait() -> None:
        started = time.monotonic()
        woke["grew"] = log.wait_for_end(0, 30, unless=park)
        woke["after"] = time.monotonic() - started

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert parked.wait(10), "the waiter never waited"
    log.append(values(1))
    waiter.join(30)
    assert woke["grew"] and woke["after"] < 10
    parked.clear()
    closer = threading.Thread(target=lambda: woke.update(closed=log.wait_for_end(5, 30, unless=park)))
    closer.start()
    assert parked.wait(10), "the waiter never waited"
    log.close()
    closer.join(30)
    assert woke["closed"] is False


class LeaderAndFollower(RuleBasedStateMachine):
    """A leader that appends and changes epochs, a follower that fetches, diverges and truncates.

    Invariant: after a catch-up (truncate to the epoch end the leader gives for
    the follower's latest epoch, then fetch), the follower holds exactly the
    leader's log.
    """

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp()
        config = LogConfig(segment_bytes=4096)
        self.leader = Log.open(f"{self.tmp}/leader", config)
        self.follower = Log.open(f"{self.tmp}/follower", config)
        self.epoch = 0
        self.count = 0

    @rule(n=st.integers(1, 30))
    def leader_appends(self, n: int) -> None:
        self.leader.append(values(n, size=16, start=self.count))
        self.count += n

    @rule(n=st.integers(1, 10))
    def follower_appends_on_its_own(self, n: int) -> None:
        """Writes of a deposed leader: they diverge and must be truncated away."""
        self.follower.assign_leader_epoch(self.epoch + 1)
        self.follower.append(values(n, size=16, start=10_000 + self.count))
        self.count += n

    @rule()
    def new_epoch(self) -> None:
        self.epoch += 2
        self.leader.assign_leader_epoch(self.epoch)

    @rule(max_bytes=st.sampled_from([None, 200, 3000]))
    def fetch(self, max_bytes: int | None) -> None:
        self._truncate_by_epoch()
        replicate(self.leader, self.follower, max_bytes)

    def _truncate_by_epoch(self) -> None:
        latest = self.follower.leader_epoch if self.follower.leader_epochs else None
        cut = truncation_offset(
            latest,
            self.follower.log_start_offset,
            self.leader.end_offset_for_epoch,
            self.follower.end_offset_for_epoch,
        )
        self.follower.truncate_to(cut)

    @rule()
    def catch_up(self) -> None:
        self._truncate_by_epoch()
        while replicate(self.leader, self.follower):
            pass
        assert everything(self.follower).equals(everything(self.leader))
        # The follower learns epochs from their data; the leader also has its
        # current epoch before any data of it.
        with_data = tuple(e for e in self.leader.leader_epochs if e[1] < self.leader.log_end_offset)
        assert self.follower.leader_epochs == with_data

    def teardown(self) -> None:
        self.leader.close()
        self.follower.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


LeaderAndFollower.TestCase.settings = settings(max_examples=100, stateful_step_count=30)
test_leader_and_follower = LeaderAndFollower.TestCase


def _stored(offsets: list[int], epochs: list[int], stamps: list[int]) -> pa.RecordBatch:
    """A batch in the log schema with the given offsets, leader epochs and timestamps (µs)."""
    rows = len(offsets)
    columns = {
        "offset": pa.array(offsets, pa.int64()),
        "timestamp": pa.array(stamps, pa.int64()).cast(TIMESTAMP_TYPE),
        "leader_epoch": pa.array(epochs, pa.int32()),
        "value": pa.array([b"v%d" % i for i in range(rows)], pa.binary()),
    }
    return pa.record_batch(
        [columns.get(f.name, pa.nulls(rows, f.type)) for f in LOG_SCHEMA], schema=LOG_SCHEMA
    )


@pytest.mark.parametrize("rows", [1, 3, SMALL_BATCH, SMALL_BATCH + 1, 500])
def test_a_replicated_frame_is_indexed_alike_below_and_above_the_small_batch_limit(rows):
    # Small batches are checked in Python, larger ones with Arrow compute: the same entry either way,
    # and the same as a scan of the frame in a file finds.
    offsets = [10 + 2 * i for i in range(rows)]  # gaps, as compaction leaves them
    stamps = [1_000_000 + (i * 7919) % 1000 for i in range(rows)]  # not in order
    frame = encode_frame(_stored(offsets, [4] * rows, stamps))
    entry = replicated_entry(frame, 9)
    assert entry is not None
    assert (entry.base_offset, entry.last_offset, entry.leader_epoch) == (10, offsets[-1], 4)
    assert (entry.record_count, entry.max_timestamp, entry.size) == (rows, max(stamps), frame.size)
    scanned = parse_frame(frame, 0, 9, None)
    assert scanned is not None and scanned == entry
    assert replicated_entry(frame, 10) is None  # an overlap with what the log holds


@pytest.mark.parametrize("rows", [3, SMALL_BATCH + 1])
def test_a_replicated_frame_with_unordered_offsets_or_mixed_epochs_is_refused(rows):
    ordered = list(range(rows))
    stamps = [1_000_000] * rows
    assert replicated_entry(encode_frame(_stored(ordered, [1] * rows, stamps)), -1) is not None
    repeated = [*ordered[:-1], ordered[-2]]
    assert replicated_entry(encode_frame(_stored(repeated, [1] * rows, stamps)), -1) is None
    backwards = ordered[::-1]
    assert replicated_entry(encode_frame(_stored(backwards, [1] * rows, stamps)), -1) is None
    mixed = [1] * (rows - 1) + [2]
    assert replicated_entry(encode_frame(_stored(ordered, mixed, stamps)), -1) is None
    with_null = encode_frame(
        _stored(ordered, [1] * rows, stamps).set_column(
            0, LOG_SCHEMA.field("offset"), pa.array([None, *ordered[1:]], pa.int64())
        )
    )
    assert replicated_entry(with_null, -1) is None


def test_a_replicated_frame_of_sliced_columns_is_read_at_its_slice():
    whole = _stored(list(range(100, 110)), [3] * 10, [5_000_000 + i for i in range(10)])
    part = whole.slice(4, 3)  # serialized with the slice's offset honoured
    entry = replicated_entry(encode_frame(part), -1)
    assert entry is not None
    found = (entry.base_offset, entry.last_offset, entry.record_count, entry.max_timestamp)
    assert found == (104, 106, 3, 5_000_006)


def test_a_small_replicated_frame_with_a_null_timestamp_is_indexed_as_a_scan_finds_it():
    # Nulls never come from a leader; a frame holding one takes the compute path, as before.
    batch = _stored([0, 1, 2], [1] * 3, [5_000_000, 5_000_009, 5_000_001])
    stamps = pa.array([5_000_000, None, 5_000_001], pa.int64()).cast(TIMESTAMP_TYPE)
    with_null = batch.set_column(1, LOG_SCHEMA.field("timestamp"), stamps)
    frame = encode_frame(with_null)
    entry = replicated_entry(frame, -1)
    assert entry is not None and entry.max_timestamp == 5_000_001
    assert entry == parse_frame(frame, 0, -1, None)
