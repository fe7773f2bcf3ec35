"""The replication connection: a follower's own connection to its leader's replication listener.

A follower opens one TCP connection (TLS when the leader's brokers serve TLS)
per followed partition to the address its leader registers as
``replication`` (see the brokers' registrations in the coordinator).  The
leader's event loop serves it: what the leader appends goes out on the
connection at once, and the follower's acknowledgements move the high
watermark on the same loop, without a thread in between.

Every message, either way, is a 5-byte head and a body, little-endian::

    u32   the body's length in bytes
    u8    the kind (:class:`Kind`)
    ...   the body

In order:

1. The follower sends ``HELLO``, a JSON object of exactly :data:`HELLO_FIELDS`:
   the wire's ``version`` (:data:`VERSION`), the ``stream``, ``partition``,
   the follower's broker id (``replica``), the ``leader_epoch`` in which it
   follows, and ``authorization`` (a ``Basic`` header value as on Flight, or
   ``""``; a client certificate serves as on Flight too).  The leader answers
   ``WELCOME`` (no body) or ``ERROR`` and closes.  Until ``WELCOME`` the
   leader reads no message longer than :data:`MAX_HELLO_BYTES`.
2. The follower may ask where an epoch ends on the leader (Kafka's
   OffsetsForLeaderEpoch, for truncation): ``EPOCH`` (``i32`` epoch),
   answered by ``EPOCH_END`` (``i32`` the largest epoch <= it the leader
   has, ``i64`` where it ends).
3. The follower sends ``FETCH`` (``i64`` its log end offset, ``u64`` the most
   stored bytes per message, ``f64`` the longest silence in seconds).  From
   then on the leader sends ``DATA`` as soon as it appends: the stored frames
   that follow what it sent before, packed (:func:`data_message`), with its
   offsets; one with no frames after the longest silence (a heartbeat).  The
   follower answers what it received and stored with ``ACK`` (``i64`` its
   new log end offset, which acknowledges every offset before it) -- one
   acknowledgement may answer several messages.  Each acknowledgement is
   checked as a fetch is (the leader epoch, the offset range).
4. Either side may send ``ERROR`` (a JSON object ``{"code", "message",
   "fields"}``, the error taxonomy's code) and close.  The follower closes the
   connection to stop.

A ``DATA`` body is a 40-byte head, each frame's size, then the frames::

    4 bytes   b"JSR2"
    i64 x 3   high_watermark, log_start_offset, log_end_offset
    i32       leader_epoch
    u64       number of frames, n
    u64 x n   each frame's size
    ...       the frames' bytes (Arrow IPC record-batch messages as stored)

The head and the sizes keep each frame at a multiple of 8 bytes from the
body's start, as frames are in the log.  Pure: nothing here does I/O.
"""

from __future__ import annotations

import enum
import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa

from .errors import InvalidArgumentError, JetStreamError, error_from_code, shown
from .flight import decode_json_object, validate_offset, validate_partition
from .replication import MAX_FETCH_BYTES, MAX_FETCH_WAIT, LeaderOffsets
from .streams import bounded_int

VERSION = 2
"""The wire's version (the first, a Flight ``do_exchange``, is gone)."""
HELLO_FIELDS = frozenset({"version", "stream", "partition", "replica", "leader_epoch", "authorization"})
MAX_HELLO_BYTES = 64 * 1024
"""The longest message a leader reads before it knows who is asking."""
MAX_MESSAGE_BYTES = (1 << 32) - 1
"""The longest body the head can announce."""

_HEAD = struct.Struct("<IB")
_EPOCH = struct.Struct("<i")
_EPOCH_END = struct.Struct("<iq")
_FETCH = struct.Struct("<qQd")
_ACK = struct.Struct("<q")
_DATA_HEAD = struct.Struct("<4sqqqiQ")
_DATA_MAGIC = b"JSR2"
_FRAME_SIZE = struct.Struct("<Q")
HEAD_BYTES = _HEAD.size


class Kind(enum.IntEnum):
    """What a message is (its head's second field)."""

    HELLO = 1
    WELCOME = 2
    EPOCH = 3
    EPOCH_END = 4
    FETCH = 5
    DATA = 6
    ACK = 7
    ERROR = 8


@dataclass(frozen=True, slots=True)
class Hello:
    """Who follows what (a follower's first message)."""

    stream: str
    partition: int
    replica: str
    leader_epoch: int
    authorization: str = ""

    def encode(self) -> bytes:
        """The whole ``HELLO`` message."""
        body = json.dumps(
            {
                "version": VERSION,
                "stream": self.stream,
                "partition": self.partition,
                "replica": self.replica,
                "leader_epoch": self.leader_epoch,
                "authorization": self.authorization,
            },
            separators=(",", ":"),
        ).encode()
        return message(Kind.HELLO, body)

    @classmethod
    def parse(cls, body: bytes) -> Hello:
        """A ``HELLO`` body read strictly; ``InvalidArgumentError`` naming what is wrong."""
        data = decode_json_object(body, "replication hello")
        if set(data) != HELLO_FIELDS:
            raise InvalidArgumentError(f"a replication hello needs exactly the fields {sorted(HELLO_FIELDS)}")
        if data["version"] != VERSION:
            raise InvalidArgumentError(
                f"the follower speaks replication version {shown(data['version'])}, this leader "
                f"{VERSION}: run the same version of the broker on both"
            )
        for name in ("stream", "replica"):
            if not isinstance(data[name], str) or not data[name]:
                raise InvalidArgumentError(f"a replication hello's {name} must be a non-empty string")
        if not isinstance(data["authorization"], str):
            raise InvalidArgumentError("a replication hello's authorization must be a string")
        return cls(
            data["stream"],
            validate_partition("partition", data["partition"]),
            data["replica"],
            bounded_int("leader_epoch", data["leader_epoch"], 0, 2**31 - 1),
            data["authorization"],
        )


class Fetch(NamedTuple):
    """Where a follower's stream starts, and how the leader sends it."""

    fetch_offset: int
    max_bytes: int
    max_wait: float


def message(kind: Kind, body: bytes = b"") -> bytes:
    """A whole message: the head and ``body``."""
    return _HEAD.pack(len(body), kind) + body


def epoch_message(epoch: int) -> bytes:
    """An ``EPOCH`` question: where does ``epoch`` end on the leader?"""
    return message(Kind.EPOCH, _EPOCH.pack(epoch))


def parse_epoch(body: bytes) -> int:
    """The epoch an ``EPOCH`` question names."""
    _exact(body, _EPOCH.size, "an epoch question")
    (epoch,) = _EPOCH.unpack(body)
    return epoch


def epoch_end_message(epoch: int, end_offset: int) -> bytes:
    """The answer to an ``EPOCH`` question: the largest epoch the leader has, and where it ends."""
    return message(Kind.EPOCH_END, _EPOCH_END.pack(epoch, end_offset))


def parse_epoch_end(body: bytes) -> tuple[int, int]:
    """``(epoch, end_offset)`` of an ``EPOCH_END`` answer."""
    _exact(body, _EPOCH_END.size, "an epoch answer")
    epoch, end = _EPOCH_END.unpack(body)
    return epoch, end


def fetch_message(fetch: Fetch) -> bytes:
    """The ``FETCH`` that starts the leader's stream."""
    return message(Kind.FETCH, _FETCH.pack(fetch.fetch_offset, fetch.max_bytes, fetch.max_wait))


def parse_fetch(body: bytes) -> Fetch:
    """A ``FETCH`` read and checked; ``InvalidArgumentError`` naming the bad value."""
    _exact(body, _FETCH.size, "a fetch")
    offset, max_bytes, max_wait = _FETCH.unpack(body)
    if not math.isfinite(max_wait) or not 0 <= max_wait <= MAX_FETCH_WAIT:
        raise InvalidArgumentError(f"max_wait must be 0 to {MAX_FETCH_WAIT:g} seconds, got {max_wait}")
    return Fetch(
        validate_offset("fetch_offset", offset),
        bounded_int("max_bytes", max_bytes, 1, MAX_FETCH_BYTES),
        max_wait,
    )


def ack_message(log_end_offset: int) -> bytes:
    """A follower's ``ACK``: it holds every offset before ``log_end_offset``."""
    return message(Kind.ACK, _ACK.pack(log_end_offset))


def parse_ack(body: bytes) -> int:
    """The log end offset an ``ACK`` acknowledges."""
    _exact(body, _ACK.size, "an acknowledgement")
    (offset,) = _ACK.unpack(body)
    return validate_offset("fetch_offset", offset)


def error_message(error: JetStreamError) -> bytes:
    """An ``ERROR`` message carrying ``error`` (its code, text and scalar fields)."""
    fields = {k: v for k, v in error.fields.items() if isinstance(v, str | int | float | bool)}
    body = json.dumps(
        {"code": error.code.value, "message": str(error), "fields": fields}, separators=(",", ":")
    ).encode()
    return message(Kind.ERROR, body)


def parse_error(body: bytes) -> JetStreamError:
    """The error an ``ERROR`` message carries (an unreadable one becomes an ``InvalidArgumentError``
    saying so)."""
    try:
        data = decode_json_object(body, "replication error")
        code, text, fields = data["code"], data["message"], data["fields"]
        if not isinstance(code, str) or not isinstance(text, str) or not isinstance(fields, dict):
            raise InvalidArgumentError(f"a replication error holds {shown(data)}")
    except (InvalidArgumentError, KeyError) as exc:
        return InvalidArgumentError(f"the peer sent an unreadable error: {exc}")
    return error_from_code(code, text, fields)


def data_message(offsets: LeaderOffsets, frames: Sequence[pa.Buffer]) -> bytes:
    """A whole ``DATA`` message: the leader's offsets and ``frames`` (see the module docstring)."""
    sizes = [f.size for f in frames]
    head = _DATA_HEAD.pack(
        _DATA_MAGIC,
        offsets.high_watermark,
        offsets.log_start_offset,
        offsets.log_end_offset,
        offsets.leader_epoch,
        len(frames),
    )
    length = len(head) + _FRAME_SIZE.size * len(frames) + sum(sizes)
    return b"".join([_HEAD.pack(length, Kind.DATA), head, struct.pack(f"<{len(sizes)}Q", *sizes), *frames])


class Data(NamedTuple):
    """A ``DATA`` message read: the leader's offsets and the frames (slices of the body, no copy)."""

    offsets: LeaderOffsets
    frames: list[pa.Buffer]


def parse_data(body: pa.Buffer) -> Data:
    """A ``DATA`` body read; ``InvalidArgumentError`` naming what does not fit."""
    if body.size < _DATA_HEAD.size:
        raise InvalidArgumentError(
            f"a replication data message of {body.size} bytes is shorter than its {_DATA_HEAD.size}-byte head"
        )
    magic, high_watermark, log_start, log_end, epoch, count = _DATA_HEAD.unpack_from(body)
    if magic != _DATA_MAGIC:
        raise InvalidArgumentError(f"a replication data message starts with {magic!r}, not {_DATA_MAGIC!r}")
    sizes_end = _DATA_HEAD.size + count * _FRAME_SIZE.size
    if sizes_end > body.size:
        raise InvalidArgumentError(
            f"a replication data message names {count} frames but holds {body.size} bytes"
        )
    sizes = struct.unpack_from(f"<{count}Q", body, _DATA_HEAD.size)
    if sizes_end + sum(sizes) != body.size:
        raise InvalidArgumentError(
            f"the frames of a replication data message add up to {sum(sizes)} bytes, but "
            f"{body.size - sizes_end} follow its head"
        )
    frames = []
    position = sizes_end
    for size in sizes:
        frames.append(body.slice(position, size))
        position += size
    return Data(LeaderOffsets(high_watermark, log_start, log_end, epoch), frames)


class MessageReader:
    """Cuts the bytes received on a connection into whole messages (nothing is parsed beyond the
    head).  ``limit``: the longest body taken; a longer one is refused before it is buffered."""

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self.limit = limit
        self._buffer = bytearray()
        self._position = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out as messages."""
        return len(self._buffer) - self._position

    def feed(self, data: bytes) -> None:
        """Take bytes received."""
        if self._position:
            del self._buffer[: self._position]
            self._position = 0
        self._buffer += data

    def next(self) -> tuple[Kind, bytes] | None:
        """The next whole message as ``(kind, body)``, or ``None`` until more bytes come.

        ``InvalidArgumentError`` for an unknown kind or a body over the limit (the
        connection is then of no use: close it)."""
        buffer, position = self._buffer, self._position
        if len(buffer) - position < HEAD_BYTES:
            return None
        length, kind = _HEAD.unpack_from(buffer, position)
        if length > self.limit:
            raise InvalidArgumentError(
                f"a replication message announces {length} bytes, over the limit of {self.limit} here"
            )
        start = position + HEAD_BYTES
        if len(buffer) - start < length:
            return None
        try:
            known = Kind(kind)
        except ValueError:
            raise InvalidArgumentError(f"unknown replication message kind {kind}") from None
        self._position = start + length
        return known, bytes(buffer[start : start + length])


def _exact(body: bytes, size: int, what: str) -> None:
    if len(body) != size:
        raise InvalidArgumentError(f"{what} is {size} bytes, got {len(body)}")
