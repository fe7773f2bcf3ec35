"""Lost segments, lying indexes and stray files: reported and refused, never a silent gap or jump."""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from broker_node.log import CorruptSegmentError, Log, LogConfig, LogStorageError, Record
from broker_node.log import manifest as manifest_module
from broker_node.log.index import OFFSET_ENTRY

from .helpers import rows, values

CONFIG = LogConfig(segment_bytes=4_000)
MANIFEST = "segments.checkpoint"


def _fill(path, config=CONFIG):
    """40 batches of 3 messages over about ten segments; return every row and the segment bases."""
    with Log.open(path, config) as log:
        for i in range(40):
            log.append(values(3, start=i * 3))
        return rows(log), log.segment_base_offsets


def _segment_files(path, base):
    return [path / f"{base:020d}{suffix}" for suffix in (".arrows", ".index", ".timeindex")]


@pytest.mark.parametrize("damage", ["deleted", "truncated to zero", "data file deleted"])
def test_a_lost_middle_segment_is_reported_not_skipped(tmp_path, damage):
    expected, bases = _fill(tmp_path)
    lost, after = bases[3], bases[4]
    data, index, timeindex = _segment_files(tmp_path, lost)
    if damage == "deleted":
        for f in (data, index, timeindex):
            f.unlink()
    elif damage == "truncated to zero":
        os.truncate(data, 0)
    else:
        data.unlink()
    with Log.open(tmp_path, CONFIG) as log:
        assert rows(log, 0) == expected[:lost]  # stops before the lost range: no jump
        for start in (lost, after - 1):
            with pytest.raises(CorruptSegmentError, match=f"offsets {lost} to {after - 1} cannot be read"):
                log.read(start)
        assert rows(log, after) == expected[after:]
        assert [(p, f, la) for p, f, la, _ in log.damaged] == [(str(data), lost, after - 1)]
        end = log.log_end_offset
        assert end == expected[-1][0] + 1
        assert log.append(values(1)) == range(end, end + 1)
    with Log.open(tmp_path, CONFIG) as log:  # still reported after a restart
        assert [(f, la) for _, f, la, _ in log.damaged] == [(lost, after - 1)]


def test_a_lost_segment_is_repaired_from_a_replica(tmp_path):
    primary, replica = tmp_path / "primary", tmp_path / "replica"
    expected, bases = _fill(primary)
    shutil.copytree(primary, replica)
    for f in _segment_files(primary, bases[3]):
        f.unlink()
    with Log.open(primary, CONFIG) as log, Log.open(replica, CONFIG) as good:
        ((_, first, last, _),) = log.damaged
        log.repair(good.read(first, upper_bound=last + 1))
        assert log.damaged == []
    with Log.open(primary, CONFIG) as log:
        assert rows(log) == expected
        assert log.damaged == []


@pytest.mark.parametrize("which", ["closed", "active"])
def test_an_index_entry_claiming_extra_offsets_is_not_believed(tmp_path, which):
    """The CRC covers the frame, not the index fields: the offsets are checked against the frame."""
    expected, bases = _fill(tmp_path)
    base = bases[2] if which == "closed" else bases[-1]
    index_path = _segment_files(tmp_path, base)[1]
    entries = bytearray(index_path.read_bytes())
    last = len(entries) // OFFSET_ENTRY.size - 1
    entry = list(OFFSET_ENTRY.unpack_from(entries, last * OFFSET_ENTRY.size))
    entry[1] += 1000  # the relative last offset of the segment's last batch
    OFFSET_ENTRY.pack_into(entries, last * OFFSET_ENTRY.size, *entry)
    index_path.write_bytes(bytes(entries))
    end = expected[-1][0] + 1
    with Log.open(tmp_path, CONFIG) as log:
        assert rows(log) == expected
        assert log.log_end_offset == end
        assert log.append(values(1)) == range(end, end + 1)
        assert log.damaged == []


def test_a_batch_that_is_not_what_its_index_entry_says_is_refused(tmp_path):
    expected, bases = _fill(tmp_path)
    index_path = _segment_files(tmp_path, bases[2])[1]
    entries = bytearray(index_path.read_bytes())
    entry = list(OFFSET_ENTRY.unpack_from(entries, 0))
    entry[1] -= 1  # the first batch claims one offset and one row fewer than it holds
    entry[6] -= 1
    OFFSET_ENTRY.pack_into(entries, 0, *entry)
    index_path.write_bytes(bytes(entries))
    first, last = bases[2], bases[2] + 2
    with Log.open(tmp_path, CONFIG) as log:
        assert rows(log, 0) == expected[:first]
        with pytest.raises(CorruptSegmentError, match=f"holds offsets {first} to {last} in 3 rows") as info:
            log.read(first)
        assert (info.value.first_offset, info.value.last_offset) == (first, last - 1)
        assert rows(log, last + 1) == expected[last + 1 :]


@pytest.mark.parametrize("stray_base", [99_999, 1, 200])
def test_a_stray_segment_file_is_set_aside_not_adopted(tmp_path, stray_base, caplog):
    expected, bases = _fill(tmp_path)
    end = expected[-1][0] + 1
    for source in _segment_files(tmp_path, bases[1]):  # e.g. copied in from another partition
        shutil.copy(source, tmp_path / f"{stray_base:020d}{source.suffix}")
    with Log.open(tmp_path, CONFIG) as log:
        assert log.segment_base_offsets == bases
        assert rows(log) == expected
        assert log.append(values(1)) == range(end, end + 1)
    stray = f"{stray_base:020d}.arrows"
    assert stray in caplog.text and "not part of the log" in caplog.text
    assert not (tmp_path / stray).exists()
    assert (tmp_path / (stray + ".stray")).exists()  # renamed, never deleted
    with Log.open(tmp_path, CONFIG) as log:
        assert rows(log)[:-1] == expected


def test_a_log_without_a_manifest_opens_as_before_and_gets_one(tmp_path):
    """Logs written before the manifest existed: every segment file is the log."""
    expected, bases = _fill(tmp_path)
    (tmp_path / MANIFEST).unlink()
    with Log.open(tmp_path, CONFIG) as log:
        assert log.segment_base_offsets == bases
        assert rows(log) == expected
    assert (tmp_path / MANIFEST).exists()
    for f in _segment_files(tmp_path, bases[3]):
        f.unlink()
    with Log.open(tmp_path, CONFIG) as log:  # from now on a lost segment is told from a compaction gap
        assert [(f, la) for _, f, la, _ in log.damaged] == [(bases[3], bases[4] - 1)]


def test_compaction_gaps_between_segments_are_not_damage(tmp_path):
    config = LogConfig(segment_bytes=2_000)
    with Log.open(tmp_path, config) as log:
        for i in range(60):
            log.append([Record(b"%d" % i, key=b"k%d" % (i % 3))])
        log.high_watermark = log.log_end_offset
        assert log.compact() > 0
        expected = rows(log)
        # Whole segments compacted to nothing, and segments whose last messages went.
        ends = [s.next_offset for s in log._segments[:-1]]
        assert any(e < b for e, b in zip(ends, log.segment_base_offsets[1:], strict=True))
    with Log.open(tmp_path, config) as log:
        assert rows(log) == expected
        assert log.damaged == []


def _crash_on_manifest_write(monkeypatch, live, snapshot):
    """At the first manifest write, copy ``live`` to ``snapshot`` (the disk as a crash there
    would leave it), then fail the write so that the live log goes on and closes cleanly."""

    def crash(directory, bases, *, sync=True):
        if not snapshot.exists():
            shutil.copytree(live, snapshot)
        raise OSError(errno.EIO, "the process died here")

    monkeypatch.setattr(manifest_module, "write_manifest", crash)


def test_a_roll_interrupted_before_recording_its_segment(tmp_path, monkeypatch):
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    expected, _ = _fill(live)
    with Log.open(live, CONFIG) as log:
        _crash_on_manifest_write(monkeypatch, live, crashed)
        with pytest.raises(LogStorageError):
            log.roll()
        monkeypatch.undo()
        assert rows(log) == expected  # the failed roll left the log as it was
    end = expected[-1][0] + 1
    assert (crashed / f"{end:020d}.arrows").exists()  # created, not recorded
    with Log.open(crashed, CONFIG) as log:  # the restart after the crash
        assert rows(log) == expected
        assert log.damaged == []
        assert not list(crashed.glob("*.stray"))
        assert log.append(values(1)) == range(end, end + 1)


@pytest.mark.parametrize("operation", ["retention", "truncation"])
def test_deletions_interrupted_before_recording_them(tmp_path, monkeypatch, operation):
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    config = LogConfig(segment_bytes=4_000, retention_messages=30)
    expected, bases = _fill(live, config)
    with Log.open(live, config) as log:
        log.high_watermark = log.log_end_offset
        _crash_on_manifest_write(monkeypatch, live, crashed)
        if operation == "retention":
            assert log.enforce_retention() > 0
            survivors = [r for r in expected if r[0] >= log.log_start_offset]
        else:
            log.truncate_to(bases[-3] + 1)
            # The crash came before the kept segment was cut: the truncation is to be redone.
            survivors = [r for r in expected if r[0] < bases[-2]]
        monkeypatch.undo()
    with Log.open(crashed, config) as log:  # the manifest still lists the deleted segments
        assert rows(log) == survivors
        assert log.damaged == []
    with Log.open(live, config) as log:  # the live log recorded its segments at the next change
        log.roll()
    with Log.open(live, config) as log:
        assert log.damaged == []


def test_a_zeroed_segment_fails_batch_by_batch(tmp_path):
    """Its index is intact, so each batch is reported with its own range as it is read."""
    expected, bases = _fill(tmp_path)
    lost, after = bases[3], bases[4]
    data = _segment_files(tmp_path, lost)[0]
    data.write_bytes(bytes(data.stat().st_size))
    with Log.open(tmp_path, CONFIG) as log:
        assert rows(log, 0) == expected[:lost]
        for first in range(lost, after, 3):
            with pytest.raises(CorruptSegmentError, match=f"offsets {first} to {first + 2} cannot be read"):
                log.read(first)
        assert rows(log, after) == expected[after:]
        assert [(f, la) for _, f, la, _ in log.damaged] == [(f, f + 2) for f in range(lost, after, 3)]
