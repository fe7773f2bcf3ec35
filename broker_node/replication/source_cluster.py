"""Another cluster's brokers, as a mirror reads them: metadata, a stream's description, reads.

A mirror reaches its source with the Flight calls any client makes
(:mod:`pyspark_jetstream.protocol.flight`): the ``metadata`` action (who leads
each partition, where each broker serves) and ``describe_stream`` on any of
the source servers, and consumer reads (``do_get``) from a partition's
leader.  A read asks for the log's columns only, from an offset, so what
comes back is the source's stored rows as they are -- offsets, timestamps,
keys, values, headers, subjects and producer fields -- up to the source's
high watermark (committed data only), and the response's metadata carries
the source's offsets.  Nothing here keeps state between calls but the open
Flight clients; every error comes back as a ``JetStreamError`` (a Flight
error the source sent is its own; one it could not send is
``UnavailableError`` naming the address).

Blocking calls, on the caller's thread (a mirror copier's).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyarrow import flight

from pyspark_jetstream.protocol.errors import JetStreamError, UnavailableError, UnknownStreamError
from pyspark_jetstream.protocol.flight import (
    ActionType,
    ReadRequest,
    StartPosition,
    encode_json,
    error_from_message,
    parse_response_metadata,
)
from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.streams import StreamConfig

logger = logging.getLogger(__name__)

CALL_TIMEOUT = 10.0
"""Seconds an action on a source broker may take."""

Connect = Callable[[str], flight.FlightClient]
"""Opens a Flight client to an address, with the source's TLS trust and credentials."""


@dataclass(frozen=True, slots=True)
class SourceRead:
    """What one read of a source partition gave."""

    batches: list[pa.RecordBatch]
    """Stored rows in the log's columns, in offset order (possibly none)."""
    next_offset: int
    """Where the next read starts (past a compaction gap too)."""
    high_watermark: int
    """The source partition's high watermark when it answered."""
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class SourceStream:
    """A source stream as its cluster describes it."""

    config: StreamConfig
    brokers: tuple[str, ...]
    """Flight addresses of the source cluster's live brokers (to recognise a cluster)."""


class SourceCluster:
    """The brokers of one source cluster (see the module docstring); not thread-safe: one per copier."""

    def __init__(self, servers: tuple[str, ...], connect: Connect) -> None:
        self.servers = servers
        self._connect = connect
        self._clients: dict[str, flight.FlightClient] = {}

    def close(self) -> None:
        """Close every Flight client opened."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()

    def forget(self, address: str) -> None:
        """Drop the client to ``address`` (it failed: the next call connects again)."""
        client = self._clients.pop(address, None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    # ---- metadata -----------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        """The ``metadata`` action's answer from the first source server that gives one."""
        answer = self._any(ActionType.METADATA, {})
        if not isinstance(answer, dict):
            raise UnavailableError(f"the source at {','.join(self.servers)} gave no metadata")
        return answer

    def describe(self, stream: str, metadata: dict[str, Any] | None = None) -> SourceStream:
        """The source stream's config and the source's brokers (from ``metadata`` if given, else
        read now); ``UnknownStreamError`` naming the stream and the servers if there is none."""
        metadata = self.metadata() if metadata is None else metadata
        described = next((s for s in metadata.get("streams", []) if s["config"]["name"] == stream), None)
        if described is None:
            raise UnknownStreamError(
                f"the source cluster at {','.join(self.servers)} has no stream named {stream!r}",
                stream=stream,
            )
        return SourceStream(StreamConfig.from_json(described["config"]), brokers_of(metadata))

    def config(self, address: str, stream: str) -> StreamConfig:
        """The source stream's config as the broker at ``address`` has it (``describe_stream``)."""
        try:
            results = list(
                self._client(address).do_action(
                    flight.Action(ActionType.DESCRIBE_STREAM.value, encode_json({"name": stream})),
                    flight.FlightCallOptions(timeout=CALL_TIMEOUT),
                )
            )
        except flight.FlightError as exc:
            raise self._failed(exc, address) from None
        return StreamConfig.from_json(json.loads(results[0].body.to_pybytes())["config"])

    def leader_address(self, stream: str, partition: int) -> str:
        """The Flight address of the source partition's leader; ``UnavailableError`` if it has none
        now, ``UnknownStreamError`` if the source has no such partition."""
        metadata = self.metadata()
        described = next((s for s in metadata.get("streams", []) if s["config"]["name"] == stream), None)
        if described is None or not 0 <= partition < len(described["partitions"]):
            raise UnknownStreamError(
                f"the source cluster at {','.join(self.servers)} has no partition {stream}/{partition}",
                stream=stream,
                partition=partition,
            )
        leader = described["partitions"][partition]["leader"]
        address = next((b["flight"] for b in metadata.get("brokers", []) if b["broker_id"] == leader), None)
        if not leader or address is None:
            raise UnavailableError(
                f"the source partition {stream}/{partition} has no live leader now",
                stream=stream,
                partition=partition,
            )
        return str(address)

    # ---- reads ----------------------------------------------------------------------------

    def read(
        self,
        address: str,
        stream: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        max_wait: float,
        max_records: int | None = None,
    ) -> SourceRead:
        """Committed rows of ``stream/partition`` from ``offset`` on, read from ``address`` (its
        leader), waiting up to ``max_wait`` seconds for some; the source's errors as raised by it
        (``NotLeaderError``, ``OffsetOutOfRangeError`` with the source's log start, ...)."""
        request = ReadRequest(
            stream,
            partition,
            start=StartPosition("offset", offset),
            max_records=max_records,
            max_bytes=max_bytes,
            max_wait=max_wait,
            columns=tuple(LOG_SCHEMA.names),
        )
        options = flight.FlightCallOptions(timeout=max_wait + CALL_TIMEOUT)
        try:
            reader = self._client(address).do_get(flight.Ticket(request.to_ticket()), options)
            table = reader.read_all()
        except flight.FlightError as exc:
            raise self._failed(exc, address) from None
        offsets = parse_response_metadata(table.schema.metadata)
        return SourceRead(
            batches=table.to_batches(),
            next_offset=offsets.get("next_offset", offset),
            high_watermark=offsets.get("high_watermark", -1),
            log_start_offset=offsets.get("log_start_offset", -1),
        )

    # ---- internals --------------------------------------------------------------------------

    def _client(self, address: str) -> flight.FlightClient:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = self._connect(address)
        return client

    def _any(self, action: ActionType, body: dict[str, Any]) -> object:
        """``action`` on the first source server that answers; the last failure if none does."""
        failure: JetStreamError | None = None
        for address in self.servers:
            try:
                results = list(
                    self._client(address).do_action(
                        flight.Action(action.value, encode_json(body)),
                        flight.FlightCallOptions(timeout=CALL_TIMEOUT),
                    )
                )
            except flight.FlightError as exc:
                failure = self._failed(exc, address)
                if failure.code.value in ("unauthenticated", "permission_denied"):
                    raise failure from None  # every broker of the source says the same
                continue
            return json.loads(results[0].body.to_pybytes()) if results else None
        assert failure is not None
        raise failure

    def _failed(self, exc: flight.FlightError, address: str) -> JetStreamError:
        """The source's error for ``exc`` (and the client to ``address`` dropped when it is ours)."""
        known = error_from_message(str(exc), getattr(exc, "extra_info", None))
        if known is not None:
            return known
        self.forget(address)
        return UnavailableError(f"the source broker at {address} cannot be reached: {_first_line(exc)}")


def brokers_of(metadata: dict[str, Any]) -> tuple[str, ...]:
    """The Flight addresses of the brokers a ``metadata`` answer names, sorted."""
    return tuple(sorted(str(b["flight"]) for b in metadata.get("brokers", [])))


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
