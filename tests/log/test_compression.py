"""Stored-batch compression: every codec round-trips, shrinks what it should, and mixes in one log."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from broker_node.log import Log, LogConfig, Record
from broker_node.log.segment import COMPRESS_MIN_BYTES
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.schema import COMPRESSIONS, LOG_SCHEMA
from pyspark_jetstream.protocol.streams import StreamConfig

from .helpers import rows


def readings(n: int, start: int = 0) -> list[Record]:
    """JSON-like sensor readings: the kind of value compression is for."""
    return [
        Record(
            b'{"sensor":"s-%04d","temp":%d.%d,"unit":"C","site":"plant-7"}' % (i % 500, i % 40, i % 10),
            key=b"s-%04d" % (i % 500),
        )
        for i in range(start, start + n)
    ]


def stored_frames(log: Log) -> list[tuple[int, int]]:
    """``(size as stored, size if stored plain)`` of every frame in the log."""
    frames = []
    for segment in log._segments:
        data = segment.path.read_bytes()
        for position, size in zip(segment.index.positions, segment.index.sizes, strict=True):
            frame = pa.py_buffer(data[position : position + size])
            batch = pa.ipc.read_record_batch(pa.ipc.read_message(frame), LOG_SCHEMA)
            frames.append((size, batch.serialize().size))
    return frames


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_every_codec_round_trips_through_a_reopen(tmp_path, compression):
    records = readings(3_000) + [Record(os.urandom(100)) for _ in range(500)] + [Record(None, key=b"gone")]
    with Log.open(tmp_path, LogConfig(compression=compression)) as log:
        for i in range(0, len(records), 700):
            log.append(records[i : i + 700])
    with Log.open(tmp_path) as log:  # no codec setting needed to read
        assert rows(log) == [(i, r.key, r.value) for i, r in enumerate(records)]


def test_compressible_batches_are_stored_smaller_and_plain_ones_as_before(tmp_path):
    sizes = {}
    for compression in COMPRESSIONS:
        with Log.open(tmp_path / compression, LogConfig(compression=compression)) as log:
            log.append(readings(5_000))
            frames = stored_frames(log)
            sizes[compression] = log.size_bytes
        ((stored, plain),) = frames
        assert (stored == plain) if compression == "none" else (stored < plain / 4), (compression, frames)
    assert sizes["zstd"] < sizes["lz4"] < sizes["none"] / 4


def test_small_batches_are_stored_plain(tmp_path):
    with Log.open(tmp_path, LogConfig(compression="zstd")) as log:
        log.append(readings(1))
        log.append(readings(20))
        batch_bytes = LOG_SCHEMA.empty_table().nbytes + sum(len(r.value) + len(r.key) for r in readings(20))
        assert batch_bytes < COMPRESS_MIN_BYTES
        assert all(stored == plain for stored, plain in stored_frames(log))


def test_changing_the_codec_keeps_older_batches_readable(tmp_path):
    expected = []
    for round_, compression in enumerate(["none", "lz4", "zstd", "none"]):
        batch = readings(1_000, start=round_ * 1_000)
        with Log.open(tmp_path, LogConfig(compression=compression, segment_bytes=60_000)) as log:
            offsets = log.append(batch)
            expected += [(o, r.key, r.value) for o, r in zip(offsets, batch, strict=True)]
    with Log.open(tmp_path) as log:
        assert len(log.segment_base_offsets) > 1
        assert rows(log) == expected
        assert rows(log, 1_500, max_records=10) == expected[1_500:1_510]


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compaction_rewrites_with_the_codec(tmp_path, compression):
    config = LogConfig(compression=compression, compaction=True, segment_bytes=200_000)
    with Log.open(tmp_path, config) as log:
        for start in range(0, 20_000, 2_000):
            log.append(readings(2_000, start))
        log.roll()
        log.high_watermark = log.log_end_offset
        before = log.size_bytes
        log.compact()
        survivors = rows(log)
        # The newest reading of each of the 500 sensors survives, in offset order.
        assert [o for o, _, _ in survivors] == list(range(19_500, 20_000))
        assert log.size_bytes < before
        assert all(stored < plain for stored, plain in stored_frames(log) if plain >= COMPRESS_MIN_BYTES)
    with Log.open(tmp_path, config) as log:
        assert rows(log) == survivors


def test_an_unknown_codec_is_refused_by_name():
    with pytest.raises(ValueError, match="compression must be one of none, lz4, zstd, got 'snappy'"):
        LogConfig(compression="snappy")
    with pytest.raises(InvalidArgumentError, match="compression must be one of none, lz4, zstd, got 'gzip'"):
        StreamConfig(name="s", subject="s", compression="gzip")


def test_max_bytes_counts_what_a_read_holds_in_memory(tmp_path):
    with Log.open(tmp_path, LogConfig(compression="lz4")) as log:
        for start in range(0, 20_000, 5_000):
            log.append(readings(5_000, start))
        (stored, plain), *_ = stored_frames(log)
        assert 4 * stored < plain  # all four batches would fit by their stored size
        batches = log.read(0, max_bytes=plain + plain // 2)
        assert sum(b.num_rows for b in batches) == 5_000
