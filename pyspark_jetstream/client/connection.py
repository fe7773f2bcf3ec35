"""A blocking connection to one broker's Arrow Flight endpoint: admin actions and reads.

The asynchronous :class:`~.client.Client` runs these calls in worker threads;
Spark executors, which have no event loop, use them directly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyarrow import flight

from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    RequestTimeoutError,
    UnavailableError,
)
from pyspark_jetstream.protocol.flight import (
    ActionType,
    ReadRequest,
    StreamInfo,
    encode_json,
    error_from_message,
    parse_response_metadata,
)
from pyspark_jetstream.protocol.schema import LOG_SCHEMA

from .credentials import Credentials


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Batches read from one partition, and where to read next."""

    batches: list[pa.RecordBatch]
    next_offset: int
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    schema: pa.Schema = LOG_SCHEMA
    """The batches' columns: the log's (or those asked for), then a typed stream's fields."""

    @property
    def num_rows(self) -> int:
        """Messages in the result."""
        return sum(b.num_rows for b in self.batches)

    def to_table(self) -> pa.Table:
        """The batches as one table (in :attr:`schema`)."""
        return pa.Table.from_batches(self.batches, schema=self.schema)


class BrokerConnection:
    """Flight calls to one broker, with errors turned into :class:`JetStreamError` subclasses."""

    def __init__(
        self, address: str, *, timeout: float = 10.0, credentials: Credentials | None = None
    ) -> None:
        self.address = address
        self.timeout = timeout
        arguments = credentials.flight_arguments() if credentials is not None else {}
        try:
            self._flight = flight.connect(address, **arguments)
        except (pa.ArrowException, flight.FlightError) as exc:
            raise InvalidArgumentError(
                f"invalid broker address {address!r}: use grpc://host:port ({exc})"
            ) from None

    def close(self) -> None:
        """Close the channel."""
        self._flight.close()

    def action(self, action: ActionType, body: dict[str, Any], timeout: float | None = None) -> Any:
        """Run an admin action and return its decoded JSON result (waiting up to ``timeout``
        seconds; by default three times the connection's, for actions the controller carries out)."""
        options = flight.FlightCallOptions(timeout=self.timeout * 3 if timeout is None else timeout)
        try:
            results = list(self._flight.do_action(flight.Action(action.value, encode_json(body)), options))
        except flight.FlightError as exc:
            raise self.error(exc) from None
        return json.loads(results[0].body.to_pybytes()) if results else None

    def describe(self, stream: str) -> StreamInfo:
        """A stream's configuration and partition offsets."""
        return StreamInfo.from_json(self.action(ActionType.DESCRIBE_STREAM, {"name": stream}))

    def list_streams(self) -> list[StreamInfo]:
        """Every stream."""
        return [StreamInfo.from_json(s) for s in self.action(ActionType.LIST_STREAMS, {})]

    def read(self, request: ReadRequest) -> FetchResult:
        """One read (long-polling up to ``request.max_wait``)."""
        options = flight.FlightCallOptions(timeout=request.max_wait + self.timeout)
        try:
            table = self._flight.do_get(flight.Ticket(request.to_ticket()), options).read_all()
        except flight.FlightError as exc:
            raise self.error(exc) from None
        offsets = parse_response_metadata(table.schema.metadata)
        table = table.replace_schema_metadata(None)
        return FetchResult(
            batches=table.to_batches(),
            next_offset=offsets["next_offset"],
            high_watermark=offsets["high_watermark"],
            log_start_offset=offsets["log_start_offset"],
            log_end_offset=offsets["log_end_offset"],
            schema=table.schema,
        )

    def follow(self, request: ReadRequest) -> flight.FlightStreamReader:
        """Open a follow read: the broker pushes batches down the returned reader."""
        options = flight.FlightCallOptions(timeout=request.follow + self.timeout)
        try:
            return self._flight.do_get(flight.Ticket(request.to_ticket()), options)
        except flight.FlightError as exc:
            raise self.error(exc) from None

    def open_put(
        self, descriptor: flight.FlightDescriptor, schema: pa.Schema
    ) -> tuple[flight.FlightStreamWriter, flight.FlightMetadataReader]:
        """Open a put (see :mod:`pyspark_jetstream.protocol.put`): its chunk writer and ack reader."""
        try:
            return self._flight.do_put(descriptor, schema)
        except flight.FlightError as exc:
            raise self.error(exc) from None

    def error(self, exc: flight.FlightError) -> JetStreamError:
        """The error a failed Flight call stands for."""
        known = error_from_message(str(exc), getattr(exc, "extra_info", None))
        if known is not None:
            return known
        if isinstance(exc, flight.FlightUnavailableError):
            return UnavailableError(
                f"broker at {self.address} is unreachable: {exc}; is a broker running there?"
            )
        if isinstance(exc, flight.FlightTimedOutError):
            return RequestTimeoutError(f"broker at {self.address} did not answer in time")
        return UnavailableError(f"broker at {self.address} failed: {exc}")
