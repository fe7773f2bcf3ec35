"""Decoding: what one NATS message asks of a partition, as a value, with no I/O.

:func:`read` turns a message -- its subject, payload, reply subject and NATS
headers -- into one of four answers: a :class:`Single` message to coalesce
with others (a plain message, or an envelope of one message), a
:class:`Whole` envelope to store as its own batch (an Arrow batch, or an
idempotent producer's), a :class:`Refused` one with the ack that says why
(an envelope over the partition's ``max_batch_bytes``, a message over the
stream's ``max_message_bytes``, a bad message id, a ``Nats-Expected-*``
header the partition does not satisfy), or ``None``: a message that names,
in ``Nats-Expected-Stream``, another stream that receives it too, and is left
to that stream -- neither stored nor acked here.  A message id
(``Nats-Msg-Id``, or an envelope's) is read here and dropped when the
stream's ``duplicate_window`` turns de-duplication off.  Where the ack goes is
decided here too (:class:`~.replies.AckTarget`): only the partition an
envelope names acks it; other streams store a silent copy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import pyarrow as pa

from pyspark_jetstream.protocol.ack import STREAM_MISMATCH
from pyspark_jetstream.protocol.array_builders import constant_ints, constant_strings
from pyspark_jetstream.protocol.envelope import (
    TYPED_COLUMN,
    AckPolicy,
    BatchTooLargeError,
    Envelope,
    EnvelopeError,
    decode,
    looks_like_envelope,
    producer_position,
)
from pyspark_jetstream.protocol.errors import ErrorCode
from pyspark_jetstream.protocol.headers import (
    EXPECTED_STREAM_HEADER,
    MSG_ID_HEADER,
    UNSUPPORTED_EXPECTATIONS,
    decoded_id,
    message_id_problem,
    message_ids_in,
)
from pyspark_jetstream.protocol.schema import HEADER_TYPE
from pyspark_jetstream.protocol.streams import StreamConfig, partition_subject
from pyspark_jetstream.protocol.subjects import subject_matches

from .port import LogTerms, StreamLookup
from .replies import AckTarget


class Message(Protocol):
    """A NATS message as a subscription hands it over (``nats.aio.msg.Msg`` is one)."""

    @property
    def subject(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def reply(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str] | None: ...


class Single(NamedTuple):
    """One message to coalesce with others into a stored batch."""

    record: Any
    """As :attr:`LogTerms.record` built it."""
    size: int
    target: AckTarget | None
    message_id: str | None
    """Its id, when de-duplication by id is on."""
    not_envelope: EnvelopeError | None = None
    """Why a payload that looked like an envelope is stored as plain (for a debug line)."""


class Whole(NamedTuple):
    """An envelope stored as its own batch: an Arrow batch, or an idempotent producer's."""

    envelope: Envelope
    table: pa.Table
    """Its messages in the log's input columns."""
    message_ids: list[tuple[str, int]]
    """The ids its rows carry, with their row numbers (none when de-duplication is off)."""
    target: AckTarget | None
    targeted: bool
    """Whether this partition is the one the envelope names (or it names none)."""


_new_tuple = tuple.__new__


class Refused(NamedTuple):
    """A message not stored, and the ack that says why."""

    target: AckTarget | None
    error: ErrorCode
    message: str
    jetstream_error: tuple[int, int] | None
    """JetStream's (status, error code) for a plain request's reply, if it has its own."""
    level: int
    """Of the log line that tells the refusal."""
    log: tuple[Any, ...]
    """That line: a ``%`` format and its arguments."""


@dataclass(frozen=True, slots=True)
class Reader:
    """What decoding needs to know of the partition a message reached."""

    config: StreamConfig
    number: int
    max_batch_bytes: int
    """The largest envelope batch the partition takes."""
    streams: StreamLookup
    terms: LogTerms

    @property
    def name(self) -> str:
        """``stream/partition``, as log lines name it."""
        return f"{self.config.name}/{self.number}"


def read(reader: Reader, msg: Message, received: float) -> Single | Whole | Refused | None:
    """What ``msg`` asks of the partition (see the module docstring); ``received`` is when it
    arrived (``perf_counter``), for the ack latency."""
    subject, data = msg.subject, msg.data
    not_envelope = None
    if looks_like_envelope(data):
        try:
            envelope = decode(data, max_batch_bytes=reader.max_batch_bytes)
        except BatchTooLargeError as exc:
            text = str(exc)
            target = ack_target(reader, exc.header, received)
            log = ("refusing an envelope on %s for %s: %s", subject, reader.name, exc)
            return Refused(target, ErrorCode.TOO_LARGE, text, None, logging.WARNING, log)
        except EnvelopeError as exc:
            not_envelope = exc
        else:
            return _enveloped(reader, envelope, subject, received)
    return _plain(reader, msg, received, not_envelope)


def _plain(
    reader: Reader, msg: Message, received: float, not_envelope: EnvelopeError | None
) -> Single | Refused | None:
    """A plain NATS message, stored as it is, its NATS headers as the record's."""
    subject, data, reply, headers = msg.subject, msg.data, msg.reply, msg.headers
    target = AckTarget(reply, "", True, received, True) if reader.config.ack_reply and reply else None
    if not headers:
        record = reader.terms.record(data, subject=subject, reply=reply or None)
        return _single(reader, record, target, None, not_envelope)
    refused = expectations_refused(reader, headers, subject, target)
    if refused is False:
        return None  # left to the stream it names
    if refused is not None:
        return refused
    stored = tuple((k, v.encode()) for k, v in headers.items())
    record = reader.terms.record(data, headers=stored, subject=subject, reply=reply or None)
    return _single(reader, record, target, headers.get(MSG_ID_HEADER) or None, not_envelope)


def _enveloped(reader: Reader, envelope: Envelope, subject: str, received: float) -> Single | Whole | Refused:
    target = ack_target(reader, envelope, received)
    if envelope.batch is None and envelope.producer_id is None:
        headers = envelope.headers
        message_id = envelope.message_id
        if message_id is not None:
            headers = with_message_id(headers, message_id)
        elif headers:
            message_id = next((decoded_id(v) for k, v in headers if k == MSG_ID_HEADER), None) or None
        record = reader.terms.record(envelope.value, key=envelope.key, headers=headers, subject=subject)
        return _single(reader, record, target, message_id, None)
    return _whole(reader, envelope, subject, target, targeted(reader, envelope))


def _single(
    reader: Reader,
    record: Any,
    target: AckTarget | None,
    message_id: str | None,
    not_envelope: EnvelopeError | None,
) -> Single | Refused:
    """One message to coalesce -- unless it is over ``max_message_bytes`` or its id is bad."""
    size = reader.terms.size(record)
    limit = reader.config.max_message_bytes
    if size > limit:
        text = (
            f"message size exceeds maximum allowed: the message is {size} bytes, over "
            f"max_message_bytes={limit}"
        )
        log = ("refusing a %d-byte message on %s: over max_message_bytes=%d", size, reader.name, limit)
        return Refused(target, ErrorCode.TOO_LARGE, text, None, logging.WARNING, log)
    if message_id is not None and reader.config.duplicate_window <= 0:
        message_id = None  # de-duplication by id is off
    if message_id is not None:
        problem = message_id_problem(message_id)
        if problem is not None:
            return _refused(reader, target, ErrorCode.INVALID_ARGUMENT, problem)
    # One per message: built as the tuple it is, at half the cost of Single(...).
    return _new_tuple(Single, (record, size, target, message_id, not_envelope))


def expectations_refused(
    reader: Reader, headers: Mapping[str, str], subject: str, target: AckTarget | None
) -> Refused | Literal[False] | None:
    """What a plain message's JetStream headers say: ``None``, store it; a :class:`Refused`, refuse
    it; ``False``, leave it to the stream it names, which receives it too."""
    for name in UNSUPPORTED_EXPECTATIONS:
        if name in headers:
            return _refused(
                reader,
                target,
                ErrorCode.INVALID_ARGUMENT,
                f"bad request: the {name} header asks for a check pyspark-jetstream does not "
                f"make; nothing was stored on {subject!r}",
            )
    config = reader.config
    expected = headers.get(EXPECTED_STREAM_HEADER)
    if expected is None or expected == config.name:
        return None
    other = reader.streams(expected)
    if (
        other is not None
        and (other.group is None or other.group != config.group)
        and any(subject_matches(pattern, subject) for pattern in other.partition_subjects())
    ):
        return False  # that stream receives it too: it stores and acks it
    return _refused(
        reader,
        target,
        ErrorCode.INVALID_ARGUMENT,
        f"expected stream does not match: the message on {subject!r} names stream {expected!r} "
        f"in {EXPECTED_STREAM_HEADER}, but it reached stream {config.name!r}"
        + ("" if other is not None else f", and no stream {expected!r} exists"),
        STREAM_MISMATCH,
    )


def _refused(
    reader: Reader,
    target: AckTarget | None,
    error: ErrorCode,
    message: str,
    jetstream_error: tuple[int, int] | None = None,
) -> Refused:
    log = ("refusing a message for %s: %s", reader.name, message)
    return Refused(target, error, message, jetstream_error, logging.INFO, log)


def targeted(reader: Reader, envelope: Envelope) -> bool:
    """Whether this partition is the one the envelope names (or it names none)."""
    return envelope.stream is None or (
        envelope.stream == reader.config.name and envelope.partition == reader.number
    )


def ack_target(reader: Reader, envelope: Envelope, received: float) -> AckTarget | None:
    """Where to ack: only the targeted partition acks; other streams store a silent copy."""
    if not envelope.ack_inbox or envelope.ack_policy is AckPolicy.NONE or not targeted(reader, envelope):
        return None
    committed = envelope.ack_policy is AckPolicy.ALL
    return AckTarget(envelope.ack_inbox, envelope.correlation_id, committed, received)


def put_whole(reader: Reader, envelope: Envelope) -> Whole | Refused:
    """A chunk written over Flight (an envelope batch that came without an envelope, see
    :mod:`pyspark_jetstream.protocol.put`) as this partition stores it: as the same envelope on the
    partition's subject would be -- or refused if it is over the partition's batch limit."""
    assert envelope.batch is not None
    size = envelope.batch.get_total_buffer_size()  # its buffers (nbytes: the same, 50x slower)
    if size > reader.max_batch_bytes:
        text = f"the chunk is {size} bytes, over the limit of {reader.max_batch_bytes} for {reader.name}"
        return _refused(reader, None, ErrorCode.TOO_LARGE, text)
    return _whole(reader, envelope, partition_subject(reader.config.subject, reader.number), None, True)


def _whole(
    reader: Reader, envelope: Envelope, subject: str, target: AckTarget | None, targeted: bool
) -> Whole:
    """An envelope batch as stored on ``subject``, with its rows' message ids (when the stream
    de-duplicates by id)."""
    table = envelope_table(envelope, subject)
    ids = ids_of(table) if reader.config.duplicate_window > 0 else []
    return Whole(envelope, table, ids, target, targeted)


def with_message_id(headers: tuple[tuple[str, bytes], ...], message_id: str) -> tuple[tuple[str, bytes], ...]:
    """``headers`` with ``Nats-Msg-Id`` set to ``message_id`` (it is stored as that header)."""
    kept = tuple((k, v) for k, v in headers if k != MSG_ID_HEADER)
    return (*kept, (MSG_ID_HEADER, message_id.encode()))


def ids_of(table: pa.Table) -> list[tuple[str, int]]:
    """The message ids the rows of ``table`` carry, with their row numbers."""
    if "headers" not in table.column_names:
        return []
    rows, ids = message_ids_in(table.column("headers").combine_chunks())
    return list(zip(ids, rows, strict=True))


def envelope_table(envelope: Envelope, subject: str) -> pa.Table:
    """An envelope's messages as an Arrow table in the log's input columns (a typed batch's: its
    ``typed`` column instead of ``value``, which the partition renders from it)."""
    if envelope.batch is None:
        headers = [[{"key": k, "value": v} for k, v in envelope.headers] or None]
        batch = pa.record_batch(
            {
                "key": pa.array([envelope.key], pa.binary()),
                "value": pa.array([envelope.value], pa.binary()),
                "headers": pa.array(headers, HEADER_TYPE),
            }
        )
    else:
        batch = envelope.batch
    n = batch.num_rows
    columns = {name: batch.column(name) for name in batch.schema.names}
    columns["subject"] = constant_strings(subject, n)
    if envelope.producer_id is not None and envelope.sequence is not None:
        columns["producer_id"] = constant_strings(envelope.producer_id, n)
        position = producer_position(envelope.producer_epoch, envelope.sequence)
        columns["sequence"] = constant_ints(position, n, pa.int64())
    table = pa.table(columns)
    if TYPED_COLUMN in columns:  # its field says the schema version: kept for the partition
        index = table.schema.get_field_index(TYPED_COLUMN)
        table = table.set_column(index, batch.schema.field(TYPED_COLUMN), columns[TYPED_COLUMN])
    return table
