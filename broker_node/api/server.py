"""The broker's Arrow Flight server (wire format in :mod:`pyspark_jetstream.protocol.flight`).

``do_get`` streams committed record batches straight from the log (memory
mapped, never converted row by row) and long-polls for new data; metadata is
served through ``list_flights`` / ``get_flight_info``; admin and cursors are
actions.  Every error reaches the client as a Flight error whose text starts
with a stable error code.

A call refused for the client's own mistake (:data:`CLIENT_ERRORS`: a bad
argument, an unknown stream, an offset out of range...) is logged once, at
INFO, with the kind of call, the stream and partition where known, and the
error's message -- never the request's body nor any data.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import pyarrow as pa
from pyarrow import flight

from broker_node.api.actions import ACTION_DESCRIPTIONS, Actions, AdminService
from broker_node.log import LogClosedError, LogError, LogStore, ReplicaFrame
from broker_node.log import OffsetOutOfRangeError as LogOffsetOutOfRangeError
from broker_node.log.logging_labels import Labels
from pyspark_jetstream.protocol.array_builders import large_binary_of
from pyspark_jetstream.protocol.errors import (
    ErrorCode,
    InvalidArgumentError,
    JetStreamError,
    LimitExceededError,
    OffsetOutOfRangeError,
    StorageError,
)
from pyspark_jetstream.protocol.flight import (
    ActionType,
    ReadRequest,
    decode_json_object,
    encode_json,
    error_detail,
    error_message,
    response_metadata,
)
from pyspark_jetstream.protocol.put import parse_put_command
from pyspark_jetstream.protocol.replication import (
    FETCH_SCHEMA,
    LeaderOffsets,
    ReplicaFetch,
    fetch_metadata,
)
from pyspark_jetstream.protocol.replication import parse_ticket as parse_replica_ticket
from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.streams import StreamConfig

from .puts import Put, PutTarget
from .typed_reads import ReadShape

logger = logging.getLogger(__name__)
T = TypeVar("T")

CLIENT_ERRORS = frozenset(
    {
        ErrorCode.INVALID_ARGUMENT,
        ErrorCode.UNKNOWN_STREAM,
        ErrorCode.STREAM_EXISTS,
        ErrorCode.TOO_LARGE,
        ErrorCode.OFFSET_OUT_OF_RANGE,
        ErrorCode.PRODUCER_FENCED,
    }
)
"""Refusals caused by the request itself, logged (once per call) for whoever debugs the client.
Not ``not_leader`` (routine: clients follow leaders by it) nor the broker's own failures."""
LOGGED_MESSAGE_CHARS = 500


class ReadablePartition(Protocol):
    """What the server needs of a partition."""

    log: LogStore
    config: StreamConfig

    @property
    def high_watermark(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def wait_for_data(self, offset: int, timeout: float) -> bool: ...


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaFetchAnswer:
    """A repair copy (see :mod:`pyspark_jetstream.protocol.replication`): the stored frames from the
    fetch offset on, and where the answering broker's log stands."""

    frames: list[ReplicaFrame]
    offsets: LeaderOffsets


class BrokerView(AdminService, PutTarget, Protocol):
    """What the server needs of the broker: reads, repair copies, puts (see
    :class:`.puts.PutTarget`), and the admin actions."""

    @property
    def flight_address(self) -> str: ...

    def readable(self, stream: str, number: int, *, from_replicas: bool = False) -> ReadablePartition: ...

    def replica_fetch(self, request: ReplicaFetch) -> ReplicaFetchAnswer:
        """A repair copy of stored frames from ``request.fetch_offset`` on (nothing is recorded)."""


class Access(Protocol):
    """Who a call is from and what it may do (the broker's access control)."""

    def authenticate(self, authorization: str | None, peer_identity: str) -> str: ...
    def check(
        self, principal: str, action: str, *, stream: str | None = None, consumer: str | None = None
    ) -> None: ...
    def allows(self, principal: str, action: str, *, stream: str) -> bool: ...
    def check_cluster(self, principal: str, what: str) -> None: ...
    def open_follow(self, principal: str) -> Callable[[], None]: ...


class _OpenAccess:
    """No access control: everyone may do everything (no ``[security] acl_file``)."""

    def authenticate(self, authorization: str | None, peer_identity: str) -> str:
        return "anonymous"

    def check(
        self, principal: str, action: str, *, stream: str | None = None, consumer: str | None = None
    ) -> None:
        return None

    def allows(self, principal: str, action: str, *, stream: str) -> bool:
        return True

    def check_cluster(self, principal: str, what: str) -> None:
        return None

    def open_follow(self, principal: str) -> Callable[[], None]:
        return lambda: None


class _CredentialsFactory(flight.ServerMiddlewareFactory):
    """Keeps each call's ``authorization`` header for the handler (which also sees the client
    certificate's identity, which middleware does not)."""

    def start_call(self, info: flight.CallInfo, headers: dict[str, list[str]]) -> flight.ServerMiddleware:
        values = headers.get("authorization")
        return _Presented(values[0] if values else None)


class _Presented(flight.ServerMiddleware):
    def __init__(self, authorization: str | None) -> None:
        self.authorization = authorization


MIDDLEWARE_KEY = "credentials"


class FlightApi(flight.FlightServerBase):
    """Flight endpoint of one broker."""

    def __init__(
        self,
        location: str,
        broker: BrokerView,
        *,
        access: Access | None = None,
        max_streams: int | None = None,
        max_waiting_readers: int = 256,
        max_open_puts: int = 4096,
        **tls: Any,
    ) -> None:
        """``tls``: ``tls_certificates``, ``verify_client``, ``root_certificates`` of
        ``FlightServerBase`` (with a ``grpc+tls://`` location).  ``max_waiting_readers``:
        follow and long-polling reads that may wait at once (each holds a thread), all
        principals together; replica fetches are not counted.  ``max_open_puts``: producers'
        puts open at once (each holds two threads), all principals together."""
        super().__init__(location, middleware={MIDDLEWARE_KEY: _CredentialsFactory()}, **tls)
        self.broker = broker
        self.access: Access = access if access is not None else _OpenAccess()
        self.max_streams = max_streams
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        """Calls served, by kind (read, follow, replica_fetch, an action's name) and outcome code."""
        self.follow_readers = 0
        """Follow reads open now."""
        self.waiting_readers = _Places(
            max_waiting_readers,
            lambda taken, limit: (
                f"the broker has {taken} readers waiting for data (follow and "
                f"long-polling reads), its limit ([flight] max_waiting_readers) is "
                f"{limit}: each holds a thread; read without waiting, follow "
                "through the live tail (Client.tail), which holds none, or raise the limit"
            ),
        )
        """Follow reads open and long-polling reads waiting now (see ``max_waiting_readers``)."""
        self.open_puts = _Places(
            max_open_puts,
            lambda taken, limit: (
                f"the broker has {taken} puts open, its limit ([flight] max_open_puts) is "
                f"{limit}: each holds two threads; close idle producers' puts, or "
                "raise the limit"
            ),
        )
        """Producers' puts open now (see ``max_open_puts``)."""
        self._counts_lock = threading.Lock()
        self._stopping = threading.Event()

    def _principal(self, context: flight.ServerCallContext) -> str:
        presented = context.get_middleware(MIDDLEWARE_KEY)
        authorization = presented.authorization if isinstance(presented, _Presented) else None
        identity = context.peer_identity()
        return self.access.authenticate(
            authorization, identity.decode("utf-8", "replace") if isinstance(identity, bytes) else identity
        )

    def _counted(self, kind: str) -> Callable[[str], None]:
        def count(code: str) -> None:
            with self._counts_lock:
                self.requests[(kind, code)] += 1

        return count

    def _outcome(self, call: _Call) -> Callable[[str], None]:
        """Count a call's outcome under its kind as known when it ends (once its request is parsed)."""

        def count(code: str) -> None:
            self._counted(call.kind)(code)  # the kind as it is now, not when the call began

        return count

    # ---- reads -----------------------------------------------------------------

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        """Stream committed batches for the ticket's read request (or stored frames to a replica)."""

        call = _Call("read")

        def get() -> flight.FlightDataStream:
            principal = self._principal(context)
            fetch = parse_replica_ticket(ticket.ticket)
            if fetch is not None:
                call.about("replica_fetch", fetch.stream, fetch.partition)
                self.access.check_cluster(principal, "fetch as a replica")
                return self._replica_fetch(fetch)
            request = ReadRequest.from_ticket(ticket.ticket)
            call.about("follow" if request.follow > 0 else "read", request.stream, request.partition)
            self.access.check(principal, "read", stream=request.stream)
            return self._read(request, context, principal)

        return _guard(get, self._outcome(call), call)

    def _replica_fetch(self, request: ReplicaFetch) -> flight.FlightDataStream:
        answer = self.broker.replica_fetch(request)
        batch = _fetch_batch(answer.frames)
        table = pa.Table.from_batches([batch]).replace_schema_metadata(fetch_metadata(answer.offsets))
        return flight.RecordBatchStream(table)

    def _read(
        self, request: ReadRequest, context: flight.ServerCallContext, principal: str
    ) -> flight.FlightDataStream:
        partition = self.broker.readable(
            request.stream, request.partition, from_replicas=request.from_replicas
        )
        log = partition.log
        shape = ReadShape(request, partition.config.schema)
        start = self._resolve_start(request, partition)
        if request.follow > 0:
            leave = self.waiting_readers.enter()
            try:
                close_follow = self.access.open_follow(principal)
            except BaseException:
                leave()
                raise

            def close_both() -> None:
                close_follow()
                leave()

            close = _once(close_both)
            metadata = response_metadata(
                next_offset=start,
                high_watermark=partition.high_watermark,
                log_start_offset=log.log_start_offset,
                log_end_offset=log.log_end_offset,
            )
            follows = self._counting_followers(self._follow(request, shape, partition, start, context), close)
            # A call cancelled before its first batch never runs the generator's finally: the
            # count is released when the generator is dropped instead.
            weakref.finalize(follows, close)
            return flight.GeneratorStream(shape.schema.with_metadata(metadata), follows)
        if request.max_wait > 0 and start >= partition.high_watermark:
            leave = self.waiting_readers.enter()
            try:
                partition.wait_for_data(start, request.max_wait)
            finally:
                leave()
        high_watermark = partition.high_watermark
        try:
            read = shape.read(
                log,
                start,
                max_records=request.max_records,
                max_bytes=request.max_bytes,
                upper_bound=high_watermark,
            )
        except LogOffsetOutOfRangeError as exc:
            raise OffsetOutOfRangeError(
                f"{request.stream}/{request.partition}: {exc}; valid offsets are "
                f"{exc.log_start_offset} to {high_watermark}",
                offset=start,
                log_start_offset=exc.log_start_offset,
            ) from None
        # Past the last row sent; with nothing sent, past any compaction gap up to the HW.
        next_offset = read.last_offset + 1 if read.last_offset is not None else max(start, high_watermark)
        metadata = response_metadata(
            next_offset=next_offset,
            high_watermark=high_watermark,
            log_start_offset=log.log_start_offset,
            log_end_offset=log.log_end_offset,
        )
        schema = shape.schema.with_metadata(metadata)
        return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(schema, read.batches))

    def _counting_followers(
        self, batches: Iterator[pa.RecordBatch], close: Callable[[], None]
    ) -> Iterator[pa.RecordBatch]:
        with self._counts_lock:
            self.follow_readers += 1
        try:
            yield from batches
        finally:
            close()
            with self._counts_lock:
                self.follow_readers -= 1

    @staticmethod
    def _follow(
        request: ReadRequest,
        shape: ReadShape,
        partition: ReadablePartition,
        offset: int,
        context: flight.ServerCallContext,
    ) -> Iterator[pa.RecordBatch]:
        """Yield committed batches from ``offset`` as they arrive, for ``request.follow`` seconds."""
        deadline = time.monotonic() + request.follow
        cancelled = _Cancelled(context)
        while not cancelled():
            high_watermark = partition.high_watermark
            if offset < high_watermark:
                try:
                    read = shape.read(
                        partition.log,
                        offset,
                        max_records=request.max_records,
                        max_bytes=request.max_bytes,
                        upper_bound=high_watermark,
                    )
                except (LogOffsetOutOfRangeError, LogClosedError) as exc:
                    # Retention overtook the reader, or the broker is stopping: end the
                    # stream; the client's next request gets the reason with its code.
                    logger.info("ending a follow read of %s/%d: %s", request.stream, request.partition, exc)
                    return
                except LogError as exc:
                    raise flight.FlightServerError(error_message(StorageError(str(exc)))) from None
                offset = read.last_offset + 1 if read.last_offset is not None else high_watermark
                yield from read.batches
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            # Wake at least twice a second to notice a cancelled call.
            if not partition.wait_for_data(offset, min(remaining, 0.5)) and partition.closed:
                return

    @staticmethod
    def _resolve_start(request: ReadRequest, partition: ReadablePartition) -> int:
        log = partition.log
        kind, value = request.start.kind, request.start.value
        if kind == "earliest":
            return log.log_start_offset
        if kind == "latest":
            return partition.high_watermark
        if kind == "timestamp":
            assert value is not None
            return min(log.offset_for_timestamp(value), partition.high_watermark)
        assert value is not None
        offset = int(value)
        if not log.log_start_offset <= offset <= log.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {request.stream}/{request.partition}: valid "
                f"offsets are {log.log_start_offset} to {log.log_end_offset}",
                offset=offset,
                log_start_offset=log.log_start_offset,
            )
        return offset

    # ---- writes: through NATS, or a producer's chunks put to the leader -------------------

    def do_put(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        """A producer's chunks to a partition it leads (see :mod:`pyspark_jetstream.protocol.put`);
        anything else is refused: streams are otherwise written through NATS."""
        call = _Call("do_put")

        def put() -> None:
            request = parse_put_command(_command(descriptor))
            if request is None:
                _not_over_flight("do_put")()
                return
            call.about("put", request.stream, request.partition)
            self.access.check(self._principal(context), "write", stream=request.stream)
            self.broker.open_put(request)
            leave = self.open_puts.enter()
            try:
                Put(self.broker, request, reader, writer).run()
            finally:
                leave()

        _guard(put, self._outcome(call), call)

    def do_exchange(
        self,
        context: flight.ServerCallContext,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.MetadataRecordBatchWriter,
    ) -> None:
        """Refused, as :meth:`do_put`'s other uses (replication has a connection of its own, see
        :mod:`pyspark_jetstream.protocol.replication_wire`)."""
        _guard(_not_over_flight("do_exchange"), self._outcome(_Call("do_exchange")), _Call("do_exchange"))

    def shutdown(self) -> None:
        """Stop serving: long-polling reads end at their next turn, then the server stops."""
        self._stopping.set()
        super().shutdown()

    # ---- metadata ----------------------------------------------------------------

    def list_flights(self, context: flight.ServerCallContext, criteria: bytes) -> Iterator[flight.FlightInfo]:
        """One flight per stream partition (of the streams the caller may read)."""
        principal = _guard(lambda: self._principal(context), about=_Call("list_flights"))
        streams = _guard(self.broker.list_streams, about=_Call("list_flights"))
        for info in streams:
            if not self.access.allows(principal, "read", stream=info.config["name"]):
                continue
            for p in info.partitions:
                yield self._flight_info(
                    info.config["name"], p.partition, p.high_watermark - p.log_start_offset
                )

    def get_flight_info(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        """The flight of ``[stream, partition]`` (partition defaults to 0)."""
        call = _Call("flight_info")

        def info() -> flight.FlightInfo:
            path = [p.decode() if isinstance(p, bytes) else p for p in descriptor.path or []]
            if not 1 <= len(path) <= 2 or (len(path) == 2 and not str(path[1]).isdigit()):
                raise InvalidArgumentError(
                    f"descriptor path must be [stream] or [stream, partition], got {path}"
                )
            number = int(path[1]) if len(path) == 2 else 0
            call.about("flight_info", str(path[0]), number)
            self.access.check(self._principal(context), "read", stream=str(path[0]))
            partition = self.broker.readable(path[0], number)
            return self._flight_info(
                path[0], number, partition.high_watermark - partition.log.log_start_offset
            )

        return _guard(info, about=call)

    def _flight_info(self, stream: str, partition: int, records: int) -> flight.FlightInfo:
        ticket = flight.Ticket(ReadRequest(stream, partition).to_ticket())
        return flight.FlightInfo(
            LOG_SCHEMA,
            flight.FlightDescriptor.for_path(stream, str(partition)),
            [flight.FlightEndpoint(ticket, [self.broker.flight_address])],
            records,
            -1,
        )

    # ---- actions -----------------------------------------------------------------

    def list_actions(self, context: flight.ServerCallContext) -> list[tuple[str, str]]:
        """The admin actions and what they take."""
        return [(action.value, text) for action, text in ACTION_DESCRIPTIONS.items()]

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Iterator[bytes]:
        """Run an admin action; its one result is JSON."""
        body = action.body.to_pybytes() if action.body is not None else b""
        kind = action.type if action.type in _ACTION_NAMES else "unknown"
        call = _Call(kind)
        result = _guard(lambda: self._action(action.type, body, call, context), self._counted(kind), call)
        yield encode_json(result)

    def _action(self, name: str, body: bytes, call: _Call, context: flight.ServerCallContext) -> object:
        principal = self._principal(context)
        try:
            kind = ActionType(name)
        except ValueError:
            known = ", ".join(a.value for a in ActionType)
            raise InvalidArgumentError(f"unknown action {name!r}; known actions: {known}") from None
        args = decode_json_object(body, f"body of {name}")
        inner = args.get("body") if kind is ActionType.CONTROLLER_CALL else args
        if isinstance(inner, dict):  # which stream and partition it is about, for a refusal's log line
            stream, partition = inner.get("stream", inner.get("name")), inner.get("partition")
            call.about(
                call.kind,
                stream if isinstance(stream, str) else None,
                partition if isinstance(partition, int) and not isinstance(partition, bool) else None,
            )
        return Actions(self.broker, self.access, self.max_streams).run(kind, principal, args)


class _Places:
    """A broker-wide bound on calls that each hold threads while they last: :meth:`enter` takes a
    place, or refuses with ``LimitExceededError`` (``refusal(taken, limit)`` says why)."""

    def __init__(self, limit: int, refusal: Callable[[int, int], str]) -> None:
        self.limit = limit
        self.taken = 0
        """Places held now."""
        self._refusal = refusal
        self._lock = threading.Lock()

    def enter(self) -> Callable[[], None]:
        """Take a place; returns what gives it back (call it once)."""
        with self._lock:
            if self.taken >= self.limit:
                raise LimitExceededError(self._refusal(self.taken, self.limit))
            self.taken += 1

        def leave() -> None:
            with self._lock:
                self.taken -= 1

        return leave


class _Cancelled:
    """Whether a call was cancelled, asked of gRPC at most every ``every`` seconds (each ask
    costs ~75 µs: too much once per batch of a busy follow read)."""

    every = 0.25

    def __init__(self, context: flight.ServerCallContext) -> None:
        self._context = context
        self._next = 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.every
        return bool(self._context.is_cancelled())


def _fetch_batch(frames: list[ReplicaFrame]) -> pa.RecordBatch:
    """Stored frames as one batch of the replication wire's ``FETCH_SCHEMA``."""
    return pa.record_batch(
        [
            pa.array([f.base_offset for f in frames], pa.int64()),
            pa.array([f.last_offset for f in frames], pa.int64()),
            pa.array([f.leader_epoch for f in frames], pa.int32()),
            large_binary_of([f.data for f in frames]),
        ],
        schema=FETCH_SCHEMA,
    )


def _command(descriptor: flight.FlightDescriptor) -> bytes:
    """A command descriptor's bytes; empty for a path descriptor (which names no call here)."""
    if descriptor.descriptor_type != flight.DescriptorType.CMD:
        return b""
    return descriptor.command or b""


def _not_over_flight(method: str) -> Callable[[], None]:
    def refuse() -> None:
        raise InvalidArgumentError(
            f"Flight {method} is not supported: streams are written through NATS. Publish with "
            "pyspark_jetstream's Client.publish or publish_batch (an Arrow batch), `jetstream "
            "publish`, a plain NATS publish to the stream's subject, or Spark's jetstream sink"
        )

    return refuse


def _once(call: Callable[[], None]) -> Callable[[], None]:
    """``call``, run at most once however often it is called."""
    done = threading.Lock()

    def run() -> None:
        if done.acquire(blocking=False):
            call()

    return run


_ACTION_NAMES = {a.value for a in ActionType}


class _Call:
    """What a Flight call is, as far as it is known yet: its kind, and the stream and partition."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.stream: str | None = None
        self.partition: int | None = None

    def about(self, kind: str, stream: str | None, partition: int | None) -> None:
        """The call turned out to be ``kind``, about ``stream`` and ``partition`` (where known)."""
        self.kind, self.stream, self.partition = kind, stream, partition

    def refused(self, exc: JetStreamError) -> None:
        """Log a refusal for the client's mistake: one line, INFO, no request body."""
        stream = self.stream if self.stream is not None else exc.fields.get("stream")
        partition = self.partition if self.partition is not None else exc.fields.get("partition")
        labels = Labels(
            stream if isinstance(stream, str) else None,
            partition if isinstance(partition, int) and not isinstance(partition, bool) else None,
        )
        message = str(exc)
        if len(message) > LOGGED_MESSAGE_CHARS:
            message = message[: LOGGED_MESSAGE_CHARS - 3] + "..."
        labels.bind(logger).info(
            "refused a %s call (%s): %s",
            self.kind,
            exc.code.value,
            message,
            extra={"action": self.kind, "code": exc.code.value},
        )


def _guard(
    call: Callable[[], T], outcome: Callable[[str], None] = lambda code: None, about: _Call | None = None
) -> T:
    """Run ``call``, turning every failure into a Flight error with an error code; ``outcome``
    is told the code (``ok`` on success); a refusal of ``about`` for a client error is logged."""
    try:
        result = call()
    except JetStreamError as exc:
        outcome(exc.code.value)
        if about is not None and exc.code in CLIENT_ERRORS:
            about.refused(exc)
        raise flight.FlightServerError(error_message(exc), extra_info=error_detail(exc)) from None
    except LogError as exc:
        outcome(StorageError.code.value)
        raise flight.FlightServerError(error_message(StorageError(str(exc)))) from None
    except Exception as exc:
        outcome(StorageError.code.value)
        logger.exception("unexpected error in a Flight call")
        raise flight.FlightServerError(error_message(StorageError(f"internal error: {exc}"))) from None
    outcome("ok")
    return result
