"""The live-tail wire: subjects, deliveries and marks, and what a consumer refuses."""

from __future__ import annotations

import contextlib
import struct
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_jetstream.protocol import tail
from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.subjects import subject_matches
from pyspark_jetstream.protocol.tail import (
    HEADER_BYTES,
    decode_delivery,
    encode_delivery,
    encode_mark,
    stream_tail_subjects,
    tail_subject,
)


def stored_frame(first: int, count: int, compression: str | None = None) -> bytes:
    """One record-batch message in the log schema, as the log stores it."""
    now = datetime.now(UTC)
    rows = [
        {"offset": first + i, "timestamp": now, "leader_epoch": 3, "value": b"v%d" % i, "headers": []}
        for i in range(count)
    ]
    return frame_of(pa.RecordBatch.from_pylist(rows, schema=LOG_SCHEMA), compression)


def frame_of(batch: pa.RecordBatch, compression: str | None) -> bytes:
    """The record-batch message of an IPC stream written with ``compression``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(
        sink, LOG_SCHEMA, options=pa.ipc.IpcWriteOptions(compression=compression)
    ) as writer:
        writer.write_batch(batch)
    reader = pa.ipc.MessageReader.open_stream(sink.getvalue())
    reader.read_next_message()  # the schema
    return reader.read_next_message().serialize().to_pybytes()


def test_one_permission_per_stream_covers_its_partitions_and_nothing_else():
    assert tail_subject("orders", 2) == "_PJS.tail.2.orders"
    assert tail_subject("orders.eu", 0) == "_PJS.tail.0.orders.eu"
    wildcard = stream_tail_subjects("orders")
    assert subject_matches(wildcard, tail_subject("orders", 7))
    assert not subject_matches(wildcard, tail_subject("orders.eu", 7))
    assert not subject_matches(wildcard, tail_subject("orders2", 7))


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_a_delivery_round_trips_the_stored_frame(compression):
    frame = stored_frame(40, 5, compression)
    delivery = decode_delivery(encode_delivery(40, 44, 3, 45, frame))
    assert (delivery.first_offset, delivery.last_offset, delivery.leader_epoch, delivery.high_watermark) == (
        40,
        44,
        3,
        45,
    )
    assert delivery.batch is not None
    assert delivery.batch.column("offset").to_pylist() == [40, 41, 42, 43, 44]
    assert delivery.batch.schema.equals(LOG_SCHEMA)


def test_a_mark_has_no_batch():
    mark = decode_delivery(encode_mark(17, 2))
    assert mark.batch is None and mark.high_watermark == 17 and mark.leader_epoch == 2
    assert len(encode_mark(17, 2)) == HEADER_BYTES


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"", "header"),
        (b"XXXX" + bytes(28), "magic"),
        (struct.pack("<4sqqiq", b"PJT1", -1, 0, 0, 1), "offsets"),
        (struct.pack("<4sqqiq", b"PJT1", 5, 2, 0, 9), "offsets"),
        (encode_delivery(0, 4, 3, 4, stored_frame(0, 5)), "high watermark"),  # not committed
        (encode_delivery(0, 5, 3, 9, stored_frame(0, 5)), "does not hold"),  # header lies
        (encode_delivery(1, 5, 3, 9, stored_frame(0, 5)), "does not hold"),
        (struct.pack("<4sqqiq", b"PJT1", 0, 0, 0, 9) + b"not arrow", "Arrow IPC"),
    ],
)
def test_malformed_deliveries_are_refused_with_a_reason(payload, why):
    with pytest.raises(ValueError, match=why):
        decode_delivery(payload)


def test_a_compressed_bomb_is_refused_before_it_is_decoded(monkeypatch):
    monkeypatch.setattr(tail, "MAX_DECODED_BYTES", 1024 * 1024)
    now = datetime.now(UTC)
    big = pa.RecordBatch.from_pylist(
        [{"offset": 0, "timestamp": now, "leader_epoch": 0, "value": bytes(8 * 1024 * 1024)}],
        schema=LOG_SCHEMA,
    )
    frame = frame_of(big, "zstd")
    assert len(frame) < 64 * 1024
    with pytest.raises(ValueError, match="would decode"):
        decode_delivery(encode_delivery(0, 0, 0, 1, frame))


@given(st.binary(max_size=200))
def test_any_bytes_parse_or_raise_value_error(data):
    for payload in (data, b"PJT1" + data):
        with contextlib.suppress(ValueError):
            decode_delivery(payload)
