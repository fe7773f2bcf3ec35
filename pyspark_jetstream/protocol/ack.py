"""Acks: what the broker publishes to a producer's ack inbox or reply subject.

An ack is a small JSON object (so any NATS client can read it)::

    {"stream": "orders", "partition": 0, "first_offset": 41, "last_offset": 41,
     "correlation_id": "c-17", "error": "ok", "message": ""}

``error`` is an :class:`~.errors.ErrorCode` value.  ``duplicate`` means the
producer sequence was stored before: the offsets are the original ones.  On
an error other than ``duplicate`` the offsets are -1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .errors import ErrorCode, InvalidArgumentError

_FIELDS = ("stream", "partition", "first_offset", "last_offset", "correlation_id", "error", "message")


@dataclass(frozen=True, slots=True)
class Ack:
    """The broker's answer to one published message or batch."""

    stream: str
    partition: int
    first_offset: int
    last_offset: int
    correlation_id: str = ""
    error: ErrorCode = ErrorCode.OK
    message: str = ""

    @property
    def ok(self) -> bool:
        """Whether the message is stored (a duplicate was stored earlier)."""
        return self.error in (ErrorCode.OK, ErrorCode.DUPLICATE)

    @property
    def duplicate(self) -> bool:
        """Whether this repeated an already-stored producer sequence."""
        return self.error is ErrorCode.DUPLICATE


def encode_ack(ack: Ack) -> bytes:
    """The JSON bytes of ``ack``."""
    return json.dumps(
        {
            "stream": ack.stream,
            "partition": ack.partition,
            "first_offset": ack.first_offset,
            "last_offset": ack.last_offset,
            "correlation_id": ack.correlation_id,
            "error": ack.error.value,
            "message": ack.message,
        },
        separators=(",", ":"),
    ).encode()


def decode_ack(payload: bytes) -> Ack:
    """Parse an ack strictly; raises ``InvalidArgumentError`` if it is not one."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"not an ack: {exc}") from None
    if not isinstance(data, dict) or set(data) != set(_FIELDS):
        raise InvalidArgumentError(f"not an ack: expected fields {', '.join(_FIELDS)}")
    try:
        return Ack(
            stream=str(data["stream"]),
            partition=int(data["partition"]),
            first_offset=int(data["first_offset"]),
            last_offset=int(data["last_offset"]),
            correlation_id=str(data["correlation_id"]),
            error=ErrorCode(data["error"]),
            message=str(data["message"]),
        )
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"not an ack: {exc}") from None
