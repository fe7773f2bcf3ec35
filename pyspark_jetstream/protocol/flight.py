"""The Arrow Flight API of a broker: tickets, actions and their JSON bodies.

Reads
    ``do_get`` with a ticket whose bytes are a JSON :class:`ReadRequest`::

        {"stream": "orders", "partition": 0, "start": "earliest",
         "max_records": 10000, "max_bytes": 8388608, "max_wait": 5.0}

    ``start`` is ``"earliest"``, ``"latest"``, ``{"offset": N}`` or
    ``{"timestamp": seconds since the epoch}``; the other fields are optional.
    Numbers are bounded: offsets, ``max_records`` and ``max_bytes`` fit a
    signed 64-bit integer (Arrow int64, Spark long), partitions are 0 to 1023,
    timestamps finite and within years 1 to 9999, ``max_wait`` and ``follow``
    0 to 300 seconds.  Tickets and bodies are flat: JSON nested deeper than
    :data:`MAX_JSON_DEPTH` levels is refused.
    ``columns`` (a list of column names, ``offset`` always included) asks
    for only those columns: less to send for the same rows.  ``filters`` (a
    list of conditions on columns, all met) sends only the rows that meet
    them.  Both are described in :mod:`.read_shape`, with the columns of a
    typed stream's read: the log's, then the fields of its current schema
    version.
    The response is a stream of record batches in the log schema (with a
    typed stream's fields after its columns, see :mod:`.read_shape`); its schema
    metadata carries the partition's offsets at the time of the read under the
    keys of :data:`RESPONSE_KEYS` (``next_offset`` is where to read next).
    If nothing is there yet the broker waits up to ``max_wait`` seconds for
    new committed data before answering.

    With ``follow`` > 0 the response is a tail instead: the broker keeps the
    stream open for up to ``follow`` seconds and sends each batch as soon as
    it is committed (no per-batch call, so the lowest latency).  The schema
    metadata then describes the start; the client tracks offsets from the
    rows.  ``max_records``/``max_bytes`` apply to each batch sent.

Actions
    ``do_action`` with one of :class:`ActionType`; bodies and results are JSON.

Errors
    Flight errors whose message starts with ``[<error code>] `` (see
    :mod:`.errors`), e.g. ``[unknown_stream] no stream named 'x'``.
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidArgumentError, JetStreamError, error_from_code, shown
from .read_shape import ColumnFilter, filters_from_json
from .schema import LOG_SCHEMA
from .streams import (
    INT64_MAX,
    MAX_PARTITIONS,
    MAX_TIMESTAMP,
    MIN_TIMESTAMP,
    bounded_int,
    bounded_number,
    is_name_list,
)

RESPONSE_KEYS = ("next_offset", "high_watermark", "log_start_offset", "log_end_offset")
RESPONSE_PREFIX = "jetstream."
MAX_WAIT_LIMIT = 300.0
MAX_JSON_DEPTH = 16
"""Deepest nesting accepted in a ticket or action body (they need 2): deeper
JSON only costs recursion, in the parser and in every error message."""


class ActionType(enum.Enum):
    """Admin actions a broker serves."""

    CREATE_STREAM = "create_stream"
    DELETE_STREAM = "delete_stream"
    ADD_PARTITIONS = "add_partitions"
    UPDATE_SCHEMA = "update_schema"
    DESCRIBE_STREAM = "describe_stream"
    LIST_STREAMS = "list_streams"
    SET_CURSOR = "set_cursor"
    FETCH_CURSOR = "fetch_cursor"
    DELETE_CURSOR = "delete_cursor"
    STATUS = "status"
    HEALTH = "health"
    METADATA = "metadata"
    ELECT_PREFERRED_LEADERS = "elect_preferred_leaders"
    REASSIGN_PARTITIONS = "reassign_partitions"
    OFFSETS_FOR_LEADER_EPOCH = "offsets_for_leader_epoch"
    CONTROLLER_CALL = "controller_call"
    IDENTIFY = "identify"
    CREATE_MIRROR = "create_mirror"
    PROMOTE_STREAM = "promote_stream"
    MIRROR_STATUS = "mirror_status"


@dataclass(frozen=True, slots=True)
class StartPosition:
    """Where a read starts: ``earliest``, ``latest``, an ``offset`` or a ``timestamp``."""

    kind: str
    value: float | None = None

    def to_json(self) -> object:
        """Wire form: a keyword or a one-key object."""
        if self.kind in ("earliest", "latest"):
            return self.kind
        return {self.kind: self.value}

    @classmethod
    def from_json(cls, data: object) -> StartPosition:
        """Parse the wire form strictly."""
        if data in ("earliest", "latest"):
            return cls(str(data))
        if isinstance(data, dict) and len(data) == 1:
            ((kind, value),) = data.items()
            try:
                if kind == "offset":
                    return cls("offset", validate_offset("offset", value))
                if kind == "timestamp":
                    return cls("timestamp", float(validate_timestamp("timestamp", value)))
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"invalid start {shown(data)}: {exc}") from None
        raise InvalidArgumentError(
            f"invalid start {shown(data)}: use 'earliest', 'latest', {{'offset': N >= 0}} "
            "or {'timestamp': seconds}"
        )


EARLIEST = StartPosition("earliest")
LATEST = StartPosition("latest")


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """A ``do_get`` ticket."""

    stream: str
    partition: int = 0
    start: StartPosition = EARLIEST
    max_records: int | None = None
    max_bytes: int | None = None
    max_wait: float = 0.0
    follow: float = 0.0
    columns: tuple[str, ...] | None = None
    """Only these columns (the log's, and a typed stream's fields; ``offset`` always)."""
    from_replicas: bool = False
    """Let an in-sync follower serve the read (up to its own high watermark)."""
    filters: tuple[ColumnFilter, ...] = ()
    """Only the rows meeting all of these (see :mod:`.read_shape`)."""

    def to_ticket(self) -> bytes:
        """The ticket bytes."""
        return json.dumps(
            {
                "stream": self.stream,
                "partition": self.partition,
                "start": self.start.to_json(),
                "max_records": self.max_records,
                "max_bytes": self.max_bytes,
                "max_wait": self.max_wait,
                "follow": self.follow,
                "columns": None if self.columns is None else list(self.columns),
                "from_replicas": self.from_replicas,
                **({"filters": [f.to_json() for f in self.filters]} if self.filters else {}),
            }
        ).encode()

    @classmethod
    def from_ticket(cls, ticket: bytes) -> ReadRequest:
        """Parse ticket bytes strictly; raises ``InvalidArgumentError`` naming the bad field."""
        data = _json_object(ticket, "ticket")
        allowed = {
            "stream",
            "partition",
            "start",
            "max_records",
            "max_bytes",
            "max_wait",
            "follow",
            "columns",
            "from_replicas",
            "filters",
        }
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise InvalidArgumentError(f"unknown ticket field(s): {', '.join(unknown)}")
        if not isinstance(data.get("stream"), str):
            raise InvalidArgumentError(f"ticket needs a 'stream' string, got {shown(data.get('stream'))}")
        partition = validate_partition("partition", data.get("partition", 0))
        for name in ("max_records", "max_bytes"):
            value = data.get(name)
            if value is not None:
                bounded_int(name, value, 1, INT64_MAX)
        max_wait = data.get("max_wait", 0.0)
        follow = data.get("follow", 0.0)
        for name, value in (("max_wait", max_wait), ("follow", follow)):
            if not _is_number(value) or not math.isfinite(value) or not 0 <= value <= MAX_WAIT_LIMIT:
                raise InvalidArgumentError(
                    f"{name} must be 0 to {MAX_WAIT_LIMIT:g} seconds, got {shown(value)}"
                )
        columns = data.get("columns")
        if columns is not None:
            if not is_name_list(columns):
                raise InvalidArgumentError(
                    f"columns must be a non-empty list of column names; got {shown(columns)}"
                )
            # The log's columns in their order (offset always), then the others as given: a typed
            # stream's fields, checked against its schema by the broker.
            columns = tuple(name for name in LOG_SCHEMA.names if name in columns or name == "offset") + tuple(
                dict.fromkeys(c for c in columns if c not in LOG_SCHEMA.names)
            )
        return cls(
            stream=data["stream"],
            partition=partition,
            start=StartPosition.from_json(data.get("start", "earliest")),
            max_records=data.get("max_records"),
            max_bytes=data.get("max_bytes"),
            max_wait=float(max_wait),
            follow=float(follow),
            columns=columns,
            from_replicas=_flag("from_replicas", data.get("from_replicas", False)),
            filters=filters_from_json(data.get("filters", [])),
        )


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition as ``describe_stream`` reports it."""

    partition: int
    leader: str
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    leader_epoch: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """A stream's configuration (as JSON) and the state of its partitions."""

    config: dict[str, Any]
    partitions: tuple[PartitionInfo, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """Wire form."""
        return {
            "config": self.config,
            "partitions": [_partition_json(p) for p in self.partitions],
        }

    @classmethod
    def from_json(cls, data: object) -> StreamInfo:
        """Parse the wire form."""
        if not isinstance(data, dict) or set(data) != {"config", "partitions"}:
            raise InvalidArgumentError(f"not a stream description: {data!r}")
        try:
            partitions = tuple(
                PartitionInfo(**{**p, "replicas": tuple(p["replicas"]), "isr": tuple(p["isr"])})
                for p in data["partitions"]
            )
        except (TypeError, KeyError) as exc:
            raise InvalidArgumentError(f"not a stream description: {exc}") from None
        return cls(config=data["config"], partitions=partitions)


def _partition_json(p: PartitionInfo) -> dict[str, Any]:
    return {
        "partition": p.partition,
        "leader": p.leader,
        "replicas": list(p.replicas),
        "isr": list(p.isr),
        "leader_epoch": p.leader_epoch,
        "log_start_offset": p.log_start_offset,
        "log_end_offset": p.log_end_offset,
        "high_watermark": p.high_watermark,
    }


def response_metadata(**offsets: int) -> dict[str, str]:
    """Schema metadata of a read response."""
    return {RESPONSE_PREFIX + k: str(v) for k, v in offsets.items() if k in RESPONSE_KEYS}


def parse_response_metadata(metadata: dict[bytes, bytes] | None) -> dict[str, int]:
    """Offsets from a read response's schema metadata (missing keys are absent)."""
    out = {}
    for key in RESPONSE_KEYS:
        raw = (metadata or {}).get((RESPONSE_PREFIX + key).encode())
        if raw is not None:
            out[key] = int(raw)
    return out


def encode_json(body: object) -> bytes:
    """Action body or result bytes."""
    return json.dumps(body, separators=(",", ":")).encode()


def decode_json_object(body: bytes, what: str) -> dict[str, Any]:
    """Parse an action body that must be a JSON object."""
    return _json_object(body, what)


def error_message(error: JetStreamError) -> str:
    """The Flight error text for ``error``: ``[code] message``."""
    return f"[{error.code.value}] {error}"


def error_detail(error: JetStreamError) -> bytes:
    """The Flight error's ``extra_info``: the error's structured fields as a JSON object."""
    return json.dumps(
        {k: v for k, v in error.fields.items() if isinstance(v, str | int | float | bool)},
        separators=(",", ":"),
    ).encode()


_ERROR_TEXT = re.compile(r"\[([a-z_]+)\] (.*?)(?:\. Detail: .*)?$", re.DOTALL)


def error_from_message(text: str, detail: bytes | None = None) -> JetStreamError | None:
    """The error a broker's Flight error text (and ``extra_info``) stands for; ``None`` if not ours."""
    match = _ERROR_TEXT.search(text)
    if match is None:
        return None
    try:
        fields = json.loads(detail) if detail else {}
    except (ValueError, RecursionError):
        fields = {}
    if not isinstance(fields, dict):
        fields = {}
    return error_from_code(match.group(1), match.group(2), fields)


def validate_offset(name: str, value: object) -> int:
    """Return ``value`` if it is an offset: an integer from 0 to 2**63 - 1, else raise naming ``name``.

    Offsets are Arrow int64 and Spark long; a larger one cannot be stored or read.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64_MAX:
        raise InvalidArgumentError(
            f"{name} must be an integer from 0 to {INT64_MAX}: offsets must not be negative and must "
            f"fit a signed 64-bit integer; got {shown(value)}"
        )
    return value


def validate_partition(name: str, value: object) -> int:
    """Return ``value`` if it is a partition number (0 to 1023), else raise naming ``name``."""
    return bounded_int(name, value, 0, MAX_PARTITIONS - 1)


def validate_timestamp(name: str, value: object) -> float:
    """Return ``value`` if it is finite seconds since the epoch within years 1 to 9999, else raise."""
    return bounded_number(name, value, MIN_TIMESTAMP, MAX_TIMESTAMP, unit="seconds since the epoch")


def validate_body_int(name: str, value: object) -> int:
    """Check an integer field of an action body: ``partition`` a partition number, any other an offset."""
    if name == "partition":
        return validate_partition(name, value)
    return validate_offset(name, value)


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(body or b"{}")
    except RecursionError:
        raise InvalidArgumentError(f"{what} nests JSON deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{what} must be a JSON object, got {type(data).__name__}")
    _check_depth(data, what)
    return data


def _check_depth(data: object, what: str) -> None:
    """Raise if ``data`` nests deeper than :data:`MAX_JSON_DEPTH` (iteratively: no recursion)."""
    pending = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_JSON_DEPTH:
            raise InvalidArgumentError(f"{what} nests JSON deeper than {MAX_JSON_DEPTH} levels")
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be true or false, got {shown(value)}")
    return value


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
