"""Semantics of the commit log interface, on real files."""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from broker_node.log import UNDEFINED, FsyncPolicy, Log, LogConfig, LogError, Record
from broker_node.log.deferred_sync import background
from pyspark_jetstream.protocol.schema import LOG_SCHEMA

from .helpers import FakeClock, rows, values


def test_offsets_are_contiguous_from_zero_and_schema_is_exact(tmp_path):
    with Log.open(tmp_path) as log:
        assert (log.log_start_offset, log.log_end_offset) == (0, 0)
        assert log.append(values(1)) == range(0, 1)
        assert log.append(values(5)) == range(1, 6)
        batches = log.read(0)
        assert all(b.schema.equals(LOG_SCHEMA) for b in batches)
        assert LOG_SCHEMA.field("timestamp").type == pa.timestamp("us", tz="UTC")
        assert [r[0] for r in rows(log)] == list(range(6))
        assert log.log_end_offset == 6


def test_arrow_input_with_subset_of_columns_and_castable_types(tmp_path):
    table = pa.table(
        {
            "value": pa.array([b"a", None, b"c"], pa.large_binary()),
            "key": pa.array(["k1", "k2", None], pa.string()),
            "subject": ["orders.eu", "orders.us", "orders.eu"],
        }
    )
    with Log.open(tmp_path) as log:
        log.append(table)
        out = pa.Table.from_batches(log.read(0))
        assert out.column("value").to_pylist() == [b"a", None, b"c"]
        assert out.column("key").to_pylist() == [b"k1", b"k2", None]
        assert out.column("subject").to_pylist() == ["orders.eu", "orders.us", "orders.eu"]
        assert out.column("headers").null_count == 3


def test_rows_carry_headers_and_nats_context(tmp_path):
    record = Record(
        b"v",
        key=b"k",
        headers=[("trace", b"1"), ("x", b"")],
        subject="a.b",
        reply="_INBOX.1",
        producer_id="p",
        sequence=7,
    )
    with Log.open(tmp_path) as log:
        log.append([record])
        (row,) = pa.Table.from_batches(log.read(0)).to_pylist()
    assert row["headers"] == [{"key": "trace", "value": b"1"}, {"key": "x", "value": b""}]
    assert (row["subject"], row["reply"], row["producer_id"], row["sequence"]) == ("a.b", "_INBOX.1", "p", 7)


def test_read_starts_mid_batch_and_respects_limits(tmp_path):
    with Log.open(tmp_path) as log:
        for _ in range(10):
            log.append(values(10))
        assert [r[0] for r in rows(log, 15, max_records=7)] == list(range(15, 22))
        assert [r[0] for r in rows(log, 15, upper_bound=18)] == [15, 16, 17]
        assert rows(log, 15, upper_bound=15) == []
        assert rows(log, 100) == []  # at the log end: nothing yet, not an error
        one_batch = log.read(0, max_bytes=1)
        assert [b.num_rows for b in one_batch] == [10]  # at least one batch, however large
        first = log.read(0)[0]
        assert len(log.read(0, max_bytes=2 * first.nbytes + 4096)) < 10


def test_reads_are_memory_mapped_not_copied(tmp_path):
    with Log.open(tmp_path, LogConfig(segment_bytes=1 << 20)) as log:
        for i in range(40):
            log.append(values(1000, start=i * 1000))
        log.close()
    with Log.open(tmp_path) as log:
        before = pa.total_allocated_bytes()
        batches = log.read(0)
        total = sum(b.nbytes for b in batches)
        assert total > 4_000_000
        assert pa.total_allocated_bytes() - before < total // 20


def test_rolls_by_size_and_age(tmp_path):
    clock = FakeClock()
    with Log.open(tmp_path, LogConfig(segment_bytes=8000, segment_max_age=60), clock=clock) as log:
        for _ in range(6):
            log.append(values(20))  # ~2.7 KB per batch
        assert len(log.segment_base_offsets) >= 3
        sizes_ok = all(
            (tmp_path / f"{b:020d}.arrows").stat().st_size <= 8000 for b in log.segment_base_offsets
        )
        assert sizes_ok
        segments = len(log.segment_base_offsets)
        log.append(values(1))
        clock.advance(61)
        log.append(values(1))
        assert len(log.segment_base_offsets) == segments + 1
        assert [r[0] for r in rows(log)] == list(range(122))


def test_offset_for_timestamp(tmp_path):
    clock = FakeClock(1000.0)
    with Log.open(tmp_path, LogConfig(segment_bytes=4000), clock=clock) as log:
        for _i in range(10):
            log.append(values(3))
            clock.advance(10)
        assert log.offset_for_timestamp(0) == 0
        assert log.offset_for_timestamp(1000.0) == 0
        assert log.offset_for_timestamp(1000.5) == 3
        assert log.offset_for_timestamp(1050.0) == 15
        assert log.offset_for_timestamp(datetime.fromtimestamp(1050, UTC)) == 15
        assert log.offset_for_timestamp(5000.0) == log.log_end_offset
        clock.advance(-500)  # the clock goes back: timestamps never decrease
        log.append(values(1))
        assert log.offset_for_timestamp(1090.0) == 27


def test_high_watermark_and_epochs_survive_reopen(tmp_path):
    with Log.open(tmp_path) as log:
        log.append(values(5))
        log.assign_leader_epoch(3)
        log.append(values(5))
        log.assign_leader_epoch(3)  # repeat: no-op
        log.assign_leader_epoch(7)
        log.append(values(2))
        log.high_watermark = 9
    with Log.open(tmp_path) as log:
        assert log.high_watermark == 9
        assert log.leader_epochs == ((0, 0), (3, 5), (7, 10))
        assert log.leader_epoch == 7
        assert [b.column("leader_epoch")[0].as_py() for b in log.read(0)] == [0, 3, 7]
        assert log.end_offset_for_epoch(0) == (0, 5)
        assert log.end_offset_for_epoch(5) == (3, 10)
        assert log.end_offset_for_epoch(7) == (7, 12)
        assert log.end_offset_for_epoch(99) == (7, 12)
        with pytest.raises(LogError, match="cannot take leader epoch 6: it holds data of the newer epoch 7"):
            log.assign_leader_epoch(6)


def test_end_offset_for_epoch_before_any_epoch_is_undefined(tmp_path):
    with Log.open(tmp_path) as log:
        assert log.end_offset_for_epoch(0) == (UNDEFINED, UNDEFINED)
        log.assign_leader_epoch(4)
        log.append(values(1))
        assert log.end_offset_for_epoch(2) == (UNDEFINED, UNDEFINED)


def test_epoch_cache_rebuilt_from_data_when_checkpoint_lost(tmp_path):
    with Log.open(tmp_path) as log:
        log.append(values(2))
        log.assign_leader_epoch(2)
        log.append(values(2))
    (tmp_path / "leader-epoch.checkpoint").unlink()
    with Log.open(tmp_path) as log:
        assert log.leader_epochs == ((0, 0), (2, 2))


@pytest.mark.parametrize(
    "damaged",
    [
        "1\n1\n99 0\n",  # an epoch from the future in force over all the data
        "1\n2\n0 0\n2 1\n",  # epoch 2 starting before its first batch
        "1\n3\n0 0\n1 2\n2 3\n",  # an epoch the data never had, in the middle
    ],
)
def test_an_epoch_checkpoint_that_contradicts_the_data_is_rebuilt_from_it(tmp_path, caplog, damaged):
    with Log.open(tmp_path) as log:
        log.append(values(2))
        log.assign_leader_epoch(2)
        log.append(values(2))
    (tmp_path / "leader-epoch.checkpoint").write_text(damaged)
    with Log.open(tmp_path) as log:
        assert log.leader_epochs == ((0, 0), (2, 2))
        log.assign_leader_epoch(3)  # the coordinator's next epoch is taken
        log.append(values(1))
        assert log.leader_epochs == ((0, 0), (2, 2), (3, 4))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "leader-epoch.checkpoint does not match the segments (epoch" in warnings[0]
    assert warnings[0].endswith("rebuilt it from them")


def test_an_epoch_checkpoint_lagging_the_data_is_filled_in_without_a_warning(tmp_path, caplog):
    with Log.open(tmp_path) as log:
        log.append(values(2))
        log.assign_leader_epoch(2)
        log.append(values(2))
    (tmp_path / "leader-epoch.checkpoint").write_text("1\n1\n0 0\n")
    with Log.open(tmp_path) as log:
        assert log.leader_epochs == ((0, 0), (2, 2))
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_future_epochs_without_data_give_way_to_the_coordinators_epoch(tmp_path, caplog):
    with Log.open(tmp_path) as log:
        log.assign_leader_epoch(1)
        log.append(values(3))
    (tmp_path / "leader-epoch.checkpoint").write_text("1\n2\n1 0\n99 3\n")
    with Log.open(tmp_path) as log:
        assert log.leader_epochs == ((1, 0), (99, 3))  # consistent with the data: kept
        log.assign_leader_epoch(2)
        log.append(values(1))
        assert log.leader_epochs == ((1, 0), (2, 3))
    assert any("names epoch(s) 99 with no data" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("cut", [0, 3, 5, 7, 12, 29])
def test_truncate_to(tmp_path, cut):
    with Log.open(tmp_path, LogConfig(segment_bytes=3000)) as log:
        log.append(values(5))
        log.assign_leader_epoch(1)
        for _ in range(5):
            log.append(values(5))
        log.high_watermark = 30
        log.truncate_to(cut)
        assert log.log_end_offset == cut
        assert log.high_watermark == cut
        assert all(start < cut for _, start in log.leader_epochs)
        assert [r[0] for r in rows(log)] == list(range(cut))
        assert log.append(values(2)) == range(cut, cut + 2)
    with Log.open(tmp_path) as log:
        assert [r[0] for r in rows(log)] == list(range(cut + 2))


def test_truncate_past_end_is_a_no_op_and_below_start_is_an_error(tmp_path):
    with Log.open(tmp_path, LogConfig(segment_bytes=3000, retention_messages=5)) as log:
        for _ in range(6):
            log.append(values(5))
        log.truncate_to(1000)
        assert log.log_end_offset == 30
        log.high_watermark = 30
        assert log.enforce_retention() > 0
        with pytest.raises(Exception, match="out of range") as info:
            log.truncate_to(0)
        assert info.value.log_start_offset == log.log_start_offset


def test_retention_by_messages_bytes_and_age(tmp_path):
    clock = FakeClock()
    config = LogConfig(segment_bytes=3000, retention_messages=12)
    with Log.open(tmp_path / "count", config, clock=clock) as log:
        for _ in range(8):
            log.append(values(5))  # one batch of 5 per segment, roughly
        log.high_watermark = 20  # only segments below the HW may go
        log.enforce_retention()
        assert log.log_start_offset == 20  # stops at the HW, though 20 messages > 12 remain above it
        log.high_watermark = 40
        deleted = log.enforce_retention()
        assert deleted > 0
        remaining = sum(1 for _ in rows(log))
        assert 12 <= remaining < 12 + 10
        with pytest.raises(Exception, match="out of range") as info:
            log.read(0)
        assert info.value.retriable and info.value.log_start_offset == log.log_start_offset

    with Log.open(tmp_path / "bytes", LogConfig(segment_bytes=3000, retention_bytes=6000)) as log:
        for _ in range(8):
            log.append(values(5))
        log.high_watermark = log.log_end_offset
        log.enforce_retention()
        assert 6000 <= log.size_bytes < 6000 + 3000

    with Log.open(tmp_path / "age", LogConfig(segment_bytes=3000, retention_age=100), clock=clock) as log:
        for _ in range(4):
            log.append(values(5))
        clock.advance(200)
        for _ in range(2):
            log.append(values(5))
        log.high_watermark = log.log_end_offset
        log.enforce_retention()
        assert log.log_start_offset == 20
        assert log.leader_epochs[0][1] == 20


def test_compaction_keeps_newest_per_key_nulls_and_fresh_tombstones(tmp_path):
    clock = FakeClock()
    config = LogConfig(segment_bytes=2000, tombstone_retention=100)
    with Log.open(tmp_path, config, clock=clock) as log:
        log.append([Record(b"a1", key=b"a"), Record(b"b1", key=b"b"), Record(b"n1")])  # 0-2
        log.append([Record(b"a2", key=b"a"), Record(None, key=b"c")])  # 3-4
        log.append([Record(b"c1", key=b"c"), Record(None, key=b"b")])  # 5-6
        log.append([Record(b"n2"), Record(None, key=b"d")])  # 7-8
        clock.advance(50)
        log.append([Record(b"a3", key=b"a")])  # 9, stays in the active segment
        log.roll()
        log.append([Record(b"z", key=b"z")])
        log.high_watermark = log.log_end_offset
        removed = log.compact()
        assert rows(log) == [
            (2, None, b"n1"),
            (5, b"c", b"c1"),
            (6, b"b", None),
            (7, None, b"n2"),
            (8, b"d", None),
            (9, b"a", b"a3"),
            (10, b"z", b"z"),
        ]
        assert removed == 4
        assert log.log_start_offset == 0
        assert [r[0] for r in rows(log, 1)] == [2, 5, 6, 7, 8, 9, 10]  # reads skip the gaps
        clock.advance(100)  # tombstones at 6 and 8 are now older than tombstone_retention
        assert log.compact() == 2
        assert [r[0] for r in rows(log)] == [2, 5, 7, 9, 10]
    with Log.open(tmp_path) as log:
        assert [r[0] for r in rows(log)] == [2, 5, 7, 9, 10]
        assert log.append(values(1)) == range(11, 12)


def test_fsync_policies_store_the_same_data(tmp_path):
    for policy in FsyncPolicy:
        path = tmp_path / policy.value
        with Log.open(path, LogConfig(fsync=policy, fsync_interval=0.001)) as log:
            for _ in range(3):
                log.append(values(3))
            log.flush()
        with Log.open(path) as log:
            assert len(rows(log)) == 9
    assert LogConfig(fsync="always").fsync is FsyncPolicy.ALWAYS  # type: ignore[arg-type]


def test_interval_fsync_covers_the_end_of_a_burst(tmp_path, monkeypatch):
    synced: list[int] = []
    threads: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        threads.append(threading.current_thread().name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    clock = FakeClock()
    with Log.open(tmp_path, LogConfig(fsync="interval", fsync_interval=1.0), clock=clock) as log:
        log.append(values(1))  # the first append also checkpoints the leader epoch
        clock.advance(1.0)
        assert log.sync_if_due()
        synced.clear()
        log.append(values(3))  # within the interval of the last fsync: not synced by the append
        assert synced == []
        assert not log.sync_if_due()  # nor by the timer, before the interval has passed
        clock.advance(1.0)
        assert log.sync_if_due() and synced
        synced.clear()
        clock.advance(5.0)
        assert not log.sync_if_due() and synced == []  # nothing new to sync
        threads.clear()
        log.append(values(1))  # an interval has passed: this append has itself synced...
        background().submit(lambda: None).result()  # (the one background thread, in order)
        assert synced
        assert threads and all(name.startswith("log-sync") for name in threads)  # ...off its thread
        assert not log.sync_if_due()
    with Log.open(tmp_path / "never", LogConfig(fsync="never"), clock=clock) as log:
        log.append(values(1))
        clock.advance(10.0)
        assert not log.sync_if_due()


def test_scan_yields_everything_stored_across_segments_and_gaps(tmp_path):
    with Log.open(tmp_path, LogConfig(segment_bytes=2_000)) as log:
        for i in range(30):
            log.append([Record(b"%d" % i, key=b"k%d" % (i % 3))])
        log.high_watermark = log.log_end_offset
        assert log.compact() > 0
        scanned = [o for b in log.scan(max_bytes=1) for o in b.column("offset").to_pylist()]
        assert scanned == [r[0] for r in rows(log)]
        assert scanned[-3:] == [27, 28, 29] and len(scanned) < 30
