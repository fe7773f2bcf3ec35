"""Planning reads on the driver and running them on executors.

Offsets follow Spark's Kafka source: ``{stream: {partition: offset}}`` where
an offset is the *next* offset to read, so a range ``[start, end)`` holds the
messages ``start .. end - 1``.  A task reads its range over Arrow Flight and
yields Arrow batches cast to exactly the Arrow form of the query's schema;
no row becomes a Python object.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_jetstream.client.cluster import ClusterConnection
from pyspark_jetstream.client.connection import FetchResult
from pyspark_jetstream.client.credentials import Credentials
from pyspark_jetstream.client.hints import listed_streams, unknown_stream
from pyspark_jetstream.protocol.array_builders import constant_ints, constant_strings
from pyspark_jetstream.protocol.errors import InvalidArgumentError, OffsetOutOfRangeError, UnknownStreamError
from pyspark_jetstream.protocol.flight import ReadRequest, StartPosition, StreamInfo
from pyspark_jetstream.protocol.joined_batches import joined
from pyspark_jetstream.protocol.read_shape import ColumnFilter
from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.streams import INTERNAL_PREFIX

from .connections import read_pool, shared_connection
from .options import Offsets, SourceOptions

logger = logging.getLogger(__name__)

BASE_SCHEMA = (
    "key binary, value binary, stream string, subject string, partition int, offset long, timestamp timestamp"
)
HEADERS_FIELD = "headers array<struct<key:string,value:binary>>"
LOG_COLUMNS = frozenset(LOG_SCHEMA.names)
READ_BYTES = 16 * 1024 * 1024
SMALL_BATCH = 4_096
"""Rows under which a stored batch is joined with its neighbours before Spark gets it."""
GATHERED_ROWS = 65_536
"""Rows a batch joined from small ones holds at most (``protocol.joined_batches``)."""
EARLIEST, LATEST = -2, -1


def spark_schema(include_headers: bool) -> str:
    """The DDL of the rows this source produces."""
    return f"{BASE_SCHEMA}, {HEADERS_FIELD}" if include_headers else BASE_SCHEMA


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Offsets of one stream partition as the broker reports them."""

    log_start_offset: int
    high_watermark: int


def describe(connection: ClusterConnection, options: SourceOptions) -> dict[str, dict[str, PartitionState]]:
    """The streams this source reads, with each partition's readable range."""
    infos = _infos(connection, options)
    layout = {info.config["name"]: _states(info) for info in infos}
    for stream, wanted in (options.assigned or {}).items():
        held = layout[stream]
        missing = [p for p in wanted if str(p) not in held]
        if missing:
            raise InvalidArgumentError(
                f"option 'assign': stream {stream!r} has partitions 0 to {len(held) - 1}, not {missing[0]}"
            )
        layout[stream] = {str(p): held[str(p)] for p in wanted}
    return layout


def describe_configs(connection: ClusterConnection, options: SourceOptions) -> dict[str, dict[str, Any]]:
    """The configurations (their JSON form) of the streams this source reads now, by name."""
    return {info.config["name"]: info.config for info in _infos(connection, options)}


def _infos(connection: ClusterConnection, options: SourceOptions) -> list[StreamInfo]:
    if options.stream_pattern is not None:
        pattern = re.compile(options.stream_pattern)
        infos = [
            info
            for info in connection.list_streams()
            if pattern.fullmatch(info.config["name"]) and not info.config["name"].startswith(INTERNAL_PREFIX)
        ]
    else:
        infos = [_described(connection, name) for name in options.streams]
    return infos


def _described(connection: ClusterConnection, stream: str) -> StreamInfo:
    try:
        return connection.describe(stream)
    except UnknownStreamError as exc:
        raise unknown_stream(exc, stream, lambda: listed_streams(connection)) from None


def _states(info: StreamInfo) -> dict[str, PartitionState]:
    return {str(p.partition): PartitionState(p.log_start_offset, p.high_watermark) for p in info.partitions}


def resolve(
    connection: ClusterConnection,
    spec: str | Offsets,
    timestamp: float | None,
    layout: dict[str, dict[str, PartitionState]],
    cursors: dict[str, dict[str, int | None]] | None = None,
    *,
    by_timestamp: dict[str, dict[str, int]] | None = None,
    no_match: str = "latest",
    option: str = "startingOffsets",
) -> Offsets:
    """Concrete offsets for a starting/ending spec, partition by partition.

    A JSON spec (``option``) or per-partition times (``by_timestamp``) must
    name every partition read, as in Spark's Kafka source.  A per-partition
    time with no message at or after it resolves to the partition's end, or,
    with ``no_match="error"``, fails naming the partition.
    """
    given_streams = by_timestamp if by_timestamp is not None else spec if isinstance(spec, dict) else None
    if given_streams is not None:
        unknown = sorted(set(given_streams) - set(layout))
        if unknown:
            raise UnknownStreamError(
                f"offsets name stream(s) this source does not read: {', '.join(unknown)}"
            )
    out: Offsets = {}
    for stream, partitions in layout.items():
        out[stream] = {}
        for partition, state in partitions.items():
            if given_streams is not None and partition not in given_streams.get(stream, {}):
                name = f"{option}ByTimestamp" if by_timestamp is not None else option
                raise InvalidArgumentError(
                    f"option '{name}' has no entry for {stream}/{partition}: name every partition read"
                    + ("" if by_timestamp is not None else " (-2 for earliest, -1 for latest)")
                )
            if by_timestamp is not None:
                millis = by_timestamp[stream][partition]
                found = first_offset_at(connection, stream, int(partition), millis / 1000.0)
                if found is None and no_match == "error":
                    raise InvalidArgumentError(
                        f"option '{option}ByTimestamp': {stream}/{partition} has no message at or after "
                        f"{millis} ms; set startingOffsetsByTimestampStrategy=latest to start such "
                        "partitions at their end"
                    )
                out[stream][partition] = state.high_watermark if found is None else found
                continue
            if timestamp is not None:
                out[stream][partition] = offset_for_time(connection, stream, int(partition), timestamp)
                continue
            if isinstance(spec, dict):
                given = spec[stream][partition]
                offset = {EARLIEST: state.log_start_offset, LATEST: state.high_watermark}.get(given, given)
            elif spec == "cursor":
                stored = (cursors or {}).get(stream, {}).get(partition)
                offset = state.log_start_offset if stored is None else stored
            else:
                offset = state.log_start_offset if spec == "earliest" else state.high_watermark
            out[stream][partition] = offset
    return out


def offset_for_time(connection: ClusterConnection, stream: str, partition: int, seconds: float) -> int:
    """The first offset at or after ``seconds`` (or the high watermark if none)."""
    found, end = _time_lookup(connection, stream, partition, seconds)
    return end if found is None else found


def first_offset_at(connection: ClusterConnection, stream: str, partition: int, seconds: float) -> int | None:
    """The first offset at or after ``seconds``, or ``None`` when no message is that new."""
    return _time_lookup(connection, stream, partition, seconds)[0]


def _time_lookup(
    connection: ClusterConnection, stream: str, partition: int, seconds: float
) -> tuple[int | None, int]:
    result = connection.read(
        ReadRequest(stream, partition, StartPosition("timestamp", seconds), max_records=1)
    )
    found = result.batches[0].column(0)[0].as_py() if result.num_rows else None
    return found, result.next_offset


def limit_rows(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """Move from ``start`` toward ``latest`` by at most ``max_rows`` in total.

    The budget is shared in proportion to each partition's backlog (as
    Spark's Kafka source does), and every partition with a backlog advances
    by at least one, so progress is guaranteed.
    """
    backlog = {
        (s, p): max(end - start.get(s, {}).get(p, 0), 0)
        for s, parts in latest.items()
        for p, end in parts.items()
    }
    total = sum(backlog.values())
    out: Offsets = {s: dict(parts) for s, parts in latest.items()}
    if total <= max_rows:
        return out
    for (s, p), rows in backlog.items():
        begin = start.get(s, {}).get(p, 0)
        share = max(1, rows * max_rows // total) if rows else 0
        out[s][p] = begin + min(rows, share)
    return out


@dataclass(frozen=True, slots=True)
class RangeSpec:
    """One Spark task's work: a range of one stream partition."""

    broker: str
    stream: str
    partition: int
    start: int
    end: int
    log_start_offset: int | None = None
    """The partition's log start when the range was planned (``None`` if not described then)."""


def plan_ranges(
    broker: str,
    options: SourceOptions,
    start: Offsets,
    end: Offsets,
    layout: Mapping[str, Mapping[str, PartitionState]] | None = None,
) -> list[RangeSpec]:
    """Split ``[start, end)`` per partition into ranges of at most ``max_records_per_partition``,
    read from ``broker``; each carries its partition's log start from ``layout`` when it has one."""
    ranges = []
    step = options.max_records_per_partition
    for stream, partitions in sorted(end.items()):
        for partition, stop in sorted(partitions.items(), key=lambda kv: int(kv[0])):
            begin = start.get(stream, {}).get(partition, 0)
            state = (layout or {}).get(stream, {}).get(partition)
            log_start = None if state is None else state.log_start_offset
            for lo in range(begin, stop, step):
                ranges.append(RangeSpec(broker, stream, int(partition), lo, min(lo + step, stop), log_start))
    wanted = options.min_partitions or 0
    while 0 < len(ranges) < wanted:  # minPartitions: halve the longest range until there are enough
        longest = max(ranges, key=lambda r: r.end - r.start)
        if longest.end - longest.start < 2:
            break
        middle = longest.start + (longest.end - longest.start) // 2
        at = ranges.index(longest)
        ranges[at : at + 1] = [replace(longest, end=middle), replace(longest, start=middle)]
    return ranges


def _fetcher(
    connection: ClusterConnection,
    spec: RangeSpec,
    target: pa.Schema,
    filters: tuple[ColumnFilter, ...],
) -> Callable[[int, bool], FetchResult]:
    """A read of ``spec``'s partition from an offset to the range's end (``READ_BYTES`` at most),
    from a follower or not."""
    columns = _columns_for(target)

    def fetch(offset: int, replicas: bool) -> FetchResult:
        return connection.read(
            ReadRequest(
                spec.stream,
                spec.partition,
                StartPosition("offset", offset),
                max_records=spec.end - offset,
                max_bytes=READ_BYTES,
                columns=columns,
                from_replicas=replicas,
                filters=filters,
            )
        )

    return fetch


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """How a task reads its ranges (the query's options, and its filters)."""

    fail_on_data_loss: bool
    timeout: float
    from_replicas: bool = False
    credentials: Credentials | None = None
    filters: tuple[ColumnFilter, ...] = ()


def start_read(spec: RangeSpec, target: pa.Schema, settings: ReadSettings) -> Future[FetchResult]:
    """The first read of ``spec``, asked for now in the process's read pool (for
    :func:`read_range`'s ``first``)."""
    connection = shared_connection(spec.broker, settings.credentials, settings.timeout)
    fetch = _fetcher(connection, spec, target, settings.filters)
    return read_pool().submit(fetch, spec.start, settings.from_replicas)


def read_range(
    spec: RangeSpec,
    target: pa.Schema,
    settings: ReadSettings,
    first: Future[FetchResult] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Fetch ``[spec.start, spec.end)`` and yield batches in exactly ``target``'s Arrow schema.

    Reads go through the process's kept connection (see :mod:`.connections`):
    a task that fits in one read makes one round trip.  When it does not, the
    next read (up to :data:`READ_BYTES`) is fetched in the process's read pool
    while Spark consumes the batches of the current one, so the task waits
    for the broker only once.  ``first``: that of :func:`start_read`, already
    asked for.  With ``from_replicas`` an in-sync follower may serve the
    range; the range was planned from the leader's high watermark, so what a
    follower has not committed yet is read from the leader instead of waited
    for.  ``credentials`` are presented to every broker asked.  A typed stream's fields in
    ``target`` are fetched with the log's columns; ``filters`` are applied by the broker.
    """
    connection = shared_connection(spec.broker, settings.credentials, settings.timeout)
    fetch = _fetcher(connection, spec, target, settings.filters)
    replicas = settings.from_replicas
    ahead: tuple[int, bool, Future[FetchResult]] | None = None
    """The read of the next offset, asked for before the current batches were yielded."""
    if first is not None:
        ahead = (spec.start, replicas, first)
    try:
        offset = spec.start
        while offset < spec.end:
            pending = ahead[2] if ahead is not None and ahead[:2] == (offset, replicas) else None
            ahead = None
            try:
                result = fetch(offset, replicas) if pending is None else pending.result()
            except OffsetOutOfRangeError as exc:
                offset = _after_data_loss(
                    connection, spec, offset, exc, settings.fail_on_data_loss, from_leader=not replicas
                )
                continue
            if offset < result.next_offset < spec.end:
                ahead = (
                    result.next_offset,
                    replicas,
                    read_pool().submit(fetch, result.next_offset, replicas),
                )
            for batch in joined(result.batches, small_rows=SMALL_BATCH, most_rows=GATHERED_ROWS):
                # After compaction (or filters) a row count can reach past the range's end offset.
                inside = (
                    batch.filter(pc.less(batch.column(0), spec.end))
                    if batch.column(0)[-1].as_py() >= spec.end
                    else batch
                )
                if inside.num_rows:
                    yield to_spark_batch(inside, spec.stream, spec.partition, target)
            if result.next_offset <= offset:
                if replicas:
                    replicas = False  # a follower behind the leader: the rest from the leader
                    continue
                if result.high_watermark < spec.end:
                    raise OffsetOutOfRangeError(
                        f"{spec.stream}/{spec.partition}: the range ends at {spec.end} but the partition's "
                        f"high watermark is {result.high_watermark} (was the stream truncated?)"
                    )
                break
            offset = result.next_offset
    finally:
        if ahead is not None:  # the task ended early: a read not started yet is not needed
            ahead[2].cancel()


def _after_data_loss(
    connection: ClusterConnection,
    spec: RangeSpec,
    offset: int,
    exc: OffsetOutOfRangeError,
    fail: bool,
    *,
    from_leader: bool,
) -> int:
    log_start = _log_start(connection, spec, offset, exc if from_leader else None)
    if offset >= log_start:
        raise exc  # not retention: something else is wrong
    message = (
        f"{spec.stream}/{spec.partition}: offsets {offset} to {log_start - 1} were deleted by "
        "retention before this query read them"
    )
    if fail:
        raise OffsetOutOfRangeError(
            message + "; set the option failOnDataLoss=false to skip ahead instead of failing"
        ) from None
    logger.warning("%s; skipping to %d (failOnDataLoss=false)", message, log_start)
    return min(log_start, spec.end)


def _log_start(
    connection: ClusterConnection, spec: RangeSpec, offset: int, leader_refusal: OffsetOutOfRangeError | None
) -> int:
    """The partition's log start, without asking again where it is known: the leader's refusal
    carries its current one; else the plan's, if ``offset`` is already below it; else the
    leader's, described now (a follower's refusal speaks for the follower only)."""
    refused_at = None if leader_refusal is None else leader_refusal.fields.get("log_start_offset")
    if isinstance(refused_at, int):
        return refused_at
    if spec.log_start_offset is not None and offset < spec.log_start_offset:
        return spec.log_start_offset
    return connection.describe(spec.stream).partitions[spec.partition].log_start_offset


ADDED_COLUMNS = ("stream", "partition")
"""Columns of a Spark row the reader adds (the broker does not send them)."""


def _columns_for(target: pa.Schema) -> tuple[str, ...]:
    """The columns a Spark row needs (the log's, and a typed stream's fields): the others never
    leave the broker."""
    wanted = [name for name in target.names if name not in ADDED_COLUMNS]
    return (*sorted(n for n in wanted if n in LOG_COLUMNS), *(n for n in wanted if n not in LOG_COLUMNS))


def to_spark_batch(batch: pa.RecordBatch, stream: str, partition: int, target: pa.Schema) -> pa.RecordBatch:
    """A log batch as the source's row shape, cast to exactly ``target``."""
    n = batch.num_rows
    columns = {
        "stream": constant_strings(stream, n),
        "partition": constant_ints(partition, n, pa.int32()),
    }
    arrays = [
        _cast(columns[field.name] if field.name in columns else batch.column(field.name), field.type)
        for field in target
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def _cast(array: pa.Array, data_type: pa.DataType) -> pa.Array:
    """``array`` as Spark's Arrow type: timestamps to Spark's microseconds (finer ones truncated,
    as Spark truncates them), everything else exactly."""
    if array.type == data_type:
        return array
    return array.cast(data_type, safe=not pa.types.is_timestamp(data_type))
