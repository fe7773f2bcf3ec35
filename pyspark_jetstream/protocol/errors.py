"""Error codes shared by broker and client, and the exceptions they map to.

One root, :class:`JetStreamError`, with two flags that retry loops read
instead of listing classes: ``retriable`` (the same request may succeed
later) and ``invalid_metadata`` (refresh cluster metadata -- who leads what --
before retrying).  Every error the broker reports (in an ack or a Flight
error) carries a stable code, and structured fields (stream, partition,
offset, leader, leader_address, ...) that survive the wire; the client turns
the code back into the same class through :data:`ERRORS_BY_CODE`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any


class ErrorCode(enum.Enum):
    """Stable codes on the wire (acks and Flight error messages)."""

    OK = "ok"
    DUPLICATE = "duplicate"
    TOO_LARGE = "too_large"
    NOT_LEADER = "not_leader"
    NOT_ENOUGH_REPLICAS = "not_enough_replicas"
    UNKNOWN_STREAM = "unknown_stream"
    STREAM_EXISTS = "stream_exists"
    OFFSET_OUT_OF_RANGE = "offset_out_of_range"
    INVALID_ARGUMENT = "invalid_argument"
    STORAGE = "storage"
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"
    OUT_OF_ORDER_SEQUENCE = "out_of_order_sequence"
    PRODUCER_FENCED = "producer_fenced"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    LIMIT_EXCEEDED = "limit_exceeded"


class JetStreamError(Exception):
    """Root of every pyspark-jetstream error a user sees.

    ``fields`` holds structured detail (``stream``, ``partition``,
    ``offset``, ``leader``, ``leader_address``...), each also readable as an
    attribute; ``None`` values are left out.
    """

    code = ErrorCode.STORAGE
    retriable = False
    invalid_metadata = False

    def __init__(self, message: str = "", **fields: object) -> None:
        super().__init__(message)
        self.fields: dict[str, object] = {k: v for k, v in fields.items() if v is not None}

    def __getattr__(self, name: str) -> object:
        fields = self.__dict__.get("fields", {})
        if name in fields:
            return fields[name]
        raise AttributeError(name)


class InvalidArgumentError(JetStreamError, ValueError):
    """A name, subject, option or request is malformed; the message says which."""

    code = ErrorCode.INVALID_ARGUMENT


class UnknownStreamError(JetStreamError, KeyError):
    """No stream (or partition) of that name exists."""

    code = ErrorCode.UNKNOWN_STREAM

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class StreamExistsError(JetStreamError):
    """A stream of that name exists with a different configuration."""

    code = ErrorCode.STREAM_EXISTS


class MessageTooLargeError(JetStreamError):
    """A message or batch is over the stream's size limit."""

    code = ErrorCode.TOO_LARGE


class NotLeaderError(JetStreamError):
    """This broker does not lead the partition; ask the leader.

    ``leader`` and ``leader_address`` name the leader where this broker knows it.
    """

    code = ErrorCode.NOT_LEADER
    retriable = True
    invalid_metadata = True


class NotEnoughReplicasError(JetStreamError):
    """Fewer brokers or in-sync replicas than the request needs."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS
    retriable = True


class OffsetOutOfRangeError(JetStreamError):
    """An offset outside the partition's stored range."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE
    retriable = True


class OutOfOrderSequenceError(JetStreamError):
    """An idempotent producer skipped a sequence: nothing was stored; resend from the one expected.

    Retriable: the earlier message failed or is still in flight, and resending
    the messages in order stores each once.
    """

    code = ErrorCode.OUT_OF_ORDER_SEQUENCE
    retriable = True


class ProducerFencedError(JetStreamError):
    """An idempotent producer wrote with an epoch older than one already stored: a zombie."""

    code = ErrorCode.PRODUCER_FENCED


class StorageError(JetStreamError):
    """The broker failed to store or read data (a full disk, an I/O error).

    Retriable: nothing was stored, and the usual causes pass (space is freed,
    leadership moves to a replica whose disk works).
    """

    code = ErrorCode.STORAGE
    retriable = True


class UnavailableError(JetStreamError):
    """A server (NATS or broker) cannot be reached."""

    code = ErrorCode.UNAVAILABLE
    retriable = True


class RequestTimeoutError(JetStreamError, TimeoutError):
    """No answer within the timeout."""

    code = ErrorCode.TIMEOUT
    retriable = True


class UnauthenticatedError(JetStreamError):
    """The broker needs credentials (a token or a client certificate) and got none it accepts."""

    code = ErrorCode.UNAUTHENTICATED


class PermissionDeniedError(JetStreamError):
    """The principal may not do this; the message names the principal, the action and the stream."""

    code = ErrorCode.PERMISSION_DENIED


class LimitExceededError(JetStreamError):
    """A per-principal or broker-wide limit is reached (open follow reads, readers waiting
    for data, open puts, streams).

    Not retried by the client: the limit holds until reads or puts close or an
    operator raises it, which a retry loop would only wait out.
    """

    code = ErrorCode.LIMIT_EXCEEDED


ERRORS_BY_CODE: dict[ErrorCode, type[JetStreamError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        UnknownStreamError,
        StreamExistsError,
        MessageTooLargeError,
        NotLeaderError,
        NotEnoughReplicasError,
        OffsetOutOfRangeError,
        StorageError,
        UnavailableError,
        RequestTimeoutError,
        OutOfOrderSequenceError,
        ProducerFencedError,
        UnauthenticatedError,
        PermissionDeniedError,
        LimitExceededError,
    )
}


def error_from_code(code: str, message: str, fields: dict[str, object] | None = None) -> JetStreamError:
    """The exception for a wire error ``code`` (an unknown code becomes a StorageError)."""
    try:
        cls = ERRORS_BY_CODE[ErrorCode(code)]
    except (ValueError, KeyError):
        cls = StorageError
    return cls(message, **(fields or {}))


SHOWN_LENGTH = 60
"""How much of a bad value an error message shows."""


def shown(value: object) -> str:
    """``repr(value)``, cut to a readable length for an error message."""
    if isinstance(value, int) and value.bit_length() > 256:  # repr() refuses past 4300 digits
        return f"{'-' if value < 0 else ''}an integer of {value.bit_length()} bits"
    text = repr(value)
    if len(text) <= SHOWN_LENGTH:
        return text
    closing = text[-1] if text[-1] in "'\")]}" else ""
    return f"{text[: SHOWN_LENGTH - 4]}...{closing}"


def known_fields(data: object, known: Iterable[str], *, what: str, fields: str) -> dict[str, Any]:
    """``data``, a JSON object whose keys are all ``known``; else ``InvalidArgumentError`` saying
    ``{what}, got <data>`` (not an object) or ``unknown {fields}: <the keys not known>``."""
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{what}, got {shown(data)}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise InvalidArgumentError(f"unknown {fields}: {', '.join(unknown)}")
    return data
