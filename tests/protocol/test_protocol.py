"""Pure protocol codecs: no server needed."""

from __future__ import annotations

import contextlib
import itertools

import pyarrow as pa
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pyspark_jetstream.client.partitioners import RoundRobin, key_hash
from pyspark_jetstream.protocol.ack import Ack, decode_ack, decode_acks, encode_ack, encode_acks
from pyspark_jetstream.protocol.envelope import (
    AckPolicy,
    BatchTooLargeError,
    Envelope,
    EnvelopeError,
    decode,
    encode,
    producer_position,
    split_position,
)
from pyspark_jetstream.protocol.errors import (
    ErrorCode,
    InvalidArgumentError,
    MessageTooLargeError,
    StorageError,
    error_from_code,
)
from pyspark_jetstream.protocol.flight import (
    ReadRequest,
    StartPosition,
    error_from_message,
    error_message,
    parse_response_metadata,
    response_metadata,
)
from pyspark_jetstream.protocol.ipc import decoded_size
from pyspark_jetstream.protocol.read_shape import ColumnFilter
from pyspark_jetstream.protocol.streams import StreamConfig, validate_stream_name, validate_subject
from pyspark_jetstream.protocol.subjects import subject_matches, subjects_overlap

TEXT = st.text(max_size=20)
BYTES = st.binary(max_size=50)


@st.composite
def envelopes(draw) -> Envelope:
    with_producer = draw(st.booleans())
    target = draw(st.one_of(st.none(), st.tuples(TEXT, st.integers(0, 2**32 - 1))))
    batch = None
    value = draw(st.one_of(st.none(), BYTES))
    if draw(st.booleans()):
        values = draw(st.lists(st.one_of(st.none(), BYTES), min_size=1, max_size=5))
        batch = pa.record_batch({"value": pa.array(values, pa.binary())})
        value = None
    return Envelope(
        value=value,
        key=draw(st.one_of(st.none(), BYTES)),
        headers=tuple(draw(st.lists(st.tuples(TEXT, BYTES), max_size=4))),
        ack_inbox=draw(st.one_of(st.none(), st.text(min_size=1, max_size=20))),
        correlation_id=draw(TEXT),
        ack_policy=draw(st.sampled_from(AckPolicy)),
        producer_id=draw(TEXT) if with_producer else None,
        sequence=draw(st.integers(0, 2**32 - 1)) if with_producer else None,
        producer_epoch=draw(st.integers(0, 2**31 - 1)) if with_producer else 0,
        batch=batch,
        stream=target[0] if target else None,
        partition=target[1] if target else None,
        message_id=None
        if batch is not None or with_producer
        else draw(st.one_of(st.none(), st.text(min_size=1, max_size=30))),
    )


@given(envelopes())
def test_envelope_round_trip(envelope):
    decoded = decode(encode(envelope))
    if envelope.batch is not None:
        assert decoded.batch.equals(envelope.batch)
        assert decoded.message_count == envelope.message_count == envelope.batch.num_rows
        envelope, decoded = envelope._replace(batch=None), decoded._replace(batch=None)
    assert decoded == envelope


@given(st.binary(max_size=300))
def test_decoder_only_ever_raises_envelope_error(payload):
    with contextlib.suppress(EnvelopeError):
        decode(payload)


@given(envelopes(), st.data())
def test_any_corruption_of_an_envelope_is_rejected_or_decodes_cleanly(envelope, data):
    raw = bytearray(encode(envelope))
    position = data.draw(st.integers(0, len(raw) - 1))
    raw[position] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(EnvelopeError):
        decode(bytes(raw))


def test_envelope_encoding_errors_are_clear():
    with pytest.raises(EnvelopeError, match="either one value or a batch"):
        encode(Envelope(value=b"x", batch=pa.record_batch({"value": [b"y"]})))
    with pytest.raises(EnvelopeError, match="go together"):
        encode(Envelope(value=b"x", producer_id="p"))
    with pytest.raises(EnvelopeError, match="batch needs a 'value' column"):
        decode(encode(Envelope(batch=pa.record_batch({"v": [b"y"]}))))
    with pytest.raises(EnvelopeError, match="target stream and partition go together"):
        encode(Envelope(value=b"x", stream="s"))
    for field, bad in [("sequence", -1), ("sequence", 2**32), ("producer_epoch", 2**31)]:
        fields = {"producer_id": "p", "sequence": 0, field: bad}
        with pytest.raises(EnvelopeError, match="must be an integer from 0 to"):
            encode(Envelope(value=b"x", **fields))


def test_producer_positions_order_by_epoch_then_sequence():
    assert producer_position(1, 0) > producer_position(0, 2**32 - 1)
    assert split_position(producer_position(2**31 - 1, 2**32 - 1)) == (2**31 - 1, 2**32 - 1)
    assert producer_position(2**31 - 1, 2**32 - 1) == 2**63 - 1  # fits the int64 column


@pytest.mark.parametrize("codec", [None, "lz4", "zstd"])
def test_decoded_size_is_read_from_headers_not_by_decompressing(codec):
    batch = pa.record_batch({"value": pa.array([b"\0" * 100_000] * 40, pa.binary())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression=codec)) as w:
        w.write_batch(batch)
        w.write_batch(batch.slice(0, 3))
    stream = sink.getvalue()
    expected = batch.nbytes + batch.slice(0, 3).nbytes
    assert expected <= decoded_size(stream) <= expected + 64  # buffers are padded to 8 bytes
    envelope = encode(Envelope(batch=batch, ack_inbox="in", correlation_id="c"))
    with pytest.raises(BatchTooLargeError, match="decodes to") as info:
        decode(envelope, max_batch_bytes=batch.nbytes - 1)
    assert info.value.header.ack_inbox == "in" and info.value.header.correlation_id == "c"
    assert decode(envelope, max_batch_bytes=batch.nbytes + 64).batch.equals(batch)


@given(st.binary(max_size=300))
def test_decoded_size_raises_only_value_error(data):
    with contextlib.suppress(ValueError):
        decoded_size(b"\x00" + data)
        decoded_size(b"\xff\xff\xff\xff" + data)


def test_subject_matching_and_overlap():
    assert subject_matches("a.*.c", "a.b.c") and not subject_matches("a.*.c", "a.b.c.d")
    assert subject_matches("a.>", "a.b.c") and not subject_matches("a.>", "a")
    assert subject_matches(">", "x") and not subject_matches("a", "a.b")
    overlapping = [("a.>", "a.*.b"), (">", "a"), ("a.*", "*.b"), ("a", "a"), ("*", "*")]
    apart = [("a.>", "a"), ("a.*", "a.b.c"), ("a.b", "a.c"), ("a", "a.b")]
    for x, y in overlapping:
        assert subjects_overlap(x, y) and subjects_overlap(y, x), (x, y)
    for x, y in apart:
        assert not subjects_overlap(x, y) and not subjects_overlap(y, x), (x, y)


PATTERN_TOKENS = st.lists(st.sampled_from(["a", "b", "*", ">"]), min_size=1, max_size=3)


@given(PATTERN_TOKENS, PATTERN_TOKENS)
def test_overlap_agrees_with_matching_on_small_alphabets(x, y):
    assume(">" not in x[:-1] and ">" not in y[:-1])
    left, right = ".".join(x), ".".join(y)
    concrete = [".".join(t) for n in range(1, 5) for t in itertools.product("ab", repeat=n)]
    witness = any(subject_matches(left, c) and subject_matches(right, c) for c in concrete)
    assert subjects_overlap(left, right) == witness


def test_ack_round_trip_and_strictness():
    ack = Ack("s", 2, 10, 12, "c-1", ErrorCode.DUPLICATE, "")
    assert decode_ack(encode_ack(ack)) == ack and ack.ok and ack.duplicate
    assert not Ack("s", 0, -1, -1, "", ErrorCode.TOO_LARGE).ok
    batch = Ack("s", 0, 3, 5, "c-2", ErrorCode.OK, "", duplicates=((1, 0), (2, 1)))
    assert decode_acks(encode_acks([ack, batch])) == [ack, batch]
    wire = encode_ack(ack)
    for bad in [
        b"nope",
        b"[]",
        b'{"stream": "s"}',
        wire.replace(b'"duplicate"', b'"what"'),  # no such error code
        wire.replace(b'"duplicate"', b"7"),  # not a code's name at all
        wire.replace(b'"partition":2', b'"partition":"two"'),
        wire.replace(b'"message":""', b'"message":"","duplicates":[[1]]'),
        wire.replace(b'"message":""', b'"message":"","extra":1'),
    ]:
        with pytest.raises(InvalidArgumentError, match="not an ack"):
            decode_ack(bad)


def test_read_request_round_trip_and_strict_parsing():
    request = ReadRequest("s", 3, StartPosition("timestamp", 12.5), 10, 1000, 2.0)
    assert ReadRequest.from_ticket(request.to_ticket()) == request
    assert ReadRequest.from_ticket(b'{"stream": "s"}') == ReadRequest("s")
    projected = ReadRequest.from_ticket(b'{"stream": "s", "columns": ["value", "key"]}')
    assert projected.columns == ("offset", "key", "value")  # log order, offset always included
    typed = ReadRequest.from_ticket(b'{"stream": "s", "columns": ["amount", "key", "amount", "region"]}')
    assert typed.columns == ("offset", "key", "amount", "region")  # fields after: the broker checks them
    filtered = ReadRequest(
        "s", filters=(ColumnFilter("in", "region", ("eu", "us")), ColumnFilter("is_null", "x"))
    )
    assert ReadRequest.from_ticket(filtered.to_ticket()) == filtered
    for ticket, message in [
        (b"{", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"stream": "s", "colour": 1}', "unknown ticket field.*colour"),
        (b'{"partition": 1}', "needs a 'stream'"),
        (b'{"stream": "s", "partition": -1}', "partition must be a non-negative"),
        (b'{"stream": "s", "max_records": 0}', "max_records must be a positive"),
        (b'{"stream": "s", "max_wait": 1000}', "max_wait must be 0 to 300"),
        (b'{"stream": "s", "start": {"offset": -4}}', "invalid start"),
        (b'{"stream": "s", "start": "newest"}', "invalid start"),
        (b'{"stream": "s", "columns": ["value", ""]}', "columns must be a non-empty list"),
        (b'{"stream": "s", "columns": []}', "columns must be a non-empty list"),
        (b'{"stream": "s", "filters": [["like", "a", "b%"]]}', "unknown filter op 'like'"),
        (b'{"stream": "s", "filters": [["eq", "a"]]}', "filter 'eq' on 'a' needs a value"),
        (b'{"stream": "s", "filters": [["eq", "a", null]]}', "a value is a boolean, number or string"),
        (b'{"stream": "s", "filters": [["in", "a", []]]}', "needs a list of 1 to"),
        (b'{"stream": "s", "filters": [["is_null", "a", 1]]}', "takes no value"),
        (b'{"stream": "s", "filters": {"eq": 1}}', "filters must be a list"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            ReadRequest.from_ticket(ticket)


def test_response_metadata_round_trip():
    metadata = response_metadata(next_offset=5, high_watermark=9, log_start_offset=0, log_end_offset=9)
    encoded = {k.encode(): v.encode() for k, v in metadata.items()}
    assert parse_response_metadata(encoded) == {
        "next_offset": 5,
        "high_watermark": 9,
        "log_start_offset": 0,
        "log_end_offset": 9,
    }


def test_error_codes_survive_the_wire():
    text = error_message(MessageTooLargeError("message is 5 bytes")) + ". Detail: Failed"
    error = error_from_message(text)
    assert isinstance(error, MessageTooLargeError) and str(error) == "message is 5 bytes"
    assert error_from_message("some other failure") is None
    assert isinstance(error_from_code("no_such_code", "x"), StorageError)


@pytest.mark.parametrize("name", ["orders", "a", "Orders-2024.v1", "x_y"])
def test_valid_stream_names(name):
    assert validate_stream_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", ".", "..", "a/b", "a b", "x" * 201, "__internal", 7])
def test_invalid_stream_names_are_named(name):
    with pytest.raises(InvalidArgumentError, match="stream name"):
        validate_stream_name(name)


@pytest.mark.parametrize("subject", ["a", "a.b.c", "a.*.c", "a.>", "*", ">", "orders-1.eu_west"])
def test_valid_subjects(subject):
    assert validate_subject(subject) == subject


@pytest.mark.parametrize("subject", ["", "a..b", ".a", "a.", "a b", "a.>.b", "a*", "a.b>", "\t"])
def test_invalid_subjects_are_named(subject):
    with pytest.raises(InvalidArgumentError, match="subject"):
        validate_subject(subject)


def test_stream_config_validation_and_differences():
    config = StreamConfig(name="s", subject="s", partitions=2)
    assert config.partition_subjects() == ["s", "s.1"]
    assert StreamConfig.from_json(config.to_json()) == config
    other = StreamConfig(name="s", subject="s", partitions=3, compaction=True)
    assert config.differences(other) == ["partitions: 2 != 3", "compaction: False != True"]
    for options, message in [
        ({"partitions": 0}, "partitions must be a positive integer"),
        ({"subject": "s.>", "partitions": 2}, "give it one partition"),
        ({"retention_bytes": -1}, "retention_bytes must be a non-negative"),
        ({"compaction": "yes"}, "compaction must be true or false"),
        ({"group": "bad group"}, "invalid group 'bad group'"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            StreamConfig(**{"name": "s", "subject": "s", **options})
    with pytest.raises(InvalidArgumentError, match="unknown stream option.*colour"):
        StreamConfig.from_json({"name": "s", "subject": "s", "colour": "red"})


def test_partitioners():
    assert key_hash(None, 4) == 0
    assert key_hash(b"order-1", 4) == key_hash(b"order-1", 4)
    assert len({key_hash(b"k%d" % i, 4) for i in range(100)}) == 4
    robin = RoundRobin()
    assert [robin(b"same", 3) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


@given(
    stream=st.text(max_size=30),
    correlation_id=st.text(max_size=30),
    message=st.text(max_size=30),
    offsets=st.tuples(st.integers(-1, 2**62), st.integers(-1, 2**62)),
    error=st.sampled_from(ErrorCode),
)
def test_acks_round_trip_any_text(stream, correlation_id, message, offsets, error):
    ack = Ack(stream, 3, offsets[0], offsets[1], correlation_id, error, message)
    assert decode_ack(encode_ack(ack)) == ack
    assert decode_acks(encode_acks([ack, ack])) == [ack, ack]
    assert decode_acks(encode_acks([ack])) == [ack]


def test_an_ack_of_a_batch_with_repeated_rows_round_trips_and_places_every_row():
    ack = Ack("s", 0, 10, 11, "c", duplicates=((1, 4), (3, 10)))
    assert b'"duplicates":[[1,4],[3,10]]' in encode_ack(ack)
    assert decode_ack(encode_ack(ack)) == ack and decode_acks(encode_acks([ack, ack])) == [ack, ack]
    assert ack.row_offsets(4) == [10, 4, 11, 10]
    with pytest.raises(ValueError, match="acks a batch of 4 rows, not 5"):
        ack.row_offsets(5)
    assert b"duplicates" not in encode_ack(Ack("s", 0, 1, 1, "c"))
    everything_repeated = Ack("s", 0, 2, 7, "c", ErrorCode.DUPLICATE, duplicates=((0, 7), (1, 2)))
    assert everything_repeated.row_offsets(2) == [7, 2]
    # A repeated producer sequence: the original batch's offsets, row by row.
    assert Ack("s", 0, 5, 7, "c", ErrorCode.DUPLICATE).row_offsets(3) == [5, 6, 7]
    with pytest.raises(ValueError, match="not stored"):
        Ack("s", 0, -1, -1, "c", ErrorCode.STORAGE, "disk full").row_offsets(1)
