"""Replica fetches over Flight: the copies a damaged replica repairs from, and where they come from.

Replication itself runs over a connection of its own (see
:mod:`.replication_wire`).  A replica whose log is damaged fetches good copies
of the damaged range with ``do_get`` and a ticket whose bytes are JSON::

    {"replica_fetch": {"stream": "orders", "partition": 0, "replica": "broker-2",
                       "fetch_offset": 1234, "leader_epoch": 7,
                       "max_bytes": 8388608, "max_wait": 0}}

A follower asks its leader (``fetch_offset``: where the damaged range
starts); a leader asks one of its in-sync followers, which answers with its
committed frames (see ``broker_node.replication.leader_repair``).  The copy is
read, not an acknowledgement: it moves no high watermark.  ``leader_epoch``
is the epoch in which the asker knows the leader; a broker in another epoch
refuses (``not_leader``).  ``max_wait`` is kept for the ticket's form and
must be 0 to :data:`MAX_FETCH_WAIT`; nothing waits for it.

The answer is one record batch of :data:`FETCH_SCHEMA`, one row per stored
batch, byte for byte as stored (``frame``: an Arrow IPC record-batch message
in the log schema, checksums and compression intact), with the answering
broker's offsets in the schema metadata (see :data:`RESPONSE_KEYS`).  Errors
are Flight errors as everywhere (see :mod:`.flight`); an
``offset_out_of_range`` error carries the ``log_start_offset`` and
``log_end_offset`` fields.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pyarrow as pa

from .errors import InvalidArgumentError, shown
from .flight import decode_json_object, validate_offset, validate_partition
from .streams import bounded_int

FETCH_SCHEMA = pa.schema(
    [
        pa.field("base_offset", pa.int64(), nullable=False),
        pa.field("last_offset", pa.int64(), nullable=False),
        pa.field("leader_epoch", pa.int32(), nullable=False),
        pa.field("frame", pa.large_binary(), nullable=False),
    ]
)
RESPONSE_KEYS = ("high_watermark", "log_start_offset", "log_end_offset", "leader_epoch")
_PREFIX = "jetstream."
MAX_FETCH_WAIT = 30.0
MAX_FETCH_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ReplicaFetch:
    """A replica's fetch of a repair copy (the ticket)."""

    stream: str
    partition: int
    replica: str
    fetch_offset: int
    leader_epoch: int
    max_bytes: int = 8 * 1024 * 1024
    max_wait: float = 0.5

    def to_ticket(self) -> bytes:
        """The ticket bytes."""
        return json.dumps(
            {
                "replica_fetch": {
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


@dataclass(frozen=True, slots=True)
class LeaderOffsets:
    """Where a log stands, sent with every fetch answer and every replication data message.

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
