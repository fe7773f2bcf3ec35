"""The broker's NATS connection: subscriptions for the partitions it leads, and discovery.

One connection per broker.  nats-py reconnects by itself after a network
failure, but closes the connection for good when the server answers a
protocol error (a refused subscription, say); the ingestor then opens a new
connection and subscribes everything again, so ingestion is never silently
down.  Whether the connection is up is reported by :attr:`Ingestor.connected`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.envelope import Envelope
from pyspark_jetstream.protocol.errors import ErrorCode, UnavailableError
from pyspark_jetstream.protocol.streams import DISCOVERY_SUBJECT, partition_subject

from .latency import LatencyHistogram
from .partition_ingest import PartitionIngest
from .port import BatchLimits, IngestPartition, LogTerms, ReconnectSettings, StreamLookup, log_fields

logger = logging.getLogger(__name__)

PENDING_MESSAGES_LIMIT = 4_000_000
PENDING_BYTES_LIMIT = 2 * 1024 * 1024 * 1024
SUBSCRIBE_TIMEOUT = 5.0
"""Seconds for NATS to confirm a new subscription."""


async def round_trip(nc: NatsClient) -> None:
    """Return once the server has processed every command sent so far.

    Two flushes: nats-py writes a flush's PING ahead of commands still in its
    buffer, so only the second PING surely follows them.
    """
    await nc.flush(timeout=SUBSCRIBE_TIMEOUT)  # type: ignore[arg-type]
    await nc.flush(timeout=SUBSCRIBE_TIMEOUT)  # type: ignore[arg-type]


class Ingestor:
    """The broker's NATS connection and its subscriptions, in line with the partitions it leads."""

    def __init__(
        self,
        urls: list[str],
        nats_config: ReconnectSettings,
        settings: BatchLimits,
        discovery: Callable[[], dict[str, object]],
        name: str,
        *,
        terms: LogTerms,
        streams: StreamLookup | None = None,
        connect_arguments: dict[str, Any] | None = None,
    ) -> None:
        """``terms``: the log's, for every partition's ingest (see :class:`~.port.LogTerms`);
        ``streams`` finds any stream's configuration by name (for ``Nats-Expected-Stream``;
        by default a partition knows only its own stream); ``connect_arguments``: more for
        ``nats.connect`` (TLS, user and password).  :meth:`start` connects."""
        self.urls = urls
        self.nats_config = nats_config
        self.settings = settings
        self.terms = terms
        self.name = name
        self.nc = NatsClient()
        self.connect_arguments: dict[str, Any] = dict(connect_arguments or {})
        self._discovery = discovery
        self._streams = streams
        self._answering = False
        self._ingests: dict[tuple[str, int], PartitionIngest] = {}
        self._failures: dict[tuple[str, int], str] = {}
        self._discovery_sub: Subscription | None = None
        self._errors: list[str] = []
        """Errors the server sent (the last few), to tell which subscription it refused."""
        self._drops = 0
        """Connections lost so far: a server that closes the connection over a SUB says no that way."""
        self._closing = False
        self._reopening: asyncio.Task[None] | None = None
        self._latency: dict[str, LatencyHistogram] = {}
        """Ack latency per stream led here, shared by its partitions' ingests."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop the ingests run on (known once started): puts from Flight's threads go there."""

    async def start(self) -> None:
        """Connect to NATS; raise ``UnavailableError`` naming the servers if that fails."""
        self._loop = asyncio.get_running_loop()
        try:
            await self._connect(self.nc)
        except Exception as exc:
            raise UnavailableError(f"cannot connect to NATS at {', '.join(self.urls)}: {exc}") from exc

    async def _connect(self, nc: NatsClient) -> None:
        await nc.connect(
            servers=self.urls,
            name=self.name,
            reconnect_time_wait=self.nats_config.reconnect_wait,  # type: ignore[arg-type]
            max_reconnect_attempts=self.nats_config.max_reconnect_attempts,
            connect_timeout=5,
            allow_reconnect=True,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnect,
            closed_cb=self._on_closed,
            **self.connect_arguments,
        )

    async def _on_disconnect(self) -> None:
        self._drops += 1
        if not self._closing:
            logger.warning("lost the connection to NATS; reconnecting")

    async def _on_error(self, exc: Exception) -> None:
        logger.warning("NATS error: %s", exc)
        self._errors = [*self._errors[-7:], str(exc)]

    async def _on_closed(self) -> None:
        self._replace_if_closed()

    def _replace_if_closed(self) -> None:
        if self.nc.is_closed and not self._closing and self._reopening is None:
            logger.error("the NATS connection was closed (%s); opening a new one", self.nc.last_error)
            self._reopening = asyncio.ensure_future(self._reopen())

    async def _reopen(self) -> None:
        """A new connection with every subscription the closed one had (failed ones excepted)."""
        wait = max(self.nats_config.reconnect_wait, 0.1)
        while not self._closing:
            nc = NatsClient()
            try:
                await self._connect(nc)
                for ingest in self._ingests.values():
                    ingest.nc = nc
                    ingest.subscription = await self._subscribe(nc, ingest)
                if self._answering:
                    self._discovery_sub = await self._subscribe_discovery(nc)
                await round_trip(nc)
                self.nc = nc
            except Exception:
                logger.exception("cannot reopen the NATS connection; retrying in %gs", wait)
                with contextlib.suppress(Exception):
                    await nc.close()
                await asyncio.sleep(wait)
                continue
            logger.info("NATS connection reopened with %d subscription(s)", len(self._ingests))
            break
        self._reopening = None

    async def _current(self) -> NatsClient:
        """The connection to use: a closed one is replaced first (waiting for that)."""
        self._replace_if_closed()
        if self._reopening is not None:
            await asyncio.shield(self._reopening)
        return self.nc

    async def answer_discovery(self) -> None:
        """Answer discovery requests (where this broker serves Flight): call once it serves."""
        self._answering = True  # from now on, a reopened connection answers too
        nc = await self._current()
        try:
            self._discovery_sub = await self._subscribe_discovery(nc)
            await round_trip(nc)  # the server knows the subscription before anyone can ask
        except NatsError:
            await self._current()  # closed meanwhile: the new connection answers

    async def _subscribe_discovery(self, nc: NatsClient) -> Subscription:
        async def answer(msg: Msg) -> None:
            if msg.reply:
                await nc.publish(msg.reply, json.dumps(self._discovery()).encode())

        return await nc.subscribe(DISCOVERY_SUBJECT, cb=answer)

    @property
    def connected(self) -> bool:
        """Whether the NATS connection is up (it reconnects by itself when it is not)."""
        return bool(self.nc.is_connected)

    def ingesting(self) -> set[tuple[str, int]]:
        """The partitions with a live subscription."""
        return set(self._ingests)

    @property
    def failures(self) -> dict[tuple[str, int], str]:
        """Partitions whose subscription NATS refused, with the reason."""
        return dict(self._failures)

    def ack_latency(self) -> dict[str, LatencyHistogram]:
        """The ack latency of each stream with a partition ingested here (from any thread)."""
        return dict(self._latency)

    def put(self, envelope: Envelope, sequence: int) -> concurrent.futures.Future[Ack]:
        """From any thread: store a chunk written over Flight into the partition its envelope names
        (see :meth:`.PartitionIngest.put`); the ack says ``not_leader`` if it is not ingested here,
        ``unavailable`` if the broker is stopping."""
        assert envelope.stream is not None and envelope.partition is not None
        correlation_id = str(sequence)
        loop = self._loop
        if loop is None or self._closing or loop.is_closed():
            refused: concurrent.futures.Future[Ack] = concurrent.futures.Future()
            text = "the broker is stopping"
            refused.set_result(_refusal(envelope, correlation_id, ErrorCode.UNAVAILABLE, text))
            return refused
        return asyncio.run_coroutine_threadsafe(self._put(envelope, correlation_id), loop)

    async def _put(self, envelope: Envelope, correlation_id: str) -> Ack:
        assert envelope.stream is not None and envelope.partition is not None
        ingest = self._ingests.get((envelope.stream, envelope.partition))
        if ingest is None:
            text = f"{envelope.stream}/{envelope.partition} is not led (or not ingested) here now"
            return _refusal(envelope, correlation_id, ErrorCode.NOT_LEADER, text)
        return await ingest.put(envelope, correlation_id)

    async def sync(self, leading: Mapping[tuple[str, int], IngestPartition]) -> dict[tuple[str, int], str]:
        """Subscribe for partitions newly led here; unsubscribe those no longer led.

        Each new subscription is confirmed by a round trip to the server
        before the next, so one NATS refuses (it may even close the connection
        over it) is removed again and reported, and never takes the others
        down.  A refused subscription is not tried again until the broker
        restarts (trying would cost every partition a reconnect).  Returns
        the partitions whose subscription failed, with the reason.
        """
        for key in sorted(self._ingests):
            if leading.get(key) is not self._ingests[key].partition:  # not led here, or reopened
                await self._ingests.pop(key).close()
        for key in list(self._failures):
            if key not in leading:
                del self._failures[key]
        for key in sorted(set(leading) - set(self._ingests) - set(self._failures)):
            partition = leading[key]
            config = partition.config
            nc = await self._current()
            latency = self._latency.setdefault(config.name, LatencyHistogram())
            ingest = PartitionIngest(
                nc, partition, self.settings, self.terms, latency=latency, streams=self._streams
            )
            errors, drops, last_error = len(self._errors), self._drops, nc.last_error
            try:
                ingest.subscription = await self._subscribe(nc, ingest)
                # The server answers a refused SUB with -ERR before the PONG, and may
                # close the connection over it: then nats-py notes the error
                # (last_error) and the round trip can end without any PONG.
                await round_trip(nc)
                if len(self._errors) != errors:
                    raise UnavailableError(self._errors[-1])
                if nc.last_error is not last_error:
                    raise UnavailableError(str(nc.last_error))
                if self._drops != drops or not nc.is_connected:
                    raise UnavailableError("the server closed the connection")
            except Exception as exc:  # noqa: BLE001 - nats-py raises several unrelated types
                subject = partition_subject(config.subject, partition.number)
                reason = f"NATS did not accept the subscription on {subject!r}: {exc or type(exc).__name__}"
                logger.error("%s/%d: cannot ingest: %s", *key, reason, extra=log_fields(*key))
                self._failures[key] = reason
                if ingest.subscription is not None:
                    with contextlib.suppress(Exception):
                        await ingest.subscription.unsubscribe()
                continue
            self._ingests[key] = ingest
        ingested = {stream for stream, _ in self._ingests}
        self._latency = {stream: h for stream, h in self._latency.items() if stream in ingested}
        return self.failures

    @staticmethod
    async def _subscribe(nc: NatsClient, ingest: PartitionIngest) -> Subscription:
        config = ingest.config
        return await nc.subscribe(
            partition_subject(config.subject, ingest.partition.number),
            queue=config.group or "",
            cb=ingest.handle,
            pending_msgs_limit=PENDING_MESSAGES_LIMIT,
            pending_bytes_limit=PENDING_BYTES_LIMIT,
        )

    async def close(self) -> None:
        """Unsubscribe everything, storing pending messages first."""
        self._closing = True
        if self._reopening is not None:
            self._reopening.cancel()
        if self._discovery_sub is not None:
            with contextlib.suppress(Exception):  # the connection may be closed already
                await self._discovery_sub.unsubscribe()
        for key in sorted(self._ingests):
            await self._ingests.pop(key).close()
        await self.nc.close()


def _refusal(envelope: Envelope, correlation_id: str, error: ErrorCode, text: str) -> Ack:
    assert envelope.stream is not None and envelope.partition is not None
    return Ack(envelope.stream, envelope.partition, -1, -1, correlation_id, error, text)
