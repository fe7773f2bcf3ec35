"""Crash recovery: torn and corrupt tails, damaged indexes, interrupted rewrites."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from broker_node.log import CorruptSegmentError, Log, LogConfig, Record
from broker_node.log.index import OFFSET_ENTRY
from broker_node.log.segment import header_bytes
from pyspark_jetstream.protocol.schema import COMPRESSIONS

from .helpers import rows

SEGMENT_SIZES = [4_000, 64_000, 1_000_000]


def every_fill(test):
    """Parametrize ``test`` over every segment size, eight seeds and every compression."""
    test = pytest.mark.parametrize("compression", COMPRESSIONS)(test)
    test = pytest.mark.parametrize("seed", range(8))(test)
    return pytest.mark.parametrize("segment_bytes", SEGMENT_SIZES)(test)


def _fill(path, segment_bytes, seed, compression="none"):
    """Append random batches; return the rows and, for the active segment, each batch's frame end.

    With a codec, batches are large and compressible enough to be stored compressed.
    """
    rng = random.Random(seed)
    with Log.open(path, LogConfig(segment_bytes=segment_bytes, compression=compression)) as log:
        for _ in range(rng.randint(5, 60)):
            if compression == "none":
                n = rng.randint(1, 30)
                log.append(
                    [
                        Record(rng.randbytes(rng.randint(0, 200)), key=rng.choice([None, b"k"]))
                        for _ in range(n)
                    ]
                )
            else:
                n = rng.randint(100, 300)
                log.append([Record(b"%d" % rng.randrange(100) * 40, key=b"k") for _ in range(n)])
        active = log._segments[-1]
        ends = [
            (active.index.positions[i] + active.index.sizes[i], active.index.lasts[i] + 1)
            for i in range(len(active.index))
        ]
        return rows(log), active.path, ends, active.base_offset


def _surviving_end(ends, base, damaged_from):
    """Log end offset after recovery: batches wholly before the first damaged byte survive."""
    end = base
    for frame_end, next_offset in ends:
        if frame_end <= damaged_from:
            end = next_offset
    return end


def _check_prefix(path, expected, end):
    with Log.open(path) as log:
        assert log.log_end_offset == end
        assert rows(log) == [r for r in expected if r[0] < end]
        assert log.append([Record(b"after")]) == range(end, end + 1)
    with Log.open(path) as log:  # and the repaired log reopens as it was left
        assert rows(log)[-1] == (end, None, b"after")


@every_fill
def test_cut_active_segment_at_random_byte(tmp_path, segment_bytes, seed, compression):
    expected, active, ends, base = _fill(tmp_path, segment_bytes, seed, compression)
    rng = random.Random(1000 + seed)
    cut = rng.randint(0, active.stat().st_size)
    os.truncate(active, cut)
    _check_prefix(tmp_path, expected, _surviving_end(ends, base, cut))


@every_fill
def test_flip_bits_in_active_segment_tail(tmp_path, segment_bytes, seed, compression):
    expected, active, ends, base = _fill(tmp_path, segment_bytes, seed, compression)
    rng = random.Random(2000 + seed)
    data = bytearray(active.read_bytes())
    tail_start = max(len(header_bytes(base)), len(data) - 3000)
    assert tail_start < len(data)  # the active segment always holds a batch after an append
    flips = sorted(rng.randrange(tail_start, len(data)) for _ in range(rng.randint(1, 4)))
    for position in flips:
        data[position] ^= 1 << rng.randrange(8)
    active.write_bytes(bytes(data))
    _check_prefix(tmp_path, expected, _surviving_end(ends, base, flips[0]))


def test_unindexed_frame_after_a_crash_is_dropped(tmp_path):
    """A frame written without its index entry was never acknowledged: it is discarded."""
    expected, active, ends, _base = _fill(tmp_path, 1_000_000, 1)
    with open(active, "ab") as f:
        f.write(active.read_bytes()[ends[0][0] - (ends[1][0] - ends[0][0]) : ends[0][0]])
    _check_prefix(tmp_path, expected, ends[-1][1])


def test_torn_index_entry_drops_only_the_last_batch(tmp_path):
    expected, active, ends, _base = _fill(tmp_path, 1_000_000, 2)
    index = active.with_suffix(".index")
    os.truncate(index, index.stat().st_size - 5)
    _check_prefix(tmp_path, expected, ends[-2][1])


@pytest.mark.parametrize("damage", ["delete", "garbage", "contradict"])
@pytest.mark.parametrize("which", ["active", "closed"])
def test_damaged_index_is_rebuilt_without_losing_data(tmp_path, damage, which):
    expected, active, _, _ = _fill(tmp_path, 4_000, 3)
    segments = sorted(tmp_path.glob("*.arrows"))
    target = (active if which == "active" else segments[0]).with_suffix(".index")
    if damage == "delete":
        target.unlink()
    elif damage == "garbage":
        target.write_bytes(os.urandom(target.stat().st_size))
    else:  # a plausible-looking entry pointing at the wrong place
        data = bytearray(target.read_bytes())
        entry = list(OFFSET_ENTRY.unpack_from(data, 0))
        entry[2] += 8
        OFFSET_ENTRY.pack_into(data, 0, *entry)
        target.write_bytes(bytes(data))
    with Log.open(tmp_path) as log:
        assert rows(log) == expected


def test_corrupt_batch_in_closed_segment_is_reported_with_file_and_offset(tmp_path):
    expected, _, _, _ = _fill(tmp_path, 4_000, 4)
    first = sorted(tmp_path.glob("*.arrows"))[0]
    with Log.open(tmp_path) as log:
        segment = log._segments[0]
        victim = len(segment.index) - 1
        position, offset = segment.index.positions[victim], segment.index.bases[victim]
        next_segment = log.segment_base_offsets[1]
    data = bytearray(first.read_bytes())
    data[position + 40] ^= 0x10
    first.write_bytes(bytes(data))
    with Log.open(tmp_path) as log:
        with pytest.raises(CorruptSegmentError, match=f"offset {offset} in .*{first.name}") as info:
            log.read(0)
        assert info.value.offset == offset
        assert rows(log, 0, upper_bound=offset) == [r for r in expected if r[0] < offset]
        assert rows(log, next_segment) == [
            r for r in expected if r[0] >= next_segment
        ]  # the rest still serves


def test_damaged_segment_header_is_rewritten(tmp_path):
    expected, active, _, _ = _fill(tmp_path, 1_000_000, 5)
    data = bytearray(active.read_bytes())
    data[30] ^= 0xFF
    active.write_bytes(bytes(data))
    with Log.open(tmp_path) as log:
        assert rows(log) == expected


@pytest.mark.parametrize("crash_point", ["temp_written", "segment_renamed"])
def test_compaction_interrupted_by_a_crash(tmp_path, crash_point):
    """A crash at any point of a segment rewrite leaves a log that reopens consistently."""
    config = LogConfig(segment_bytes=3_000)
    path, backup = tmp_path / "log", tmp_path / "backup"
    with Log.open(path, config) as log:
        for i in range(30):
            log.append([Record(b"%d" % i, key=b"k%d" % (i % 3))])
        log.high_watermark = log.log_end_offset
        before = rows(log)
        second = log.segment_base_offsets[1]
    shutil.copytree(path, backup)
    with Log.open(path, config) as log:
        assert log.compact() > 0
        after = rows(log)
    first = sorted(p.name for p in path.glob("*.arrows"))[0]
    # Recreate on disk a crash in the middle of rewriting the first segment.
    compacted = (path / first).read_bytes()
    shutil.rmtree(path)
    shutil.copytree(backup, path)
    if crash_point == "temp_written":
        (path / (first + ".tmp")).write_bytes(compacted)
        expected = before
    else:  # the new data file was renamed in; the old indexes are still beside it
        (path / first).write_bytes(compacted)
        expected = [r for r in after if r[0] < second] + [r for r in before if r[0] >= second]
    with Log.open(path, config) as log:
        assert rows(log) == expected
        assert not list(path.glob("*.tmp"))
        log.high_watermark = log.log_end_offset
        log.compact()
        assert rows(log) == after
