"""The wire of replication between brokers: a follower's fetch, and the leader's answer.

A follower fetches from its partition's leader with ``do_get`` and a ticket
whose bytes are JSON::

    {"replica_fetch": {"stream": "orders", "partition": 0, "replica": "broker-2",
                       "fetch_offset": 1234, "leader_epoch": 7,
                       "max_bytes": 8388608, "max_wait": 0.5}}

``fetch_offset`` is the follower's log end offset, and acknowledges every
offset before it.  ``leader_epoch`` is the epoch in which the follower knows
the leader; a leader in another epoch refuses (``not_leader``), so neither a
stale leader nor a stale follower can move the high watermark.  If nothing
is past ``fetch_offset`` the leader waits up to ``max_wait`` seconds for it.

The answer is one record batch of :data:`FETCH_SCHEMA`, one row per stored
batch, byte for byte as the leader stores it (``frame``: an Arrow IPC
record-batch message in the log schema, checksums and compression intact),
with the leader's offsets in the schema metadata (see :data:`RESPONSE_KEYS`).
Errors are Flight errors as everywhere (see :mod:`.flight`); an
``offset_out_of_range`` error carries the leader's ``log_start_offset`` and
``log_end_offset`` fields.

The follower asks where its latest epoch ends on the leader with the action
``offsets_for_leader_epoch`` (body ``{"stream", "partition", "epoch"}``,
result ``{"epoch", "end_offset"}``, Kafka's OffsetsForLeaderEpoch).

The replication stream (what an in-sync follower uses; the fetch above stays
for repairs and for leaders that do not offer the stream) is one long-lived
Flight ``do_exchange`` per followed partition, opened with a command
descriptor whose bytes are a fetch ticket as above (``fetch_offset`` where the
stream starts, ``max_wait`` the longest pause between two messages of the
leader).  Then:

- the leader sends a message as soon as something is appended: the stored
  frames that follow what it sent before, up to ``max_bytes`` (none if
  nothing came within ``max_wait``: a heartbeat; the frames' offsets and
  epochs are in the frames themselves), and its offsets.  A stream opened
  with the ticket key ``replica_stream`` (:data:`PACKED_STREAM`, the fetch's
  fields inside) gets *packed* messages, all in ``app_metadata``
  (:func:`packed_stream_message`), little-endian::

      4 bytes   b"JSR1" (the form's version)
      i64 x 3   high_watermark, log_start_offset, log_end_offset
      i32       leader_epoch
      u64       number of frames, n
      u64 x n   each frame's size
      ...       the frames' bytes, one after another

  (a 40-byte head).  One opened with a ``replica_fetch``
  ticket, as followers of earlier versions open it, gets record batches of
  :data:`STREAM_SCHEMA` with the offsets in ``app_metadata`` as JSON:
  ``{"high_watermark": .., "log_start_offset": .., "log_end_offset": ..,
  "leader_epoch": ..}``; a follower whose leader refuses the packed ticket
  (an earlier version) opens that one instead.  The leader sends ahead of the
  acknowledgements, a few messages at most, so a batch appended while an
  acknowledgement travels is not held back;
- the follower appends each message's frames in order and answers each with a
  metadata-only message, ``{"fetch_offset": N}``: its new log end offset,
  acknowledging everything before it, exactly as the next fetch's
  ``fetch_offset`` would.

Each acknowledgement is checked as a fetch would be (leader epoch, offset
range), so a stream of an earlier leadership is refused with ``not_leader``
and ends; the follower ends a stream by closing its side (and cancelling the
call) after a message, and opens a new one (it does so every few seconds, so a
stream never outlives a change it should see).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa

from .errors import InvalidArgumentError
from .flight import decode_json_object, validate_offset, validate_partition
from .streams import bounded_int, shown

FETCH_SCHEMA = pa.schema(
    [
        pa.field("base_offset", pa.int64(), nullable=False),
        pa.field("last_offset", pa.int64(), nullable=False),
        pa.field("leader_epoch", pa.int32(), nullable=False),
        pa.field("frame", pa.large_binary(), nullable=False),
    ]
)
STREAM_SCHEMA = pa.schema([pa.field("frame", pa.large_binary(), nullable=False)])
"""A leader's batches on the replication stream: one stored frame per row."""
RESPONSE_KEYS = ("high_watermark", "log_start_offset", "log_end_offset", "leader_epoch")
_PREFIX = "jetstream."
MAX_FETCH_WAIT = 30.0
MAX_FETCH_BYTES = 1024 * 1024 * 1024
PACKED_STREAM = "replica_stream"
"""The ticket key of a replication stream whose leader messages are packed."""
_PACKED_HEAD = struct.Struct("<4sqqqiQ")
"""A packed message's head: :data:`_PACKED_MAGIC`, the leader's offsets, the number of frames.
Its 40 bytes and the 8-byte sizes keep each frame at a multiple of 8 bytes from the start of the
message, as in the log (frames are padded to a multiple of 8 bytes); where the message itself
lies in memory is up to Flight (Arrow reads unaligned frames too)."""
_PACKED_MAGIC = b"JSR1"
_FRAME_SIZE = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class ReplicaFetch:
    """A follower's fetch (the ticket)."""

    stream: str
    partition: int
    replica: str
    fetch_offset: int
    leader_epoch: int
    max_bytes: int = 8 * 1024 * 1024
    max_wait: float = 0.5

    def to_ticket(self, *, packed: bool = False) -> bytes:
        """The ticket bytes; ``packed``: a replication stream's, asking for packed messages."""
        return json.dumps(
            {
                PACKED_STREAM if packed else "replica_fetch": {
                    "stream": self.stream,
                    "partition": self.partition,
                    "replica": self.replica,
                    "fetch_offset": self.fetch_offset,
                    "leader_epoch": self.leader_epoch,
                    "max_bytes": self.max_bytes,
                    "max_wait": self.max_wait,
                }
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: object) -> ReplicaFetch:
        """Parse the inner object strictly."""
        if not isinstance(data, dict):
            raise InvalidArgumentError(f"replica_fetch must be an object, got {shown(data)}")
        fields = {"stream", "partition", "replica", "fetch_offset", "leader_epoch", "max_bytes", "max_wait"}
        if set(data) != fields:
            raise InvalidArgumentError(f"replica_fetch needs exactly the fields {sorted(fields)}")
        for name in ("stream", "replica"):
            if not isinstance(data[name], str) or not data[name]:
                raise InvalidArgumentError(f"replica_fetch {name} must be a non-empty string")
        wait = data["max_wait"]
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not math.isfinite(wait):
            raise InvalidArgumentError(f"max_wait must be a number of seconds, got {shown(wait)}")
        if not 0 <= wait <= MAX_FETCH_WAIT:
            raise InvalidArgumentError(f"max_wait must be 0 to {MAX_FETCH_WAIT:g} seconds, got {wait}")
        return cls(
            stream=data["stream"],
            partition=validate_partition("partition", data["partition"]),
            replica=data["replica"],
            fetch_offset=validate_offset("fetch_offset", data["fetch_offset"]),
            leader_epoch=bounded_int("leader_epoch", data["leader_epoch"], 0, 2**31 - 1),
            max_bytes=bounded_int("max_bytes", data["max_bytes"], 1, MAX_FETCH_BYTES),
            max_wait=float(wait),
        )


def parse_ticket(ticket: bytes) -> ReplicaFetch | None:
    """The replica fetch a ticket holds, or ``None`` if it is a consumer's read ticket."""
    if not ticket.startswith(b'{"replica_fetch"'):
        return None
    return ReplicaFetch.from_json(decode_json_object(ticket, "replica fetch ticket")["replica_fetch"])


class StreamTicket(NamedTuple):
    """What a replication stream opens with: the fetch, and whether it asks for packed messages."""

    fetch: ReplicaFetch
    packed: bool


def parse_stream_ticket(command: bytes) -> StreamTicket | None:
    """The ticket a replication stream opens with; ``None`` if the command is not a replica's."""
    if command.startswith(b'{"%s"' % PACKED_STREAM.encode()):
        data = decode_json_object(command, "replica stream ticket")
        if set(data) != {PACKED_STREAM}:
            raise InvalidArgumentError(
                f"a replica stream ticket holds only {PACKED_STREAM}, got {shown(data)}"
            )
        return StreamTicket(ReplicaFetch.from_json(data[PACKED_STREAM]), packed=True)
    fetch = parse_ticket(command)
    return None if fetch is None else StreamTicket(fetch, packed=False)


def packed_stream_message(offsets: LeaderOffsets, frames: Sequence[pa.Buffer]) -> bytes:
    """A leader's message on a packed replication stream, all of it in ``app_metadata``: the head
    (:data:`_PACKED_HEAD`), each frame's size (u64), then the frames' bytes one after another.

    No Arrow record batch is built, sent and read for each message (a leader's
    send took 48 against 87 µs of its thread, a follower's receive 65 against 86,
    one frame per message).
    """
    head = _PACKED_HEAD.pack(
        _PACKED_MAGIC,
        offsets.high_watermark,
        offsets.log_start_offset,
        offsets.log_end_offset,
        offsets.leader_epoch,
        len(frames),
    )
    return b"".join([head, *(_FRAME_SIZE.pack(f.size) for f in frames), *frames])


class PackedMessage(NamedTuple):
    """A packed message read: the leader's offsets and the frames (slices of the message)."""

    offsets: LeaderOffsets
    frames: list[pa.Buffer]


def parse_packed_stream_message(metadata: pa.Buffer | None) -> PackedMessage:
    """The leader's offsets and the frames (slices of ``metadata``, no copy) of a packed message;
    ``InvalidArgumentError`` naming what does not fit."""
    if metadata is None or metadata.size < _PACKED_HEAD.size:
        size = 0 if metadata is None else metadata.size
        raise InvalidArgumentError(
            f"a packed replication stream message of {size} bytes is shorter than its "
            f"{_PACKED_HEAD.size}-byte head"
        )
    magic, high_watermark, log_start, log_end, epoch, count = _PACKED_HEAD.unpack_from(metadata)
    if magic != _PACKED_MAGIC:
        raise InvalidArgumentError(
            f"a packed replication stream message starts with {magic!r}, not {_PACKED_MAGIC!r}"
        )
    sizes_end = _PACKED_HEAD.size + count * _FRAME_SIZE.size
    if sizes_end > metadata.size:
        raise InvalidArgumentError(
            f"a packed replication stream message names {count} frames but holds {metadata.size} bytes"
        )
    sizes = struct.unpack_from(f"<{count}Q", metadata, _PACKED_HEAD.size)
    if sizes_end + sum(sizes) != metadata.size:
        raise InvalidArgumentError(
            f"the frames of a packed replication stream message add up to {sum(sizes)} bytes, "
            f"but {metadata.size - sizes_end} follow its head"
        )
    frames = []
    position = sizes_end
    for size in sizes:
        frames.append(metadata.slice(position, size))
        position += size
    return PackedMessage(LeaderOffsets(high_watermark, log_start, log_end, epoch), frames)


@dataclass(frozen=True, slots=True)
class LeaderOffsets:
    """Where the leader's log stands, sent with every fetch answer and replication-stream message.

    Its fields are :data:`RESPONSE_KEYS`, in that order (the order they go on the wire).
    """

    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    leader_epoch: int

    def as_dict(self) -> dict[str, int]:
        """The offsets by their wire names, in :data:`RESPONSE_KEYS` order."""
        return {key: getattr(self, key) for key in RESPONSE_KEYS}


def fetch_metadata(offsets: LeaderOffsets) -> dict[str, str]:
    """Schema metadata of a fetch answer."""
    return {_PREFIX + k: str(v) for k, v in offsets.as_dict().items()}


def parse_fetch_metadata(metadata: dict[bytes, bytes] | None) -> LeaderOffsets:
    """Offsets from a fetch answer's schema metadata; every key of :data:`RESPONSE_KEYS` must be there."""
    try:
        return LeaderOffsets(
            **{key: int((metadata or {})[(_PREFIX + key).encode()]) for key in RESPONSE_KEYS}
        )
    except (KeyError, ValueError) as exc:
        raise InvalidArgumentError(f"a replica fetch answer lacks its offsets: {exc}") from None


_STREAM_MESSAGE = ("{" + ",".join(f'"{key}":%d' for key in RESPONSE_KEYS) + "}").encode()
_JSON_INT = r"(-?(?:0|[1-9]\d{0,18}))"
"""A JSON integer of at most 19 digits (no leading zeros, as JSON has none)."""
_STREAM_MESSAGE_FORM = re.compile(
    ("\\{" + ",".join(f'"{key}":{_JSON_INT}' for key in RESPONSE_KEYS) + "\\}").encode()
)
"""The leader's message metadata exactly as :func:`stream_message_metadata` writes it: parsed by
one match (a few µs, where the JSON parser and its checks take 15; one per replicated message)."""
_STREAM_ACK_FORM = re.compile(rb'\{"fetch_offset":(0|[1-9]\d{0,18})\}')
"""An acknowledgement exactly as :func:`stream_ack` writes it (see :data:`_STREAM_MESSAGE_FORM`)."""


def stream_message_metadata(offsets: LeaderOffsets) -> bytes:
    """The ``app_metadata`` of a leader's message on the replication stream (a JSON object of
    :data:`RESPONSE_KEYS`, in that order, without spaces)."""
    return _STREAM_MESSAGE % (
        offsets.high_watermark,
        offsets.log_start_offset,
        offsets.log_end_offset,
        offsets.leader_epoch,
    )


def parse_stream_message_metadata(metadata: pa.Buffer | bytes | None) -> LeaderOffsets:
    """Offsets of a leader's message on the replication stream; every key of :data:`RESPONSE_KEYS`.

    What :func:`stream_message_metadata` writes is read by one match; any other
    JSON object goes through the JSON parser and is refused unless it holds
    exactly those integer fields.
    """
    data = _bytes(metadata)
    match = _STREAM_MESSAGE_FORM.fullmatch(data)
    if match is not None:
        high_watermark, log_start_offset, log_end_offset, leader_epoch = map(int, match.groups())
        return LeaderOffsets(high_watermark, log_start_offset, log_end_offset, leader_epoch)
    fields = decode_json_object(data, "replication stream message")
    if set(fields) != set(RESPONSE_KEYS) or not all(_is_int(fields[k]) for k in RESPONSE_KEYS):
        raise InvalidArgumentError(
            f"a replication stream message needs exactly the integer fields {list(RESPONSE_KEYS)}, "
            f"got {shown(fields)}"
        )
    return LeaderOffsets(**{k: int(fields[k]) for k in RESPONSE_KEYS})


def stream_ack(fetch_offset: int) -> bytes:
    """A follower's acknowledgement on the replication stream: its log end offset."""
    return b'{"fetch_offset":%d}' % fetch_offset


def parse_stream_ack(metadata: pa.Buffer | bytes | None) -> int:
    """The log end offset a follower acknowledged (``InvalidArgumentError`` naming what is wrong).

    What :func:`stream_ack` writes is read by one match; anything else goes
    through the JSON parser and the offset's checks.
    """
    data = _bytes(metadata)
    match = _STREAM_ACK_FORM.fullmatch(data)
    if match is not None:
        return validate_offset("fetch_offset", int(match.group(1)))
    fields = decode_json_object(data, "replication stream acknowledgement")
    if set(fields) != {"fetch_offset"}:
        raise InvalidArgumentError(
            f"a replication stream acknowledgement needs exactly the field fetch_offset, got {shown(fields)}"
        )
    return validate_offset("fetch_offset", fields["fetch_offset"])


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bytes(metadata: pa.Buffer | bytes | None) -> bytes:
    if metadata is None:
        return b""
    return metadata.to_pybytes() if isinstance(metadata, pa.Buffer) else bytes(metadata)
