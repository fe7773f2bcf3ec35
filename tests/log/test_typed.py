"""Typed columns stored in a frame beside the log's columns, on both log implementations: read back
as stored, invisible to readers of the log's columns, replicated byte for byte, kept row for row when
a batch is cut."""

from __future__ import annotations

import shutil
import struct

import pyarrow as pa
import pytest

from broker_node.log import (
    CorruptSegmentError,
    InvalidRecordsError,
    Log,
    LogConfig,
    Record,
    typed_columns,
    typed_of,
)
from broker_node.log.segment import encode_frame
from broker_node.log.typed_frames import _message_parts, encode_typed_frame
from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.typed_values import TypedValues, parse_json
from pyspark_jetstream.protocol.value_schema import SchemaDocument, StreamSchema

from .helpers import FakeClock, stored_batch
from .test_store_contract import KINDS, open_log


@pytest.fixture(params=KINDS)
def new_log(request, tmp_path):
    """Opens logs of one kind (the test runs once per kind: file and memory); closes them after."""
    opened = []

    def open_(config: LogConfig | None = None, name: str = "log"):
        log = open_log(request.param, tmp_path / name, config, FakeClock())
        opened.append(log)
        return log

    yield open_
    for log in opened:
        log.close()


V1 = StreamSchema.first(
    SchemaDocument.from_json(
        {"fields": [{"name": "id", "type": "int32", "nullable": False}, {"name": "name", "type": "string"}]}
    )
)
V2 = V1.evolved(
    SchemaDocument.from_json(
        {
            "fields": [
                {"name": "id", "type": "int64", "nullable": False},
                {"name": "name", "type": "string"},
                {"name": "extra", "type": "float64"},
            ]
        }
    )
)


def messages(ids: range, schema: StreamSchema = V1) -> tuple[list[Record], TypedValues]:
    values = [b'{"id": %d, "name": "n%d"}' % (i, i) for i in ids]
    parsed = parse_json(values, schema)
    assert parsed.typed is not None and not parsed.refused
    return [Record(v) for v in values], parsed.typed


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_typed_columns_are_stored_with_their_version_and_read_back_as_stored(new_log, compression):
    log = new_log(LogConfig(compression=compression))
    records, typed = messages(range(3))
    assert log.append(records, typed=typed) == range(0, 3)
    big_records, big_typed = messages(range(3, 2003), V2)  # past the compression threshold
    log.append(big_records, typed=big_typed)
    log.append([Record(b"not typed")])
    frames = log.read_frames(0)
    assert [typed_of(f.data) is None for f in frames] == [False, False, True]
    first, second = typed_of(frames[0].data), typed_of(frames[1].data)
    assert first is not None and first.version == 1 and first.batch.equals(typed.batch)
    assert second is not None and second.version == 2 and second.batch.equals(big_typed.batch)
    # Readers of the log's columns see exactly the log's columns, as before.
    batches = log.read(0)
    assert all(b.schema.equals(LOG_SCHEMA) for b in batches)
    assert pa.Table.from_batches(batches).column("value").to_pylist()[:3] == [r.value for r in records]
    # The old version's columns read under the new one: widened, nulls for the new field.
    read = typed_columns(frames[0].data, V2)
    assert read is not None and read.schema == V2.current
    assert read.to_pylist() == [{"id": i, "name": f"n{i}", "extra": None} for i in range(3)]


def test_an_untyped_batch_is_stored_exactly_as_before(new_log):
    log = new_log()
    log.append([Record(b"a"), Record(b"b")])
    frame = log.read_frames(0)[0].data
    batch = log.read(0)[0]
    assert frame.equals(encode_frame(batch)) and encode_typed_frame(batch, None).equals(frame)


def test_typed_columns_must_have_a_row_per_message(new_log):
    log = new_log()
    records, typed = messages(range(3))
    with pytest.raises(InvalidRecordsError, match="typed columns of 3 rows cannot be stored with 2 messages"):
        log.append(records[:2], typed=typed)
    assert log.log_end_offset == 0


def test_a_follower_stores_the_leaders_typed_frames_byte_for_byte(new_log):
    leader, follower = new_log(name="leader"), new_log(name="follower")
    for start in (0, 5):
        append_typed(leader, range(start, start + 5))
    follower.append_replicated(f.data for f in leader.read_frames(0))
    assert [f.data.to_pybytes() for f in follower.read_frames(0)] == [
        f.data.to_pybytes() for f in leader.read_frames(0)
    ]
    # A fetch starting inside a batch gets its rows from there on, typed columns sliced alike.
    sliced = leader.read_frames(7)[0]
    typed = typed_of(sliced.data)
    assert (sliced.base_offset, sliced.last_offset) == (7, 9)
    assert typed is not None and typed.batch.column("id").to_pylist() == [7, 8, 9]


def test_a_truncation_inside_a_batch_keeps_the_typed_columns_of_what_stays(new_log):
    log = new_log()
    for start in (0, 4):
        append_typed(log, range(start, start + 4))
    log.truncate_to(6)
    frames = log.read_frames(0)
    assert [typed_of(f.data).batch.column("id").to_pylist() for f in frames] == [[0, 1, 2, 3], [4, 5]]  # type: ignore[union-attr]


def test_typed_frames_survive_reopening_a_file_log(tmp_path):
    with Log.open(tmp_path / "log") as log:
        append_typed(log, range(4))
    with Log.open(tmp_path / "log") as log:
        typed = typed_of(log.read_frames(0)[0].data)
        assert typed is not None and typed.batch.column("id").to_pylist() == [0, 1, 2, 3]


def append_typed(log, ids: range) -> range:
    records, typed = messages(ids)
    return log.append(records, typed=typed)


def test_the_segment_stays_an_arrow_stream_any_reader_opens(tmp_path):
    with Log.open(tmp_path / "log") as log:
        append_typed(log, range(4))
        path = next((tmp_path / "log").glob("*.arrows"))
    reader = pa.ipc.open_stream(path.read_bytes())
    batch, metadata = reader.read_next_batch_with_custom_metadata()
    assert batch.schema.equals(LOG_SCHEMA) and batch.num_rows == 4
    assert metadata is not None and metadata[b"jetstream.schema_version"] == b"1"


def test_a_repair_from_a_replicas_frames_keeps_the_typed_columns(tmp_path):
    config = LogConfig(segment_bytes=4_000)
    primary, replica = tmp_path / "primary", tmp_path / "replica"
    with Log.open(primary, config) as log:
        for start in range(0, 120, 3):
            records, typed = messages(range(start, start + 3))
            log.append(records, typed=typed)
        segment = log._segments[1]
        i = len(segment.index) // 2
        path, position = segment.path, segment.index.positions[i]
        first, last = segment.index.bases[i], segment.index.lasts[i]
    shutil.copytree(primary, replica)
    data = bytearray(path.read_bytes())
    data[position + 60] ^= 0x04  # a bit flipped in the frame's header
    path.write_bytes(bytes(data))
    with Log.open(primary, config) as log, Log.open(replica, config) as good:
        with pytest.raises(CorruptSegmentError):
            log.read(first)
        copies = [f.data for f in good.read_frames(first) if f.last_offset <= last]
        assert [(r.first_offset, r.last_offset) for r in log.repair(copies)] == [(first, last)]
        typed = typed_of(log.read_frames(first)[0].data)
        assert typed is not None and typed.batch.column("id").to_pylist() == list(range(first, last + 1))
        # Every other batch of the rewritten segment kept its typed columns too.
        assert all(typed_of(f.data) is not None for f in log.read_frames(0))


def _log_batch(records: list[Record]) -> pa.RecordBatch:
    """``records``' values as a stored batch of the log's columns, from offset 0."""
    return stored_batch(len(records), leader_epoch=3, value=[r.value for r in records])


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_frames_custom_metadata_is_read_from_its_header_as_arrows_reader_reads_it(compression):
    # The typed columns are found in the message's flatbuffer without decoding the batch: the
    # same keys and values as pyarrow's stream reader gives, and the batch's row count.
    records, typed = messages(range(2500), V2)
    batch = _log_batch(records)
    frame = encode_typed_frame(batch, typed, compression)
    rows, pairs = _message_parts(pa.ipc.read_message(frame).metadata)
    stream = pa.ipc.open_stream(LOG_SCHEMA.serialize().to_pybytes() + frame.to_pybytes())
    _, metadata = stream.read_next_batch_with_custom_metadata()
    assert rows == 2500
    assert {k: v.to_pybytes() for k, v in pairs.items()} == dict(metadata)
    found = typed_of(frame)
    assert found is not None and found.version == 2 and found.batch.equals(typed.batch)
    assert _message_parts(pa.ipc.read_message(encode_frame(batch)).metadata) == (2500, {})


def test_a_header_that_does_not_hold_together_is_refused():
    records, typed = messages(range(3))
    header = pa.ipc.read_message(encode_typed_frame(_log_batch(records), typed)).metadata.to_pybytes()
    for cut in (8, 64):
        with pytest.raises((struct.error, IndexError)):
            _message_parts(pa.py_buffer(header[:cut]))
