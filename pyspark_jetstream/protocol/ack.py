"""Acks: what the broker publishes to a producer's ack inbox or reply subject.

An ack is a small JSON object (so any NATS client can read it)::

    {"stream": "orders", "partition": 0, "first_offset": 41, "last_offset": 41,
     "correlation_id": "c-17", "error": "ok", "message": ""}

``error`` is an :class:`~.errors.ErrorCode` value.  ``duplicate`` means the
producer sequence, or the message id, was stored before: the offsets are the
original ones (or -1 when a producer sequence is older than the broker
remembers).  On any other error the offsets are -1.

A batch whose rows carry message ids (``Nats-Msg-Id`` headers) stores only
the rows whose ids are new; the ack of such a batch adds ``"duplicates"``,
``[[row, original offset], ...]`` for the rows not stored, and its offsets span
the rows stored (in row order).  A batch of nothing but repeats is a
``duplicate`` whose offsets span the originals.  :meth:`Ack.row_offsets` gives
each row's offset either way.  Acks without repeats have no such field.

When one flush stores several messages for the same ack inbox, their acks
travel together as one NATS message holding a JSON array of such objects;
a single ack is always the bare object.

Plain NATS requests (not envelopes: ``nats-py``'s ``js.publish`` and any
other JetStream publisher) are answered in JetStream's publish-ack format
instead, so that JetStream clients parse it unchanged (:func:`encode_pub_ack`)::

    {"stream": "orders", "seq": 41, "duplicate": false, "partition": 0, "offset": 41}
    {"error": {"code": 400, "err_code": 10054, "description": "message size exceeds ..."},
     "stream": "orders", "partition": 0}

``seq`` is the offset in the partition (``partition`` and ``offset`` are
ours, beside JetStream's fields); ``code`` is HTTP-like and ``err_code``
JetStream's own number for the error (:data:`PUB_ACK_ERRORS`), so a
JetStream client raises its usual error types.  Always one object per
message.
"""

from __future__ import annotations

import functools
import json
import re
from typing import NamedTuple

from .errors import ErrorCode, InvalidArgumentError

_FIELDS = ("stream", "partition", "first_offset", "last_offset", "correlation_id", "error", "message")
_FIELD_SET = frozenset(_FIELDS)
_WITH_DUPLICATES = frozenset((*_FIELDS, "duplicates"))
_CODES = {code.value: code for code in ErrorCode}
"""Each error code by its wire value (a dict lookup; ``ErrorCode(value)`` is slower)."""


class Ack(NamedTuple):
    """The broker's answer to one published message or batch (a named tuple: one per message)."""

    stream: str
    partition: int
    first_offset: int
    last_offset: int
    correlation_id: str = ""
    error: ErrorCode = ErrorCode.OK
    message: str = ""
    duplicates: tuple[tuple[int, int], ...] = ()
    """Of a batch: ``(row, original offset)`` of each row not stored because its message id was."""

    @property
    def ok(self) -> bool:
        """Whether the message is stored (a duplicate was stored earlier)."""
        return self.error in (ErrorCode.OK, ErrorCode.DUPLICATE)

    @property
    def duplicate(self) -> bool:
        """Whether this repeated an already-stored producer sequence or message id (``False``
        for anything else): nothing was stored, the offsets are the original's."""
        return self.error is ErrorCode.DUPLICATE

    def row_offsets(self, rows: int) -> list[int]:
        """The offset of each of the ``rows`` rows of the batch this acks: a repeated row's
        original offset, the others' from ``first_offset`` up in row order."""
        if not self.ok:
            raise ValueError(f"the batch was not stored: {self.error.value}: {self.message}")
        repeated = dict(self.duplicates)
        stored = 0 if self.duplicate and repeated else self.last_offset - self.first_offset + 1
        if stored + len(repeated) != rows:
            raise ValueError(f"this ack acks a batch of {stored + len(repeated)} rows, not {rows}")
        if self.duplicate and not repeated:  # a repeated producer sequence: the original's offsets
            return list(range(self.first_offset, self.first_offset + rows))
        fresh = iter(range(self.first_offset, self.last_offset + 1))
        return [repeated[row] if row in repeated else next(fresh) for row in range(rows)]


def encode_ack(ack: Ack) -> bytes:
    """The JSON bytes of ``ack``."""
    return _ack_json(ack).encode()


def encode_acks(acks: list[Ack]) -> bytes:
    """One ack as an object, several as an array (one NATS message for a whole flush)."""
    if len(acks) == 1:
        return encode_ack(acks[0])
    return ("[" + ",".join(map(_ack_json, acks)) + "]").encode()


def _ack_json(ack: Ack) -> str:
    # Formatted by hand: an ack is built per message on the hot path.
    return (
        f'{_prefix(ack.stream, int(ack.partition))}"first_offset":{int(ack.first_offset)},'
        f'"last_offset":{int(ack.last_offset)},"correlation_id":{_json_string(ack.correlation_id)},'
        f'"error":"{ack.error.value}","message":{_json_string(ack.message)}'
        + (f',"duplicates":{json.dumps(ack.duplicates, separators=(",", ":"))}}}' if ack.duplicates else "}")
    )


@functools.lru_cache(maxsize=4096)
def _prefix(stream: str, partition: int) -> str:
    return f'{{"stream":{json.dumps(stream)},"partition":{partition},'


_PLAIN = re.compile(r"[A-Za-z0-9_.:-]*")


def _json_string(text: str) -> str:
    return f'"{text}"' if _PLAIN.fullmatch(text) else json.dumps(text)


def decode_acks(payload: bytes) -> list[Ack]:
    """Parse one ack or an array of them, strictly."""
    data = _json(payload)
    return [_ack_from(item) for item in (data if isinstance(data, list) else [data])]


def decode_ack(payload: bytes) -> Ack:
    """Parse a single ack strictly; raises ``InvalidArgumentError`` if it is not one."""
    return _ack_from(_json(payload))


def _json(payload: bytes) -> object:
    try:
        return json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"not an ack: {exc}") from None


def _ack_from(data: object) -> Ack:
    # On the client's hot path (an ack per message): the checks cost what they must, no more.
    if not isinstance(data, dict) or not (data.keys() == _FIELD_SET or data.keys() == _WITH_DUPLICATES):
        raise InvalidArgumentError(f"not an ack: expected fields {', '.join(_FIELDS)} (and duplicates)")
    error = _CODES.get(data["error"]) if isinstance(data["error"], str) else None
    if error is None:
        raise InvalidArgumentError(f"not an ack: {data['error']!r} is not an error code")
    try:
        duplicates = data.get("duplicates")
        return Ack(
            str(data["stream"]),
            int(data["partition"]),
            int(data["first_offset"]),
            int(data["last_offset"]),
            str(data["correlation_id"]),
            error,
            str(data["message"]),
            tuple((int(row), int(offset)) for row, offset in duplicates) if duplicates else (),
        )
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"not an ack: {exc}") from None


PUB_ACK_ERRORS: dict[ErrorCode, tuple[int, int]] = {
    ErrorCode.TOO_LARGE: (400, 10054),  # JSStreamMessageExceedsMaximumErr
    ErrorCode.INVALID_ARGUMENT: (400, 10003),  # JSBadRequestErr
    ErrorCode.UNKNOWN_STREAM: (404, 10059),  # JSStreamNotFoundErr
    ErrorCode.NOT_ENOUGH_REPLICAS: (503, 10008),  # JSClusterNotAvailErr
    ErrorCode.NOT_LEADER: (503, 10008),
    ErrorCode.UNAVAILABLE: (503, 10008),
    ErrorCode.TIMEOUT: (503, 10008),
    ErrorCode.STORAGE: (503, 10077),  # JSStreamStoreFailedF
}
"""JetStream's ``(code, err_code)`` for each error a plain request can get; anything else is
``(500, 10051)`` (JSStreamGeneralErrorF).  503s are what a JetStream client retries."""
STREAM_MISMATCH = (400, 10060)
"""JSStreamNotMatchErr: the ``Nats-Expected-Stream`` header names another stream."""
_GENERAL_ERROR = (500, 10051)


def encode_pub_ack(ack: Ack, jetstream_error: tuple[int, int] | None = None) -> bytes:
    """``ack`` in JetStream's publish-ack format (see the module docstring).

    ``jetstream_error`` overrides the ``(code, err_code)`` of an error ack.
    """
    if ack.ok:
        return (
            f'{_prefix(ack.stream, int(ack.partition))}"seq":{int(ack.first_offset)},'
            f'"duplicate":{"true" if ack.duplicate else "false"},"offset":{int(ack.first_offset)}}}'
        ).encode()
    code, err_code = jetstream_error or PUB_ACK_ERRORS.get(ack.error, _GENERAL_ERROR)
    error = {"code": code, "err_code": err_code, "description": ack.message or ack.error.value}
    return json.dumps({"error": error, "stream": ack.stream, "partition": int(ack.partition)}).encode()
