"""Decoding a NATS message into what a partition's ingest does with it: pure, no server needed."""

from __future__ import annotations

import logging
from typing import NamedTuple

import pyarrow as pa
import pytest

from broker_node.ingest.decoding import Reader, Refused, Single, Whole, read
from broker_node.ingest.replies import AckTarget
from broker_node.log import Record
from broker_node.log_terms import LOG_TERMS
from pyspark_jetstream.protocol.ack import STREAM_MISMATCH
from pyspark_jetstream.protocol.envelope import AckPolicy, Envelope, encode
from pyspark_jetstream.protocol.errors import ErrorCode
from pyspark_jetstream.protocol.schema import HEADER_TYPE
from pyspark_jetstream.protocol.streams import StreamConfig

ORDERS = StreamConfig(name="orders", subject="orders", partitions=2)


class Msg(NamedTuple):
    subject: str
    data: bytes
    reply: str = ""
    headers: dict[str, str] | None = None


def reader(config: StreamConfig = ORDERS, *others: StreamConfig, number: int = 0) -> Reader:
    streams = {c.name: c for c in (config, *others)}
    return Reader(config, number, 1024 * 1024, streams.get, LOG_TERMS)


SUBJECT = ORDERS.partition_subjects()[0]


def test_a_plain_message_is_one_record_acked_alone_like_jetstream_when_it_has_a_reply():
    got = read(reader(), Msg(SUBJECT, b"hello", "_INBOX.r"), 5.0)
    assert got == Single(
        Record(b"hello", subject=SUBJECT, reply="_INBOX.r"),
        LOG_TERMS.size(Record(b"hello", subject=SUBJECT, reply="_INBOX.r")),
        AckTarget("_INBOX.r", "", True, 5.0, True),
        None,
    )
    quiet = read(reader(), Msg(SUBJECT, b"hello"), 5.0)
    assert isinstance(quiet, Single) and quiet.target is None and quiet.record.reply is None
    no_reply = StreamConfig(name="orders", subject="orders", partitions=2, ack_reply=False)
    unacked = read(reader(no_reply), Msg(SUBJECT, b"hello", "_INBOX.r"), 5.0)
    assert isinstance(unacked, Single) and unacked.target is None


def test_a_plain_message_keeps_its_headers_and_its_id_unless_the_window_is_off():
    msg = Msg(SUBJECT, b"v", "_INBOX.r", {"Nats-Msg-Id": "m-1", "x": "y"})
    got = read(reader(), msg, 0.0)
    assert isinstance(got, Single) and got.message_id == "m-1"
    assert got.record.headers == (("Nats-Msg-Id", b"m-1"), ("x", b"y"))
    off = StreamConfig(name="orders", subject="orders", partitions=2, duplicate_window=0)
    stored = read(reader(off), msg, 0.0)
    assert isinstance(stored, Single) and stored.message_id is None
    assert stored.record.headers == got.record.headers  # still stored as a header


def test_a_bad_message_id_is_refused():
    got = read(reader(), Msg(SUBJECT, b"v", "_INBOX.r", {"Nats-Msg-Id": "x" * 257}), 0.0)
    assert isinstance(got, Refused) and got.error is ErrorCode.INVALID_ARGUMENT
    assert "256" in got.message and got.target == AckTarget("_INBOX.r", "", True, 0.0, True)


@pytest.mark.parametrize("header", ["Nats-Expected-Last-Sequence", "Nats-Expected-Last-Msg-Id"])
def test_an_expectation_the_broker_does_not_check_is_refused(header):
    got = read(reader(), Msg(SUBJECT, b"v", "_INBOX.r", {header: "3"}), 0.0)
    assert isinstance(got, Refused) and got.error is ErrorCode.INVALID_ARGUMENT
    assert header in got.message and got.jetstream_error is None and got.level == logging.INFO


def test_nats_expected_stream_stores_leaves_or_refuses():
    def expecting(stream: str) -> Msg:
        return Msg(SUBJECT, b"v", "_INBOX.r", {"Nats-Expected-Stream": stream})

    assert isinstance(read(reader(), expecting("orders"), 0.0), Single)
    # Another stream listening on the subject, not in this one's group: it stores and acks.
    audit = StreamConfig(name="audit", subject="orders", partitions=2)
    assert read(reader(ORDERS, audit), expecting("audit"), 0.0) is None
    # One that does not listen there, or none at all: JetStream's "stream does not match".
    elsewhere = StreamConfig(name="elsewhere", subject="other")
    for r, name, missing in ((reader(ORDERS, elsewhere), "elsewhere", False), (reader(), "ghost", True)):
        got = read(r, expecting(name), 0.0)
        assert isinstance(got, Refused) and got.error is ErrorCode.INVALID_ARGUMENT
        assert got.jetstream_error == STREAM_MISMATCH and "expected stream does not match" in got.message
        assert ("no stream 'ghost' exists" in got.message) is missing
    # The same load-balance group: one of the two gets it, so this one may not leave it.
    grouped = StreamConfig(name="orders", subject="orders", partitions=2, group="g")
    sibling = StreamConfig(name="sibling", subject="orders", partitions=2, group="g")
    assert isinstance(read(reader(grouped, sibling), expecting("sibling"), 0.0), Refused)


def test_a_message_over_max_message_bytes_is_refused_before_anything_else():
    small = StreamConfig(name="orders", subject="orders", partitions=2, max_message_bytes=100)
    got = read(reader(small), Msg(SUBJECT, b"x" * 200, "_INBOX.r"), 0.0)
    assert isinstance(got, Refused) and got.error is ErrorCode.TOO_LARGE
    assert "max_message_bytes=100" in got.message and got.level == logging.WARNING
    assert isinstance(read(reader(small), Msg(SUBJECT, b"x" * 10), 0.0), Single)


def test_an_envelope_of_one_message_is_acked_where_and_when_it_asks():
    envelope = Envelope(
        value=b"v", key=b"k", ack_inbox="_INBOX.a", correlation_id="7", ack_policy=AckPolicy.ALL
    )
    got = read(reader(), Msg(SUBJECT, encode(envelope)), 2.0)
    assert isinstance(got, Single) and got.message_id is None
    assert got.record == Record(b"v", key=b"k", headers=(), subject=SUBJECT)
    assert got.target == AckTarget("_INBOX.a", "7", True, 2.0)
    leader = read(reader(), Msg(SUBJECT, encode(envelope._replace(ack_policy=AckPolicy.LEADER))), 2.0)
    assert isinstance(leader, Single) and leader.target is not None and not leader.target.committed
    silent = read(reader(), Msg(SUBJECT, encode(envelope._replace(ack_policy=AckPolicy.NONE))), 2.0)
    assert isinstance(silent, Single) and silent.target is None
    # Another partition named: a silent copy here.
    other = read(reader(), Msg(SUBJECT, encode(envelope._replace(stream="orders", partition=1))), 2.0)
    assert isinstance(other, Single) and other.target is None
    mine = read(reader(number=1), Msg(SUBJECT, encode(envelope._replace(stream="orders", partition=1))), 2.0)
    assert isinstance(mine, Single) and mine.target is not None


def test_an_envelopes_message_id_becomes_its_nats_msg_id_header():
    envelope = Envelope(value=b"v", headers=(("Nats-Msg-Id", b"old"), ("a", b"b")), message_id="new")
    got = read(reader(), Msg(SUBJECT, encode(envelope)), 0.0)
    assert isinstance(got, Single) and got.message_id == "new"
    assert got.record.headers == (("a", b"b"), ("Nats-Msg-Id", b"new"))
    from_header = read(reader(), Msg(SUBJECT, encode(envelope._replace(message_id=None))), 0.0)
    assert isinstance(from_header, Single) and from_header.message_id == "old"


def test_a_batch_envelope_is_stored_whole_with_its_subject_and_the_ids_its_rows_carry():
    headers = pa.array(
        [[{"key": "Nats-Msg-Id", "value": b"a"}], None, [{"key": "Nats-Msg-Id", "value": b"c"}]], HEADER_TYPE
    )
    batch = pa.record_batch({"value": pa.array([b"1", b"2", b"3"], pa.binary()), "headers": headers})
    got = read(reader(), Msg(SUBJECT, encode(Envelope(batch=batch, ack_inbox="_INBOX.b"))), 0.0)
    assert isinstance(got, Whole) and got.targeted
    assert got.table.column("subject").to_pylist() == [SUBJECT] * 3
    assert got.message_ids == [("a", 0), ("c", 2)]
    assert got.target == AckTarget("_INBOX.b", "", False, 0.0)
    off = StreamConfig(name="orders", subject="orders", partitions=2, duplicate_window=0)
    unchecked = read(reader(off), Msg(SUBJECT, encode(Envelope(batch=batch))), 0.0)
    assert isinstance(unchecked, Whole) and unchecked.message_ids == []


def test_an_idempotent_producers_envelope_is_stored_whole_with_its_position():
    envelope = Envelope(value=b"v", producer_id="p", sequence=4, producer_epoch=1)
    got = read(reader(), Msg(SUBJECT, encode(envelope)), 0.0)
    assert isinstance(got, Whole)
    assert got.table.column("producer_id").to_pylist() == ["p"]
    assert got.table.column("sequence").to_pylist() == [(1 << 32) | 4]


def test_an_envelope_over_the_partitions_batch_limit_is_refused_to_its_inbox():
    batch = pa.record_batch({"value": pa.array([b"x" * 2048] * 4, pa.binary())})
    data = encode(Envelope(batch=batch, ack_inbox="_INBOX.big", correlation_id="9"))
    small = Reader(ORDERS, 0, 1024, lambda name: None, LOG_TERMS)
    got = read(small, Msg(SUBJECT, data), 1.0)
    assert isinstance(got, Refused) and got.error is ErrorCode.TOO_LARGE
    assert got.target == AckTarget("_INBOX.big", "9", False, 1.0) and got.level == logging.WARNING


def test_a_payload_that_only_looks_like_an_envelope_is_stored_as_plain():
    data = encode(Envelope(value=b"v"))[:-1]  # cut short
    got = read(reader(), Msg(SUBJECT, data), 0.0)
    assert isinstance(got, Single) and got.record.value == data and got.not_envelope is not None
