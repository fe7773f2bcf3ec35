"""The asynchronous client: a thin façade over a NATS publisher and the Flight side.

Publishing goes through NATS (a stream is attached to NATS subjects, so any
NATS client can publish too): :mod:`.publisher` sends envelopes and matches
the acks that come back on one inbox per client.  Reads and admin go to a
broker over Arrow Flight (:mod:`.cluster`, blocking), in worker threads so the
event loop never blocks (:mod:`.reading`, :mod:`.admin`).  The NATS connection
and its errors are :mod:`.nats_connection`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from nats.aio.client import Client as NatsClient

from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.envelope import AckPolicy
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.flight import ActionType, StreamInfo
from pyspark_jetstream.protocol.mirror import MirrorStatus
from pyspark_jetstream.protocol.read_shape import ColumnFilter
from pyspark_jetstream.protocol.streams import StreamConfig, bounded_number

from .admin import LEADERSHIP_TIMEOUT, Admin, mirror_request, stream_config
from .cluster import ClusterConnection
from .connection import FetchResult
from .credentials import Credentials
from .nats_connection import NatsErrors, ask_for_broker, connect_nats, discover_broker
from .partitioners import Partitioner, key_hash
from .publish_options import DEFAULT_OPTIONS, PublishOptions
from .publisher import PUBLISH_REFUSED, Publisher, await_ack
from .reading import FOLLOW_BUFFER, Message, Reader, Start, start_position
from .routing import METADATA_MAX_AGE

MIN_METADATA_MAX_AGE = 0.1
MAX_METADATA_MAX_AGE = 24 * 3600.0

# The module's public names before the split stay importable from here.
__all__ = [
    "FOLLOW_BUFFER",
    "LEADERSHIP_TIMEOUT",
    "PUBLISH_REFUSED",
    "Client",
    "FetchResult",
    "Message",
    "PublishOptions",
    "Start",
    "discover_broker",
    "start_position",
]


class Client:
    """Connection to a pyspark-jetstream deployment (NATS for publishing, Flight for the rest)."""

    def __init__(
        self,
        nc: NatsClient,
        broker: str,
        timeout: float,
        max_pending: int = 4000,
        credentials: Credentials | None = None,
        *,
        metadata_max_age: float = METADATA_MAX_AGE,
    ) -> None:
        self.nc = nc
        self.broker = broker
        self.timeout = timeout
        self.credentials = credentials if credentials is not None else Credentials()
        self._broker = ClusterConnection(broker, timeout=timeout, credentials=self.credentials)
        self._admin = Admin(self._broker)
        self._reader = Reader(nc, self._broker, timeout)
        self._publisher = Publisher(
            nc,
            timeout=timeout,
            max_pending=max_pending,
            user=self.credentials.user,
            describe=self._admin.describe_stream,
            leadership=self._admin.leadership,
            metadata_max_age=metadata_max_age,
            metadata=self._admin.metadata,
        )

    @classmethod
    async def connect(
        cls,
        *,
        nats_urls: str | Sequence[str] = "nats://127.0.0.1:4222",
        broker: str | None = None,
        timeout: float = 10.0,
        max_pending: int = 4000,
        credentials: Credentials | None = None,
        metadata_max_age: float = METADATA_MAX_AGE,
    ) -> Client:
        """Connect to NATS, and to ``broker`` (``grpc://host:port``) or one found through NATS.

        ``max_pending`` bounds the acks ``publish_async`` leaves outstanding:
        past it, publishing waits for the oldest (a sliding window).  Raises
        ``UnavailableError`` naming the address that cannot be reached, and
        ``InvalidArgumentError`` for a malformed ``broker`` address.  ``credentials``
        (TLS, user and token) are presented to NATS and to every broker.
        ``metadata_max_age``: seconds a stream's configuration is used for routing
        publishes before it is read again (a stream that grew is routed over its
        new partitions within this time).
        """
        if not isinstance(max_pending, int) or max_pending < 1:
            raise InvalidArgumentError(f"max_pending must be a positive integer, got {max_pending!r}")
        bounded_number("metadata_max_age", metadata_max_age, MIN_METADATA_MAX_AGE, MAX_METADATA_MAX_AGE)
        urls = [nats_urls] if isinstance(nats_urls, str) else list(nats_urls)
        credentials = credentials if credentials is not None else Credentials()
        errors = NatsErrors()
        nc = await connect_nats(urls, timeout, credentials, errors)
        try:
            if broker is None:
                broker = await ask_for_broker(nc, urls, timeout)
            client = cls(nc, broker, timeout, max_pending, credentials, metadata_max_age=metadata_max_age)
            errors.handler = client._publisher.on_nats_error
            await client._publisher.start()
        except BaseException:
            # Left open, its tasks would die with the event loop, each with a traceback.
            await nc.close()
            raise
        return client

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a live tail then ends instead of going on over Flight)."""
        return self._reader.closed

    async def close(self) -> None:
        """Fail pending acks, close the connections."""
        self._reader.closed = True
        await self._publisher.send_waiting()
        self._publisher.close()
        await self.nc.close()
        self._broker.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- admin ---------------------------------------------------------------------

    async def create_stream(self, name: str, subject: str, **options: Any) -> StreamInfo:
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
        info = await self._admin.create_stream(config)
        self._publisher.learn(info, config)
        return info

    async def add_partitions(self, name: str, partitions: int) -> StreamInfo:
        """Grow stream ``name`` to ``partitions`` partitions; the same count again changes nothing.

        Partitions are only ever added (``InvalidArgumentError`` for fewer).
        Returns once every new partition is served.  Keyed messages published
        from then on hash over the new count, so a key may go to another
        partition than before (its older messages stay where they are); this
        client routes by the new count at once, other clients within
        ``metadata_max_age`` seconds.
        """
        info = await self._admin.add_partitions(name, partitions)
        self._publisher.learn(info, StreamConfig.from_json(info.config))
        return info

    async def update_schema(self, name: str, schema: object) -> StreamInfo:
        """Give stream ``name``'s schema its next version; the current schema again changes nothing.

        ``schema`` is taken as ``create_stream`` takes it.  Compatible changes only (a new
        nullable field, int32 -> int64, float32 -> float64, a field made nullable); anything
        else raises ``InvalidArgumentError`` whose one line names the field and why.
        """
        return await self._admin.update_schema(name, schema)

    async def delete_stream(self, name: str) -> None:
        """Delete a stream and all its data."""
        await self._admin.delete_stream(name)
        self._publisher.forget(name)

    async def create_mirror(
        self, name: str, source_stream: str, source_servers: Any, **options: Any
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
        return await self._admin.create_mirror(mirror_request(name, source_stream, source_servers, **options))

    async def promote_stream(self, name: str) -> StreamInfo:
        """Stop mirror ``name`` copying, for good, and let it take publishes from its end offset on."""
        return await self._admin.promote_stream(name)

    async def mirror_status(self, name: str) -> list[MirrorStatus]:
        """How each partition of mirror ``name`` stands: lag in messages and seconds, the source, the
        last error (see :class:`~pyspark_jetstream.protocol.mirror.MirrorStatus`)."""
        return await self._admin.mirror_status(name)

    async def describe_stream(self, name: str) -> StreamInfo:
        """A stream's configuration and its partitions: leaders, ISRs and offsets (from each leader)."""
        return await self._admin.describe_stream(name)

    async def list_streams(self) -> list[StreamInfo]:
        """Every stream."""
        return await self._admin.list_streams()

    async def status(self) -> dict[str, Any]:
        """The broker's status: streams, partitions, cursors and their lag."""
        return await self._admin.status()

    async def metadata(self) -> dict[str, Any]:
        """The cluster as a broker sees it: brokers, the controller, every partition's leader and ISR."""
        return await self._admin.metadata()

    async def cluster_status(self) -> dict[str, Any]:
        """Every live broker's status (``{broker id: status}``; an unreachable one maps to its error)."""
        return await self._admin.cluster_status()

    async def elect_preferred_leaders(self) -> dict[str, Any]:
        """Move leadership back to each partition's first replica where it is in sync (after restarts)."""
        return await self._admin.elect_preferred_leaders()

    async def reassign(self, plan: object, *, throttle: int = 0) -> dict[str, Any]:
        """Begin moving partitions as ``plan`` says (``{"partitions": [{"stream", "partition",
        "replicas"}, ...]}``): new replicas catch up at ``throttle`` bytes/s per broker (0: no limit),
        join the ISR, then the old ones are dropped.  Every entry is checked before anything moves."""
        return await self._admin.reassign(plan, throttle)

    async def cancel_reassignment(self, partitions: list[tuple[str, int]] | None = None) -> dict[str, Any]:
        """Put partitions being moved (all of them by default) back on their original replicas."""
        return await self._admin.cancel_reassignment(partitions)

    async def drain(self, broker: str, *, throttle: int = 0) -> dict[str, Any]:
        """Move every replica off ``broker`` (before retiring it); the plan used is in ``"plan"``."""
        return await self._admin.drain(broker, throttle)

    async def reassignments(self) -> list[dict[str, Any]]:
        """The partitions being moved: replicas, target, adding, removing, ISR, throttle."""
        return await self._admin.reassignments()

    async def generate_reassignment(
        self, brokers: list[str], streams: list[str] | None = None
    ) -> dict[str, Any]:
        """A plan spreading ``streams`` (all but internal ones by default) evenly over ``brokers``,
        rack-aware when brokers declare racks: ``{"current": [...], "proposed": [...]}``."""
        return await self._admin.generate_reassignment(brokers, streams)

    async def health(self) -> dict[str, Any]:
        """Whether the broker can ingest and serve everything: ``{"ok": bool, "problems": [...]}``."""
        return await self._admin.health()

    async def set_cursor(self, consumer: str, stream: str, partition: int, offset: int) -> None:
        """Store ``consumer``'s position (the next offset it will read) in the log."""
        await self._admin.set_cursor(consumer, stream, partition, offset)

    async def delete_cursor(self, consumer: str, stream: str, partition: int) -> None:
        """Forget ``consumer``'s stored position on one partition."""
        await self._admin.delete_cursor(consumer, stream, partition)

    async def fetch_cursor(self, consumer: str, stream: str, partition: int) -> int | None:
        """The stored position, or ``None`` if ``consumer`` never set one."""
        return await self._admin.fetch_cursor(consumer, stream, partition)

    # ---- publishing ------------------------------------------------------------------

    async def publish(
        self,
        stream: str | None,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] = (),
        partition: int | None = None,
        partitioner: Partitioner = key_hash,
        subject: str | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        producer_id: str | None = None,
        producer_epoch: int = 0,
        sequence: int | None = None,
        timeout: float | None = None,
        message_id: str | None = None,
    ) -> Ack | None:
        """Publish one message and wait for its ack (``None`` with ``AckPolicy.NONE``).

        The partition is ``partition``, else ``partitioner(key, partitions)``;
        ``subject`` overrides the partition's subject (needed for streams on
        wildcard subjects; the partition is then the one whose subject it
        matches).  Only the named stream's partition acks, even when other
        streams listen on the same subject.  ``stream=None`` with a
        ``subject`` publishes without naming a stream: every stream storing
        the message acks it, and the first ack wins.

        A negative ack raises the matching error.  With ``producer_id``,
        ``producer_epoch`` and ``sequence`` the publish is idempotent: each
        epoch's sequences start at 0 and go up by one; a repeat returns an ack
        with ``duplicate`` set; a gap raises ``OutOfOrderSequenceError``
        (nothing stored: resend from the sequence it names); an epoch older
        than one stored raises ``ProducerFencedError``.

        With ``message_id`` (1 to 256 bytes of UTF-8, stored as the
        ``Nats-Msg-Id`` header), a message whose id the partition stored
        within the stream's ``duplicate_window`` (two minutes by default) is
        not stored again: the ack has ``duplicate`` set and the original
        offset.  Any publisher may repeat an id (several processes publishing
        the same record, a retry after a failover); ids are per partition,
        so repeats must go to the same partition (the same key, say).  Not
        combined with ``producer_id``.
        """
        future = await self._publisher.publish(
            stream,
            value,
            key=key,
            headers=_pairs(headers),
            message_id=message_id,
            options=_options(
                partition=partition,
                partitioner=partitioner,
                subject=subject,
                ack_policy=ack_policy,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                sequence=sequence,
                timeout=timeout,
            ),
        )
        return None if future is None else await await_ack(future)

    async def publish_async(
        self,
        stream: str | None,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]] = (),
        partition: int | None = None,
        partitioner: Partitioner = key_hash,
        subject: str | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        producer_id: str | None = None,
        producer_epoch: int = 0,
        sequence: int | None = None,
        timeout: float | None = None,
        message_id: str | None = None,
    ) -> asyncio.Future[Ack] | None:
        """Publish without waiting: returns a future for the ack (pipelining), or ``None``.

        The future fails with ``RequestTimeoutError`` if no ack comes within
        ``timeout`` seconds (default: the client's timeout).  Its ack may be a
        refusal: check ``ack.ok`` (:meth:`publish` raises the error instead).
        Publishes leave in the order they are called, also when started together
        (several coroutines, or ``SyncClient.publish_batch_nowait``): pipelined
        producer sequences reach the broker in order.
        """
        return await self._publisher.publish(
            stream,
            value,
            key=key,
            headers=_pairs(headers),
            message_id=message_id,
            options=_options(
                partition=partition,
                partitioner=partitioner,
                subject=subject,
                ack_policy=ack_policy,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                sequence=sequence,
                timeout=timeout,
            ),
        )

    async def publish_batch(
        self,
        stream: str | None,
        data: pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]],
        *,
        partition: int | None = None,
        subject: str | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        producer_id: str | None = None,
        producer_epoch: int = 0,
        sequence: int | None = None,
        timeout: float | None = None,
        message_ids: Sequence[str] | pa.Array | str | None = None,
    ) -> Ack | None:
        """Publish many messages as one Arrow batch in one envelope, stored as one batch.

        ``data`` has a ``value`` column and optionally ``key`` and ``headers``
        (or is a list of dicts with those keys).  For a typed stream, ``data``
        may instead hold the stream's fields as columns, beside ``key`` and
        ``headers`` (no ``value``): the rows are sent as typed columns of the
        schema's current version, cast where no value is lost (see
        :mod:`pyspark_jetstream.protocol.typed_rows`); a column that is not a
        field, a missing non-nullable field or a type that does not fit fails
        here naming the column, and the broker checks them again and stores
        them without parsing JSON (each row's value is their JSON text).
        All go to one partition:
        ``partition`` (default 0), or the one ``subject`` belongs to.
        Idempotence as for :meth:`publish`.

        ``message_ids``: an id per row (strings, or a string Arrow array), or the
        name of the batch's string column holding them (the column is not
        stored as data).  Each becomes the row's ``Nats-Msg-Id`` header, and the
        broker de-duplicates row by row as it does single messages: only the
        rows whose ids it did not store within the window are stored, and the
        ack lists the others in ``duplicates`` (``Ack.row_offsets`` gives every
        row's offset).  Not combined with a producer sequence.
        """
        future = await self._publisher.publish_batch(
            stream,
            data,
            message_ids=message_ids,
            options=_options(
                partition=partition,
                partitioner=key_hash,
                subject=subject,
                ack_policy=ack_policy,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                sequence=sequence,
                timeout=timeout,
            ),
        )
        return None if future is None else await await_ack(future)

    async def publish_batch_async(
        self,
        stream: str | None,
        data: pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]],
        *,
        partition: int | None = None,
        subject: str | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        producer_id: str | None = None,
        producer_epoch: int = 0,
        sequence: int | None = None,
        timeout: float | None = None,
        message_ids: Sequence[str] | pa.Array | str | None = None,
    ) -> asyncio.Future[Ack] | None:
        """:meth:`publish_batch` without waiting: a future for the ack, or ``None``; batches leave
        in the order they are called (see :meth:`publish_async`)."""
        return await self._publisher.publish_batch(
            stream,
            data,
            message_ids=message_ids,
            options=_options(
                partition=partition,
                partitioner=key_hash,
                subject=subject,
                ack_policy=ack_policy,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                sequence=sequence,
                timeout=timeout,
            ),
        )

    async def partition_for(self, stream: str, key: bytes | None = None) -> int:
        """The partition :meth:`publish` sends ``key`` to in ``stream`` (the default partitioner)."""
        (partition,) = await self._publisher.partitions_for(stream, [key])
        return partition

    async def partitions_for(self, stream: str, keys: Sequence[bytes | None]) -> list[int]:
        """The partition :meth:`publish` sends each of ``keys`` to in ``stream`` (the default
        partitioner), the stream looked up once."""
        return await self._publisher.partitions_for(stream, keys)

    # ---- reading -----------------------------------------------------------------------

    async def fetch(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "earliest",
        max_records: int | None = None,
        max_bytes: int | None = None,
        max_wait: float = 0.0,
        from_replicas: bool = False,
        columns: Sequence[str] | None = None,
        filters: Sequence[ColumnFilter] = (),
    ) -> FetchResult:
        """Read committed batches from ``start``; wait up to ``max_wait`` s if there are none yet.

        Reads go to the partition's leader; with ``from_replicas`` an in-sync
        follower may answer (up to its own high watermark), which spreads
        readers over the replicas.  Leadership changes are followed.

        Batches hold the log's columns and, for a typed stream, its fields (as
        its current schema version; null where a message has none).
        ``columns`` asks for only those (``offset`` always comes); ``filters``
        (:class:`~pyspark_jetstream.protocol.read_shape.ColumnFilter`, all
        met) sends only the rows that meet them: both are applied by the
        broker, so what is left out never crosses the network.  The result's
        ``next_offset`` moves past filtered-out rows too.
        """
        return await self._reader.fetch(
            stream,
            partition,
            start=start,
            max_records=max_records,
            max_bytes=max_bytes,
            max_wait=max_wait,
            from_replicas=from_replicas,
            columns=columns,
            filters=filters,
        )

    def tail(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "earliest",
        follow: float = 30.0,
        max_records: int | None = 10_000,
        max_bytes: int | None = None,
        live: bool = True,
    ) -> AsyncIterator[pa.RecordBatch]:
        """Committed batches from ``start`` on, each as soon as it is committed; runs until you stop.

        Batches are in the log schema, each offset once and in order.  With
        ``live`` (the default) the history is read over Flight and new batches
        then come from the partition's live tail on NATS, which the leader
        publishes once for every consumer (see :mod:`.live`; the result's
        ``stats`` say where batches came from).  Without it, or when the
        broker publishes no live tail, one Flight stream stays open (renewed
        every ``follow`` seconds) and the broker pushes batches down it.
        """
        return self._reader.tail(
            stream,
            partition,
            start=start,
            follow=follow,
            max_records=max_records,
            max_bytes=max_bytes,
            live=live,
        )

    def subscribe(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "earliest",
        follow: float = 30.0,
        max_records: int = 10_000,
        live: bool = True,
    ) -> AsyncIterator[Message]:
        """Every message from ``start`` on, then new ones as they are committed (see :meth:`tail`)."""
        return self._reader.subscribe(
            stream, partition, start=start, follow=follow, max_records=max_records, live=live
        )

    def subscribe_partitions(
        self, stream: str, partitions: Sequence[int], *, start: Start = "earliest", live: bool = True
    ) -> AsyncIterator[Message]:
        """Messages of several partitions as each arrives: in offset order within a partition,
        interleaved across them (see :meth:`subscribe`)."""
        return self._reader.subscribe_partitions(stream, partitions, start=start, live=live)

    # ---- plumbing ------------------------------------------------------------------------

    @property
    def _streams(self) -> dict[str, StreamConfig]:
        """The configurations of the streams published to (tests set it to skip a description)."""
        return self._publisher.routes.streams

    @_streams.setter
    def _streams(self, streams: dict[str, StreamConfig]) -> None:
        self._publisher.routes.streams = streams

    async def _action(self, action: ActionType, body: dict[str, Any]) -> Any:
        return await self._admin.action(action, body)


def _pairs(headers: Mapping[str, bytes] | Iterable[tuple[str, bytes]]) -> tuple[tuple[str, bytes], ...]:
    return tuple(headers.items()) if isinstance(headers, Mapping) else tuple(headers)


def _options(
    *,
    partition: int | None,
    partitioner: Partitioner,
    subject: str | None,
    ack_policy: AckPolicy,
    producer_id: str | None,
    producer_epoch: int,
    sequence: int | None,
    timeout: float | None,
) -> PublishOptions:
    """The publish's options; the shared default instance when every one is at its default
    (the common case, on the hot path: no new object per message)."""
    if (
        partition is None
        and partitioner is key_hash
        and subject is None
        and ack_policy is AckPolicy.LEADER
        and producer_id is None
        and producer_epoch == 0
        and sequence is None
        and timeout is None
    ):
        return DEFAULT_OPTIONS
    return PublishOptions(
        partition, partitioner, subject, ack_policy, producer_id, producer_epoch, sequence, timeout
    )
