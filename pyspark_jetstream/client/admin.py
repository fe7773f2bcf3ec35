"""Admin and cursors over Flight: a blocking core, and its asynchronous face.

:class:`BlockingAdmin` holds each call's logic (its request body, how the answer
is read) and runs it on :class:`~.cluster.ClusterConnection` (which routes it to
the broker that can answer, and retries what its errors' flags allow) in the
caller's thread: :class:`~.sync.SyncClient` calls it directly.  :class:`Admin`
runs the same calls in worker threads, so the event loop never blocks on Flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence
from typing import Any

from pyspark_jetstream.protocol.errors import InvalidArgumentError, JetStreamError
from pyspark_jetstream.protocol.flight import ActionType, StreamInfo
from pyspark_jetstream.protocol.mirror import MirrorRequest, MirrorSource, MirrorStatus
from pyspark_jetstream.protocol.streams import MAX_PARTITIONS, StreamConfig, bounded_int
from pyspark_jetstream.protocol.value_schema import StreamSchema, as_document

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


class BlockingAdmin:
    """Streams, cluster state and cursors over Flight, blocking the caller (see :class:`~.client.Client`
    for each call).  Thread-safe: the :class:`ClusterConnection` it shares is."""

    def __init__(self, cluster: ClusterConnection) -> None:
        self.cluster = cluster

    def action(self, action: ActionType, body: dict[str, Any]) -> Any:
        """One Flight action, sent to any broker (which forwards what only the controller may do)."""
        return self.cluster.action(action, body)

    def create_stream(self, config: StreamConfig) -> StreamInfo:
        """See :meth:`.Client.create_stream` (``config`` from :func:`stream_config`)."""
        return StreamInfo.from_json(self.action(ActionType.CREATE_STREAM, config.to_json()))

    def create_mirror(self, request: MirrorRequest) -> StreamInfo:
        """See :meth:`.Client.create_mirror`."""
        return StreamInfo.from_json(self.action(ActionType.CREATE_MIRROR, request.to_json()))

    def promote_stream(self, name: str) -> StreamInfo:
        """See :meth:`.Client.promote_stream`."""
        return StreamInfo.from_json(self.action(ActionType.PROMOTE_STREAM, {"name": name}))

    def mirror_status(self, name: str) -> list[MirrorStatus]:
        """See :meth:`.Client.mirror_status`."""
        return [MirrorStatus.from_json(s) for s in self.action(ActionType.MIRROR_STATUS, {"name": name})]

    def add_partitions(self, name: str, partitions: int) -> StreamInfo:
        """See :meth:`.Client.add_partitions`."""
        bounded_int("partitions", partitions, 1, MAX_PARTITIONS)
        body = {"name": name, "partitions": partitions}
        return StreamInfo.from_json(self.action(ActionType.ADD_PARTITIONS, body))

    def update_schema(self, name: str, schema: object) -> StreamInfo:
        """See :meth:`.Client.update_schema`."""
        body = {"name": name, "schema": as_document(schema).to_json()}
        return StreamInfo.from_json(self.action(ActionType.UPDATE_SCHEMA, body))

    def delete_stream(self, name: str) -> None:
        """See :meth:`.Client.delete_stream`."""
        self.action(ActionType.DELETE_STREAM, {"name": name})

    def describe_stream(self, name: str) -> StreamInfo:
        """See :meth:`.Client.describe_stream`."""
        return self.cluster.describe(name)

    def leadership(self, name: str) -> StreamInfo:
        """A stream's partitions' leaders and epochs (no offsets: see ``ClusterConnection.leadership``)."""
        # Short: the resender asks again at its next check, and a thread still asking holds up close.
        return self.cluster.leadership(name, LEADERSHIP_TIMEOUT)

    def list_streams(self) -> list[StreamInfo]:
        """See :meth:`.Client.list_streams`."""
        return self.cluster.list_streams()

    def status(self) -> dict[str, Any]:
        """See :meth:`.Client.status`."""
        result: dict[str, Any] = self.action(ActionType.STATUS, {})
        return result

    def metadata(self) -> dict[str, Any]:
        """See :meth:`.Client.metadata`."""
        return self.cluster.refresh()

    def cluster_status(self) -> dict[str, Any]:
        """See :meth:`.Client.cluster_status`."""

        def ask(address: str) -> dict[str, Any]:
            try:
                status: dict[str, Any] = self.cluster.connection(address).action(
                    ActionType.STATUS, {}, self.cluster.timeout
                )
                return status
            except JetStreamError as exc:
                return {"error": str(exc)}

        self.cluster.refresh()
        brokers = sorted(self.cluster.brokers().items())
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

    def elect_preferred_leaders(self) -> dict[str, Any]:
        """See :meth:`.Client.elect_preferred_leaders`."""
        result: dict[str, Any] = self.action(ActionType.ELECT_PREFERRED_LEADERS, {})
        return result

    def reassign_partitions(self, body: dict[str, Any]) -> dict[str, Any]:
        """One ``REASSIGN_PARTITIONS`` operation (``body["op"]``)."""
        result: dict[str, Any] = self.action(ActionType.REASSIGN_PARTITIONS, body)
        return result

    def reassign(self, plan: object, throttle: int = 0) -> dict[str, Any]:
        """See :meth:`.Client.reassign`."""
        return self.reassign_partitions({"op": "start", "plan": plan, "throttle": throttle})

    def cancel_reassignment(self, partitions: list[tuple[str, int]] | None = None) -> dict[str, Any]:
        """See :meth:`.Client.cancel_reassignment`."""
        body: dict[str, Any] = {"op": "cancel"}
        if partitions is not None:
            body["partitions"] = [[stream, number] for stream, number in partitions]
        return self.reassign_partitions(body)

    def drain(self, broker: str, throttle: int = 0) -> dict[str, Any]:
        """See :meth:`.Client.drain`."""
        return self.reassign_partitions({"op": "drain", "broker": broker, "throttle": throttle})

    def reassignments(self) -> list[dict[str, Any]]:
        """See :meth:`.Client.reassignments`."""
        partitions: list[dict[str, Any]] = self.reassign_partitions({"op": "list"})["partitions"]
        return partitions

    def generate_reassignment(self, brokers: list[str], streams: list[str] | None = None) -> dict[str, Any]:
        """See :meth:`.Client.generate_reassignment`."""
        body: dict[str, Any] = {"op": "generate", "brokers": brokers}
        if streams is not None:
            body["streams"] = streams
        return self.reassign_partitions(body)

    def health(self) -> dict[str, Any]:
        """See :meth:`.Client.health`."""
        result: dict[str, Any] = self.action(ActionType.HEALTH, {})
        return result

    def set_cursor(self, consumer: str, stream: str, partition: int, offset: int) -> None:
        """See :meth:`.Client.set_cursor`."""
        self.action(
            ActionType.SET_CURSOR,
            {"consumer": consumer, "stream": stream, "partition": partition, "offset": offset},
        )

    def delete_cursor(self, consumer: str, stream: str, partition: int) -> None:
        """See :meth:`.Client.delete_cursor`."""
        self.action(
            ActionType.DELETE_CURSOR, {"consumer": consumer, "stream": stream, "partition": partition}
        )

    def fetch_cursor(self, consumer: str, stream: str, partition: int) -> int | None:
        """See :meth:`.Client.fetch_cursor`."""
        result = self.action(
            ActionType.FETCH_CURSOR, {"consumer": consumer, "stream": stream, "partition": partition}
        )
        offset: int | None = result["offset"]
        return offset


class Admin:
    """:class:`BlockingAdmin`'s calls as coroutines, each in a worker thread."""

    def __init__(self, cluster: ClusterConnection) -> None:
        self.cluster = cluster
        self.core = BlockingAdmin(cluster)

    async def action(self, action: ActionType, body: dict[str, Any]) -> Any:
        """See :meth:`BlockingAdmin.action`."""
        return await asyncio.to_thread(self.core.action, action, body)

    async def create_stream(self, config: StreamConfig) -> StreamInfo:
        """See :meth:`.Client.create_stream`."""
        return await asyncio.to_thread(self.core.create_stream, config)

    async def create_mirror(self, request: MirrorRequest) -> StreamInfo:
        """See :meth:`.Client.create_mirror`."""
        return await asyncio.to_thread(self.core.create_mirror, request)

    async def promote_stream(self, name: str) -> StreamInfo:
        """See :meth:`.Client.promote_stream`."""
        return await asyncio.to_thread(self.core.promote_stream, name)

    async def mirror_status(self, name: str) -> list[MirrorStatus]:
        """See :meth:`.Client.mirror_status`."""
        return await asyncio.to_thread(self.core.mirror_status, name)

    async def add_partitions(self, name: str, partitions: int) -> StreamInfo:
        """See :meth:`.Client.add_partitions`."""
        return await asyncio.to_thread(self.core.add_partitions, name, partitions)

    async def update_schema(self, name: str, schema: object) -> StreamInfo:
        """See :meth:`.Client.update_schema`."""
        return await asyncio.to_thread(self.core.update_schema, name, schema)

    async def delete_stream(self, name: str) -> None:
        """See :meth:`.Client.delete_stream`."""
        await asyncio.to_thread(self.core.delete_stream, name)

    async def describe_stream(self, name: str) -> StreamInfo:
        """See :meth:`.Client.describe_stream`."""
        return await asyncio.to_thread(self.core.describe_stream, name)

    async def leadership(self, name: str) -> StreamInfo:
        """See :meth:`BlockingAdmin.leadership`."""
        return await asyncio.to_thread(self.core.leadership, name)

    async def list_streams(self) -> list[StreamInfo]:
        """See :meth:`.Client.list_streams`."""
        return await asyncio.to_thread(self.core.list_streams)

    async def status(self) -> dict[str, Any]:
        """See :meth:`.Client.status`."""
        return await asyncio.to_thread(self.core.status)

    async def metadata(self) -> dict[str, Any]:
        """See :meth:`.Client.metadata`."""
        return await asyncio.to_thread(self.core.metadata)

    async def cluster_status(self) -> dict[str, Any]:
        """See :meth:`.Client.cluster_status`."""
        return await asyncio.to_thread(self.core.cluster_status)

    async def elect_preferred_leaders(self) -> dict[str, Any]:
        """See :meth:`.Client.elect_preferred_leaders`."""
        return await asyncio.to_thread(self.core.elect_preferred_leaders)

    async def reassign(self, plan: object, throttle: int = 0) -> dict[str, Any]:
        """See :meth:`.Client.reassign`."""
        return await asyncio.to_thread(self.core.reassign, plan, throttle)

    async def cancel_reassignment(self, partitions: list[tuple[str, int]] | None = None) -> dict[str, Any]:
        """See :meth:`.Client.cancel_reassignment`."""
        return await asyncio.to_thread(self.core.cancel_reassignment, partitions)

    async def drain(self, broker: str, throttle: int = 0) -> dict[str, Any]:
        """See :meth:`.Client.drain`."""
        return await asyncio.to_thread(self.core.drain, broker, throttle)

    async def reassignments(self) -> list[dict[str, Any]]:
        """See :meth:`.Client.reassignments`."""
        return await asyncio.to_thread(self.core.reassignments)

    async def generate_reassignment(
        self, brokers: list[str], streams: list[str] | None = None
    ) -> dict[str, Any]:
        """See :meth:`.Client.generate_reassignment`."""
        return await asyncio.to_thread(self.core.generate_reassignment, brokers, streams)

    async def health(self) -> dict[str, Any]:
        """See :meth:`.Client.health`."""
        return await asyncio.to_thread(self.core.health)

    async def set_cursor(self, consumer: str, stream: str, partition: int, offset: int) -> None:
        """See :meth:`.Client.set_cursor`."""
        await asyncio.to_thread(self.core.set_cursor, consumer, stream, partition, offset)

    async def delete_cursor(self, consumer: str, stream: str, partition: int) -> None:
        """See :meth:`.Client.delete_cursor`."""
        await asyncio.to_thread(self.core.delete_cursor, consumer, stream, partition)

    async def fetch_cursor(self, consumer: str, stream: str, partition: int) -> int | None:
        """See :meth:`.Client.fetch_cursor`."""
        return await asyncio.to_thread(self.core.fetch_cursor, consumer, stream, partition)
