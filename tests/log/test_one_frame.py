"""One plain message's frame, written from a prepared shape, is pyarrow's frame byte for byte."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from broker_node.log import Log, LogConfig, Record
from broker_node.log.one_frame import OneFrames
from pyspark_jetstream.protocol.schema import LOG_SCHEMA

from .helpers import FakeClock

FRAMES = OneFrames()
optional_bytes = st.none() | st.binary(max_size=300)
optional_text = st.none() | st.text(max_size=40)


def pyarrows(offset: int, timestamp: int, epoch: int, record: Record) -> bytes:
    row = {
        "offset": offset,
        "timestamp": timestamp,
        "leader_epoch": epoch,
        "key": record.key,
        "value": record.value,
        "headers": None,
        "subject": record.subject,
        "reply": record.reply,
        "producer_id": None,
        "sequence": None,
    }
    return pa.RecordBatch.from_pylist([row], schema=LOG_SCHEMA).serialize().to_pybytes()


@given(
    offset=st.integers(0, 2**63 - 1),
    timestamp=st.integers(0, 2**62),
    epoch=st.integers(0, 2**31 - 1),
    key=optional_bytes,
    value=optional_bytes,
    subject=optional_text,
    reply=optional_text,
)
def test_the_frame_is_what_pyarrow_writes_for_the_same_batch(
    offset, timestamp, epoch, key, value, subject, reply
):
    record = Record(value, key=key, subject=subject, reply=reply)
    assert FRAMES.frame(offset, timestamp, epoch, record) == pyarrows(offset, timestamp, epoch, record)


def test_a_log_stores_one_message_as_the_general_path_would(tmp_path):
    """The same messages appended one by one as records (the prepared shapes) and as one-row
    Arrow tables (the general path, whose arrays pyarrow may lay out otherwise): the same
    batches, and a reopened log checks and reads them all."""
    clock = FakeClock()
    records = [
        Record(
            b"v" * n, key=None if n % 3 else b"k%d" % n, subject=f"orders.{n}", reply=None if n % 2 else "r"
        )
        for n in range(40)
    ] + [Record(None, key=b"gone")]
    with (
        Log.open(tmp_path / "shaped", LogConfig(segment_bytes=2_000), clock=clock) as shaped,
        Log.open(tmp_path / "general", LogConfig(segment_bytes=2_000), clock=clock) as general,
    ):
        for record in records:
            shaped.append([record])
            general.append(
                pa.table(
                    {
                        "key": pa.array([record.key], pa.binary()),
                        "value": pa.array([record.value], pa.binary()),
                        "subject": pa.array([record.subject], pa.string()),
                        "reply": pa.array([record.reply], pa.string()),
                    }
                )
            )
            clock.advance(0.001)
        ours, theirs = shaped.read(0), general.read(0)
        assert len(ours) == len(theirs) == len(records)
        assert all(a.equals(b) for a, b in zip(ours, theirs, strict=True))
        assert len(shaped._segments) > 1
    with Log.open(tmp_path / "shaped", LogConfig(segment_bytes=2_000), clock=clock) as reopened:
        assert reopened.verify(1 << 30) > 0 and not reopened.damaged  # every checksum holds
        table = pa.Table.from_batches(reopened.read(0))
        assert table.column("value").to_pylist() == [r.value for r in records]
        assert table.column("offset").to_pylist() == list(range(len(records)))
