"""Message ids and the JetStream publish-ack format: pure codecs, no server needed."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from nats.js.api import PubAck
from nats.js.errors import APIError, BadRequestError, ServerError, ServiceUnavailableError

from pyspark_jetstream.protocol.ack import STREAM_MISMATCH, Ack, encode_pub_ack
from pyspark_jetstream.protocol.envelope import Envelope, EnvelopeError, decode, encode
from pyspark_jetstream.protocol.errors import ErrorCode, InvalidArgumentError
from pyspark_jetstream.protocol.headers import message_id_problem, message_ids_in, validate_message_id
from pyspark_jetstream.protocol.schema import HEADER_TYPE
from pyspark_jetstream.protocol.streams import StreamConfig


def test_an_envelope_without_a_message_id_is_unchanged_and_one_with_it_round_trips():
    plain = Envelope(value=b"v", key=b"k", ack_inbox="_INBOX.x", correlation_id="7")
    assert encode(plain)[5] == 0b00011  # the flags: key and value, no new bit
    with_id = plain._replace(message_id="orders:17")
    assert decode(encode(with_id)) == with_id
    assert encode(with_id)[5] == 0b100011


def test_a_message_id_goes_with_one_message_only():
    batch = pa.record_batch({"value": pa.array([b"a"], pa.binary())})
    for envelope in (
        Envelope(batch=batch, message_id="m"),
        Envelope(value=b"v", producer_id="p", sequence=0, message_id="m"),
    ):
        with pytest.raises(EnvelopeError, match="a message id goes with one message"):
            encode(envelope)
    with pytest.raises(EnvelopeError, match="1 to 256 bytes"):
        encode(Envelope(value=b"v", message_id="x" * 257))
    # Hand-made: the flag beside a producer does not decode (so it is stored as plain).
    raw = bytearray(encode(Envelope(value=b"v", producer_id="p", sequence=0)))
    raw[5] |= 0b100000
    with pytest.raises(EnvelopeError, match="invalid envelope flags"):
        decode(bytes(raw))


@pytest.mark.parametrize(
    ("message_id", "problem"),
    [
        ("", "1 to 256 bytes of UTF-8, got '' (0 bytes)"),
        ("é" * 129, "(258 bytes)"),
        ("\udc80", "is not valid UTF-8"),
        (b"bytes", "must be a string, got b'bytes'"),
        (None, "must be a string, got None"),
    ],
)
def test_bad_message_ids_are_named(message_id, problem):
    assert problem in message_id_problem(message_id)
    with pytest.raises(InvalidArgumentError, match="message_id"):
        validate_message_id(message_id)


def test_good_message_ids():
    for message_id in ("a", "x" * 256, "é" * 128, "orders:17 / ünïcode"):
        assert message_id_problem(message_id) is None
        assert validate_message_id(message_id) == message_id


def test_message_ids_are_read_from_a_headers_column():
    headers = pa.array(
        [
            None,
            [{"key": "Nats-Msg-Id", "value": b"a"}, {"key": "Nats-Msg-Id", "value": b"second"}],
            [],
            [{"key": "nats-msg-id", "value": b"case matters"}, {"key": "Nats-Msg-Id", "value": b"b\xff"}],
            [{"key": "Nats-Msg-Id", "value": b""}],
        ],
        HEADER_TYPE,
    )
    assert message_ids_in(headers) == ([1, 3], ["a", "b\ufffd"])
    assert message_ids_in(headers.slice(2)) == ([1], ["b\ufffd"])
    assert message_ids_in(pa.nulls(3, HEADER_TYPE)) == ([], [])


def test_pub_acks_parse_as_nats_py_reads_them():
    ok = json.loads(encode_pub_ack(Ack("orders", 2, 41, 41)))
    assert ok == {"stream": "orders", "partition": 2, "seq": 41, "duplicate": False, "offset": 41}
    assert PubAck.from_response(ok) == PubAck(stream="orders", seq=41, duplicate=False)
    duplicate = json.loads(encode_pub_ack(Ack("orders", 0, 3, 3, "", ErrorCode.DUPLICATE)))
    assert (duplicate["seq"], duplicate["duplicate"]) == (3, True)


@pytest.mark.parametrize(
    ("error", "override", "raised", "codes"),
    [
        (ErrorCode.TOO_LARGE, None, BadRequestError, (400, 10054)),
        (ErrorCode.INVALID_ARGUMENT, STREAM_MISMATCH, BadRequestError, (400, 10060)),
        (ErrorCode.NOT_ENOUGH_REPLICAS, None, ServiceUnavailableError, (503, 10008)),
        (ErrorCode.STORAGE, None, ServiceUnavailableError, (503, 10077)),
        (ErrorCode.PRODUCER_FENCED, None, ServerError, (500, 10051)),
    ],
)
def test_refusals_raise_nats_py_error_types(error, override, raised, codes):
    body = json.loads(encode_pub_ack(Ack("s", 1, -1, -1, "", error, 'why, with "quotes"'), override))
    assert (body["stream"], body["partition"]) == ("s", 1)
    with pytest.raises(raised) as caught:
        APIError.from_error(body["error"])
    assert (caught.value.code, caught.value.err_code) == codes
    assert caught.value.description == 'why, with "quotes"'


def test_stream_window_options_are_checked_and_default_as_in_jetstream():
    config = StreamConfig(name="s", subject="s")
    assert (config.duplicate_window, config.duplicate_max_ids) == (120.0, 1_000_000)
    old = {k: v for k, v in config.to_json().items() if not k.startswith("duplicate_")}
    assert StreamConfig.from_json(old) == config  # metadata stored before the options existed
    assert (
        StreamConfig.from_json(
            StreamConfig(name="s", subject="s", duplicate_window=0).to_json()
        ).duplicate_window
        == 0
    )
    for options, message in [
        (
            {"duplicate_window": -0.5},
            "duplicate_window must be a number of seconds from 0 to 604800, got -0.5",
        ),
        ({"duplicate_window": True}, "got True"),
        ({"duplicate_window": float("nan")}, "got nan"),
        (
            {"duplicate_max_ids": 10**9},
            "duplicate_max_ids must be a positive integer up to 100000000, got 1000000000",
        ),
        ({"duplicate_max_ids": 1.5}, "got 1.5"),
    ]:
        with pytest.raises(InvalidArgumentError) as refused:
            StreamConfig(name="s", subject="s", **options)
        assert message in str(refused.value)
