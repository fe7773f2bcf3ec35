"""Property test: random operations on the log match a simple in-memory model."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker_node.log import Log, LogConfig, OffsetOutOfRangeError, Record

from .helpers import FakeClock, machine_settings

KEYS = st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d"]))
VALUES = st.one_of(st.none(), st.binary(max_size=300))
TOMBSTONE_RETENTION = 50.0


class LogMachine(RuleBasedStateMachine):
    """The model is a dict offset -> (key, value, timestamp) plus start, end, HW and epochs."""

    @initialize(
        segment_bytes=st.integers(1_500, 6_000),
        retention_messages=st.one_of(st.none(), st.integers(0, 40)),
    )
    def open_log(self, segment_bytes, retention_messages):
        self.dir = Path(tempfile.mkdtemp(prefix="log-model-"))
        self.clock = FakeClock()
        self.config = LogConfig(
            segment_bytes=segment_bytes,
            retention_messages=retention_messages,
            tombstone_retention=TOMBSTONE_RETENTION,
            high_watermark_checkpoint_interval=0,
        )
        self.log = Log.open(self.dir, self.config, clock=self.clock)
        self.messages: dict[int, tuple[bytes | None, bytes | None, int]] = {}
        self.start = self.end = self.hw = 0
        self.epochs: list[tuple[int, int]] = []  # (epoch, start offset), as the log's cache
        self.next_epoch = 1

    def teardown(self):
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(batch=st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=12))
    def append(self, batch):
        offsets = self.log.append([Record(v, key=k) for k, v in batch])
        if not self.epochs:
            self.epochs.append((0, self.end))
        assert offsets == range(self.end, self.end + len(batch))
        newest = max((ts for _, _, ts in self.messages.values()), default=0)
        ts = max(int(self.clock.now * 1_000_000), newest)
        for offset, (k, v) in zip(offsets, batch, strict=True):
            self.messages[offset] = (k, v, ts)
        self.end += len(batch)

    @rule(seconds=st.floats(-30, 120))
    def tick(self, seconds):
        self.clock.advance(seconds)

    @rule(data=st.data())
    def read(self, data):
        start = data.draw(st.integers(self.start - 2, self.end + 2))
        max_records = data.draw(st.one_of(st.none(), st.integers(1, 30)))
        upper = data.draw(st.one_of(st.none(), st.integers(0, self.end + 5)))
        if not self.start <= start <= self.end:
            with pytest.raises(OffsetOutOfRangeError):
                self.log.read(start)
            return
        got = self.log.read(start, max_records=max_records, upper_bound=upper)
        stop = self.end if upper is None else min(upper, self.end)
        expected = [o for o in sorted(self.messages) if start <= o < stop][:max_records]
        table = pa.Table.from_batches(got) if got else None
        offsets = table.column("offset").to_pylist() if table else []
        assert offsets == expected
        if table:
            assert table.column("key").to_pylist() == [self.messages[o][0] for o in offsets]
            assert table.column("value").to_pylist() == [self.messages[o][1] for o in offsets]
            stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
            assert stamps == [self.messages[o][2] for o in offsets]
            for offset, epoch in zip(offsets, table.column("leader_epoch").to_pylist(), strict=True):
                assert epoch == max(e for e, s in self.epochs if s <= offset)

    @rule(data=st.data())
    def offset_for_timestamp(self, data):
        stamps = sorted({ts for _, _, ts in self.messages.values()})
        target = data.draw(
            st.one_of(st.sampled_from(stamps), st.integers(0, 2**50)) if stamps else st.integers(0, 2**50)
        )
        expected = min((o for o, (_, _, ts) in self.messages.items() if ts >= target), default=self.end)
        assert self.log.offset_for_timestamp(target / 1_000_000) == expected

    @rule()
    def roll(self):
        self.log.roll()

    @rule(data=st.data())
    def set_high_watermark(self, data):
        self.hw = data.draw(st.integers(0, self.end))
        self.log.high_watermark = self.hw

    @rule()
    def new_epoch(self):
        self.log.assign_leader_epoch(self.next_epoch)
        if self.epochs and self.epochs[-1][1] == self.end:
            self.epochs.pop()  # the previous epoch holds no data: replaced
        self.epochs.append((self.next_epoch, self.end))
        self.next_epoch += 1

    @rule(data=st.data())
    def truncate(self, data):
        offset = data.draw(st.integers(self.start, self.end + 3))
        self.log.truncate_to(offset)
        if offset < self.end:
            self.messages = {o: m for o, m in self.messages.items() if o < offset}
            self.end = offset
            self.hw = min(self.hw, offset)
        if offset <= self.end:
            # At the log end only epochs begun there without data are forgotten.
            self.epochs = [(e, s) for e, s in self.epochs if s < offset]

    @rule()
    def reopen(self):
        self.log.close()
        self.log = Log.open(self.dir, self.config, clock=self.clock)

    @rule()
    def retention(self):
        self.log.enforce_retention()
        new_start = self.log.log_start_offset
        assert self.start <= new_start <= max(self.hw, self.start)
        if new_start > self.start and self.config.retention_messages is not None:
            remaining = sum(1 for o in self.messages if o >= new_start)
            assert remaining >= self.config.retention_messages
        self.messages = {o: m for o, m in self.messages.items() if o >= new_start}
        self.start = new_start
        below = [i for i, (_, s) in enumerate(self.epochs) if s < new_start]
        if below:
            rest = self.epochs[below[-1] + 1 :]
            if not (rest and rest[0][1] == new_start):
                rest = [(self.epochs[below[-1]][0], new_start), *rest]
            self.epochs = rest

    @precondition(lambda self: self.messages)
    @rule()
    def compact(self):
        removed = self.log.compact()
        got = self.log.read(self.start)
        present = set(pa.Table.from_batches(got).column("offset").to_pylist()) if got else set()
        newest = {}  # among committed messages only: uncommitted ones may yet be truncated
        for offset, (key, _, _) in sorted(self.messages.items()):
            if key is not None and offset < self.hw:
                newest[key] = offset
        horizon = int((self.clock.now - TOMBSTONE_RETENTION) * 1_000_000)
        for offset, (key, value, ts) in self.messages.items():
            removable = key in newest and (newest[key] != offset or (value is None and ts < horizon))
            if not removable:
                assert offset in present, f"compaction removed offset {offset} it must keep"
            if offset >= self.hw:
                assert offset in present, f"compaction touched offset {offset} above the HW"
        assert removed == len(self.messages) - len(present)
        self.messages = {o: m for o, m in self.messages.items() if o in present}

    @invariant()
    def offsets_agree(self):
        assert self.log.log_start_offset == self.start
        assert self.log.log_end_offset == self.end
        assert self.log.high_watermark == self.hw
        assert self.log.leader_epochs == tuple(self.epochs)
        assert self.log.leader_epoch == (self.epochs[-1][0] if self.epochs else 0)


LogMachine.TestCase.settings = machine_settings("LOG_MODEL_EXAMPLES", examples=60, steps=40)
TestLogModel = LogMachine.TestCase
