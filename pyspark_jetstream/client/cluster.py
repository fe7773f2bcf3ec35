"""Blocking calls to a deployment of one or more brokers, routed to the broker that can answer.

:class:`ClusterConnection` knows the cluster's metadata (which brokers exist,
where they serve Flight, who leads each partition), asked of any broker it
reaches.  Reads and cursors go to the partition's leader (reads may go to an
in-sync follower with ``from_replicas``); admin goes to any broker, which
forwards what only the controller may do.  An error whose ``invalid_metadata``
flag is set (``NotLeaderError``: leadership moved) makes it refresh the
metadata -- taking the new leader's address straight from the error when it
carries one -- and retry; other ``retriable`` errors are retried after a short
backoff; all within the connection's timeout.  Nothing is retried that could
store twice: reads, metadata and cursors are idempotent.  Until a first broker
has answered, brokers that cannot be reached are retried for the shorter
``connect_timeout`` only: a wrong address or a deployment that is down fails
at once, while a broker lost later (a failover) is waited for.

The asynchronous :class:`~.client.Client` runs these calls in worker threads;
``SyncClient`` (in the caller's thread, through the same instance) and Spark
executors, which have no event loop, use them directly.  One instance serves
any number of threads at once: its state changes under one lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pyarrow import flight

from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    NotEnoughReplicasError,
    OffsetOutOfRangeError,
    RequestTimeoutError,
    UnavailableError,
)
from pyspark_jetstream.protocol.flight import LATEST, ActionType, ReadRequest, StreamInfo

from .connection import BrokerConnection, FetchResult
from .credentials import Credentials

logger = logging.getLogger(__name__)
T = TypeVar("T")

CURSOR_STREAM = "__cursors"
BACKOFF = (0.05, 1.0)
"""First and longest pause (seconds) between retries."""


class ClusterConnection:
    """Flight calls to whichever broker should answer them (see the module docstring)."""

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        timeout: float = 10.0,
        connect_timeout: float | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """``servers``: one or more broker Flight addresses (``grpc://host:port``, or
        ``grpc+tls://host:port`` with TLS; a list or one comma-separated string), any will do;
        ``connect_timeout``: seconds to keep trying while no broker has answered yet (``None``:
        the whole ``timeout``); ``credentials``: what to present to each of them."""
        self.credentials = credentials if credentials is not None else Credentials()
        listed = servers.split(",") if isinstance(servers, str) else list(servers)
        self.bootstrap = [s.strip() for s in listed if s.strip()]
        if not self.bootstrap:
            raise InvalidArgumentError("give at least one broker address (grpc://host:port)")
        self.timeout = timeout
        self.connect_timeout = timeout if connect_timeout is None else min(connect_timeout, timeout)
        self._reached = False
        """Whether any broker has answered (a result or an error of its own) since this was made."""
        self._connections: dict[str, BrokerConnection] = {}
        self._brokers: dict[str, str] = {}
        self._leaders: dict[tuple[str, int], str] = {}
        self._isr: dict[tuple[str, int], tuple[str, ...]] = {}
        self._lock = threading.RLock()
        self._known = False
        self._answered: str | None = None
        """The broker that answered the last call any broker may answer: asked first next time, so a
        hung broker (paused, or behind a broken network) costs one timeout, not one per call."""
        self.connection(self.bootstrap[0])  # a malformed address fails here, naming it

    def _lookup(
        self, action: ActionType, body: dict[str, Any], timeout: float | None = None
    ) -> tuple[Any, str]:
        """A metadata lookup any broker can answer, and the address that answered.  One broker may
        take half the connection's timeout (at most the connect timeout until one has answered),
        so that a hung one leaves time to ask another; retried for ``timeout`` seconds (default:
        the connection's)."""
        each = self.timeout / 2 if self._reached else min(self.timeout / 2, self.connect_timeout)
        return self._any(lambda c: (c.action(action, body, each), c.address), timeout)

    @property
    def address(self) -> str:
        """The first broker address given."""
        return self.bootstrap[0]

    def close(self) -> None:
        """Close every channel."""
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()

    def connection(self, address: str) -> BrokerConnection:
        """The (shared) connection to one broker."""
        with self._lock:
            found = self._connections.get(address)
            if found is None:
                found = self._connections[address] = BrokerConnection(
                    address, timeout=self.timeout, credentials=self.credentials
                )
            return found

    # ---- metadata --------------------------------------------------------------------------

    def refresh(self) -> dict[str, Any]:
        """Ask any reachable broker for the cluster's metadata and remember it."""
        metadata, _ = self._lookup(ActionType.METADATA, {})
        # Built first, then swapped in at once: a thread interrupted here (Ctrl-C in a SyncClient
        # call) leaves the old state or the new one, never a half-filled one.
        brokers = {b["broker_id"]: b["flight"] for b in metadata["brokers"]}
        leaders: dict[tuple[str, int], str] = {}
        isr: dict[tuple[str, int], tuple[str, ...]] = {}
        for stream in metadata["streams"]:
            name = stream["config"]["name"]
            for p in stream["partitions"]:
                leaders[(name, p["partition"])] = p["leader"]
                isr[(name, p["partition"])] = tuple(p["isr"])
        with self._lock:
            self._brokers, self._leaders, self._isr, self._known = brokers, leaders, isr, True
        result: dict[str, Any] = metadata
        return result

    def brokers(self) -> dict[str, str]:
        """Live brokers as last seen: ``{broker id: Flight address}``."""
        if not self._known:
            self.refresh()
        with self._lock:
            return dict(self._brokers)

    def _address_for(self, stream: str, partition: int, *, from_replicas: bool) -> str:
        if not self._known:
            self.refresh()
        with self._lock:
            key = (stream, partition)
            if from_replicas and self._isr.get(key):
                candidates = [self._brokers[b] for b in self._isr[key] if b in self._brokers]
                if candidates:
                    return random.choice(candidates)
            leader = self._leaders.get(key)
            if leader and leader in self._brokers:
                return self._brokers[leader]
        # Unknown partition, or no leader right now: any broker answers with the reason.
        return self.bootstrap[0]

    def leader_address(self, stream: str, partition: int) -> str:
        """The Flight address of the partition's leader, as last known (any broker's if none is)."""
        return self._address_for(stream, partition, from_replicas=False)

    def forget_leader(self, stream: str, partition: int, exc: JetStreamError) -> None:
        """A call to the partition's leader failed with ``exc``: learn where it leads now."""
        hinted = exc.fields.get("leader_address")
        self._forget(stream, partition, hinted if isinstance(hinted, str) else None, exc)

    # ---- calls ---------------------------------------------------------------------------------

    def action(self, action: ActionType, body: dict[str, Any]) -> Any:
        """An admin action on any broker (cursors go to the cursor stream's leader)."""
        if action in (ActionType.SET_CURSOR, ActionType.FETCH_CURSOR, ActionType.DELETE_CURSOR):
            return self._routed(CURSOR_STREAM, 0, False, lambda c: c.action(action, body))
        if action in (ActionType.CREATE_STREAM, ActionType.ADD_PARTITIONS):
            # Too few live brokers for the replication factor is an answer, not a state to wait out
            # (Kafka's topic creation answers the same at once).
            return self._any(lambda c: c.action(action, body), final=NotEnoughReplicasError)
        return self._any(lambda c: c.action(action, body))

    def describe(self, stream: str) -> StreamInfo:
        """A stream's configuration and its partitions, with each partition's offsets from its leader."""
        found, address = self._lookup(ActionType.DESCRIBE_STREAM, {"name": stream})
        return self._with_leader_offsets(StreamInfo.from_json(found), address)

    def leadership(self, stream: str, timeout: float | None = None) -> StreamInfo:
        """A stream's configuration and its partitions' leaders, ISRs and epochs, as any broker
        knows them (no offsets: no call to each leader, which may be the one that is gone);
        retried for ``timeout`` seconds (default: the connection's)."""
        found, _ = self._lookup(ActionType.DESCRIBE_STREAM, {"name": stream}, timeout)
        return StreamInfo.from_json(found)

    def list_streams(self) -> list[StreamInfo]:
        """Every stream, each partition's offsets from its leader."""
        found, address = self._lookup(ActionType.LIST_STREAMS, {})
        return [self._with_leader_offsets(StreamInfo.from_json(s), address) for s in found]

    def _with_leader_offsets(self, info: StreamInfo, answered_at: str) -> StreamInfo:
        """``info`` with the offsets of partitions the answering broker does not lead, from their leaders."""
        brokers = self.brokers()
        answered_by = next((b for b, a in brokers.items() if a == answered_at), None)
        partitions = []
        for p in info.partitions:
            read = None
            if p.leader and p.leader != answered_by:
                with contextlib.suppress(JetStreamError):  # the leader is away: keep what was answered
                    read = self.read(ReadRequest(info.config["name"], p.partition, LATEST, max_records=1))
            partitions.append(
                p
                if read is None
                else dataclasses.replace(
                    p,
                    log_start_offset=read.log_start_offset,
                    log_end_offset=read.log_end_offset,
                    high_watermark=read.high_watermark,
                )
            )
        return dataclasses.replace(info, partitions=tuple(partitions))

    def read(self, request: ReadRequest) -> FetchResult:
        """One read from the partition's leader (or an in-sync follower), long-polling up to ``max_wait``."""
        return self._routed(
            request.stream,
            request.partition,
            request.from_replicas,
            lambda c: c.read(request),
            extra=request.max_wait,
        )

    def follow(self, request: ReadRequest) -> tuple[flight.FlightStreamReader, BrokerConnection]:
        """Open a follow read on the partition's leader; the connection is for turning errors."""
        address = self._address_for(request.stream, request.partition, from_replicas=request.from_replicas)
        connection = self.connection(address)
        return connection.follow(request), connection

    def _routed(
        self,
        stream: str,
        partition: int,
        from_replicas: bool,
        call: Callable[[BrokerConnection], T],
        *,
        extra: float = 0.0,
    ) -> T:
        deadline = time.monotonic() + self.timeout + extra
        backoff = BACKOFF[0]
        while True:
            address = self._address_for(stream, partition, from_replicas=from_replicas)
            try:
                return call(self.connection(address))
            except JetStreamError as exc:
                if not exc.retriable or _gone(exc) or time.monotonic() + backoff > deadline:
                    raise
                hinted = exc.fields.get("leader_address")
                if exc.invalid_metadata or isinstance(exc, UnavailableError):
                    self._forget(stream, partition, hinted if isinstance(hinted, str) else None, exc)
                logger.debug("retrying %s/%d at another broker: %s", stream, partition, exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF[1])

    def _forget(self, stream: str, partition: int, hinted: str | None, exc: JetStreamError) -> None:
        leader = exc.fields.get("leader")
        if hinted and isinstance(leader, str):
            with self._lock:
                self._brokers[leader] = hinted
                self._leaders[(stream, partition)] = leader
            return
        try:
            self.refresh()
        except JetStreamError:
            with self._lock:
                self._known = False

    def _any(
        self,
        call: Callable[[BrokerConnection], T],
        timeout: float | None = None,
        final: type[JetStreamError] | None = None,
    ) -> T:
        """``call`` on the first broker that answers (the bootstrap ones, then those it knows);
        retriable errors are retried until ``timeout``, except those of type ``final``; until a
        broker has answered, for the connect timeout at most."""
        started = time.monotonic()
        deadline = started + (self.timeout if timeout is None else timeout)
        backoff = BACKOFF[0]
        last: JetStreamError | None = None
        while True:
            with self._lock:
                first = [self._answered] if self._answered else []
                addresses = list(dict.fromkeys([*first, *self.bootstrap, *self._brokers.values()]))
            for address in addresses:
                try:
                    answer = call(self.connection(address))
                    self._answered = address
                    self._reached = True
                    return answer
                except (UnavailableError, RequestTimeoutError) as exc:
                    if self._answered == address:
                        self._answered = None
                    last = exc
                    continue
                except JetStreamError as exc:
                    self._reached = True  # a broker answered, with an error of its own
                    final_now = final is not None and isinstance(exc, final)
                    if not exc.retriable or final_now or time.monotonic() + backoff > deadline:
                        raise
                    last = exc
                    break
            limit = deadline if self._reached else min(deadline, started + self.connect_timeout)
            if time.monotonic() + backoff > limit:
                assert last is not None
                raise last
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF[1])


def _gone(exc: JetStreamError) -> bool:
    """An offset below the log start: retention or compaction removed it, and no broker has it back.

    (Above the log end, the same error is worth retrying: a new leader may still be catching up.)
    """
    offset, start = exc.fields.get("offset"), exc.fields.get("log_start_offset")
    return (
        isinstance(exc, OffsetOutOfRangeError)
        and isinstance(offset, int)
        and isinstance(start, int)
        and offset < start
    )
