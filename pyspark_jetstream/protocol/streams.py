"""Streams: names, NATS subjects, partition subjects and the stream configuration.

A stream is a named, durable log attached to a NATS subject.  Partition 0
listens on the stream's subject and partition *N* on ``<subject>.N``.
Pure functions and frozen value types; the JSON form is what the broker keeps
in its metadata and what admin actions carry.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgumentError
from .schema import COMPRESSIONS

DISCOVERY_SUBJECT = "_PJS.discover"
"""NATS subject on which every broker answers with its Flight address (JSON)."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
INTERNAL_PREFIX = "__"
_SUBJECT_TOKEN = re.compile(r"[^\s.*>]+|\*|>")


def validate_stream_name(name: object, *, internal: bool = False) -> str:
    """Return ``name`` if it is a valid stream name, else raise naming the problem.

    Names are 1-200 characters of letters, digits, ``_``, ``-`` and ``.``,
    starting with a letter or digit (they become directory names).  Names
    starting with ``__`` are reserved for the broker's internal streams.
    """
    if not isinstance(name, str):
        raise InvalidArgumentError(f"stream name must be a string, got {name!r}")
    if internal and name.startswith(INTERNAL_PREFIX) and NAME_PATTERN.fullmatch(name[2:]):
        return name
    if not NAME_PATTERN.fullmatch(name) or name in {".", ".."}:
        raise InvalidArgumentError(
            f"invalid stream name {name!r}: use 1-200 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit"
        )
    return name


def validate_subject(subject: object, *, wildcards: bool = True) -> str:
    """Return ``subject`` if it is a valid NATS subject, else raise naming the problem.

    Tokens are separated by ``.``, none empty or containing whitespace;
    ``*`` matches one token and ``>`` the rest (last token only).
    """
    if not isinstance(subject, str) or not subject:
        raise InvalidArgumentError(f"subject must be a non-empty string, got {subject!r}")
    tokens = subject.split(".")
    for i, token in enumerate(tokens):
        if not _SUBJECT_TOKEN.fullmatch(token):
            raise InvalidArgumentError(
                f"invalid subject {subject!r}: token {i + 1} ({token!r}) is empty or has "
                "whitespace or a misplaced wildcard"
            )
        if token in {"*", ">"} and not wildcards:
            raise InvalidArgumentError(f"subject {subject!r} may not contain wildcards here")
        if token == ">" and i != len(tokens) - 1:
            raise InvalidArgumentError(f"invalid subject {subject!r}: '>' must be the last token")
    return subject


def partition_subject(subject: str, partition: int) -> str:
    """The NATS subject partition ``partition`` of a stream on ``subject`` listens on."""
    return subject if partition == 0 else f"{subject}.{partition}"


@dataclass(frozen=True, kw_only=True)
class StreamConfig:
    """Everything that defines a stream; creating the same config twice is a no-op."""

    name: str
    subject: str
    partitions: int = 1
    replication_factor: int = 1
    group: str | None = None
    """Load-balance group: streams in one group share a NATS queue group."""
    retention_age: float | None = None
    retention_bytes: int | None = None
    retention_messages: int | None = None
    compaction: bool = False
    segment_bytes: int = 64 * 1024 * 1024
    max_message_bytes: int = 1024 * 1024
    compression: str = "none"
    """How stored batches are compressed: ``none``, ``lz4`` or ``zstd``."""
    ack_reply: bool = True
    """Ack plain NATS messages that carry a reply subject, on that subject."""

    def __post_init__(self) -> None:
        validate_stream_name(self.name, internal=True)
        validate_subject(self.subject)
        _positive_int("partitions", self.partitions)
        _positive_int("replication_factor", self.replication_factor)
        _positive_int("segment_bytes", self.segment_bytes)
        _positive_int("max_message_bytes", self.max_message_bytes)
        if self.partitions > 1 and self.subject.endswith(">"):
            raise InvalidArgumentError(
                f"stream {self.name!r}: a subject ending in '>' ({self.subject!r}) already "
                "matches every partition subject; give it one partition"
            )
        if self.compression not in COMPRESSIONS:
            raise InvalidArgumentError(
                f"compression must be one of {', '.join(COMPRESSIONS)}, got {self.compression!r}"
            )
        if self.group is not None:
            validate_stream_name(self.group)
        for option in ("retention_age", "retention_bytes", "retention_messages"):
            value = getattr(self, option)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value < 0
            ):
                raise InvalidArgumentError(f"{option} must be a non-negative number, got {value!r}")
        for option in ("compaction", "ack_reply"):
            if not isinstance(getattr(self, option), bool):
                raise InvalidArgumentError(f"{option} must be true or false, got {getattr(self, option)!r}")

    def to_json(self) -> dict[str, Any]:
        """The wire/metadata form: a plain dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: object) -> StreamConfig:
        """Parse the wire form strictly: unknown or missing fields are errors."""
        if not isinstance(data, dict):
            raise InvalidArgumentError(f"stream config must be an object, got {data!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidArgumentError(f"unknown stream option(s): {', '.join(unknown)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise InvalidArgumentError(f"invalid stream config: {exc}") from None

    def differences(self, other: StreamConfig) -> list[str]:
        """Human-readable ``field: ours != theirs`` for every field that differs."""
        return [
            f"{f.name}: {getattr(self, f.name)!r} != {getattr(other, f.name)!r}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]

    def partition_subjects(self) -> list[str]:
        """The subject of each partition, by partition number."""
        return [partition_subject(self.subject, p) for p in range(self.partitions)]


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
