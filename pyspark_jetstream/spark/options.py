"""Spark's string options for ``format("jetstream")``, parsed once into typed values.

Every error names the option, the value and what would be accepted, so a
misconfigured query fails at planning with a one-line reason.  Parsing is
pure: no broker or NATS server is asked anything here (that is
:mod:`.planning`'s job, once, on the driver), so a query's options are
checked in full before any connection is tried.  Numbers are
bounded (inclusive): ``maxRecordsPerTrigger`` and ``maxRecordsPerPartition``
1 to 2**63 - 1 (Spark longs), ``timeout`` 0.1 to 3600 seconds,
``maxBatchBytes`` 64 bytes to 64 MiB, offsets -2 to 2**63 - 1, partitions 0
to 1023, and timestamps in milliseconds up to the end of year 9999.

Credentials for a secured deployment (TLS, a user and token) are the options
``user``, ``token``, ``tls.ca``, ``tls.cert``, ``tls.key`` and
``credentialsFile`` (a TOML file with the keys ``user``, ``token``,
``tls_ca``, ``tls_cert``, ``tls_key``; options given override its values).
Readers and writers present them to every broker, and the sink to NATS.
Once parsed, the token lives only in a
:class:`~pyspark_jetstream.client.credentials.Credentials` (whose ``repr``
hides it), not in the parsed options.  Spark itself shows a source's options
in its plans, masking those whose name matches ``spark.redaction.regex``
(``token`` does by default); ``credentialsFile`` keeps the token out of the
query's options altogether, whatever that setting says.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from pyspark_jetstream.client.credentials import CREDENTIALS_FILE_OPTION, OPTION_KEYS, Credentials
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.streams import (
    INT64_MAX,
    MAX_MESSAGE_BYTES,
    MAX_PARTITIONS,
    MAX_TIMESTAMP,
    int_range,
    number_range,
    shown,
    validate_stream_name,
)

DEFAULT_MAX_RECORDS_PER_PARTITION = 2_000_000
"""Offset ranges longer than this are split over several Spark tasks."""
READ_MODES = ("tasks", "driver")
"""``readMode``: micro-batches read in Spark tasks (the default), or in the driver (see
:mod:`.driver_reader`)."""
DEFAULT_MAX_TRIGGER_DELAY = 15 * 60.0
"""``maxTriggerDelay``'s default, as in Spark's Kafka source: 15 minutes."""
MAX_MIN_PARTITIONS = 100_000
MIN_TIMEOUT = 0.1
MAX_TIMEOUT = 3600.0
MIN_SINK_BATCH_BYTES = 64
"""A chunk always holds at least one row, so any size works; the sink's tests use
64 bytes to get one row per chunk."""
MAX_SINK_BATCH_BYTES = MAX_MESSAGE_BYTES
"""A chunk is one NATS message: nats-server cannot take payloads over 64 MiB."""
MAX_TIMESTAMP_MS = MAX_TIMESTAMP * 1000 + 999

Offsets = dict[str, dict[str, int]]
"""``{stream: {partition (as a string): offset}}``: Spark's offset format for this source."""

CREDENTIAL_OPTIONS = (*OPTION_KEYS, CREDENTIALS_FILE_OPTION)
"""``user``, ``token``, ``tls.ca``, ``tls.cert``, ``tls.key`` and ``credentialsFile``."""
COMMON_OPTIONS = ("servers", "nats", "timeout", *CREDENTIAL_OPTIONS)
SOURCE_OPTIONS = (
    *COMMON_OPTIONS,
    "stream",
    "streams",
    "streamPattern",
    "assign",
    "startingOffsets",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets",
    "endingTimestamp",
    "endingOffsetsByTimestamp",
    "maxRecordsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "maxRecordsPerPartition",
    "minPartitions",
    "failOnDataLoss",
    "includeHeaders",
    "readFromReplicas",
    "consumerId",
    "valueFormat",
    "columns",
    "pushFilters",
    "readMode",
)
SINK_OPTIONS = (*COMMON_OPTIONS, "stream", "maxBatchBytes")
SPARK_OPTIONS = ("path", "checkpointLocation")
"""Options Spark itself may hand a data source; accepted and left to Spark."""
SOURCE_ALIASES = {
    "subscribe": "streams",
    "subscribePattern": "streamPattern",
    "maxOffsetsPerTrigger": "maxRecordsPerTrigger",
}
"""Spark's Kafka source names with the same meaning here."""
SINK_ALIASES = {"topic": "stream"}
KAFKA_ONLY = {
    "kafka.bootstrap.servers": "use 'servers' (the brokers' Flight addresses, grpc://host:port) or 'nats'",
    "groupIdPrefix": "use 'consumerId' (the name the query's cursors are stored under)",
    "kafka.group.id": "use 'consumerId' (the name the query's cursors are stored under)",
    "fetchOffset.numRetries": "not needed: reads follow leader changes and retry by themselves",
    "fetchOffset.retryIntervalMs": "not needed: reads follow leader changes and retry by themselves",
    "kafkaConsumer.pollTimeoutMs": "use 'timeout' (seconds)",
}
"""Kafka source and sink options that mean something else here, or nothing yet: refused with
what to use instead."""


def checked_options(
    options: Mapping[str, str], known: tuple[str, ...], aliases: Mapping[str, str]
) -> dict[str, str]:
    """``options`` with lower-cased names and Kafka aliases replaced by our names.

    Raises ``InvalidArgumentError`` for an option this side does not know
    (naming the closest known one, or saying that it is the other side's), a
    Kafka option that does not apply (with what to use instead), and an
    option given under two names.
    """
    by_lower = {name.lower(): name for name in (*known, *SPARK_OPTIONS)}
    alias_of = {alias.lower(): target for alias, target in aliases.items()}
    out: dict[str, str] = {}
    for name, value in options.items():
        lower = name.lower()
        if lower in alias_of:
            target = alias_of[lower]
            if target.lower() in {k.lower() for k in options}:
                raise InvalidArgumentError(
                    f"options '{name}' and '{target}' mean the same here: give one of them"
                )
            out[target.lower()] = value
        elif lower in by_lower:
            out[lower] = value
        else:
            raise _refused_name(name, known, aliases)
    return out


def check_option_names(options: Mapping[str, str]) -> None:
    """Refuse, at planning, an option name that neither reads nor writes take.

    For ``format("jetstream")`` itself: Spark hands a data source its options
    with lower-cased names, so the name cannot be echoed as the user wrote
    it; the message says so and names the closest option in its own
    spelling.  Which side an option belongs to is checked when the reader or
    writer is made.
    """
    known = tuple(dict.fromkeys((*SOURCE_OPTIONS, *SINK_OPTIONS)))
    aliases = {**SOURCE_ALIASES, **SINK_ALIASES}
    taken = {name.lower() for name in (*known, *aliases, *SPARK_OPTIONS)}
    for name in options:
        if name.lower() not in taken:
            raise _refused_name(name, known, aliases, lower_cased=True)


def _refused_name(
    name: str, known: tuple[str, ...], aliases: Mapping[str, str], *, lower_cased: bool = False
) -> InvalidArgumentError:
    """The error for an option name ``known`` and ``aliases`` lack: Kafka's, the other side's
    (both named in their own spelling), or unknown, ending with the closest known name, or
    with every known name when none is close."""
    lower = name.lower()
    kafka_only = {kafka.lower(): (kafka, why) for kafka, why in KAFKA_ONLY.items()}
    if lower in kafka_only:
        return InvalidArgumentError(f"option '{kafka_only[lower][0]}' is Kafka's: {kafka_only[lower][1]}")
    reading = {n.lower(): n for n in (*SOURCE_OPTIONS, *SOURCE_ALIASES)}
    writing = {n.lower(): n for n in (*SINK_OPTIONS, *SINK_ALIASES)}
    for side, names in (
        ("reads (spark.read, spark.readStream)", reading),
        ("writes (df.write, df.writeStream)", writing),
    ):
        if lower in names:
            return InvalidArgumentError(f"option '{names[lower]}' is for {side} only")
    choices = [*known, *aliases]
    close = difflib.get_close_matches(lower, [n.lower() for n in choices], n=1, cutoff=0.6)
    given = (
        f"'{name}' (Spark passes option names in lower case)"
        if lower_cased and name == lower
        else f"'{name}'"
    )
    if close:  # the fix, last: Spark shows this line at the end of a long trace
        return InvalidArgumentError(
            f"unknown option {given}; did you mean '{next(n for n in choices if n.lower() == close[0])}'?"
        )
    return InvalidArgumentError(
        f"unknown option {given} (known: {', '.join(sorted(choices, key=str.lower))})"
    )


@dataclass(frozen=True, slots=True)
class Addresses:
    """Where the deployment is, as the options give it: checked, not yet asked.

    ``servers`` are Flight addresses to start from; ``nats`` the NATS servers
    where a broker answers (used to find one when ``servers`` is empty, and by
    the sink to publish).  :mod:`.planning` turns them into brokers.
    """

    servers: tuple[str, ...] = ()
    nats: tuple[str, ...] = ()
    connect_timeout: float = 10.0
    """Seconds to reach the deployment (to find a broker through ``nats``, or for a first broker
    of ``servers`` to answer): the option ``timeout``, or 10.  A wrong address or a deployment
    that is down fails the query's planning after this, not after the longer ``timeout``."""


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """A reader's options, typed; :func:`.planning.plan_source` adds the brokers to ask."""

    addresses: Addresses
    streams: tuple[str, ...] = ()
    stream_pattern: str | None = None
    assigned: dict[str, tuple[int, ...]] | None = None
    """``assign``: only these partitions of these streams."""
    starting: str | Offsets = "latest"
    starting_timestamp: float | None = None
    ending: str | Offsets = "latest"
    ending_timestamp: float | None = None
    starting_by_timestamp: dict[str, dict[str, int]] | None = None
    """``startingOffsetsByTimestamp``: milliseconds per stream partition."""
    ending_by_timestamp: dict[str, dict[str, int]] | None = None
    by_timestamp_strategy: str = "error"
    """``startingOffsetsByTimestampStrategy``: ``error`` or ``latest`` when no message is that new."""
    max_records_per_trigger: int | None = None
    min_records_per_trigger: int | None = None
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    read_from_replicas: bool = False
    consumer_id: str = ""
    """``consumerId``, or (not given) the name a checkpoint written before queries kept their own
    carries on with (see :mod:`.consumers`)."""
    consumer_given: bool = False
    """Whether ``consumerId`` was given: a query without one stores its cursors under its own name."""
    timeout: float = 30.0
    value_format: str | None = None
    """``valueFormat``: ``typed``, ``binary``, or ``None`` for typed when the streams are (see
    :mod:`.typed_source`)."""
    columns: tuple[str, ...] | None = None
    """``columns``: the typed fields to read (all of them if ``None``)."""
    push_filters: bool = False
    """``pushFilters``: hand Spark's filters on typed fields to the broker (batch reads)."""
    read_mode: str = "tasks"
    """``readMode``: one of :data:`READ_MODES` (streaming reads)."""
    credentials: Credentials = field(default_factory=Credentials)
    options: dict[str, str] = field(default_factory=dict)
    """The options as given, but the credentials' (see :func:`without_credentials`)."""


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """A writer's options, typed; :func:`.planning.plan_sink` adds the brokers and NATS servers."""

    addresses: Addresses
    stream: str | None
    timeout: float = 30.0
    max_batch_bytes: int = 900 * 1024
    credentials: Credentials = field(default_factory=Credentials)


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Parse a reader's options; raises ``InvalidArgumentError`` naming the bad option."""
    opts = checked_options(options, SOURCE_OPTIONS, SOURCE_ALIASES)
    chosen = [name for name in ("stream", "streams", "streampattern", "assign") if opts.get(name)]
    if len(chosen) != 1:
        raise InvalidArgumentError(
            "give exactly one of the options 'stream', 'streams' (comma-separated), 'streamPattern' "
            f"(a regular expression) or 'assign' (JSON); got {', '.join(chosen) or 'none'}"
        )
    streams: tuple[str, ...] = ()
    pattern = None
    assigned = None
    if chosen[0] == "assign":
        assigned = _assignment(opts["assign"])
        streams = tuple(assigned)
    elif chosen[0] == "stream":
        streams = (_stream_name("stream", opts["stream"]),)
    elif chosen[0] == "streams":
        streams = tuple(_stream_name("streams", s.strip()) for s in opts["streams"].split(",") if s.strip())
        if not streams:
            raise InvalidArgumentError(f"option 'streams' lists no stream: {opts['streams']!r}")
    else:
        pattern = opts["streampattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidArgumentError(
                f"option 'streamPattern' {pattern!r} is not a regular expression: {exc}"
            ) from None
    starting = _offsets_option(
        "startingOffsets", opts.get("startingoffsets", "latest" if streaming else "earliest")
    )
    if starting == "cursor" and not opts.get("consumerid"):
        # A query without one stores its cursors under a name of its own (see .consumers): there
        # are none to start from.
        raise InvalidArgumentError(
            "startingOffsets=cursor needs the option 'consumerId' (the consumer whose cursors to start from)"
        )
    ending = _offsets_option("endingOffsets", opts.get("endingoffsets", "latest"), allow_cursor=False)
    if streaming and ("endingoffsets" in opts or "endingtimestamp" in opts):
        raise InvalidArgumentError(
            "endingOffsets and endingTimestamp are for batch reads (spark.read), not streams"
        )
    if ending == "earliest":
        raise InvalidArgumentError(
            "endingOffsets='earliest' would read nothing; use 'latest' or JSON offsets"
        )
    max_per_trigger = _positive_int(opts, "maxRecordsPerTrigger")
    min_per_trigger = _positive_int(opts, "minOffsetsPerTrigger")
    for given in ("maxRecordsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "readMode"):
        if given.lower() in opts and not streaming:
            raise InvalidArgumentError(f"{given} applies to streaming reads only")
    if "maxtriggerdelay" in opts and min_per_trigger is None:
        raise InvalidArgumentError("maxTriggerDelay goes with minOffsetsPerTrigger: give both, or neither")
    if min_per_trigger is not None and max_per_trigger is not None and min_per_trigger > max_per_trigger:
        raise InvalidArgumentError(
            f"minOffsetsPerTrigger ({min_per_trigger}) is more than maxRecordsPerTrigger ({max_per_trigger})"
        )
    read_mode = _read_mode(opts, min_per_trigger)
    starting_by_time = _timestamps_option(opts, "startingOffsetsByTimestamp")
    ending_by_time = _timestamps_option(opts, "endingOffsetsByTimestamp")
    if starting_by_time is not None and ("startingtimestamp" in opts or "startingoffsets" in opts):
        raise InvalidArgumentError(
            "give one of startingOffsets, startingTimestamp and startingOffsetsByTimestamp"
        )
    if ending_by_time is not None and ("endingtimestamp" in opts or "endingoffsets" in opts):
        raise InvalidArgumentError("give one of endingOffsets, endingTimestamp and endingOffsetsByTimestamp")
    if streaming and ending_by_time is not None:
        raise InvalidArgumentError("endingOffsetsByTimestamp is for batch reads (spark.read), not streams")
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise InvalidArgumentError(
            f"option 'startingOffsetsByTimestampStrategy' must be error or latest, got {shown(strategy)}"
        )
    consumer = opts.get("consumerid") or _default_consumer(opts)
    if "/" in consumer:
        raise InvalidArgumentError(f"option 'consumerId' must not contain '/', got {consumer!r}")
    if streaming and "pushfilters" in opts:
        raise InvalidArgumentError(
            "pushFilters is for batch reads (spark.read): PySpark's streaming readers take no filters"
        )
    credentials = credentials_option(opts)
    return SourceOptions(
        addresses=addresses_option(opts, nats_always=False),
        streams=streams,
        stream_pattern=pattern,
        assigned=assigned,
        starting=starting,
        starting_timestamp=_timestamp(opts, "startingTimestamp"),
        ending=ending,
        ending_timestamp=_timestamp(opts, "endingTimestamp"),
        starting_by_timestamp=starting_by_time,
        ending_by_timestamp=ending_by_time,
        by_timestamp_strategy=strategy,
        max_records_per_trigger=max_per_trigger,
        min_records_per_trigger=min_per_trigger,
        max_trigger_delay=_duration(opts, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY),
        max_records_per_partition=_positive_int(opts, "maxRecordsPerPartition")
        or DEFAULT_MAX_RECORDS_PER_PARTITION,
        min_partitions=_bounded_int(opts, "minPartitions", 1, MAX_MIN_PARTITIONS),
        fail_on_data_loss=_boolean(opts, "failOnDataLoss", True),
        include_headers=_boolean(opts, "includeHeaders", False),
        read_from_replicas=_boolean(opts, "readFromReplicas", False),
        consumer_id=consumer,
        consumer_given=bool(opts.get("consumerid")),
        timeout=_seconds(opts, "timeout", 30.0),
        value_format=_value_format(opts),
        columns=_columns(opts),
        push_filters=_boolean(opts, "pushFilters", False),
        read_mode=read_mode,
        credentials=credentials,
        options=without_credentials(options),
    )


def _read_mode(opts: Mapping[str, str], min_per_trigger: int | None) -> str:
    """``readMode``, with what ``driver`` cannot take refused."""
    given = opts.get("readmode", "tasks")
    mode = given.strip().lower()
    if mode not in READ_MODES:
        raise InvalidArgumentError(
            f"option 'readMode' must be tasks (micro-batches read in Spark tasks) or driver (read in the "
            f"driver, for low rates), got {shown(given)}"
        )
    if mode == "driver" and min_per_trigger is not None:
        raise InvalidArgumentError(
            "readMode=driver reads a micro-batch as soon as Spark asks for one: minOffsetsPerTrigger "
            "cannot hold it back there; leave minOffsetsPerTrigger out, or use readMode=tasks"
        )
    if mode == "driver" and "minpartitions" in opts:
        raise InvalidArgumentError(
            "readMode=driver reads each micro-batch in the driver, in no Spark task of its own: "
            "minPartitions does not apply; leave it out, or use readMode=tasks"
        )
    return mode


def _value_format(opts: Mapping[str, str]) -> str | None:
    given = opts.get("valueformat")
    if given is None:
        return None
    value = given.strip().lower()
    if value not in ("typed", "binary"):
        raise InvalidArgumentError(
            f"option 'valueFormat' must be typed (a typed stream's fields as columns) or binary "
            f"(Kafka's value bytes), got {shown(given)}"
        )
    return value


def _columns(opts: Mapping[str, str]) -> tuple[str, ...] | None:
    given = opts.get("columns")
    if given is None:
        return None
    names = tuple(dict.fromkeys(n.strip() for n in given.split(",") if n.strip()))
    if not names:
        raise InvalidArgumentError(f"option 'columns' names no field: {shown(given)}")
    return names


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Parse a writer's options; raises ``InvalidArgumentError`` naming the bad option."""
    opts = checked_options(options, SINK_OPTIONS, SINK_ALIASES)
    stream = opts.get("stream")
    if stream is not None:
        _stream_name("stream", stream)
    timeout = _seconds(opts, "timeout", 30.0)
    max_batch_bytes = (
        _bounded_int(opts, "maxBatchBytes", MIN_SINK_BATCH_BYTES, MAX_SINK_BATCH_BYTES) or 900 * 1024
    )
    credentials = credentials_option(opts)
    return SinkOptions(
        addresses=addresses_option(opts, nats_always=True),
        stream=stream,
        timeout=timeout,
        max_batch_bytes=max_batch_bytes,
        credentials=credentials,
    )


def include_headers(options: Mapping[str, str]) -> bool:
    """The option ``includeHeaders`` alone (for the schema, which Spark asks for before a reader
    exists): ``False`` unless given; raises ``InvalidArgumentError`` for a value not true or false."""
    return _boolean({name.lower(): value for name, value in options.items()}, "includeHeaders", False)


def credentials_option(opts: Mapping[str, str]) -> Credentials:
    """The credentials of checked options (lower-cased names): given options override the file's.

    Errors name the option or the file, never the token.
    """
    by_lower = {name.lower(): name for name in CREDENTIAL_OPTIONS}
    given = {by_lower[k]: v for k, v in opts.items() if k in by_lower}
    for name in ("tls.ca", "tls.cert", "tls.key", CREDENTIALS_FILE_OPTION):
        if name in given and not given[name].strip():
            raise InvalidArgumentError(f"option '{name}' is empty: give a file's path, or leave it out")
    if "token" in given and not given["token"]:
        raise InvalidArgumentError("option 'token' is empty")
    return Credentials.from_options(given)


def without_credentials(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` with the credentials' options left out (they live in :class:`Credentials`)."""
    secret = {name.lower() for name in CREDENTIAL_OPTIONS}
    return {k: v for k, v in options.items() if k.lower() not in secret}


def addresses_option(opts: Mapping[str, str], *, nats_always: bool) -> Addresses:
    """The options ``servers`` and ``nats`` of checked options (lower-cased names), checked.

    There is no default: without either the query fails at planning.  The
    ``nats`` servers are checked when they are needed (``servers`` is empty)
    or, with ``nats_always`` (the sink publishes there), whenever given.
    """
    if not opts.get("servers", "").strip() and not opts.get("nats", "").strip():
        raise InvalidArgumentError(
            "give the option 'servers' (the brokers' Flight addresses, grpc://host:port[,...]) or "
            "'nats' (nats://host:port[,...], where a broker answers); there is no default address"
        )
    servers = tuple(s.strip() for s in opts.get("servers", "").split(",") if s.strip())
    for server in servers:
        if not re.fullmatch(r"grpc(\+tcp|\+tls)?://[^\s/]+:\d+", server):
            raise InvalidArgumentError(
                f"option 'servers' has {server!r}; use grpc://host:port[,grpc://host:port] "
                "(grpc+tls:// with TLS)"
            )
    nats = _nats_urls(opts) if nats_always or not servers else ()
    return Addresses(servers, nats, connect_timeout=_seconds(opts, "timeout", 10.0))


def _nats_urls(opts: Mapping[str, str]) -> tuple[str, ...]:
    urls = tuple(u.strip() for u in opts.get("nats", "").split(",") if u.strip())
    for url in urls:
        if not re.fullmatch(r"(nats|tls|ws|wss)://[^\s]+", url):
            raise InvalidArgumentError(f"option 'nats' has {url!r}; use nats://host:port[,nats://host:port]")
    return urls


def _stream_name(option: str, value: str) -> str:
    try:
        return validate_stream_name(value.strip())
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"option '{option}': {exc}") from None


def _assignment(value: str) -> dict[str, tuple[int, ...]]:
    """``assign``: JSON like Kafka's, ``{"orders": [0, 2], "payments": [1]}``."""
    example = '{"orders": [0, 2]}'
    try:
        data = json.loads(value)
    except (ValueError, RecursionError):
        raise InvalidArgumentError(f"option 'assign' is {shown(value)}: use JSON like {example}") from None
    if not isinstance(data, dict) or not data:
        raise InvalidArgumentError(
            f"option 'assign' must map stream names to partition lists, like {example}"
        )
    out: dict[str, tuple[int, ...]] = {}
    for stream, partitions in data.items():
        _stream_name("assign", stream)
        if (
            not isinstance(partitions, list)
            or not partitions
            or not all(
                isinstance(p, int) and not isinstance(p, bool) and 0 <= p < MAX_PARTITIONS for p in partitions
            )
        ):
            raise InvalidArgumentError(
                f"option 'assign': {stream!r} needs a non-empty list of partition numbers from 0 to "
                f"{MAX_PARTITIONS - 1}, got {shown(partitions)}"
            )
        out[stream] = tuple(sorted(set(partitions)))
    return out


def _offsets_option(option: str, value: str, *, allow_cursor: bool = True) -> str | Offsets:
    text = value.strip()
    keywords = ("earliest", "latest", "cursor") if allow_cursor else ("earliest", "latest")
    if text.lower() in keywords:
        return text.lower()
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidArgumentError(
            f"option '{option}' is {shown(value)}: use {', '.join(keywords)} or JSON like "
            '{"orders": {"0": 42, "1": 17}}'
        ) from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise InvalidArgumentError(
            f"option '{option}' must map stream names to {{partition: offset}}, got {shown(text)}"
        )
    offsets: Offsets = {}
    for stream, partitions in data.items():
        offsets[stream] = {}
        for partition, offset in partitions.items():
            number = _partition_number(option, stream, partition)
            if not isinstance(offset, int) or isinstance(offset, bool) or not -2 <= offset <= INT64_MAX:
                raise InvalidArgumentError(
                    f"option '{option}': offset {shown(offset)} of {stream}/{partition} must be an integer "
                    f"from 0 to {INT64_MAX} (or -2 for earliest, -1 for latest)"
                )
            offsets[stream][str(number)] = offset
    return offsets


def _partition_number(option: str, stream: str, partition: str) -> int:
    """A partition key of a per-partition JSON option (``"0"``, ``"1"``, ...) as its number."""
    number = int(partition) if str(partition).isdigit() and len(partition) <= 4 else None
    if number is None or number >= MAX_PARTITIONS:
        raise InvalidArgumentError(
            f"option '{option}': partition {shown(partition)} of {stream!r} must be a partition "
            f"number from 0 to {MAX_PARTITIONS - 1}"
        )
    return number


def _timestamps_option(opts: Mapping[str, str], option: str) -> dict[str, dict[str, int]] | None:
    """Kafka's per-partition times: ``{"orders": {"0": 1700000000000, "1": ...}}`` (milliseconds)."""
    raw = opts.get(option.lower())
    if raw is None:
        return None
    example = '{"orders": {"0": 1767225600000, "1": 1767225600000}}'
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or not data or not all(isinstance(v, dict) and v for v in data.values()):
        raise InvalidArgumentError(
            f"option '{option}' is {shown(raw)}: map each stream to {{partition: milliseconds since the "
            f"epoch}}, like {example}"
        )
    out: dict[str, dict[str, int]] = {}
    for stream, partitions in data.items():
        _stream_name(option, stream)
        out[stream] = {}
        for partition, millis in partitions.items():
            number = _partition_number(option, stream, partition)
            if not isinstance(millis, int) or isinstance(millis, bool) or not 0 <= millis <= MAX_TIMESTAMP_MS:
                raise InvalidArgumentError(
                    f"option '{option}': {stream}/{partition} has {shown(millis)}; use milliseconds since "
                    f"the epoch, 0 to {MAX_TIMESTAMP_MS}"
                )
            out[stream][str(number)] = millis
    return out


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(opts: Mapping[str, str], option: str, default: float) -> float:
    """A duration as Spark writes them (``15m``, ``30s``, ``500ms``, ``1h``); returns seconds."""
    raw = opts.get(option.lower())
    if raw is None:
        return default
    match = re.fullmatch(r"\s*(\d{1,9})\s*(ms|s|min|m|h|d)?\s*", raw.lower())
    if match is None:
        raise InvalidArgumentError(
            f"option '{option}' is {shown(raw)}: use a duration like 30s, 15m, 500ms or 1h"
        )
    return int(match[1]) * _DURATION_UNITS[match[2] or "ms"]


def _positive_int(opts: Mapping[str, str], option: str) -> int | None:
    return _bounded_int(opts, option, 1, INT64_MAX)


_N = TypeVar("_N", int, float)


def _bounded_int(opts: Mapping[str, str], option: str, low: int, high: int) -> int | None:
    unit = "bytes" if option.endswith("Bytes") else ""
    return _in_range(opts, option, _integer, low=low, high=high, expected=int_range(low, high, unit=unit))


def _seconds(opts: Mapping[str, str], option: str, default: float) -> float:
    expected = number_range(MIN_TIMEOUT, MAX_TIMEOUT)
    value = _in_range(opts, option, _finite, low=MIN_TIMEOUT, high=MAX_TIMEOUT, expected=expected)
    return default if value is None else value


def _in_range(
    opts: Mapping[str, str],
    option: str,
    parse: Callable[[str], _N | None],
    *,
    low: _N,
    high: _N,
    expected: str,
) -> _N | None:
    """The option's value parsed, or ``None`` when it is not given; one line naming the option,
    what it must be (``expected``) and what it got when it does not parse or lies outside."""
    raw = opts.get(option.lower())
    if raw is None:
        return None
    value = parse(raw)
    if value is None or not low <= value <= high:
        raise InvalidArgumentError(f"option '{option}' must be {expected}, got {shown(raw)}")
    return value


def _integer(raw: str) -> int | None:
    try:
        return int(raw) if len(raw) <= 40 else None  # int() of thousands of digits raises, slowly
    except ValueError:
        return None


def _finite(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _boolean(opts: Mapping[str, str], option: str, default: bool) -> bool:
    raw = opts.get(option.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise InvalidArgumentError(f"option '{option}' must be true or false, got {raw!r}")


def _timestamp(opts: Mapping[str, str], option: str) -> float | None:
    """Milliseconds since the epoch (as Spark's Kafka source takes) or an ISO-8601 time; returns seconds."""
    raw = opts.get(option.lower())
    if raw is None:
        return None
    text = raw.strip()
    if text.isdigit() and len(text) <= len(str(MAX_TIMESTAMP_MS)) and int(text) <= MAX_TIMESTAMP_MS:
        return int(text) / 1000.0
    try:
        parsed = None if text.isdigit() else datetime.fromisoformat(text)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise InvalidArgumentError(
            f"option '{option}' is {shown(raw)}: use milliseconds since the epoch (up to "
            f"{MAX_TIMESTAMP_MS}, the end of year 9999) or an ISO time with a zone "
            "(2026-11-22T10:00:00+00:00)"
        )
    return parsed.timestamp()


def _default_consumer(opts: Mapping[str, str]) -> str:
    """The cursor name for this source's streams and broker that queries without ``consumerId``
    used before each query had its own (shared by every query with the same options)."""
    identity = json.dumps(
        {k: opts.get(k) for k in ("stream", "streams", "streampattern", "assign", "servers", "nats")},
        sort_keys=True,
    )
    return "spark-" + hashlib.sha1(identity.encode()).hexdigest()[:12]
