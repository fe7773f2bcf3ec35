"""The asynchronous client: a thin façade over a NATS publisher and the Flight side.

Publishing goes through NATS (a stream is attached to NATS subjects, so any
NATS client can publish too): :mod:`.publisher` sends envelopes and matches
the acks that come back on one inbox per client.  Reads and admin go to a
broker over Arrow Flight (:mod:`.cluster`, blocking), in worker threads so the
event loop never blocks (:mod:`.reading`, :mod:`.admin`).  The admin calls are
:attr:`Client.admin`'s (``client.admin.create_stream(...)``); the client hands
each of :class:`~.admin.AdminActions` on to it, so ``client.create_stream(...)``
works too.  The NATS connection and its errors are :mod:`.nats_connection`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Any, ParamSpec, TypedDict, TypeVar, Unpack

import pyarrow as pa
from nats.aio.client import Client as NatsClient

from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.streams import StreamConfig, bounded_number

from .admin import LEADERSHIP_TIMEOUT, Admin, AdminActions, leadership
from .admin_faces import AdminAction, AsyncFace
from .cluster import ClusterConnection
from .connection import FetchResult
from .credentials import Credentials
from .nats_connection import NatsErrors, ask_for_broker, connect_nats, discover_broker
from .publish_options import (
    BatchOptions,
    MessageOptions,
    PublishOptions,
    batch_options,
    header_pairs,
    message_options,
)
from .publisher import PUBLISH_REFUSED, Publisher, await_ack
from .reading import FOLLOW_BUFFER, FetchOptions, Message, Reader, Start, TailOptions, start_position
from .routing import METADATA_MAX_AGE

P = ParamSpec("P")
R = TypeVar("R")

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


class ConnectOptions(TypedDict, total=False):
    """The keyword arguments of a connection (see :meth:`Client.connect`, whose defaults they
    take), declared once for :meth:`Client.connect` and :class:`~.sync.SyncClient`."""

    nats_urls: str | Sequence[str]
    broker: str | None
    timeout: float
    max_pending: int
    credentials: Credentials | None
    metadata_max_age: float


class Client(AdminActions, AsyncFace):
    """Connection to a pyspark-jetstream deployment (NATS for publishing, Flight for the rest);
    its admin calls (:class:`~.admin.AdminActions`) are :attr:`admin`'s, as coroutines."""

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
        self._reader = Reader(nc, self._broker, timeout)
        self._publisher = Publisher(
            nc,
            timeout=timeout,
            max_pending=max_pending,
            user=self.credentials.user,
            describe=lambda name: asyncio.to_thread(self._broker.describe, name),
            leadership=lambda name: asyncio.to_thread(leadership, self._broker, name),
            metadata_max_age=metadata_max_age,
            metadata=lambda: asyncio.to_thread(self._broker.refresh),
        )
        self.admin = Admin(self._broker, self._publisher)
        """Streams, the cluster and cursors (see :class:`~.admin.AdminActions`), as coroutines."""

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

    # ---- publishing ------------------------------------------------------------------

    async def publish(
        self, stream: str | None, value: bytes | None, **options: Unpack[MessageOptions]
    ) -> Ack | None:
        """Publish one message and wait for its ack (``None`` with ``AckPolicy.NONE``).

        Options (:class:`~.publish_options.MessageOptions`, keywords): ``key``,
        ``headers``, ``partition``, ``partitioner`` (default: ``key_hash``), ``subject``,
        ``ack_policy`` (default ``AckPolicy.LEADER``), ``producer_id``, ``producer_epoch``,
        ``sequence``, ``timeout`` and ``message_id``.

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
        future = await self.publish_async(stream, value, **options)
        return None if future is None else await await_ack(future)

    async def publish_async(
        self, stream: str | None, value: bytes | None, **options: Unpack[MessageOptions]
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
            key=options.get("key"),
            headers=header_pairs(options.get("headers", ())),
            message_id=options.get("message_id"),
            options=message_options(options),
        )

    async def publish_batch(
        self,
        stream: str | None,
        data: pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]],
        **options: Unpack[BatchOptions],
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
        Options (:class:`~.publish_options.BatchOptions`) are :meth:`publish`'s but
        ``key``, ``headers``, ``partitioner`` and ``message_id``, and ``message_ids``.
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
        future = await self.publish_batch_async(stream, data, **options)
        return None if future is None else await await_ack(future)

    async def publish_batch_async(
        self,
        stream: str | None,
        data: pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]],
        **options: Unpack[BatchOptions],
    ) -> asyncio.Future[Ack] | None:
        """:meth:`publish_batch` without waiting: a future for the ack, or ``None``; batches leave
        in the order they are called (see :meth:`publish_async`)."""
        sent = batch_options(options)
        return await self._publisher.publish_batch(
            stream, data, message_ids=options.get("message_ids"), options=sent
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

    async def fetch(self, stream: str, partition: int = 0, **options: Unpack[FetchOptions]) -> FetchResult:
        """Read committed batches from ``start``; wait up to ``max_wait`` s if there are none yet
        (the options and their defaults: :class:`~.reading.FetchOptions`).

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
        return await self._reader.fetch(stream, partition, **options)

    def tail(
        self, stream: str, partition: int = 0, **options: Unpack[TailOptions]
    ) -> AsyncIterator[pa.RecordBatch]:
        """Committed batches from ``start`` on, each as soon as it is committed; runs until you stop
        (the options and their defaults: :class:`~.reading.TailOptions`).

        Batches are in the log schema, each offset once and in order.  With
        ``live`` (the default) the history is read over Flight and new batches
        then come from the partition's live tail on NATS, which the leader
        publishes once for every consumer (see :mod:`.live`; the result's
        ``stats`` say where batches came from).  Without it, or when the
        broker publishes no live tail, one Flight stream stays open (renewed
        every ``follow`` seconds) and the broker pushes batches down it.
        """
        return self._reader.tail(stream, partition, **options)

    def subscribe(
        self, stream: str, partition: int = 0, **options: Unpack[TailOptions]
    ) -> AsyncIterator[Message]:
        """Every message from ``start`` on, then new ones as they are committed (see :meth:`tail`)."""
        return self._reader.subscribe(stream, partition, **options)

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

    def bind(self, action: AdminAction[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
        """``action`` as :attr:`admin` runs it (the admin calls on the client hand each on)."""
        return action.__get__(self.admin)
