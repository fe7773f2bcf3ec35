"""The replication wire's pure parts: the connection's messages, and the repair fetch's ticket."""

from __future__ import annotations

import json
import struct

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    NotLeaderError,
    OffsetOutOfRangeError,
)
from pyspark_jetstream.protocol.replication import (
    LeaderOffsets,
    ReplicaFetch,
    fetch_metadata,
    parse_fetch_metadata,
    parse_ticket,
)
from pyspark_jetstream.protocol.replication_wire import (
    HEAD_BYTES,
    MAX_HELLO_BYTES,
    Fetch,
    Hello,
    Kind,
    MessageReader,
    ack_message,
    data_message,
    epoch_end_message,
    epoch_message,
    error_message,
    fetch_message,
    message,
    parse_ack,
    parse_data,
    parse_epoch,
    parse_epoch_end,
    parse_error,
    parse_fetch,
)

offsets = st.integers(min_value=0, max_value=2**63 - 1)
leader_offsets = st.builds(LeaderOffsets, offsets, offsets, offsets, st.integers(0, 2**31 - 1))
frames = st.lists(st.binary(max_size=64).map(lambda b: pa.py_buffer(b + b"\0" * (-len(b) % 8))), max_size=6)


def one(data: bytes) -> tuple[Kind, bytes]:
    """The single message ``data`` holds."""
    reader = MessageReader()
    reader.feed(data)
    got = reader.next()
    assert got is not None and reader.next() is None and reader.buffered == 0
    return got


@given(offset=offsets)
def test_an_acknowledgement_round_trips(offset):
    kind, body = one(ack_message(offset))
    assert kind is Kind.ACK and parse_ack(body) == offset


def test_an_acknowledgement_of_a_negative_offset_is_refused():
    with pytest.raises(InvalidArgumentError, match="fetch_offset must be an integer from 0"):
        parse_ack(struct.pack("<q", -1))


@given(sent=leader_offsets, stored=frames)
def test_a_data_message_round_trips_its_offsets_and_frames(sent, stored):
    kind, body = one(data_message(sent, stored))
    assert kind is Kind.DATA
    offsets, got = parse_data(pa.py_buffer(body))
    assert offsets == sent
    assert [f.to_pybytes() for f in got] == [f.to_pybytes() for f in stored]


def test_frames_keep_their_8_byte_alignment_within_a_data_body():
    stored = [pa.py_buffer(b"a" * 16), pa.py_buffer(b"b" * 8), pa.py_buffer(b"c" * 24)]
    _, body = one(data_message(LeaderOffsets(1, 0, 3, 2), stored))
    start = 40 + 8 * len(stored)
    for frame in stored:
        assert start % 8 == 0
        assert body[start : start + frame.size] == frame.to_pybytes()
        start += frame.size


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"JSR2", "shorter than its 40-byte head"),
        (struct.pack("<4sqqqiQ", b"JSR1", 0, 0, 0, 0, 0), "starts with b'JSR1'"),
        (struct.pack("<4sqqqiQ", b"JSR2", 0, 0, 0, 0, 3), "names 3 frames but holds 40 bytes"),
        (struct.pack("<4sqqqiQQ", b"JSR2", 0, 0, 0, 0, 1, 16) + b"x" * 8, "add up to 16 bytes, but 8"),
    ],
)
def test_a_bad_data_message_is_refused_naming_what_does_not_fit(body, match):
    with pytest.raises(InvalidArgumentError, match=match):
        parse_data(pa.py_buffer(body))


def test_a_hello_round_trips_and_is_read_strictly():
    hello = Hello("orders", 3, "broker-2", 7, "Basic YTpi")
    kind, body = one(hello.encode())
    assert kind is Kind.HELLO and Hello.parse(body) == hello
    fields = json.loads(body)
    assert set(fields) == {"version", "stream", "partition", "replica", "leader_epoch", "authorization"}
    for change, match in [
        ({"version": 1}, "speaks replication version 1, this leader 2"),
        ({"stream": ""}, "stream must be a non-empty string"),
        ({"partition": -1}, "partition"),
        ({"leader_epoch": 2**31}, "leader_epoch"),
        ({"authorization": None}, "authorization must be a string"),
        ({"extra": 1}, "exactly the fields"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match):
            Hello.parse(json.dumps({**fields, **change}).encode())
    with pytest.raises(InvalidArgumentError):
        Hello.parse(b"not json")


@given(offset=offsets, max_bytes=st.integers(1, 1 << 30), max_wait=st.floats(0, 30))
def test_a_fetch_round_trips(offset, max_bytes, max_wait):
    kind, body = one(fetch_message(Fetch(offset, max_bytes, max_wait)))
    assert kind is Kind.FETCH and parse_fetch(body) == Fetch(offset, max_bytes, max_wait)


@pytest.mark.parametrize(
    ("fetch", "match"),
    [
        ((0, 0, 0.5), "max_bytes"),
        ((0, 1 << 31, 0.5), "max_bytes"),
        ((0, 1024, float("nan")), "max_wait must be 0 to 30 seconds"),
        ((0, 1024, 31.0), "max_wait must be 0 to 30 seconds"),
        ((-5, 1024, 0.5), "fetch_offset must be an integer from 0"),
    ],
)
def test_a_bad_fetch_is_refused_naming_the_value(fetch, match):
    with pytest.raises(InvalidArgumentError, match=match):
        parse_fetch(struct.pack("<qQd", *fetch))


def test_epoch_questions_and_answers_round_trip():
    kind, body = one(epoch_message(7))
    assert kind is Kind.EPOCH and parse_epoch(body) == 7
    kind, body = one(epoch_end_message(6, 1234))
    assert kind is Kind.EPOCH_END and parse_epoch_end(body) == (6, 1234)
    with pytest.raises(InvalidArgumentError, match="an epoch question is 4 bytes, got 5"):
        parse_epoch(b"12345")


def test_an_error_carries_its_class_and_fields_and_a_garbled_one_says_so():
    sent = OffsetOutOfRangeError("from 9, but 0 to 5", stream="orders", partition=0, log_end_offset=5)
    kind, body = one(error_message(sent))
    assert kind is Kind.ERROR
    got = parse_error(body)
    assert isinstance(got, OffsetOutOfRangeError) and str(got) == str(sent)
    assert got.fields["log_end_offset"] == 5 and got.fields["partition"] == 0
    assert isinstance(parse_error(one(error_message(NotLeaderError("no", partition=1)))[1]), NotLeaderError)
    garbled = parse_error(b'{"code": 5}')
    assert isinstance(garbled, InvalidArgumentError) and "unreadable error" in str(garbled)


@given(
    sent=st.lists(st.tuples(st.sampled_from(list(Kind)), st.binary(max_size=40)), max_size=8),
    cuts=st.lists(st.integers(0, 400), max_size=10),
)
def test_messages_come_out_whole_and_in_order_however_the_bytes_arrive(sent, cuts):
    data = b"".join(message(kind, body) for kind, body in sent)
    reader = MessageReader()
    got = []
    start = 0
    for cut in [*sorted({min(c, len(data)) for c in cuts}), len(data)]:
        reader.feed(data[start:cut])
        start = max(start, cut)
        while (each := reader.next()) is not None:
            got.append(each)
    assert got == sent
    assert reader.buffered == 0


def test_a_message_over_the_limit_or_of_an_unknown_kind_is_refused_before_it_is_read():
    reader = MessageReader(MAX_HELLO_BYTES)
    reader.feed(struct.pack("<IB", MAX_HELLO_BYTES + 1, Kind.HELLO))  # only the head arrived
    with pytest.raises(InvalidArgumentError, match="announces 65537 bytes, over the limit of 65536"):
        reader.next()
    reader = MessageReader()
    reader.feed(struct.pack("<IB", 0, 99))
    with pytest.raises(InvalidArgumentError, match="unknown replication message kind 99"):
        reader.next()
    assert HEAD_BYTES == 5


def test_the_repair_fetch_ticket_round_trips_and_its_answer_carries_the_offsets():
    fetch = ReplicaFetch("orders", 1, "broker-2", 10, 3, max_bytes=1024, max_wait=0.0)
    assert parse_ticket(fetch.to_ticket()) == fetch
    assert parse_ticket(b'{"stream":"orders"}') is None  # a consumer's read ticket
    offsets = LeaderOffsets(high_watermark=5, log_start_offset=1, log_end_offset=9, leader_epoch=3)
    metadata = fetch_metadata(offsets)
    assert list(metadata.items()) == [
        ("jetstream.high_watermark", "5"),
        ("jetstream.log_start_offset", "1"),
        ("jetstream.log_end_offset", "9"),
        ("jetstream.leader_epoch", "3"),
    ]
    assert parse_fetch_metadata({k.encode(): v.encode() for k, v in metadata.items()}) == offsets
