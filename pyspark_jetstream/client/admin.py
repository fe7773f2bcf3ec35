"""Admin and cursors, asynchronously: the blocking Flight calls of :mod:`.cluster` in worker threads.

Each call runs :class:`~.cluster.ClusterConnection` (which routes it to the
broker that can answer, and retries what its errors' flags allow) in a worker
thread, so the event loop never blocks on Flight.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pyspark_jetstream.protocol.errors import InvalidArgumentError, JetStreamError
from pyspark_jetstream.protocol.flight import ActionType, StreamInfo
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import SchemaDocument, StreamSchema, as_document

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


class Admin:
    """Streams, cluster state and cursors over Flight (see :class:`~.client.Client` for each call)."""

    def __init__(self, cluster: ClusterConnection) -> None:
        self.cluster = cluster

    async def action(self, action: ActionType, body: dict[str, Any]) -> Any:
        """One Flight action, sent to any broker (which forwards what only the controller may do)."""
        return await asyncio.to_thread(self.cluster.action, action, body)

    async def create_stream(self, config: StreamConfig) -> StreamInfo:
        """See :meth:`.Client.create_stream`."""
        return StreamInfo.from_json(await self.action(ActionType.CREATE_STREAM, config.to_json()))

    async def add_partitions(self, name: str, partitions: int) -> StreamInfo:
        """See :meth:`.Client.add_partitions`."""
        body = {"name": name, "partitions": partitions}
        return StreamInfo.from_json(await self.action(ActionType.ADD_PARTITIONS, body))

    async def update_schema(self, name: str, document: SchemaDocument) -> StreamInfo:
        """See :meth:`.Client.update_schema`."""
        body = {"name": name, "schema": document.to_json()}
        return StreamInfo.from_json(await self.action(ActionType.UPDATE_SCHEMA, body))

    async def delete_stream(self, name: str) -> None:
        """See :meth:`.Client.delete_stream`."""
        await self.action(ActionType.DELETE_STREAM, {"name": name})

    async def describe_stream(self, name: str) -> StreamInfo:
        """See :meth:`.Client.describe_stream`."""
        return await asyncio.to_thread(self.cluster.describe, name)

    async def leadership(self, name: str) -> StreamInfo:
        """A stream's partitions' leaders and epochs (no offsets: see ``ClusterConnection.leadership``)."""
        # Short: the resender asks again at its next check, and a thread still asking holds up close.
        return await asyncio.to_thread(self.cluster.leadership, name, LEADERSHIP_TIMEOUT)

    async def list_streams(self) -> list[StreamInfo]:
        """See :meth:`.Client.list_streams`."""
        return await asyncio.to_thread(self.cluster.list_streams)

    async def status(self) -> dict[str, Any]:
        """See :meth:`.Client.status`."""
        result: dict[str, Any] = await self.action(ActionType.STATUS, {})
        return result

    async def metadata(self) -> dict[str, Any]:
        """See :meth:`.Client.metadata`."""
        return await asyncio.to_thread(self.cluster.refresh)

    async def cluster_status(self) -> dict[str, Any]:
        """See :meth:`.Client.cluster_status`."""

        def ask(address: str) -> dict[str, Any]:
            try:
                status: dict[str, Any] = self.cluster.connection(address).action(
                    ActionType.STATUS, {}, self.cluster.timeout
                )
                return status
            except JetStreamError as exc:
                return {"error": str(exc)}

        await asyncio.to_thread(self.cluster.refresh)
        brokers = sorted(self.cluster.brokers().items())
        # All at once: a broker whose advertised address does not answer costs one timeout, not one each.
        answers = await asyncio.gather(*(asyncio.to_thread(ask, address) for _, address in brokers))
        return {broker_id: answer for (broker_id, _), answer in zip(brokers, answers, strict=True)}

    async def elect_preferred_leaders(self) -> dict[str, Any]:
        """See :meth:`.Client.elect_preferred_leaders`."""
        result: dict[str, Any] = await self.action(ActionType.ELECT_PREFERRED_LEADERS, {})
        return result

    async def reassign_partitions(self, body: dict[str, Any]) -> dict[str, Any]:
        """See :meth:`.Client.reassign_partitions`."""
        result: dict[str, Any] = await self.action(ActionType.REASSIGN_PARTITIONS, body)
        return result

    async def health(self) -> dict[str, Any]:
        """See :meth:`.Client.health`."""
        result: dict[str, Any] = await self.action(ActionType.HEALTH, {})
        return result

    async def set_cursor(self, consumer: str, stream: str, partition: int, offset: int) -> None:
        """See :meth:`.Client.set_cursor`."""
        await self.action(
            ActionType.SET_CURSOR,
            {"consumer": consumer, "stream": stream, "partition": partition, "offset": offset},
        )

    async def delete_cursor(self, consumer: str, stream: str, partition: int) -> None:
        """See :meth:`.Client.delete_cursor`."""
        await self.action(
            ActionType.DELETE_CURSOR, {"consumer": consumer, "stream": stream, "partition": partition}
        )

    async def fetch_cursor(self, consumer: str, stream: str, partition: int) -> int | None:
        """See :meth:`.Client.fetch_cursor`."""
        result = await self.action(
            ActionType.FETCH_CURSOR, {"consumer": consumer, "stream": stream, "partition": partition}
        )
        offset: int | None = result["offset"]
        return offset
