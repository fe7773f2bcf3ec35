"""An idempotent producer's chunks put straight to each partition's leader over Flight.

What the Spark sink writes into a stream's partitions goes this way (wire:
:mod:`pyspark_jetstream.protocol.put`): one Flight ``do_put`` per partition,
opened at the partition's leader on the first chunk, kept open for the
chunks after it.  A thread per put reads the acks, which come in the order
the chunks went, and settles each chunk's future: with its :class:`Ack`,
or with the error its refusal stands for.

A put that fails as a whole (the leader moved or went away, the call
broke) fails every chunk still waiting on it with the error, and is
dropped: the next chunk for the partition opens a new put at the leader
as the cluster now knows it (after a ``not_leader`` or an unreachable
broker, the client asks the cluster again).  Resending what failed is the
producer's business: its sequences make a resent chunk that was stored
a duplicate, not a second copy.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque

import pyarrow as pa
from pyarrow import flight

from pyspark_jetstream.protocol.ack import Ack, decode_ack
from pyspark_jetstream.protocol.envelope import AckPolicy
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    RequestTimeoutError,
    UnavailableError,
    error_from_code,
)
from pyspark_jetstream.protocol.put import PUT_SCHEMA, PutRequest, chunk_message

from .cluster import ClusterConnection
from .connection import BrokerConnection

logger = logging.getLogger(__name__)

CLOSE_TIMEOUTS = 3
"""Closing a put waits this many of the cluster's timeouts for the acks still owed."""
IDLE_SECONDS = 5.0
"""A partition's put with nothing waiting that was not used for this long is closed at the next chunk
for another partition: an open put holds two of its broker's threads, and holds up its shutdown."""
MOVED_PAUSE = (0.05, 1.0)
"""Seconds between asking the cluster for a partition's new leader: the first pause, the longest."""


class PartitionPut:
    """One open put to one partition's leader (see the module docstring)."""

    def __init__(
        self, connection: BrokerConnection, request: PutRequest, schema: pa.Schema, *, timeout: float = 30.0
    ) -> None:
        """``timeout``: how long :meth:`close` waits for the acks still owed."""
        self.connection = connection
        self.request = request
        self.schema = schema
        self.timeout = timeout
        self.last_used = time.monotonic()
        descriptor = flight.FlightDescriptor.for_command(request.to_command())
        self._writer, self._reader = connection.open_put(descriptor, PUT_SCHEMA)
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        """Held by a write and by closing the call (from the ack reader, too)."""
        self._closed = False
        self._waiting: deque[tuple[int, concurrent.futures.Future[Ack]]] = deque()
        self._failure: JetStreamError | None = None
        self._acks = threading.Thread(
            target=self._read_acks, name=f"put-{request.stream}-{request.partition}", daemon=True
        )
        self._acks.start()

    @property
    def failure(self) -> JetStreamError | None:
        """Why the put failed as a whole (a new one is needed for more chunks), if it did."""
        return self._failure

    def send(self, sequence: int, batch: pa.RecordBatch) -> concurrent.futures.Future[Ack]:
        """Write one chunk; the future is settled by its ack."""
        future: concurrent.futures.Future[Ack] = concurrent.futures.Future()
        self.last_used = time.monotonic()
        with self._lock:
            if self._failure is not None:
                future.set_exception(self._failure)
                return future
            self._waiting.append((sequence, future))
        try:
            with self._writing:
                if self._closed:
                    raise flight.FlightError("the put's call has ended")
                self._writer.write_metadata(pa.py_buffer(chunk_message(sequence, batch)))
        except flight.FlightError as exc:
            self._fail(self.connection.error(exc))
        except pa.ArrowException as exc:  # a batch that cannot be written: nothing was sent
            self._fail(InvalidArgumentError(f"cannot put a chunk to {self._name}: {exc}"))
        return future

    @property
    def idle(self) -> bool:
        """Whether no chunk waits for its ack."""
        with self._lock:
            return not self._waiting

    def close(self) -> None:
        """Say no more chunks come, wait (up to :attr:`timeout`) for the acks of those sent, and end
        the call; what is not acked by then fails with ``RequestTimeoutError``."""
        with self._writing:
            if not self._closed:
                try:
                    self._writer.done_writing()
                except flight.FlightError as exc:
                    self._fail(self.connection.error(exc))
        self._acks.join(self.timeout)
        if self._acks.is_alive():  # the broker stopped answering: its thread is left to the call
            waited = f"the put to {self._name} was not answered within {self.timeout:g}s"
            self._fail(RequestTimeoutError(waited))
            return
        error = self._end()
        if error is not None:  # every chunk is settled already
            logger.debug("put to %s ended with %s", self._name, error)
        self._fail(UnavailableError(f"the put to {self._name} is closed"))

    def _end(self) -> JetStreamError | None:
        """End the call (once); the error it ended with, if any."""
        with self._writing:
            if self._closed:
                return None
            self._closed = True
            try:
                self._writer.close()
            except flight.FlightError as exc:
                return self.connection.error(exc)
            return None

    @property
    def _name(self) -> str:
        return f"{self.request.stream}/{self.request.partition} at {self.connection.address}"

    def _read_acks(self) -> None:
        while True:
            try:
                buffer = self._reader.read()
            except flight.FlightError as exc:
                self._fail(self.connection.error(exc))
                return
            if buffer is None:  # the broker ended the call: its status says why
                error = self._end()
                with self._lock:
                    unanswered = bool(self._waiting)
                if error is None and unanswered:
                    error = UnavailableError(f"the put to {self._name} ended before answering every chunk")
                if error is not None:
                    self._fail(error)
                return
            try:
                ack = decode_ack(buffer.to_pybytes())
            except JetStreamError as exc:
                self._fail(exc)
                return
            with self._lock:
                if not self._waiting:
                    unexpected = True
                else:
                    unexpected = False
                    sequence, future = self._waiting.popleft()
            if unexpected:
                self._fail(UnavailableError(f"the put to {self._name} answered a chunk never sent"))
                return
            if ack.ok:
                if ack.correlation_id != str(sequence):
                    self._fail(UnavailableError(f"the put to {self._name} answered out of order"))
                    future.set_exception(
                        UnavailableError(f"chunk {sequence}: the put's answers were out of order")
                    )
                    return
                future.set_result(ack)
            else:
                error = error_from_code(ack.error.value, f"{ack.stream}/{ack.partition}: {ack.message}")
                future.set_exception(error)
                if error.invalid_metadata or isinstance(error, UnavailableError):
                    self._fail(error)  # the leader moved: the chunks after it go to the new one
                    return

    def abandon(self, error: JetStreamError) -> None:
        """Give up on this put: every chunk still waiting fails with ``error``."""
        self._fail(error)

    def _fail(self, error: JetStreamError) -> None:
        """The put is over: every chunk still waiting fails with ``error``."""
        with self._lock:
            if self._failure is None:
                self._failure = error
            waiting, self._waiting = list(self._waiting), deque()
        for _, future in waiting:
            if not future.done():
                future.set_exception(error)


class Putter:
    """One idempotent producer's puts, one per partition, each to that partition's leader."""

    def __init__(
        self,
        cluster: ClusterConnection,
        producer_id: str,
        producer_epoch: int = 0,
        ack_policy: AckPolicy = AckPolicy.LEADER,
    ) -> None:
        self.cluster = cluster
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.ack_policy = ack_policy
        self._puts: dict[tuple[str, int], PartitionPut] = {}
        self._moved: dict[tuple[str, int], str] = {}
        """Partitions whose put failed because the leader moved or went away, and that leader's
        address: the next put waits (up to the cluster's timeout) for the cluster to name another."""

    def send(
        self, stream: str, partition: int, sequence: int, batch: pa.RecordBatch
    ) -> concurrent.futures.Future[Ack]:
        """Put one chunk of the producer's into ``stream``/``partition`` with ``sequence``."""
        key = (stream, partition)
        put = self._puts.get(key)
        if put is not None and (put.failure is not None or put.schema != batch.schema):
            self._retire(key, put)
            put = None
        if put is None:
            try:
                put = self._puts[key] = self._open(stream, partition, batch.schema)
            except JetStreamError as exc:
                failed: concurrent.futures.Future[Ack] = concurrent.futures.Future()
                failed.set_exception(exc)
                return failed
        sent = put.send(sequence, batch)
        self._close_idle(sent_to=key)
        return sent

    def _close_idle(self, sent_to: tuple[str, int]) -> None:
        """Close the other partitions' puts that were idle for :data:`IDLE_SECONDS`."""
        now = time.monotonic()
        for key, put in list(self._puts.items()):
            if key != sent_to and now - put.last_used > IDLE_SECONDS and put.idle:
                del self._puts[key]
                put.close()

    def abandon(self, stream: str, partition: int, error: JetStreamError) -> None:
        """Fail the partition's put with ``error`` (its broker stopped answering, say): the chunks
        still waiting on it fail, and the next one opens a new put."""
        put = self._puts.get((stream, partition))
        if put is not None:
            put.abandon(error)

    def close(self, *, error: JetStreamError | None = None) -> None:
        """End every put, once its chunks are answered; with ``error`` (the producer gave up),
        fail the chunks still waiting with it instead, and end the puts without waiting."""
        puts, self._puts = list(self._puts.values()), {}
        for put in puts:
            if error is None:
                put.close()
            else:
                put.abandon(error)
                threading.Thread(target=put.close, name="put-close", daemon=True).start()

    def _open(self, stream: str, partition: int, schema: pa.Schema) -> PartitionPut:
        request = PutRequest(stream, partition, self.producer_id, self.producer_epoch, self.ack_policy)
        address = self._leader(stream, partition)
        try:
            connection = self.cluster.connection(address)
            return PartitionPut(connection, request, schema, timeout=CLOSE_TIMEOUTS * self.cluster.timeout)
        except JetStreamError as exc:
            self._failed((stream, partition), address, exc)
            raise

    def _failed(self, key: tuple[str, int], address: str, failure: JetStreamError) -> None:
        """A put at ``address`` failed: if because the leader moved or went away, learn where it is."""
        if failure.invalid_metadata or isinstance(failure, UnavailableError):
            self._moved[key] = address
            self.cluster.forget_leader(*key, failure)

    def _leader(self, stream: str, partition: int) -> str:
        """The partition leader's address; after the leader moved or went away, the one the
        cluster names next, waiting up to the cluster's timeout for a new one (a controller
        elects it once the old leader's session ends) before trying the old one again."""
        key = (stream, partition)
        address = self.cluster.leader_address(stream, partition)
        gone = self._moved.pop(key, None)
        if gone is None or address != gone:
            return address
        deadline = time.monotonic() + self.cluster.timeout
        pause = MOVED_PAUSE[0]
        while address == gone and time.monotonic() + pause < deadline:
            time.sleep(pause)
            pause = min(pause * 2, MOVED_PAUSE[1])
            try:
                self.cluster.refresh()
            except JetStreamError as exc:  # no broker answers now: ask again after the pause
                logger.debug("cannot learn the leader of %s/%d yet: %s", stream, partition, exc)
            address = self.cluster.leader_address(stream, partition)
        return address

    def _retire(self, key: tuple[str, int], put: PartitionPut) -> None:
        """Drop ``put``; after a failure that says the leader moved, ask the cluster where it is."""
        del self._puts[key]
        failure = put.failure
        if failure is None:
            put.close()
        else:  # its call may still be waiting on a broker that is gone: not waited for
            threading.Thread(target=put.close, name="put-close", daemon=True).start()
        if failure is not None:
            self._failed(key, put.connection.address, failure)
