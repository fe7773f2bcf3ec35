"""Failures in the middle of log operations: the log stays consistent and usable."""

from __future__ import annotations

import errno

import pytest

from broker_node.log import CorruptSegmentError, Log, LogConfig, LogStorageError, Record
from broker_node.log import segment as segment_module

from .helpers import rows, values


class CrashError(Exception):
    """Stands for the process dying at this point."""


def test_truncate_interrupted_after_the_data_rename_keeps_committed_rows(tmp_path, monkeypatch):
    with Log.open(tmp_path) as log:
        for _ in range(3):
            log.append(values(10))
        expected = rows(log, upper_bound=15)

        def crash(self):
            raise CrashError

        monkeypatch.setattr(segment_module.Segment, "_install_index_temps", crash)
        with pytest.raises(CrashError):
            log.truncate_to(15)
        monkeypatch.undo()
        assert list(tmp_path.glob("*.index.tmp"))  # the new index waits beside the new data
        with Log.open(tmp_path) as reopened:  # the "restart"
            assert reopened.log_end_offset == 15
            assert rows(reopened) == expected
            assert not list(tmp_path.glob("*.tmp"))


def test_rewrite_interrupted_before_the_data_rename_keeps_the_old_segment(tmp_path, monkeypatch):
    config = LogConfig(segment_bytes=3_000)
    with Log.open(tmp_path, config) as log:
        for i in range(30):
            log.append([Record(b"%d" % i, key=b"k%d" % (i % 3))])
        log.high_watermark = log.log_end_offset
        before = rows(log)
        real_replace = segment_module.os.replace

        def crash_on_data_rename(src, dst):
            if str(dst).endswith(".arrows"):
                raise CrashError
            return real_replace(src, dst)

        monkeypatch.setattr(segment_module.os, "replace", crash_on_data_rename)
        with pytest.raises(CrashError):
            log.compact()
        monkeypatch.undo()
    with Log.open(tmp_path, config) as reopened:
        assert rows(reopened) == before
        assert not list(tmp_path.glob("*.tmp"))


def test_lost_range_of_a_damaged_closed_segment_raises_instead_of_being_skipped(tmp_path):
    with Log.open(tmp_path, LogConfig(segment_bytes=20_000)) as log:
        for i in range(40):
            log.append(values(3, start=i * 3))
        first = log._segments[0]
        victim = len(first.index) - 2
        assert victim > 3
        position, lost_from = first.index.positions[victim], first.index.bases[victim]
        second = log.segment_base_offsets[1]
    data = bytearray(first.path.read_bytes())
    data[position + 2] ^= 0xFF  # break the frame's framing, then lose the index
    first.path.write_bytes(bytes(data))
    first.offset_index_path.unlink()
    with Log.open(tmp_path) as log:
        assert [r[0] for r in rows(log, 0, upper_bound=lost_from)] == list(range(lost_from))
        assert [r[0] for r in rows(log, 0)] == list(range(lost_from))  # stops before the gap
        with pytest.raises(CorruptSegmentError, match=f"offset {lost_from}") as info:
            log.read(lost_from)
        assert info.value.path.endswith(first.path.name)
        assert rows(log, second)[0][0] == second  # later segments still serve


def test_failed_roll_leaves_the_log_writable(tmp_path, monkeypatch):
    with Log.open(tmp_path, LogConfig(segment_bytes=3_000)) as log:
        log.append(values(20))

        def no_more_files(directory, base_offset, *, sync=True):
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(segment_module.Segment, "create", no_more_files)
        with pytest.raises(LogStorageError, match="Too many open files") as info:
            log.append(values(20))
        assert info.value.retriable
        monkeypatch.undo()
        assert log.append(values(20)) == range(20, 40)
        assert [r[0] for r in rows(log)] == list(range(40))


def test_failed_write_leaves_no_trace(tmp_path, monkeypatch):
    with Log.open(tmp_path) as log:
        log.append(values(5))
        real = segment_module._write_all
        calls = {"n": 0}

        def disk_full_on_index(f, data):
            calls["n"] += 1
            if calls["n"] == 2:  # the frame is written, its index entry is not
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(f, data)

        monkeypatch.setattr(segment_module, "_write_all", disk_full_on_index)
        with pytest.raises(LogStorageError, match="No space left"):
            log.append(values(5))
        monkeypatch.undo()
        assert log.append(values(1)) == range(5, 6)
    with Log.open(tmp_path) as log:
        assert [r[0] for r in rows(log)] == list(range(6))
