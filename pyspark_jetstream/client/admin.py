"""Admin and cursors over Flight: every action declared once, in :class:`AdminActions`.

Each action is a blocking function of a :class:`~.cluster.ClusterConnection`
(which routes it to the broker that can answer, and retries what its errors'
flags allow) and the caller's arguments: its request body, how the answer is
read, its docstring.  :class:`AdminActions` lists them, with what each tells the
publisher and its ``jetstream`` command where that is a plain pass-through (see
:mod:`.admin_faces`).  The faces are derived from that table: :class:`BlockingAdmin`
(``SyncClient.admin``) calls in the caller's thread, :class:`Admin`
(``Client.admin``) in worker threads, and ``Client`` and ``SyncClient`` hand
each action on to their admin.  A new action is one function and one line here.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark_jetstream.protocol.errors import InvalidArgumentError, JetStreamError
from pyspark_jetstream.protocol.flight import ActionType, StreamInfo
from pyspark_jetstream.protocol.mirror import MirrorRequest, MirrorSource, MirrorStatus
from pyspark_jetstream.protocol.streams import MAX_PARTITIONS, StreamConfig, bounded_int
from pyspark_jetstream.protocol.value_schema import StreamSchema, as_document

from .admin_faces import AdminAction, Argument, Command, InCallersThread, InWorkerThreads, forgets, learns
from .cluster import ClusterConnection

LEADERSHIP_TIMEOUT = 2.0
"""Seconds the resender's read of a stream's leaders is retried before it waits for its next check."""


def stream_config(name: str, subject: str, options: dict[str, Any]) -> StreamConfig:
    """The configuration ``create_stream`` asks for; ``InvalidArgumentError`` for an unknown option.

    A ``schema`` option is a ``pyarrow.Schema``, a :class:`SchemaDocument` or its JSON form: the
    stream's schema version 1.
    """
    if options.get("schema") is not None:
        options = {**options, "schema": StreamSchema.first(as_document(options["schema"]))}
    try:
        return StreamConfig(name=name, subject=subject, **options)
    except TypeError as exc:
        raise InvalidArgumentError(f"create_stream: {exc}") from None


def mirror_request(
    name: str,
    source_stream: str,
    source_servers: str | Sequence[str],
    *,
    source_credentials: str | None = None,
    replication_factor: int = 1,
    min_insync_replicas: int = 1,
    partitions: int | None = None,
    subject: str | None = None,
) -> MirrorRequest:
    """What ``create_mirror`` asks for (every argument checked here, naming a bad one)."""
    servers = source_servers if isinstance(source_servers, str) else tuple(source_servers)
    source = MirrorSource(stream=source_stream, servers=servers, credentials=source_credentials)  # type: ignore[arg-type]
    return MirrorRequest(
        name=name,
        source=source,
        replication_factor=replication_factor,
        min_insync_replicas=min_insync_replicas,
        partitions=partitions,
        subject=subject,
    )


def leadership(cluster: ClusterConnection, name: str) -> StreamInfo:
    """A stream's partitions' leaders and epochs (no offsets: see ``ClusterConnection.leadership``)."""
    # Short: the resender asks again at its next check, and a thread still asking holds up close.
    return cluster.leadership(name, LEADERSHIP_TIMEOUT)


# ---- streams ---------------------------------------------------------------------------


def _create_stream(cluster: ClusterConnection, name: str, subject: str, **options: Any) -> StreamInfo:
    """Create a stream on ``subject`` (idempotent for the same configuration).

    Options are those of :class:`~pyspark_jetstream.protocol.streams.StreamConfig`:
    ``partitions``, ``replication_factor``, ``group``, ``retention_age``,
    ``retention_bytes``, ``retention_messages``, ``compaction``,
    ``segment_bytes``, ``max_message_bytes``, ``compression``, ``ack_reply``,
    ``min_insync_replicas``, ``unclean_leader_election``, ``duplicate_window``
    (seconds message ids are remembered; 0: off), ``duplicate_max_ids`` and ``schema``
    (what message values hold: a ``pyarrow.Schema``, a
    :class:`~pyspark_jetstream.protocol.value_schema.SchemaDocument` or its JSON form,
    ``{"format": "json", "fields": [...]}``; it becomes the schema's version 1).
    """
    config = stream_config(name, subject, options)
    return StreamInfo.from_json(cluster.action(ActionType.CREATE_STREAM, config.to_json()))


def _add_partitions(cluster: ClusterConnection, name: str, partitions: int) -> StreamInfo:
    """Grow stream ``name`` to ``partitions`` partitions; the same count again changes nothing.

    Partitions are only ever added (``InvalidArgumentError`` for fewer).
    Returns once every new partition is served.  Keyed messages published
    from then on hash over the new count, so a key may go to another
    partition than before (its older messages stay where they are); this
    client routes by the new count at once, other clients within
    ``metadata_max_age`` seconds.
    """
    bounded_int("partitions", partitions, 1, MAX_PARTITIONS)
    body = {"name": name, "partitions": partitions}
    return StreamInfo.from_json(cluster.action(ActionType.ADD_PARTITIONS, body))


def _update_schema(cluster: ClusterConnection, name: str, schema: object) -> StreamInfo:
    """Give stream ``name``'s schema its next version; the current schema again changes nothing.

    ``schema`` is taken as ``create_stream`` takes it.  Compatible changes only (a new
    nullable field, int32 -> int64, float32 -> float64, a field made nullable); anything
    else raises ``InvalidArgumentError`` whose one line names the field and why.
    """
    body = {"name": name, "schema": as_document(schema).to_json()}
    return StreamInfo.from_json(cluster.action(ActionType.UPDATE_SCHEMA, body))


def _delete_stream(cluster: ClusterConnection, name: str) -> None:
    """Delete a stream and all its data."""
    cluster.action(ActionType.DELETE_STREAM, {"name": name})


_DELETE = Command(
    "stream",
    "delete",
    "delete a stream and its data",
    lambda _, a: f"deleted stream {a['name']}",
    (Argument("name"),),
)


def _create_mirror(
    cluster: ClusterConnection, name: str, source_stream: str, source_servers: Any, **options: Any
) -> StreamInfo:
    """Create stream ``name`` as a mirror of ``source_stream`` in the cluster whose brokers serve
    Flight at ``source_servers`` (addresses, a list or comma-separated): every message at the
    source's partition and offset, copied by each partition's leader here; idempotent.

    Options: ``source_credentials`` (the path of a credentials file every broker of this
    cluster reads to reach the source), ``replication_factor``, ``min_insync_replicas``
    (the mirror's own), ``partitions`` (refused unless the source's count) and ``subject``
    (where publishes to the mirror are refused; the source's by default).  Everything else
    is the source's configuration.  See :meth:`promote_stream` for disaster recovery.
    """
    request = mirror_request(name, source_stream, source_servers, **options)
    return StreamInfo.from_json(cluster.action(ActionType.CREATE_MIRROR, request.to_json()))


def _promote_stream(cluster: ClusterConnection, name: str) -> StreamInfo:
    """Stop mirror ``name`` copying, for good, and let it take publishes from its end offset on."""
    return StreamInfo.from_json(cluster.action(ActionType.PROMOTE_STREAM, {"name": name}))


def _promoted(info: StreamInfo, args: Mapping[str, Any]) -> str:
    ends = ", ".join(f"{p.partition}: {p.log_end_offset}" for p in info.partitions)
    return f"stream {args['name']} is promoted: it copies no more and takes publishes (end offsets {ends})"


_PROMOTE_HELP = "stop a mirror for good and let it take publishes (disaster recovery)"
_PROMOTE = Command("stream", "promote", _PROMOTE_HELP, _promoted, (Argument("name"),))


def _mirror_status(cluster: ClusterConnection, name: str) -> list[MirrorStatus]:
    """How each partition of mirror ``name`` stands: lag in messages and seconds, the source, the
    last error (see :class:`~pyspark_jetstream.protocol.mirror.MirrorStatus`)."""
    return [MirrorStatus.from_json(s) for s in cluster.action(ActionType.MIRROR_STATUS, {"name": name})]


def _describe_stream(cluster: ClusterConnection, name: str) -> StreamInfo:
    """A stream's configuration and its partitions: leaders, ISRs and offsets (from each leader)."""
    return cluster.describe(name)


def _list_streams(cluster: ClusterConnection) -> list[StreamInfo]:
    """Every stream."""
    return cluster.list_streams()


# ---- the cluster -----------------------------------------------------------------------


def _status(cluster: ClusterConnection) -> dict[str, Any]:
    """The broker's status: streams, partitions, cursors and their lag."""
    result: dict[str, Any] = cluster.action(ActionType.STATUS, {})
    return result


def _metadata(cluster: ClusterConnection) -> dict[str, Any]:
    """The cluster as a broker sees it: brokers, the controller, every partition's leader and ISR."""
    return cluster.refresh()


def _cluster_status(cluster: ClusterConnection) -> dict[str, Any]:
    """Every live broker's status (``{broker id: status}``; an unreachable one maps to its error)."""

    def ask(address: str) -> dict[str, Any]:
        try:
            status: dict[str, Any] = cluster.connection(address).action(
                ActionType.STATUS, {}, cluster.timeout
            )
            return status
        except JetStreamError as exc:
            return {"error": str(exc)}

    cluster.refresh()
    brokers = sorted(cluster.brokers().items())
    if not brokers:
        return {}
    # All at once: a broker whose advertised address does not answer costs one timeout, not one each.
    pool = concurrent.futures.ThreadPoolExecutor(len(brokers), thread_name_prefix="jetstream-status")
    try:
        answers = list(pool.map(ask, [address for _, address in brokers]))
    finally:
        # Not waiting: after an interrupt (Ctrl-C) the asks end on their own, within the timeout.
        pool.shutdown(wait=False)
    return {broker_id: answer for (broker_id, _), answer in zip(brokers, answers, strict=True)}


def _health(cluster: ClusterConnection) -> dict[str, Any]:
    """Whether the broker can ingest and serve everything: ``{"ok": bool, "problems": [...]}``."""
    result: dict[str, Any] = cluster.action(ActionType.HEALTH, {})
    return result


def _elect_preferred_leaders(cluster: ClusterConnection) -> dict[str, Any]:
    """Move leadership back to each partition's first replica where it is in sync (after restarts)."""
    result: dict[str, Any] = cluster.action(ActionType.ELECT_PREFERRED_LEADERS, {})
    return result


def _elected(result: dict[str, Any], args: Mapping[str, Any]) -> str:
    moved = result.get("moved", [])
    return "\n".join(moved) if moved else "every partition is led by its preferred replica already"


_ELECT_HELP = "lead each partition from its preferred replica again (after restarts)"
_ELECT = Command("cluster", "elect-leaders", _ELECT_HELP, _elected)


def _reassign_partitions(cluster: ClusterConnection, body: dict[str, Any]) -> dict[str, Any]:
    """One ``REASSIGN_PARTITIONS`` operation (``body["op"]``)."""
    result: dict[str, Any] = cluster.action(ActionType.REASSIGN_PARTITIONS, body)
    return result


def _reassign(cluster: ClusterConnection, plan: object, *, throttle: int = 0) -> dict[str, Any]:
    """Begin moving partitions as ``plan`` says (``{"partitions": [{"stream", "partition",
    "replicas"}, ...]}``): new replicas catch up at ``throttle`` bytes/s per broker (0: no limit),
    join the ISR, then the old ones are dropped.  Every entry is checked before anything moves."""
    return _reassign_partitions(cluster, {"op": "start", "plan": plan, "throttle": throttle})


def _cancel_reassignment(
    cluster: ClusterConnection, partitions: list[tuple[str, int]] | None = None
) -> dict[str, Any]:
    """Put partitions being moved (all of them by default) back on their original replicas."""
    body: dict[str, Any] = {"op": "cancel"}
    if partitions is not None:
        body["partitions"] = [[stream, number] for stream, number in partitions]
    return _reassign_partitions(cluster, body)


def _drain(cluster: ClusterConnection, broker: str, *, throttle: int = 0) -> dict[str, Any]:
    """Move every replica off ``broker`` (before retiring it); the plan used is in ``"plan"``."""
    return _reassign_partitions(cluster, {"op": "drain", "broker": broker, "throttle": throttle})


def _reassignments(cluster: ClusterConnection) -> list[dict[str, Any]]:
    """The partitions being moved: replicas, target, adding, removing, ISR, throttle."""
    partitions: list[dict[str, Any]] = _reassign_partitions(cluster, {"op": "list"})["partitions"]
    return partitions


def _generate_reassignment(
    cluster: ClusterConnection, brokers: list[str], streams: list[str] | None = None
) -> dict[str, Any]:
    """A plan spreading ``streams`` (all but internal ones by default) evenly over ``brokers``,
    rack-aware when brokers declare racks: ``{"current": [...], "proposed": [...]}``."""
    body: dict[str, Any] = {"op": "generate", "brokers": brokers}
    if streams is not None:
        body["streams"] = streams
    return _reassign_partitions(cluster, body)


# ---- cursors ---------------------------------------------------------------------------


def _set_cursor(cluster: ClusterConnection, consumer: str, stream: str, partition: int, offset: int) -> None:
    """Store ``consumer``'s position (the next offset it will read) in the log."""
    body = {"consumer": consumer, "stream": stream, "partition": partition, "offset": offset}
    cluster.action(ActionType.SET_CURSOR, body)


def _delete_cursor(cluster: ClusterConnection, consumer: str, stream: str, partition: int) -> None:
    """Forget ``consumer``'s stored position on one partition."""
    cluster.action(ActionType.DELETE_CURSOR, {"consumer": consumer, "stream": stream, "partition": partition})


def _fetch_cursor(cluster: ClusterConnection, consumer: str, stream: str, partition: int) -> int | None:
    """The stored position, or ``None`` if ``consumer`` never set one."""
    body = {"consumer": consumer, "stream": stream, "partition": partition}
    offset: int | None = cluster.action(ActionType.FETCH_CURSOR, body)["offset"]
    return offset


_CURSOR = (Argument("consumer"), Argument("stream"))
_PARTITION = Argument("--partition", type=int, default=0)
_CURSOR_GET = Command(
    "cursor",
    "get",
    "a consumer's stored position on one partition",
    lambda offset, _: "(none)" if offset is None else str(offset),
    (*_CURSOR, _PARTITION),
)
_CURSOR_SET = Command(
    "cursor",
    "set",
    "store a consumer's position on one partition",
    lambda _, a: f"cursor {a['consumer']} on {a['stream']}/{a['partition']} set to {a['offset']}",
    (*_CURSOR, Argument("offset", type=int), _PARTITION),
)


class AdminActions:
    """Every admin action, once: what it does, what the publisher hears of it, its command."""

    create_stream = AdminAction(_create_stream, tells=learns)
    add_partitions = AdminAction(_add_partitions, tells=learns)
    update_schema = AdminAction(_update_schema)
    create_mirror = AdminAction(_create_mirror)
    promote_stream = AdminAction(_promote_stream, command=_PROMOTE)
    delete_stream = AdminAction(_delete_stream, tells=forgets, command=_DELETE)
    mirror_status = AdminAction(_mirror_status)
    describe_stream = AdminAction(_describe_stream)
    list_streams = AdminAction(_list_streams)
    status = AdminAction(_status)
    metadata = AdminAction(_metadata)
    cluster_status = AdminAction(_cluster_status)
    health = AdminAction(_health)
    elect_preferred_leaders = AdminAction(_elect_preferred_leaders, command=_ELECT)
    reassign = AdminAction(_reassign)
    cancel_reassignment = AdminAction(_cancel_reassignment)
    drain = AdminAction(_drain)
    reassignments = AdminAction(_reassignments)
    generate_reassignment = AdminAction(_generate_reassignment)
    fetch_cursor = AdminAction(_fetch_cursor, command=_CURSOR_GET)
    set_cursor = AdminAction(_set_cursor, command=_CURSOR_SET)
    delete_cursor = AdminAction(_delete_cursor)


class BlockingAdmin(AdminActions, InCallersThread):
    """The admin actions, each blocking the caller (``SyncClient.admin``); see :class:`InCallersThread`."""


class Admin(AdminActions, InWorkerThreads):
    """The admin actions as coroutines, each in a worker thread (``Client.admin``); see
    :class:`InWorkerThreads`."""
