"""The replication wire's pure parts: the stream's messages and acknowledgements."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.replication import (
    RESPONSE_KEYS,
    LeaderOffsets,
    ReplicaFetch,
    StreamTicket,
    fetch_metadata,
    packed_stream_message,
    parse_fetch_metadata,
    parse_packed_stream_message,
    parse_stream_ack,
    parse_stream_message_metadata,
    parse_stream_ticket,
    parse_ticket,
    stream_ack,
    stream_message_metadata,
)

offsets = st.integers(min_value=0, max_value=2**63 - 1)


@given(offset=offsets)
def test_an_acknowledgement_round_trips(offset):
    assert parse_stream_ack(stream_ack(offset)) == offset
    assert parse_stream_ack(pa.py_buffer(stream_ack(offset))) == offset


@given(values=st.tuples(offsets, offsets, offsets, st.integers(0, 2**31 - 1)))
def test_a_leaders_message_metadata_round_trips(values):
    sent = LeaderOffsets(**dict(zip(RESPONSE_KEYS, values, strict=True)))
    assert parse_stream_message_metadata(pa.py_buffer(stream_message_metadata(sent))) == sent


def test_the_leaders_offsets_keep_their_wire_form():
    offsets = LeaderOffsets(high_watermark=5, log_start_offset=1, log_end_offset=9, leader_epoch=3)
    assert stream_message_metadata(offsets) == (
        b'{"high_watermark":5,"log_start_offset":1,"log_end_offset":9,"leader_epoch":3}'
    )
    metadata = fetch_metadata(offsets)
    assert list(metadata.items()) == [
        ("jetstream.high_watermark", "5"),
        ("jetstream.log_start_offset", "1"),
        ("jetstream.log_end_offset", "9"),
        ("jetstream.leader_epoch", "3"),
    ]
    assert parse_fetch_metadata({k.encode(): v.encode() for k, v in metadata.items()}) == offsets


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        b"",
        b"[]",
        b"{",
        b'{"fetch_offset":-1}',
        b'{"fetch_offset":"7"}',
        b'{"fetch_offset":true}',
        b'{"fetch_offset":1,"more":2}',
        b'{"offset":1}',
        b'{"fetch_offset":9223372036854775808}',
    ],
)
def test_a_bad_acknowledgement_is_refused_naming_what_is_wrong(metadata):
    with pytest.raises(InvalidArgumentError, match="fetch_offset|acknowledgement|JSON"):
        parse_stream_ack(metadata)


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        b"{}",
        b'{"high_watermark":1}',
        b'{"high_watermark":1,"log_start_offset":0,"log_end_offset":1,"leader_epoch":"1"}',
        b'{"high_watermark":1,"log_start_offset":0,"log_end_offset":1,"leader_epoch":1,"x":0}',
    ],
)
def test_a_bad_leader_message_is_refused(metadata):
    with pytest.raises(InvalidArgumentError):
        parse_stream_message_metadata(metadata)


def test_the_stream_opens_with_a_fetch_ticket():
    fetch = ReplicaFetch("orders", 2, "broker-2", 10, 3, 1024, 0.5)
    assert parse_ticket(fetch.to_ticket()) == fetch


@given(values=st.tuples(*[st.integers(-(2**70), 2**70)] * 4))
def test_any_leaders_offsets_read_back_as_the_json_parser_reads_them(values):
    # The wire form is read by one match; what the match does not take goes to the JSON parser.
    # Either way the offsets come back as written, and the JSON parser agrees with the match.
    sent = LeaderOffsets(*values)
    wire = stream_message_metadata(sent)
    assert json.loads(wire) == dict(zip(RESPONSE_KEYS, values, strict=True))
    assert parse_stream_message_metadata(wire) == sent


@pytest.mark.parametrize(
    "metadata",
    [
        b'{"high_watermark": 5, "log_start_offset": 1, "log_end_offset": 9, "leader_epoch": 3}',
        b'{"leader_epoch":3,"log_end_offset":9,"log_start_offset":1,"high_watermark":5}',
        b'{"high_watermark":5,"log_start_offset":1,"log_end_offset":9,"leader_epoch":3} ',
    ],
)
def test_a_leader_message_in_another_json_form_is_read_by_the_json_parser(metadata):
    assert parse_stream_message_metadata(metadata) == LeaderOffsets(5, 1, 9, 3)


@pytest.mark.parametrize(
    "metadata",
    [
        b'{"high_watermark":05,"log_start_offset":1,"log_end_offset":9,"leader_epoch":3}',  # not JSON
        b'{"high_watermark":5,"log_start_offset":1,"log_end_offset":9,"leader_epoch":3}\x00',
        b'{"high_watermark":5.0,"log_start_offset":1,"log_end_offset":9,"leader_epoch":3}',
    ],
)
def test_what_only_looks_like_the_wire_form_is_refused(metadata):
    with pytest.raises(InvalidArgumentError):
        parse_stream_message_metadata(metadata)


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (b'{"fetch_offset": 7}', 7),
        (b'{"fetch_offset":9223372036854775807}', 2**63 - 1),
    ],
)
def test_an_acknowledgement_in_another_json_form_or_at_the_largest_offset_is_read(metadata, expected):
    assert parse_stream_ack(metadata) == expected


@pytest.mark.parametrize("metadata", [b'{"fetch_offset":007}', b'{"fetch_offset":9999999999999999999}'])
def test_an_acknowledgement_in_the_wire_form_but_not_an_offset_is_refused(metadata):
    with pytest.raises(InvalidArgumentError, match="fetch_offset|JSON"):
        parse_stream_ack(metadata)


@given(
    values=st.tuples(offsets, offsets, offsets, st.integers(0, 2**31 - 1)),
    frames=st.lists(st.binary(max_size=200), max_size=8),
)
def test_a_packed_message_round_trips_its_offsets_and_frames(values, frames):
    sent = LeaderOffsets(*values)
    wire = pa.py_buffer(packed_stream_message(sent, [pa.py_buffer(f) for f in frames]))
    got, got_frames = parse_packed_stream_message(wire)
    assert got == sent
    assert [f.to_pybytes() for f in got_frames] == frames


def test_packed_frames_keep_their_8_byte_alignment_within_the_message():
    frames = [pa.py_buffer(b"f" * size) for size in (1120, 8, 2048, 16)]  # frames are padded to 8
    wire = pa.py_buffer(packed_stream_message(LeaderOffsets(5, 1, 9, 3), frames))
    _, got = parse_packed_stream_message(wire)
    assert [(f.address - wire.address) % 8 for f in got] == [0, 0, 0, 0]


def _packed(*frames: bytes) -> bytes:
    return packed_stream_message(LeaderOffsets(5, 1, 9, 3), [pa.py_buffer(f) for f in frames])


@pytest.mark.parametrize(
    ("metadata", "match"),
    [
        (None, "shorter than its"),
        (_packed(b"abc")[:20], "shorter than its"),
        (b"XXXX" + _packed(b"abc")[4:], "starts with b'XXXX'"),
        (_packed(b"abc")[:-1], "add up to 3 bytes, but 2 follow"),
        (_packed(b"abc") + b"!", "add up to 3 bytes, but 4 follow"),
        (_packed()[:-8] + (2**32 - 1).to_bytes(8, "little"), "names 4294967295 frames"),
    ],
)
def test_a_bad_packed_message_is_refused_naming_what_does_not_fit(metadata, match):
    buffer = None if metadata is None else pa.py_buffer(metadata)
    with pytest.raises(InvalidArgumentError, match=match):
        parse_packed_stream_message(buffer)


def test_a_stream_opens_with_either_ticket_and_says_which_form_it_wants():
    fetch = ReplicaFetch("orders", 2, "broker-2", 10, 3, 1024, 0.5)
    assert parse_stream_ticket(fetch.to_ticket()) == StreamTicket(fetch, packed=False)
    assert parse_stream_ticket(fetch.to_ticket(packed=True)) == StreamTicket(fetch, packed=True)
    assert parse_ticket(fetch.to_ticket(packed=True)) is None  # not a fetch's ticket
    assert parse_stream_ticket(b'{"stream":"orders"}') is None  # a consumer's
    with pytest.raises(InvalidArgumentError, match="holds only replica_stream"):
        parse_stream_ticket(
            b'{"replica_stream":' + fetch.to_ticket()[len(b'{"replica_fetch":') : -1] + b',"x":1}'
        )
