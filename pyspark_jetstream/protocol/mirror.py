"""Mirrors: a stream that copies another cluster's stream, offset for offset.

A mirror is a stream whose :class:`~.streams.StreamConfig` has a ``mirror``
(:class:`MirrorSource`): the source stream's name, the Flight addresses of
the source cluster's brokers, and optionally a credentials file (TOML, as
:class:`pyspark_jetstream.client.Credentials` reads it) that every broker of
the mirror's cluster reads to reach the source.  Each partition of the mirror
holds every message of the same partition of the source at the same offset,
with the same timestamp, key, value, headers (message ids among them),
subject and producer fields; only the ``leader_epoch`` column is the mirror
cluster's own (epochs are a cluster's record of its own leaderships).

JSON form, inside the stream config (left out when the stream is no mirror)::

    "mirror": {"stream": "orders", "servers": ["grpc://a:7001", "grpc://b:7001"],
               "credentials": null, "promoted": false}

``promoted`` becomes true when the mirror is promoted (disaster recovery):
it stops copying for good and takes publishes from its end offset on.

The create request (action ``create_mirror``) names the mirror and its
source and the few options that are the mirror's own; the rest of the
config (subject, partitions, retention, compaction, schema, ...) is the
source's, read by the broker from the source cluster.  Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgumentError, known_fields, shown
from .mirror_source import MirrorSource
from .streams import MAX_REPLICATION_FACTOR, StreamConfig, bounded_int, validate_stream_name, validate_subject

__all__ = [
    "MirrorRequest",
    "MirrorSource",
    "MirrorStatus",
    "promoted",
    "publish_refusal",
    "refuse_mirror_change",
]


def publish_refusal(name: str, source: MirrorSource) -> str:
    """The one line a publish to an active mirror is refused with."""
    return f"stream {name!r} mirrors {source.where()}: publish to the source (or promote the mirror)"


@dataclass(frozen=True, kw_only=True)
class MirrorRequest:
    """A ``create_mirror`` action's body: the mirror, its source and the mirror's own options."""

    name: str
    source: MirrorSource
    replication_factor: int = 1
    min_insync_replicas: int = 1
    partitions: int | None = None
    """The partition count the caller expects (``None``: the source's); a different count is refused."""
    subject: str | None = None
    """The NATS subject the mirror listens on to refuse publishes (``None``: the source's)."""

    def __post_init__(self) -> None:
        validate_stream_name(self.name)
        bounded_int("replication_factor", self.replication_factor, 1, MAX_REPLICATION_FACTOR)
        bounded_int("min_insync_replicas", self.min_insync_replicas, 1, MAX_REPLICATION_FACTOR)
        if self.partitions is not None:
            bounded_int("partitions", self.partitions, 1, 1024)
        if self.subject is not None:
            validate_subject(self.subject)
        if self.source.promoted:
            raise InvalidArgumentError("a new mirror cannot be created promoted")

    def to_json(self) -> dict[str, Any]:
        """The action body."""
        return {
            "name": self.name,
            "mirror": self.source.to_json(),
            "replication_factor": self.replication_factor,
            "min_insync_replicas": self.min_insync_replicas,
            "partitions": self.partitions,
            "subject": self.subject,
        }

    @classmethod
    def from_json(cls, data: object) -> MirrorRequest:
        """Parse the action body strictly."""
        known = ("name", "mirror", "replication_factor", "min_insync_replicas", "partitions", "subject")
        body = known_fields(
            data, known, what="create_mirror needs an object", fields="create_mirror field(s)"
        )
        return cls(
            name=body.get("name"),  # type: ignore[arg-type] # checked in __post_init__
            source=MirrorSource.from_json(body.get("mirror")),
            replication_factor=body.get("replication_factor", 1),
            min_insync_replicas=body.get("min_insync_replicas", 1),
            partitions=body.get("partitions"),
            subject=body.get("subject"),
        )


@dataclass(frozen=True, slots=True)
class MirrorStatus:
    """How one mirrored partition stands, as its leader in the mirror's cluster reports it."""

    stream: str
    partition: int
    source: str
    """The source stream and servers (:meth:`MirrorSource.where`)."""
    source_leader: str | None
    """The source partition leader's address last read from, if any."""
    state: str
    """``copying``, ``waiting`` (for the source, after an error), ``stopped`` (a mismatch) or ``promoted``."""
    mirror_end: int
    """The mirror partition's log end offset."""
    source_end: int
    """The source's high watermark as last seen (-1: not seen yet)."""
    lag_messages: int
    """Offsets the source has committed that the mirror has not copied yet (-1: unknown)."""
    lag_seconds: float
    """Age of the oldest message not copied yet, or 0 when caught up (-1: unknown)."""
    last_error: str | None
    """Why the last attempt failed (``None`` after a success)."""

    def to_json(self) -> dict[str, Any]:
        """Wire form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: object) -> MirrorStatus:
        """Parse the wire form."""
        if not isinstance(data, dict) or set(data) != {f.name for f in dataclasses.fields(cls)}:
            raise InvalidArgumentError(f"not a mirror status: {shown(data)}")
        return cls(**data)


def promoted(config: StreamConfig) -> StreamConfig | None:
    """``config`` with its mirror promoted, or ``None`` if it was promoted already.

    ``InvalidArgumentError`` for a stream that is no mirror (only a mirror can be promoted).
    """
    if config.mirror is None:
        raise InvalidArgumentError(
            f"stream {config.name!r} is not a mirror: only a mirror is promoted (it takes publishes already)"
        )
    if config.mirror.promoted:
        return None
    return dataclasses.replace(config, mirror=dataclasses.replace(config.mirror, promoted=True))


def refuse_mirror_change(config: StreamConfig, change: str) -> None:
    """``InvalidArgumentError`` if ``config`` is an active mirror: its partitions and schema are the
    source's (``change`` names what was asked)."""
    if config.mirror is not None and config.mirror.active:
        raise InvalidArgumentError(
            f"stream {config.name!r} mirrors {config.mirror.where()}: {change} on the source (the mirror "
            "follows it), or promote the mirror first"
        )
