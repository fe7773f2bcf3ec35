"""Streams: names, NATS subjects, partition subjects and the stream configuration.

A stream is a named, durable log attached to a NATS subject.  Partition 0
listens on the stream's subject and partition *N* on ``<subject>.N``.
Pure functions and frozen value types; the JSON form is what the broker keeps
in its metadata and what admin actions carry.

Everything is checked here, before a config is stored: a subject the broker
cannot subscribe to would otherwise be stored and fail on every start.  The
bounds of every number (and the helpers that check them, shared by the log's,
the broker's and the Spark connector's options) are defined here too, so an
error always names the option, the value and the accepted range.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

from .errors import InvalidArgumentError, known_fields, shown
from .mirror_source import MirrorSource
from .schema import COMPRESSIONS
from .value_schema import SchemaDocument, StreamSchema

DISCOVERY_SUBJECT = "_PJS.discover"
"""NATS subject on which every broker answers with its Flight address (JSON)."""
BROKER_SUBJECT_TOKEN = "_PJS"
"""First token of the broker's own subjects; only internal streams may use it."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
INTERNAL_PREFIX = "__"

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
INT64_MAX = 2**63 - 1
"""Offsets, sizes and counts are Arrow int64 / Spark long: nothing above this fits."""

MAX_SUBJECT_BYTES = 1024
"""Longest stream subject, in UTF-8 bytes (NATS counts bytes).

nats-server closes a connection that sends a protocol line whose arguments
are longer than its ``max_control_line`` (4096 bytes by default), and the
broker would fail the same way on every restart.  The broker subscribes with
``SUB <subject>.<N> <queue group> <sid>``: at most 1024 + 5 (``.1023``) + 1 +
200 (group) + 1 + 20 (sid) = 1251 bytes.  A publisher's ``HPUB <subject>
<reply> <header bytes> <total bytes>`` keeps over 2,000 bytes for its reply
subject.  The margin also covers servers configured with a lower limit;
NATS recommends short subjects anyway.
"""
MAX_PARTITIONS = 1024
"""Each partition is a NATS subscription, a directory of open segment files and
a Spark task; the bound also keeps the partition suffix to 5 bytes (``.1023``)."""
MAX_GROUP_LENGTH = 200
"""Longest load-balance group (a NATS queue group name, sent in every SUB line)."""
MAX_REPLICATION_FACTOR = 16
MIN_SEGMENT_BYTES = 1 * KiB
"""Smallest segment.  Production wants megabytes (the default is 64 MiB); below
about a kilobyte every stored batch gets a segment of its own (three files).
The floor is not higher because retention and compaction tests roll segments
every few messages with 1.5-4 KB segments (tests/log, tests/broker, tests/spark)."""
MAX_SEGMENT_BYTES = 4 * GiB
"""Largest segment: recovery rescans the active segment after a crash, and
retention deletes whole segments, so bigger ones mean slower restarts and
coarser retention."""
MAX_MESSAGE_BYTES = 64 * MiB
"""A message arrives as one NATS payload, and nats-server refuses a
``max_payload`` above its ``max_pending`` (64 MiB by default): no larger
message can reach the broker."""
MAX_AGE = 100 * 365 * 24 * 3600
"""Longest retention or tombstone age: 100 years, in seconds (none means forever)."""
MAX_DUPLICATE_WINDOW = 7 * 24 * 3600
"""Longest ``duplicate_window``: a week, in seconds.  A partition reads the log's last window
of messages each time it opens, to remember their ids, so a longer window means a slower
start; retries and failovers are over long before a week."""
DEFAULT_DUPLICATE_WINDOW = 120.0
"""JetStream's default (two minutes)."""
MAX_DUPLICATE_IDS = 100_000_000
"""Most message ids a partition may remember (each takes about 170 bytes of memory plus the id)."""
MIN_TIMESTAMP = -62135596800
"""0001-01-01T00:00:00Z in seconds: read timestamps span Python's ``datetime``
(years 1 to 9999), far inside the log's int64 microseconds."""
MAX_TIMESTAMP = 253402300799
"""9999-12-31T23:59:59Z in seconds."""

_RESERVED_FIRST_TOKENS = {
    "_INBOX": "NATS request and reply inboxes",
    "_R_": "nats-server's replies to imported services",
    "_GR_": "nats-server's replies across gateways",
    BROKER_SUBJECT_TOKEN: "the broker's own subjects (discovery, cursors)",
}


def validate_stream_name(name: object, *, internal: bool = False) -> str:
    """Return ``name`` if it is a valid stream name, else raise naming the problem.

    Names are 1-200 characters of letters, digits, ``_``, ``-`` and ``.``,
    starting with a letter or digit (they become directory names).  Names
    starting with ``__`` are reserved for the broker's internal streams.
    """
    if not isinstance(name, str):
        raise InvalidArgumentError(f"stream name must be a string, got {shown(name)}")
    if internal and name.startswith(INTERNAL_PREFIX) and NAME_PATTERN.fullmatch(name[2:]):
        return name
    if not NAME_PATTERN.fullmatch(name) or name in {".", ".."}:
        raise InvalidArgumentError(
            f"invalid stream name {shown(name)}: use 1-200 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit"
        )
    return name


def validate_group(group: object) -> str:
    """Return ``group`` if it is a valid load-balance group (a NATS queue group name), else raise."""
    if not isinstance(group, str) or not NAME_PATTERN.fullmatch(group):
        raise InvalidArgumentError(
            f"invalid group {shown(group)}: a load-balance group names a NATS queue group; use "
            f"1-{MAX_GROUP_LENGTH} letters, digits, '_', '-' or '.', starting with a letter or digit"
        )
    return group


def validate_subject(subject: object, *, wildcards: bool = True) -> str:
    """Return ``subject`` if it is a valid NATS subject, else raise naming the subject and the rule.

    At most :data:`MAX_SUBJECT_BYTES` bytes of UTF-8; tokens are separated by
    ``.``, none empty, none with whitespace or control (or other invisible)
    characters; ``*`` matches one token and ``>`` the rest: both only as whole
    tokens, ``>`` only as the last one.
    """
    if not isinstance(subject, str) or not subject:
        raise InvalidArgumentError(f"subject must be a non-empty string, got {shown(subject)}")
    size = len(subject.encode("utf-8", "surrogatepass"))
    if size > MAX_SUBJECT_BYTES:
        raise InvalidArgumentError(
            f"invalid subject {shown(subject)}: {size} bytes, but a subject may be at most "
            f"{MAX_SUBJECT_BYTES} bytes (UTF-8) so that subscribing to it fits nats-server's "
            "protocol line limit"
        )
    for char in subject:
        if char.isspace():
            raise InvalidArgumentError(
                f"invalid subject {shown(subject)}: it contains whitespace ({char!r}), which NATS "
                "uses to separate a protocol line's arguments"
            )
        if not char.isprintable():
            raise InvalidArgumentError(
                f"invalid subject {shown(subject)}: it contains the control or invisible character "
                f"{char!r}; NATS subjects are printable text"
            )
    tokens = subject.split(".")
    for i, token in enumerate(tokens):
        if not token:
            raise InvalidArgumentError(
                f"invalid subject {shown(subject)}: token {i + 1} is an empty token (a dot at "
                "either end, or two in a row)"
            )
        if len(token) > 1 and ("*" in token or ">" in token):
            raise InvalidArgumentError(
                f"invalid subject {shown(subject)}: token {i + 1} ({shown(token)}) mixes a wildcard "
                "with text; use '*' and '>' only as whole tokens"
            )
        if token in {"*", ">"} and not wildcards:
            raise InvalidArgumentError(f"subject {shown(subject)} may not contain wildcards here")
        if token == ">" and i != len(tokens) - 1:
            raise InvalidArgumentError(
                f"invalid subject {shown(subject)}: '>' matches the rest of a subject, so use "
                "'>' only as the last token"
            )
    return subject


def validate_stream_subject(subject: object, *, internal: bool = False) -> str:
    """Return ``subject`` if a stream may listen on it, else raise naming the subject and the rule.

    On top of :func:`validate_subject`: no subject of NATS or JetStream
    (first token starting with ``$``: ``$SYS``, ``$JS``, ``$KV``, ``$O``,
    ``$JSC``, ``$NRG``, ``$MQTT``, ...; or ``_INBOX``, ``_R_``, ``_GR_``),
    none of the broker's own (``_PJS``; an ``internal`` stream may use a
    literal one other than :data:`DISCOVERY_SUBJECT`), and no subject made only
    of wildcards other than ``*``: ``>``, ``*.>`` or ``*.*`` would capture the
    broker's discovery requests and every client's ack inbox.
    """
    subject = validate_subject(subject)
    tokens = subject.split(".")
    first = tokens[0]
    if first.startswith("$"):
        raise InvalidArgumentError(
            f"invalid subject {shown(subject)}: subjects starting with '$' are reserved for NATS "
            "and JetStream ($SYS, $JS, $KV, $O, ...); choose another first token"
        )
    owner = _RESERVED_FIRST_TOKENS.get(first)
    broker_own = first == BROKER_SUBJECT_TOKEN and internal
    if owner is not None and not (broker_own and "*" not in tokens and ">" not in tokens):
        raise InvalidArgumentError(
            f"invalid subject {shown(subject)}: '{first}.' subjects are reserved for {owner}; "
            "choose another first token"
        )
    if subject == DISCOVERY_SUBJECT:
        raise InvalidArgumentError(f"invalid subject {shown(subject)}: it is reserved for broker discovery")
    if all(token in {"*", ">"} for token in tokens) and subject != "*":
        raise InvalidArgumentError(
            f"invalid subject {shown(subject)}: it matches the broker's discovery requests "
            f"({DISCOVERY_SUBJECT}) and every client's ack inbox (_INBOX.*); start it with a "
            "literal token"
        )
    return subject


def partition_subject(subject: str, partition: int) -> str:
    """The NATS subject partition ``partition`` of a stream on ``subject`` listens on."""
    return subject if partition == 0 else f"{subject}.{partition}"


@dataclass(frozen=True, kw_only=True)
class StreamConfig:
    """Everything that defines a stream; creating the same config twice is a no-op.

    Every field is checked on construction (ranges inclusive); see the
    constants above for why each bound is where it is.
    """

    name: str
    subject: str
    """A NATS subject (:func:`validate_stream_subject`), at most 1024 bytes."""
    partitions: int = 1
    """1 to 1024."""
    replication_factor: int = 1
    """1 to 16."""
    group: str | None = None
    """Load-balance group: streams in one group share a NATS queue group (1-200 characters)."""
    retention_age: float | None = None
    """Seconds, 0 to 100 years; ``None``: no limit."""
    retention_bytes: int | None = None
    """0 to 2**63 - 1; ``None``: no limit."""
    retention_messages: int | None = None
    """0 to 2**63 - 1; ``None``: no limit."""
    compaction: bool = False
    segment_bytes: int = 64 * MiB
    """1 KiB to 4 GiB."""
    max_message_bytes: int = 1 * MiB
    """1 byte to 64 MiB."""
    compression: str = "none"
    """How stored batches are compressed: ``none``, ``lz4`` or ``zstd``."""
    ack_reply: bool = True
    """Ack plain NATS messages that carry a reply subject, on that subject."""
    min_insync_replicas: int = 1
    """``ALL``-acked writes (and plain messages with a reply subject) are refused with
    ``NotEnoughReplicasError`` while fewer replicas are in sync; 1 to the replication factor."""
    unclean_leader_election: bool = False
    """When every in-sync replica is down, let a replica outside the ISR lead: the
    partition is writable again sooner, but committed messages it lacks are lost."""
    duplicate_window: float = DEFAULT_DUPLICATE_WINDOW
    """Seconds a message id is remembered (``Nats-Msg-Id``, or the client's ``message_id``):
    a message whose id was stored this recently in the same partition is acked as a
    duplicate instead of being stored; 0 turns de-duplication by id off.  0 to a week."""
    duplicate_max_ids: int = 1_000_000
    """Most message ids a partition remembers; past it the oldest are forgotten first, even
    within the window.  1 to 100,000,000."""
    schema: StreamSchema | None = None
    """What the message values hold, every version of it (:mod:`.value_schema`); ``None``: plain
    bytes.  Left out of the JSON form when ``None``, so untyped streams are stored as before."""
    mirror: MirrorSource | None = None
    """The stream another cluster's stream is copied from, offset for offset (see :mod:`.mirror`);
    ``None``: an ordinary stream.  Left out of the JSON form when ``None``."""

    def __post_init__(self) -> None:
        validate_stream_name(self.name, internal=True)
        validate_stream_subject(self.subject, internal=self.name.startswith(INTERNAL_PREFIX))
        bounded_int("partitions", self.partitions, 1, MAX_PARTITIONS)
        bounded_int("replication_factor", self.replication_factor, 1, MAX_REPLICATION_FACTOR)
        bounded_int("segment_bytes", self.segment_bytes, MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES, unit="bytes")
        bounded_int("max_message_bytes", self.max_message_bytes, 1, MAX_MESSAGE_BYTES, unit="bytes")
        if self.partitions > 1 and self.subject.endswith(">"):
            raise InvalidArgumentError(
                f"stream {self.name!r}: a subject ending in '>' ({self.subject!r}) already "
                "matches every partition subject; give it one partition"
            )
        if self.compression not in COMPRESSIONS:
            raise InvalidArgumentError(
                f"compression must be one of {', '.join(COMPRESSIONS)}, got {shown(self.compression)}"
            )
        if self.group is not None:
            validate_group(self.group)
        check_retention(self.retention_age, self.retention_bytes, self.retention_messages)
        bounded_number("duplicate_window", self.duplicate_window, 0, MAX_DUPLICATE_WINDOW)
        bounded_int("duplicate_max_ids", self.duplicate_max_ids, 1, MAX_DUPLICATE_IDS)
        bounded_int("min_insync_replicas", self.min_insync_replicas, 1, MAX_REPLICATION_FACTOR)
        if self.min_insync_replicas > self.replication_factor:
            raise InvalidArgumentError(
                f"min_insync_replicas ({self.min_insync_replicas}) cannot exceed replication_factor "
                f"({self.replication_factor}): no write could ever be acknowledged"
            )
        if self.schema is not None and not isinstance(self.schema, StreamSchema):
            raise InvalidArgumentError(f"schema must be a StreamSchema or None, got {shown(self.schema)}")
        if self.schema is not None:
            self._check_typed(self.schema)
        if self.mirror is not None:
            if not isinstance(self.mirror, MirrorSource):
                raise InvalidArgumentError(f"mirror must be a MirrorSource or None, got {shown(self.mirror)}")
            validate_stream_name(self.mirror.stream)
            if self.name.startswith(INTERNAL_PREFIX):
                raise InvalidArgumentError(f"internal stream {self.name!r} cannot be a mirror")
        for option in ("compaction", "ack_reply", "unclean_leader_election"):
            if not isinstance(getattr(self, option), bool):
                raise InvalidArgumentError(
                    f"{option} must be true or false, got {shown(getattr(self, option))}"
                )

    def _check_typed(self, schema: StreamSchema) -> None:
        if schema.dead_letter is not None:
            validate_stream_name(schema.dead_letter)
            if schema.dead_letter == self.name:
                raise InvalidArgumentError(
                    f"stream {self.name!r} cannot be its own dead-letter stream: name another, untyped one"
                )

    def to_json(self) -> dict[str, Any]:
        """The wire/metadata form: a plain dict (``schema`` and ``mirror`` in their JSON forms, each
        left out when ``None``)."""
        stored = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("schema", "mirror"):
            value = getattr(self, name)
            if value is None:
                del stored[name]
            else:
                stored[name] = value.to_json()
        return stored

    @classmethod
    def from_json(cls, data: object) -> StreamConfig:
        """Parse the wire form strictly: unknown or missing fields are errors."""
        known = (f.name for f in dataclasses.fields(cls))
        data = known_fields(data, known, what="stream config must be an object", fields="stream option(s)")
        if data.get("schema") is not None:
            data = {**data, "schema": StreamSchema.from_json(data["schema"])}
        if data.get("mirror") is not None:
            data = {**data, "mirror": MirrorSource.from_json(data["mirror"])}
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


def check_new_typed(config: StreamConfig, existing: Callable[[str], StreamConfig | None]) -> None:
    """At a stream's creation: raise ``InvalidArgumentError`` if it is typed and compacted (not yet
    supported: compaction would drop the typed columns stored with its batches), or if its
    dead-letter stream does not fit (:func:`check_dead_letter`).  Checked at creation, not on
    every configuration read, so a stream stored before stays readable."""
    if config.schema is not None and config.compaction:
        raise InvalidArgumentError(
            f"stream {config.name!r}: a typed stream cannot be compacted yet (compaction would drop "
            "the typed columns stored with its batches); leave compaction off or the schema out"
        )
    check_dead_letter(config, existing)


def check_dead_letter(
    config: StreamConfig,
    existing: Callable[[str], StreamConfig | None],
    before: StreamConfig | None = None,
) -> None:
    """At a typed stream's creation (or its policy's change): raise ``InvalidArgumentError`` unless
    its dead-letter stream, if it names one, exists (``existing(name)``) and is untyped -- a typed
    one could refuse the very messages it is to keep.

    ``before``: the stream's config before a schema update.  A dead-letter stream it already
    named is not checked again: it may have been deleted since (the stream's invalid messages
    are refused at ingest then), which must not block the stream's schema changes."""
    dead_letter = config.schema.dead_letter if config.schema is not None else None
    if dead_letter is None:
        return
    if before is not None and before.schema is not None and before.schema.dead_letter == dead_letter:
        return
    target = existing(dead_letter)
    if target is None:
        raise InvalidArgumentError(
            f"stream {config.name!r}: its dead-letter stream {dead_letter!r} does not exist; create it "
            "first (untyped)"
        )
    if target.schema is not None:
        raise InvalidArgumentError(
            f"stream {config.name!r}: its dead-letter stream {dead_letter!r} is typed; invalid messages "
            "need an untyped one"
        )
    if any(token in ("*", ">") for token in target.subject.split(".")):
        raise InvalidArgumentError(
            f"stream {config.name!r}: its dead-letter stream {dead_letter!r} listens on a wildcard "
            f"subject ({target.subject!r}), which cannot be published to; name one on a plain subject"
        )


def schema_updated(config: StreamConfig, document: SchemaDocument) -> StreamConfig | None:
    """``config`` with ``document`` as its schema's next version, or ``None`` if it is the current one.

    Raises ``InvalidArgumentError`` with one line naming the field and why when the change is not
    compatible (:func:`.value_schema.check_compatible`), and for a stream without a schema (a
    schema is declared when the stream is created: its messages so far are untyped).
    """
    if config.schema is None:
        raise InvalidArgumentError(
            f"stream {config.name!r} has no schema: a schema is given when a stream is created "
            "(create a new stream with --schema)"
        )
    evolved = config.schema.evolved(document)
    if evolved is config.schema:
        return None
    return dataclasses.replace(config, schema=evolved)


def check_retention(age: object, size: object, messages: object) -> None:
    """Check the retention limits (each ``None`` for no limit) as a stream and a log take them."""
    if age is not None:
        bounded_number("retention_age", age, 0, MAX_AGE)
    if size is not None:
        bounded_int("retention_bytes", size, 0, INT64_MAX, unit="bytes")
    if messages is not None:
        bounded_int("retention_messages", messages, 0, INT64_MAX)


def bounded_int(name: str, value: object, low: int, high: int, *, unit: str = "") -> int:
    """Return ``value`` if it is an integer from ``low`` to ``high``, else raise naming all three.

    ``unit="bytes"`` shows large limits also as KiB, MiB or GiB.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be {int_range(low, high, unit=unit)}, got {shown(value)}")
    return value


def bounded_number(name: str, value: object, low: float, high: float, *, unit: str = "seconds") -> float:
    """Return ``value`` if it is a finite number (int or float) from ``low`` to ``high``, else raise."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise InvalidArgumentError(f"{name} must be {number_range(low, high, unit=unit)}, got {shown(value)}")
    return value


def int_range(low: int, high: int, *, unit: str = "") -> str:
    """``a positive integer up to 1024``, ``an integer from 1024 (1 KiB) to ...``: for messages."""
    if low == 0:
        return f"a non-negative integer up to {_limit(high, unit)}"
    if low == 1:
        return f"a positive integer up to {_limit(high, unit)}"
    return f"an integer from {_limit(low, unit)} to {_limit(high, unit)}"


def number_range(low: float, high: float, *, unit: str = "seconds") -> str:
    """``a number of seconds from 0.001 to 3600``: for messages."""
    return f"a number of {unit} from {_number(low)} to {_number(high)}"


def is_name_list(value: object) -> TypeGuard[list[str]]:
    """Whether ``value`` is a non-empty list of non-empty strings (broker ids, column names)."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) and v for v in value)


def _limit(value: int, unit: str) -> str:
    if unit == "bytes":
        for size, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
            if value >= size and value % size == 0:
                return f"{value} ({value // size} {name})"
    return str(value)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
