"""The asynchronous client.

Publishing goes through NATS (a stream is attached to NATS subjects, so any
NATS client can publish too); acks come back on one inbox per client and are
matched by correlation id.  Reads and admin go to a broker over Arrow Flight,
in a worker thread so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import logging
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import pyarrow as pa
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import SlowConsumerError
from pyarrow import flight

from pyspark_jetstream.protocol.ack import Ack, decode_acks
from pyspark_jetstream.protocol.envelope import AckPolicy, Envelope, EnvelopeError, encode
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    MessageTooLargeError,
    PermissionDeniedError,
    RequestTimeoutError,
    UnauthenticatedError,
    UnavailableError,
    error_from_code,
)
from pyspark_jetstream.protocol.flight import (
    ActionType,
    ReadRequest,
    StartPosition,
    StreamInfo,
    parse_response_metadata,
)
from pyspark_jetstream.protocol.headers import (
    MSG_ID_HEADER,
    checked_message_ids,
    message_ids_in,
    validate_message_id,
    with_message_ids,
)
from pyspark_jetstream.protocol.streams import (
    DISCOVERY_SUBJECT,
    INTERNAL_PREFIX,
    StreamConfig,
    partition_subject,
)
from pyspark_jetstream.protocol.subjects import subject_matches

from .cluster import ClusterConnection
from .connection import BrokerConnection, FetchResult
from .credentials import Credentials
from .live import LiveTail
from .partitioners import Partitioner, key_hash
from .resend import Resender

logger = logging.getLogger(__name__)

_TLS_EOF_WARNING = "returning true from eof_received() has no effect when using ssl"


def _not_the_tls_eof_warning(record: logging.LogRecord) -> bool:
    """asyncio's warning when a NATS connection over TLS reaches its end.

    nats-py opens a plain connection and upgrades it to TLS (NATS sends its INFO
    line first), so its stream protocol answers the end of the connection as a
    plain one would; asyncio then closes it as it should, and says so on stderr
    at every client's exit.  Only that line is dropped.
    """
    return record.msg != _TLS_EOF_WARNING


logging.getLogger("asyncio").addFilter(_not_the_tls_eof_warning)

FOLLOW_BUFFER = 16
"""Batches a follow stream reads ahead of its consumer."""
LEADERSHIP_TIMEOUT = 2.0
"""Seconds the resender's read of a stream's leaders is retried before it waits for its next check."""

Start = str | int | datetime | StartPosition


@dataclass(frozen=True, slots=True)
class Message:
    """One stored message, as a subscriber sees it."""

    stream: str
    partition: int
    offset: int
    timestamp: datetime
    value: bytes | None
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    subject: str | None
    reply: str | None


def start_position(start: Start) -> StartPosition:
    """``'earliest'``, ``'latest'``, an offset, an aware ``datetime`` or a StartPosition."""
    if isinstance(start, StartPosition):
        return start
    if start in ("earliest", "latest"):
        return StartPosition(str(start))
    if isinstance(start, datetime):
        if start.tzinfo is None:
            raise InvalidArgumentError(f"start time {start.isoformat()} needs a time zone")
        return StartPosition("timestamp", start.timestamp())
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return StartPosition("offset", start)
    raise InvalidArgumentError(
        f"invalid start {start!r}: use 'earliest', 'latest', an offset >= 0 or an aware datetime"
    )


async def discover_broker(
    nats_urls: Sequence[str], *, timeout: float = 10.0, credentials: Credentials | None = None
) -> str:
    """The Flight address of a broker that answers on NATS at ``nats_urls``."""
    nc = await _connect_nats(list(nats_urls), timeout, credentials or Credentials())
    try:
        return await _ask_for_broker(nc, list(nats_urls), timeout)
    finally:
        await nc.close()


class _SlowConsumerLog:
    """Messages NATS dropped for a slow subscription, logged once per ``every`` seconds."""

    every = 10.0

    def __init__(self) -> None:
        self.dropped = 0
        self.logged_at = -math.inf

    def note(self, error: Exception) -> None:
        self.dropped += 1
        now = time.monotonic()
        if now - self.logged_at >= self.every:
            logger.warning(
                "NATS dropped %d message(s) for a slow subscription (%s); a live tail reads what it "
                "missed over Flight",
                self.dropped,
                getattr(error, "subject", "?"),
            )
            self.logged_at, self.dropped = now, 0


_slow_consumers = _SlowConsumerLog()


async def _log_nats_error(error: Exception) -> None:
    """Log an error nats-py reports (a failed connect attempt, a lost connection, a slow consumer).

    nats-py's default callback logs each with its traceback: four of them for
    one unreachable server.  A line each is enough; an error that fails a call
    is raised by that call.  Slow-consumer drops (one error per message) are
    summed up every ten seconds.
    """
    if isinstance(error, SlowConsumerError):
        _slow_consumers.note(error)
        return
    logger.warning("NATS: %s", str(error) or type(error).__name__)


PUBLISH_REFUSED = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)
"""nats-server's error for a publish the user's permissions refuse (nats-py reports it lower-cased)."""


class _NatsErrors:
    """nats-py's error callback: while connecting, keeps the errors (the cause of a failed
    connect is raised once, not logged); afterwards logs each and hands it to the client's
    own handler."""

    def __init__(self) -> None:
        self.last: Exception | None = None
        self.handler: Callable[[Exception], None] | None = None
        self.final = False
        """Set on an error no later attempt can change: refused credentials, an untrusted certificate."""

    async def report(self, error: Exception) -> None:
        """The callback (a coroutine function, as nats-py requires).

        While connecting, a final error is raised from here: nats-py awaits this
        callback inside ``connect``'s own error handling, so ``connect`` ends with
        it, at once and without being cancelled half-way through a TLS upgrade
        (which would leave its socket open).
        """
        if self.handler is None:
            # A final error is kept over what follows it: the server closes the connection after
            # its -ERR, so the next attempt (or this one's write) may only see a reset.
            if not self.final:
                self.last = error
            logger.debug("NATS, while connecting: %s", str(error) or type(error).__name__)
            if _is_refusal(error) or "certificate verify failed" in str(error).lower():
                self.final = True
                raise _GiveUpError from error
            return
        self.last = error
        self.handler(error)
        await _log_nats_error(error)


class _GiveUpError(Exception):
    """Raised through nats-py's connect to end it on an error no retry can change."""


def _is_refusal(error: Exception) -> bool:
    """Whether nats-server refused the connection's credentials."""
    return "authorization violation" in str(error).lower()


async def _connect_nats(
    urls: list[str], timeout: float, credentials: Credentials, errors: _NatsErrors | None = None
) -> NatsClient:
    """A NATS connection, or the error that prevented it: ``UnauthenticatedError`` as soon as
    the server refuses the credentials, ``UnavailableError`` naming the cause otherwise."""
    errors = errors if errors is not None else _NatsErrors()
    nc = NatsClient()
    connecting = asyncio.ensure_future(
        nc.connect(
            servers=urls,
            connect_timeout=timeout,  # type: ignore[arg-type]  # nats-py takes seconds as a float
            max_reconnect_attempts=3,
            error_cb=errors.report,
            **credentials.nats_arguments(),
        )
    )
    # Bounded as a whole: a failed TLS handshake makes nats-py retry without end.  The
    # cancellation is the last resort; a refusal ends connect itself (_NatsErrors.report).
    done, _ = await asyncio.wait({connecting}, timeout=timeout * 2)
    if not done:
        connecting.cancel()
        await asyncio.wait({connecting})
    failure = None if connecting.cancelled() else connecting.exception()
    if failure is None and not connecting.cancelled():
        return nc
    last = errors.last
    await _drop_transport(nc)
    if last is not None and _is_refusal(last):
        raise UnauthenticatedError(_refusal_message(urls, credentials)) from None
    cause = last if last is not None else failure or TimeoutError()
    raise UnavailableError(
        f"cannot connect to NATS at {', '.join(urls)}: {str(cause) or type(cause).__name__}"
        f"{_nats_hint(str(cause))}"
    ) from None


async def _drop_transport(nc: NatsClient) -> None:
    """Close the socket of a connect that failed on its last attempt.

    nats-py closes the sockets of the attempts it retries, not that of the
    attempt that raised; its ``close()`` would flush to the dead socket first.
    """
    transport = nc._transport  # nats-py offers no other way to it
    if transport is None:
        return
    writer = getattr(transport, "_io_writer", None)
    # A failed TLS upgrade has closed the socket already, and its writer never learns it.
    closed = writer is None or writer.transport.is_closing()
    transport.close()
    if not closed:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(transport.wait_closed(), 1.0)


def _refusal_message(urls: list[str], credentials: Credentials) -> str:
    where = ", ".join(urls)
    if credentials.user is None:
        return f"NATS at {where} needs a user and token, and none were given"
    return f"NATS at {where} refused user {credentials.user!r}: wrong user or token (Authorization Violation)"


def _nats_hint(cause: str) -> str:
    """What to do about a failed NATS connect, judged from its cause."""
    lowered = cause.lower()
    if "certificate" in lowered or "ssl" in lowered:
        return " (a TLS problem: give the CA that signed the server's certificate as tls.ca)"
    return "; is a broker or nats-server running there?"


async def _ask_for_broker(nc: NatsClient, urls: list[str], timeout: float) -> str:
    try:
        reply = await nc.request(DISCOVERY_SUBJECT, b"", timeout=timeout)
        address: str = json.loads(reply.data)["flight"]
    except (NatsError, TimeoutError, ValueError, KeyError, TypeError) as exc:
        raise UnavailableError(
            f"no pyspark-jetstream broker answered on NATS at {', '.join(urls)} "
            f"({exc or type(exc).__name__}); start one with 'jetstream broker start' or pass broker='grpc://host:port'"
        ) from None
    return address


class Client:
    """Connection to a pyspark-jetstream deployment (NATS for publishing, Flight for the rest)."""

    def __init__(
        self,
        nc: NatsClient,
        broker: str,
        timeout: float,
        max_pending: int = 4000,
        credentials: Credentials | None = None,
    ) -> None:
        self.nc = nc
        self.broker = broker
        self.timeout = timeout
        self._window = asyncio.Semaphore(max_pending)
        self._publishing = asyncio.Lock()
        """Held by a publish from its call until NATS has its payload, so publishes leave in the
        order they were called: a stream's first publish awaits its description, and one called
        meanwhile must not overtake it (an idempotent producer's sequences must arrive in order,
        or the broker refuses them).  The lock is FIFO; uncontended, it costs no switch."""
        # (deadline, correlation id, subject, seconds): a heap, soonest first.
        self._deadlines: list[tuple[float, str, str, float]] = []
        self._sweeper: asyncio.Future[None] | None = None
        self.closed = False
        """Whether :meth:`close` was called (a live tail then ends instead of going on over Flight)."""
        self._sooner = asyncio.Event()  # a deadline before the one the sweeper sleeps for
        self.credentials = credentials if credentials is not None else Credentials()
        self._broker = ClusterConnection(broker, timeout=timeout, credentials=self.credentials)
        self._streams: dict[str, StreamConfig] = {}
        self._acks: dict[str, asyncio.Future[Ack]] = {}
        self._ids = itertools.count()
        self._inbox = nc.new_inbox()
        self._ack_sub: Any = None
        self._resender = Resender(self._leadership, nc.publish)

    @classmethod
    async def connect(
        cls,
        *,
        nats_urls: str | Sequence[str] = "nats://127.0.0.1:4222",
        broker: str | None = None,
        timeout: float = 10.0,
        max_pending: int = 4000,
        credentials: Credentials | None = None,
    ) -> Client:
        """Connect to NATS, and to ``broker`` (``grpc://host:port``) or one found through NATS.

        ``max_pending`` bounds the acks ``publish_async`` leaves outstanding:
        past it, publishing waits for the oldest (a sliding window).  Raises
        ``UnavailableError`` naming the address that cannot be reached, and
        ``InvalidArgumentError`` for a malformed ``broker`` address.  ``credentials``
        (TLS, user and token) are presented to NATS and to every broker.
        """
        if not isinstance(max_pending, int) or max_pending < 1:
            raise InvalidArgumentError(f"max_pending must be a positive integer, got {max_pending!r}")
        urls = [nats_urls] if isinstance(nats_urls, str) else list(nats_urls)
        credentials = credentials if credentials is not None else Credentials()
        errors = _NatsErrors()
        nc = await _connect_nats(urls, timeout, credentials, errors)
        try:
            if broker is None:
                broker = await _ask_for_broker(nc, urls, timeout)
            client = cls(nc, broker, timeout, max_pending, credentials)
            errors.handler = client._on_nats_error
            client._ack_sub = await nc.subscribe(client._inbox, cb=client._on_ack)
        except BaseException:
            # Left open, its tasks would die with the event loop, each with a traceback.
            await nc.close()
            raise
        return client

    async def close(self) -> None:
        """Fail pending acks, close the connections."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._resender.close()
        for future in self._acks.values():
            if not future.done():
                future.set_exception(UnavailableError("client closed before the ack arrived"))
        self._acks.clear()
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
        (seconds message ids are remembered; 0: off) and ``duplicate_max_ids``.
        """
        try:
            config = StreamConfig(name=name, subject=subject, **options)
        except TypeError as exc:
            raise InvalidArgumentError(f"create_stream: {exc}") from None
        info = StreamInfo.from_json(await self._action(ActionType.CREATE_STREAM, config.to_json()))
        self._streams[name] = config
        self._resender.learn(info)
        return info

    async def delete_stream(self, name: str) -> None:
        """Delete a stream and all its data."""
        await self._action(ActionType.DELETE_STREAM, {"name": name})
        self._streams.pop(name, None)

    async def describe_stream(self, name: str) -> StreamInfo:
        """A stream's configuration and its partitions: leaders, ISRs and offsets (from each leader)."""
        return await asyncio.to_thread(self._broker.describe, name)

    async def _leadership(self, name: str) -> StreamInfo:
        """A stream's partitions' leaders and epochs (no offsets: see ``ClusterConnection.leadership``)."""
        # Short: the resender asks again at its next check, and a thread still asking holds up close.
        return await asyncio.to_thread(self._broker.leadership, name, LEADERSHIP_TIMEOUT)

    async def list_streams(self) -> list[StreamInfo]:
        """Every stream."""
        return await asyncio.to_thread(self._broker.list_streams)

    async def status(self) -> dict[str, Any]:
        """The broker's status: streams, partitions, cursors and their lag."""
        result: dict[str, Any] = await self._action(ActionType.STATUS, {})
        return result

    async def metadata(self) -> dict[str, Any]:
        """The cluster as a broker sees it: brokers, the controller, every partition's leader and ISR."""
        return await asyncio.to_thread(self._broker.refresh)

    async def cluster_status(self) -> dict[str, Any]:
        """Every live broker's status (``{broker id: status}``; an unreachable one maps to its error)."""

        def gather() -> dict[str, Any]:
            out: dict[str, Any] = {}
            for broker_id, address in sorted(self._broker.brokers().items()):
                try:
                    out[broker_id] = self._broker.connection(address).action(ActionType.STATUS, {})
                except JetStreamError as exc:
                    out[broker_id] = {"error": str(exc)}
            return out

        await asyncio.to_thread(self._broker.refresh)
        return await asyncio.to_thread(gather)

    async def elect_preferred_leaders(self) -> dict[str, Any]:
        """Move leadership back to each partition's first replica where it is in sync (after restarts)."""
        result: dict[str, Any] = await self._action(ActionType.ELECT_PREFERRED_LEADERS, {})
        return result

    async def health(self) -> dict[str, Any]:
        """Whether the broker can ingest and serve everything: ``{"ok": bool, "problems": [...]}``."""
        result: dict[str, Any] = await self._action(ActionType.HEALTH, {})
        return result

    async def set_cursor(self, consumer: str, stream: str, partition: int, offset: int) -> None:
        """Store ``consumer``'s position (the next offset it will read) in the log."""
        await self._action(
            ActionType.SET_CURSOR,
            {"consumer": consumer, "stream": stream, "partition": partition, "offset": offset},
        )

    async def delete_cursor(self, consumer: str, stream: str, partition: int) -> None:
        """Forget ``consumer``'s stored position on one partition."""
        await self._action(
            ActionType.DELETE_CURSOR, {"consumer": consumer, "stream": stream, "partition": partition}
        )

    async def fetch_cursor(self, consumer: str, stream: str, partition: int) -> int | None:
        """The stored position, or ``None`` if ``consumer`` never set one."""
        result = await self._action(
            ActionType.FETCH_CURSOR, {"consumer": consumer, "stream": stream, "partition": partition}
        )
        offset: int | None = result["offset"]
        return offset

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
        future = await self.publish_async(
            stream,
            value,
            key=key,
            headers=headers,
            partition=partition,
            partitioner=partitioner,
            subject=subject,
            ack_policy=ack_policy,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            sequence=sequence,
            timeout=timeout,
            message_id=message_id,
        )
        return None if future is None else await self._await_ack(future)

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
        pairs = tuple(headers.items()) if isinstance(headers, Mapping) else tuple(headers)
        if message_id is not None:
            _check_message_id(message_id, pairs, producer_id)
        async with self._publishing:
            target = await self._target(stream, key, partition, partitioner, subject)
            return await self._send(
                target,
                ack_policy,
                timeout,
                value=value,
                key=key,
                headers=pairs,
                message_id=message_id,
                **_producer(producer_id, producer_epoch, sequence),
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
        (or is a list of dicts with those keys).  All go to one partition:
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
        future = await self.publish_batch_async(
            stream,
            data,
            partition=partition,
            subject=subject,
            ack_policy=ack_policy,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            sequence=sequence,
            timeout=timeout,
            message_ids=message_ids,
        )
        return None if future is None else await self._await_ack(future)

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
        batch = _as_batch(data)
        producer = _producer(producer_id, producer_epoch, sequence)
        if message_ids is not None:
            if producer_id is not None:
                raise InvalidArgumentError(
                    f"message_ids and producer_id {producer_id!r} are not combined: a producer's "
                    "sequence already de-duplicates its batches"
                )
            batch = _with_ids(batch, message_ids)
        if partition is None and subject is None:
            partition = 0
        async with self._publishing:
            target = await self._target(stream, None, partition, key_hash, subject)
            return await self._send(target, ack_policy, timeout, batch=batch, **producer)

    async def _send(
        self, target: _Target, ack_policy: AckPolicy, timeout: float | None, **fields: Any
    ) -> asyncio.Future[Ack] | None:
        subject = target.subject
        wants_ack = ack_policy is not AckPolicy.NONE
        correlation_id = str(next(self._ids)) if wants_ack else ""
        try:
            payload = encode(
                Envelope(
                    ack_inbox=self._inbox if wants_ack else None,
                    correlation_id=correlation_id,
                    ack_policy=ack_policy,
                    stream=target.stream,
                    partition=target.partition,
                    **fields,
                )
            )
        except EnvelopeError as exc:
            raise InvalidArgumentError(str(exc)) from None
        if len(payload) > self.nc.max_payload:
            raise MessageTooLargeError(
                f"the message is {len(payload)} bytes, over the NATS server's max_payload of "
                f"{self.nc.max_payload}: publish smaller batches or raise max_payload in nats-server"
            )
        if not wants_ack:
            await self.nc.publish(subject, payload)
            return None
        await self._window.acquire()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Ack] = loop.create_future()
        future.add_done_callback(self._release_window)
        self._acks[correlation_id] = future
        # Every ack future ends: with the ack, or when the sweeper finds it overdue.
        seconds = timeout or self.timeout
        heapq.heappush(self._deadlines, (loop.time() + seconds, correlation_id, subject, seconds))
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())
        elif self._deadlines[0][1] == correlation_id:
            self._sooner.set()
        if target.stream is not None and target.partition is not None and _deduplicated(fields):
            producer_id = fields.get("producer_id")
            self._resender.track(
                correlation_id,
                subject,
                payload,
                stream=target.stream,
                partition=target.partition,
                producer=None if producer_id is None else (producer_id, fields.get("producer_epoch", 0)),
                sequence=fields.get("sequence") or 0,
            )
            future.add_done_callback(lambda _: self._resender.done(correlation_id))
        try:
            await self.nc.publish(subject, payload)
        except NatsError as exc:
            future.cancel()
            raise UnavailableError(f"publish to {subject!r} failed: {exc}") from None
        return future

    def _release_window(self, _: asyncio.Future[Ack]) -> None:
        self._window.release()

    def _on_nats_error(self, error: Exception) -> None:
        """NATS refused a publish (no write permission): fail its pending acks at once, rather
        than let each wait out its timeout."""
        refused = PUBLISH_REFUSED.search(str(error))
        if refused is None:
            return
        subject = refused.group(1)  # nats-py lower-cases the server's error, subject included
        stream = next(
            (
                name
                for name, config in self._streams.items()
                if subject in (s.lower() for s in config.partition_subjects())
            ),
            None,
        )
        what = f"stream {stream!r}" if stream is not None else f"subject {subject!r}"
        who = f"principal {self.credentials.user!r}" if self.credentials.user else "this client"
        for _, correlation_id, pending_subject, _ in self._deadlines:
            future = self._acks.get(correlation_id) if pending_subject.lower() == subject else None
            if future is not None and not future.done():
                future.set_exception(
                    PermissionDeniedError(
                        f"{who} may not write {what} (NATS refused the publish to {subject!r})",
                        stream=stream,
                    )
                )

    async def _sweep(self) -> None:
        """Fail acks that are overdue, soonest deadline first."""
        loop = asyncio.get_running_loop()
        while self._deadlines:
            deadline, correlation_id, subject, seconds = self._deadlines[0]
            if deadline > loop.time():
                self._sooner.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._sooner.wait(), deadline - loop.time())
                continue
            heapq.heappop(self._deadlines)
            future = self._acks.pop(correlation_id, None)
            if future is not None and not future.done():
                future.set_exception(
                    RequestTimeoutError(
                        f"no ack for message {correlation_id} on {subject!r} within {seconds:g}s: "
                        "is a broker leading that partition? (A message with a producer id and "
                        "sequence, or a message id, is resent after a leader change; others are not.)"
                    )
                )
        self._sweeper = None

    @staticmethod
    async def _await_ack(future: asyncio.Future[Ack]) -> Ack:
        """The ack, or the error it carries (the sweeper fails the future on timeout)."""
        ack = await future
        if not ack.ok:
            raise error_from_code(ack.error.value, f"{ack.stream}/{ack.partition}: {ack.message}")
        return ack

    async def _on_ack(self, msg: Msg) -> None:
        try:
            acks = decode_acks(msg.data)
        except JetStreamError:
            logger.warning("ignoring a malformed ack: %r", msg.data[:200])
            return
        for ack in acks:
            if self._resender.holds(ack):
                continue  # refused behind a lost message: answered after its resend
            future = self._acks.pop(ack.correlation_id, None)
            if future is not None and not future.done():
                future.set_result(ack)

    async def partition_for(self, stream: str, key: bytes | None = None) -> int:
        """The partition :meth:`publish` sends ``key`` to in ``stream`` (the default partitioner)."""
        target = await self._target(stream, key, None, key_hash, None)
        assert target.partition is not None
        return target.partition

    async def _target(
        self,
        stream: str | None,
        key: bytes | None,
        partition: int | None,
        partitioner: Partitioner,
        subject: str | None,
    ) -> _Target:
        if stream is None:
            if subject is None:
                raise InvalidArgumentError("publish needs a stream, or a subject to publish on")
            return _Target(subject, None, None)
        config = self._streams.get(stream)
        if config is None:
            try:
                info = await self.describe_stream(stream)
            except PermissionDeniedError as exc:  # no grant on the stream at all
                who = exc.fields.get("principal", self.credentials.user)
                raise PermissionDeniedError(
                    f"principal {who!r} may not write stream {stream!r} (nor read or administer it)",
                    principal=who,
                    stream=stream,
                ) from None
            config = StreamConfig.from_json(info.config)
            self._streams[stream] = config
            self._resender.learn(info)
        if subject is not None:
            matching = [
                p
                for p, pattern in enumerate(config.partition_subjects())
                if subject_matches(pattern, subject)
            ]
            if not matching or (partition is not None and partition not in matching):
                raise InvalidArgumentError(
                    f"subject {subject!r} is not a subject of stream {stream!r}"
                    + (f" partition {partition}" if partition is not None else "")
                    + f" (its partitions' subjects: {', '.join(config.partition_subjects())})"
                )
            return _Target(subject, stream, matching[0] if partition is None else partition)
        number = partitioner(key, config.partitions) if partition is None else partition
        if not 0 <= number < config.partitions:
            raise InvalidArgumentError(
                f"stream {stream!r} has partitions 0 to {config.partitions - 1}, not {number}"
            )
        target = partition_subject(config.subject, number)
        if "*" in target.split(".") or target.endswith(">"):
            raise InvalidArgumentError(
                f"stream {stream!r} listens on the wildcard subject {config.subject!r}: "
                "pass subject= with a concrete subject it matches"
            )
        return _Target(target, stream, number)

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
    ) -> FetchResult:
        """Read committed batches from ``start``; wait up to ``max_wait`` s if there are none yet.

        Reads go to the partition's leader; with ``from_replicas`` an in-sync
        follower may answer (up to its own high watermark), which spreads
        readers over the replicas.  Leadership changes are followed.
        """
        request = ReadRequest(
            stream,
            partition,
            start_position(start),
            max_records,
            max_bytes,
            max_wait,
            from_replicas=from_replicas,
        )
        return await asyncio.to_thread(self._broker.read, request)

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
        position = start_position(start)
        if live and not stream.startswith(INTERNAL_PREFIX):

            def over_flight(offset: int) -> AsyncIterator[pa.RecordBatch]:
                resume = position if offset < 0 else StartPosition("offset", offset)
                return self._flight_tail(
                    stream, partition, resume, follow=follow, max_records=max_records, max_bytes=max_bytes
                )

            return LiveTail(
                self,
                stream,
                partition,
                position,
                max_records=max_records,
                max_bytes=max_bytes,
                flight_tail=over_flight,
            )
        return self._flight_tail(
            stream, partition, position, follow=follow, max_records=max_records, max_bytes=max_bytes
        )

    async def _flight_tail(
        self,
        stream: str,
        partition: int,
        position: StartPosition,
        *,
        follow: float,
        max_records: int | None,
        max_bytes: int | None,
    ) -> AsyncIterator[pa.RecordBatch]:
        """Batches from a Flight follow stream, reopened after each renewal or leader change."""
        retry_until: float | None = None
        while True:
            request = ReadRequest(stream, partition, position, max_records, max_bytes, 0.0, follow)
            try:
                async for item in self._follow(request):
                    retry_until = None
                    if isinstance(item, int):  # where the broker resolved the start to
                        position = StartPosition("offset", item)
                        continue
                    position = StartPosition("offset", item.column(0)[-1].as_py() + 1)
                    yield item
            except JetStreamError as exc:
                # The leader moved or went away: find the new one and go on from here.
                now = asyncio.get_running_loop().time()
                retry_until = retry_until or now + self.timeout
                if not exc.retriable or now > retry_until:
                    raise
                if exc.invalid_metadata or isinstance(exc, UnavailableError):
                    await asyncio.to_thread(self._refresh_quietly)
                await asyncio.sleep(0.1)

    def _refresh_quietly(self) -> None:
        with contextlib.suppress(JetStreamError):
            self._broker.refresh()

    async def _follow(self, request: ReadRequest) -> AsyncIterator[pa.RecordBatch | int]:
        """One follow stream: its resolved start offset, then its batches."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[pa.RecordBatch | int | JetStreamError | None] = asyncio.Queue()
        # Bounded: a slow consumer makes the reader thread (and the broker's stream) wait.
        room = threading.Semaphore(FOLLOW_BUFFER)
        readers: list[flight.FlightStreamReader] = []
        stopped = threading.Event()

        def put(item: pa.RecordBatch | int | JetStreamError | None) -> None:
            while not room.acquire(timeout=0.25):
                if stopped.is_set():
                    return
            if not stopped.is_set():
                # No round trip through the loop: the consumer wakes as soon as it can run.
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def pump() -> None:
            # A thread of its own: it blocks for the whole stream.
            item: pa.RecordBatch | int | JetStreamError | None = None
            connection: BrokerConnection | None = None
            try:
                reader, connection = self._broker.follow(request)
                readers.append(reader)
                if stopped.is_set():
                    reader.cancel()
                    return
                put(parse_response_metadata(reader.schema.metadata)["next_offset"])
                while not stopped.is_set():
                    put(reader.read_chunk().data)
            except StopIteration:
                item = None
            except JetStreamError as exc:
                item = None if stopped.is_set() else exc
            except flight.FlightError as exc:
                if stopped.is_set():
                    item = None
                elif connection is not None:
                    item = connection.error(exc)
                else:
                    item = UnavailableError(f"cannot follow {request.stream}/{request.partition}: {exc}")
            except RuntimeError:
                return  # the consumer's loop is gone
            with contextlib.suppress(RuntimeError):  # ...or went while the stream ended
                put(item)

        thread = threading.Thread(target=pump, name="jetstream-tail", daemon=True)
        thread.start()
        try:
            while (item := await queue.get()) is not None:
                room.release()
                if isinstance(item, JetStreamError):
                    raise item
                yield item
        finally:
            stopped.set()
            for reader in readers:
                reader.cancel()

    async def subscribe(
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
        batches = self.tail(stream, partition, start=start, follow=follow, max_records=max_records, live=live)
        async for batch in batches:
            for row in batch.to_pylist():
                yield Message(
                    stream=stream,
                    partition=partition,
                    offset=row["offset"],
                    timestamp=row["timestamp"].astimezone(UTC),
                    value=row["value"],
                    key=row["key"],
                    headers=tuple((h["key"], h["value"]) for h in row["headers"] or ()),
                    subject=row["subject"],
                    reply=row["reply"],
                )

    async def subscribe_partitions(
        self, stream: str, partitions: Sequence[int], *, start: Start = "earliest", live: bool = True
    ) -> AsyncIterator[Message]:
        """Messages of several partitions as each arrives: in offset order within a partition,
        interleaved across them (see :meth:`subscribe`)."""
        queue: asyncio.Queue[Message | BaseException] = asyncio.Queue(maxsize=FOLLOW_BUFFER * 64)

        async def pump(partition: int) -> None:
            try:
                async for message in self.subscribe(stream, partition, start=start, live=live):
                    await queue.put(message)
            except Exception as exc:  # noqa: BLE001 - handed to the consumer
                await queue.put(exc)

        pumps = [asyncio.ensure_future(pump(p)) for p in partitions]
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for task in pumps:
                task.cancel()

    # ---- plumbing ------------------------------------------------------------------------

    async def _action(self, action: ActionType, body: dict[str, Any]) -> Any:
        return await asyncio.to_thread(self._broker.action, action, body)


class _Target(NamedTuple):
    """Where a publish goes: the subject, and the stream partition it targets (if named)."""

    subject: str
    stream: str | None
    partition: int | None


def _deduplicated(fields: Mapping[str, Any]) -> bool:
    """Whether the broker de-duplicates a message of these envelope fields (resending is safe):
    a producer's sequence, a message id, or a batch whose every row carries one."""
    if fields.get("producer_id") is not None or fields.get("message_id") is not None:
        return True
    batch = fields.get("batch")
    if batch is None:
        return any(name == MSG_ID_HEADER for name, _ in fields.get("headers", ()))
    if "headers" not in batch.schema.names:
        return False
    rows, _ = message_ids_in(batch.column("headers"))
    return len(rows) == batch.num_rows


def _producer(producer_id: str | None, epoch: int, sequence: int | None) -> dict[str, Any]:
    if (producer_id is None) != (sequence is None):
        raise InvalidArgumentError("producer_id and sequence go together")
    return {"producer_id": producer_id, "producer_epoch": epoch, "sequence": sequence}


def _check_message_id(
    message_id: object, headers: tuple[tuple[str, bytes], ...], producer_id: str | None
) -> None:
    """Refuse a bad ``message_id``, naming it, and one that contradicts the other arguments."""
    validate_message_id(message_id)
    if producer_id is not None:
        raise InvalidArgumentError(
            f"message_id {message_id!r} and producer_id {producer_id!r} cannot be combined: an "
            "idempotent producer's sequences already de-duplicate its retries; use one or the other"
        )
    for name, value in headers:
        if name == MSG_ID_HEADER and value != str(message_id).encode():
            raise InvalidArgumentError(
                f"message_id {message_id!r} contradicts the {MSG_ID_HEADER} header {value!r}: "
                "message_id is stored as that header; pass one of them"
            )


def _with_ids(batch: pa.RecordBatch, message_ids: Sequence[str] | pa.Array | str) -> pa.RecordBatch:
    """``batch`` with each row's message id in its headers (see :meth:`Client.publish_batch`)."""
    what = "message_ids"
    if isinstance(message_ids, str):
        if message_ids not in batch.schema.names:
            raise InvalidArgumentError(
                f"message_ids names the column {message_ids!r}, which the batch does not have "
                f"(its columns: {', '.join(batch.schema.names)})"
            )
        what = f"message_ids column {message_ids!r}"
        column = batch.column(message_ids)
        batch = batch.drop_columns([message_ids])
        message_ids = column
    ids = checked_message_ids(message_ids, batch.num_rows, what)
    headers = batch.column("headers") if "headers" in batch.schema.names else None
    merged = with_message_ids(headers, ids)
    if headers is None:
        return batch.append_column("headers", merged)
    return batch.set_column(batch.schema.get_field_index("headers"), "headers", merged)


def _as_batch(data: pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
    if isinstance(data, pa.Table):
        batches = data.combine_chunks().to_batches()
        if not batches:
            raise InvalidArgumentError("publish_batch needs at least one row")
        return batches[0]
    if isinstance(data, pa.RecordBatch):
        return data
    rows = list(data)
    if not rows:
        raise InvalidArgumentError("publish_batch needs at least one row")
    try:
        return pa.RecordBatch.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InvalidArgumentError(f"rows do not form an Arrow batch: {exc}") from None
