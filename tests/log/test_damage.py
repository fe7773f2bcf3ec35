"""A damaged batch in a closed segment: reported precisely, the rest of the log serves, repair restores it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from broker_node.log import CorruptSegmentError, InvalidRecordsError, Log, LogConfig, Record
from broker_node.log.index import OFFSET_ENTRY

from .helpers import rows, values

CONFIG = LogConfig(segment_bytes=4_000)


def _fill(path):
    """40 batches of 3 messages over about ten segments; return every row."""
    with Log.open(path, CONFIG) as log:
        for i in range(40):
            log.append(values(3, start=i * 3))
        return rows(log)


def _batch_in_a_closed_segment(path):
    """``(segment path, batch number, position, first offset, last offset)`` of a batch in the
    middle of the log's second segment."""
    with Log.open(path, CONFIG) as log:
        segment = log._segments[1]
        i = len(segment.index) // 2
        index = segment.index
        return segment.path, i, index.positions[i], index.bases[i], index.lasts[i]


def _damage(path, how):
    """Damage one batch of a closed segment in place; return its file and offset range."""
    data_path, i, position, first, last = _batch_in_a_closed_segment(path)
    if how == "bit flip":
        data = bytearray(data_path.read_bytes())
        data[position + 60] ^= 0x04
        data_path.write_bytes(bytes(data))
    else:  # a wrong checksum in the index: the data is fine, but nothing can tell
        index_path = data_path.with_suffix(".index")
        entries = bytearray(index_path.read_bytes())
        entry = list(OFFSET_ENTRY.unpack_from(entries, i * OFFSET_ENTRY.size))
        entry[4] ^= 1 << 7
        OFFSET_ENTRY.pack_into(entries, i * OFFSET_ENTRY.size, *entry)
        index_path.write_bytes(bytes(entries))
    return data_path, first, last


@pytest.mark.parametrize("how", ["bit flip", "index checksum"])
def test_a_damaged_batch_fails_only_reads_of_its_range(tmp_path, how):
    expected = _fill(tmp_path)
    path, first, last = _damage(tmp_path, how)
    with Log.open(tmp_path, CONFIG) as log:
        assert rows(log, last + 1) == expected[last + 1 :]  # everything after the damage is served
        assert log.damaged == []  # closed segments are checked as they are read, not at open
        # A read from before the damage returns what precedes it...
        assert rows(log, 0) == expected[:first]
        assert rows(log, first - 2) == expected[first - 2 : first]
        # ... the next read, at the damaged range, says which range of which file is lost ...
        for start in (first, last):
            with pytest.raises(
                CorruptSegmentError, match=f"{path.name} .offsets {first} to {last} cannot"
            ) as info:
                log.read(start)
            assert (info.value.path, info.value.first_offset, info.value.last_offset) == (
                str(path),
                first,
                last,
            )
            assert not info.value.retriable
        ((damaged_path, damaged_first, damaged_last, detail),) = log.damaged
        assert (damaged_path, damaged_first, damaged_last) == (str(path), first, last)
        assert "checksum" in detail
        end = log.log_end_offset
        assert log.append(values(2)) == range(end, end + 2)  # and the log takes appends
        assert rows(log, end) == [(end + k, None, r.value) for k, r in enumerate(values(2))]


def test_scan_skips_damaged_batches_only_when_asked_and_reports_them(tmp_path):
    expected = _fill(tmp_path)
    path, first, last = _damage(tmp_path, "bit flip")
    with Log.open(tmp_path, CONFIG) as log:
        with pytest.raises(CorruptSegmentError):
            list(log.scan())
        reported: list[CorruptSegmentError] = []
        scanned = [
            o for b in log.scan(max_bytes=1, on_damaged=reported.append) for o in b["offset"].to_pylist()
        ]
        assert scanned == [r[0] for r in expected if not first <= r[0] <= last]
        assert [(e.path, e.first_offset, e.last_offset) for e in reported] == [(str(path), first, last)]


def test_a_lost_index_and_a_broken_frame_lose_only_that_frame(tmp_path):
    """The rebuild of the index resynchronises on the next frame after the damaged one."""
    expected = _fill(tmp_path)
    path, _, position, first, last = _batch_in_a_closed_segment(tmp_path)
    data = bytearray(path.read_bytes())
    data[position : position + 4] = b"\0\0\0\0"  # the continuation marker: the framing is broken
    path.write_bytes(bytes(data))
    path.with_suffix(".index").unlink()
    with Log.open(tmp_path, CONFIG) as log:
        assert rows(log, 0) == expected[:first]
        with pytest.raises(CorruptSegmentError, match=f"offsets {first} to {last} "):
            log.read(first)
        assert rows(log, last + 1) == expected[last + 1 :]  # the same segment's later frames too
        assert [(p, f, la) for p, f, la, _ in log.damaged] == [(str(path), first, last)]


class DamagedPrimary(NamedTuple):
    """A log with one damaged batch, and a replica's intact copy of it."""

    primary: Path
    replica: Path
    expected: list
    """Every row, as written."""
    first: int
    last: int
    """The damaged offsets, inclusive."""


def _damaged_primary(tmp_path) -> DamagedPrimary:
    primary, replica = tmp_path / "primary", tmp_path / "replica"
    expected = _fill(primary)
    shutil.copytree(primary, replica)
    _, first, last = _damage(primary, "bit flip")
    return DamagedPrimary(primary, replica, expected, first, last)


def test_repair_replaces_a_damaged_batch_with_a_replicas_copy(tmp_path):
    primary, replica, expected, first, last = _damaged_primary(tmp_path)
    with Log.open(primary, CONFIG) as log, Log.open(replica, CONFIG) as good:
        with pytest.raises(CorruptSegmentError):
            log.read(first)
        copy = good.read(first, upper_bound=last + 1)
        log.repair(copy)
        assert log.damaged == []
        assert rows(log) == expected
        log.append(values(1))
    with Log.open(primary, CONFIG) as log:
        assert rows(log)[:-1] == expected
        assert log.damaged == []


def test_repair_refuses_what_does_not_cover_exactly_the_damaged_offsets(tmp_path):
    primary, replica, expected, first, last = _damaged_primary(tmp_path)
    with Log.open(primary, CONFIG) as log, Log.open(replica, CONFIG) as good:
        with pytest.raises(CorruptSegmentError):
            log.read(first)
        damaged = log.damaged
        refused = {
            "starts late": good.read(first + 1, upper_bound=last + 1),
            "ends early": good.read(first, upper_bound=last),
            "runs past the damage": good.read(first, upper_bound=last + 2),
            "starts before the damage": good.read(first - 1, upper_bound=last + 1),
            "undamaged offsets": good.read(0, upper_bound=3),
            "nothing": [],
        }
        for name, batches in refused.items():
            with pytest.raises(InvalidRecordsError, match=r"repair|damaged"):
                log.repair(batches)
            assert log.damaged == damaged, name
            assert rows(log, 0) == expected[:first], name


def test_compaction_waits_for_a_repair(tmp_path):
    """Damage hides which keys have newer values: compacting around it could resurrect old ones."""
    with Log.open(tmp_path, CONFIG) as log:
        for i in range(40):
            log.append([Record(b"%d" % i, key=b"k%d" % (i % 4)) for _ in range(3)])
        log.high_watermark = log.log_end_offset
        expected = rows(log)
    _, first, last = _damage(tmp_path, "bit flip")
    with Log.open(tmp_path, CONFIG) as log:
        assert log.compact() == 0  # finds the damage while reading for the newest keys
        assert log.damaged and log.damaged[0][1:3] == (first, last)
        assert rows(log, last + 1) == expected[last + 1 :]
        assert log.compact() == 0


@pytest.mark.parametrize("how", ["bit flip", "index checksum"])
def test_verifying_finds_damage_nobody_has_read_yet(tmp_path, how):
    _fill(tmp_path)
    path, first, last = _damage(tmp_path, how)
    with Log.open(tmp_path, CONFIG) as log:
        assert log.damaged == []
        checked = 0
        while (done := log.verify(1_000)) > 0:  # bounded passes, as the broker's maintenance runs them
            checked += done
        assert checked > 0
        assert [(d.path, d.first_offset, d.last_offset) for d in log.damaged] == [(str(path), first, last)]
        assert log.verify(1_000_000) == 0  # everything is checked now
