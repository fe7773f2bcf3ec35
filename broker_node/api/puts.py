"""A partition leader's side of one put: a producer's chunks over Flight (wire: protocol.put).

The call's own thread reads the chunks and hands each to the broker as soon
as it arrives, without waiting for the one before to be stored (the broker
appends them in the order they came); a second thread writes their acks
back, in the same order, as each is ready.  About :data:`IN_FLIGHT` chunks
(that many queued, one being answered, one being read) wait for their acks:
beyond that the reading stops, and gRPC's flow control holds the producer
back.  A chunk that is malformed (its metadata, its columns) or would decode
past the partition's batch limit (sized from its IPC headers before anything
is decompressed) is answered with a refusal naming what is wrong, and the put
goes on; a put whose own schema is not the empty one of wire version 2 is
refused before any chunk is read; a producer that goes away ends the call,
and the chunks already handed over are still stored (its retry is then acked
as a duplicate).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from typing import Protocol

import pyarrow as pa
from pyarrow import flight

from pyspark_jetstream.protocol.ack import Ack, encode_ack
from pyspark_jetstream.protocol.errors import ErrorCode, InvalidArgumentError, JetStreamError
from pyspark_jetstream.protocol.put import PUT_SCHEMA, PutRequest, check_chunk, decode_chunk, split_chunk

logger = logging.getLogger(__name__)

IN_FLIGHT = 16
"""Chunks of one put handed to the broker and not acked yet."""
ACK_TIMEOUT = 120.0
"""Seconds a chunk's ack may take (its commit, for ``ALL``) before it is answered with a timeout."""


class PutTarget(Protocol):
    """What a put needs of the broker."""

    def open_put(self, request: PutRequest) -> None:
        """Raise (``NotLeaderError``, ...) unless ``request``'s partition takes chunks here."""

    def chunk_limit(self, request: PutRequest) -> int:
        """The most bytes one of ``request``'s chunks may decode to (the partition's batch limit)."""

    def put_chunk(
        self, request: PutRequest, sequence: int, batch: pa.RecordBatch
    ) -> concurrent.futures.Future[Ack]:
        """Store one chunk; its ack (or refusal) when done."""


class Put:
    """One producer's put, served by :meth:`run` on the call's thread (module docstring)."""

    def __init__(
        self,
        target: PutTarget,
        request: PutRequest,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        self.target = target
        self.request = request
        self.reader = reader
        self.writer = writer
        self._acks: queue.Queue[concurrent.futures.Future[Ack] | None] = queue.Queue(IN_FLIGHT)
        self._gone = False
        """The producer went away: acks are no longer written."""

    def run(self) -> None:
        """Take chunks until the producer closes its side; return once every one is answered."""
        request = self.request
        if not self.reader.schema.equals(PUT_SCHEMA):
            # A record batch of the put's own is decoded (decompressed) by Flight before anything
            # here sees it: only chunks in app_metadata can be sized first.
            raise InvalidArgumentError(
                "a put's schema must be empty, its chunks in app_metadata (put wire version 2, "
                f"see pyspark_jetstream/protocol/put.py); got columns {self.reader.schema.names}: "
                "upgrade the producer"
            )
        limit = self.target.chunk_limit(request)
        writing = threading.Thread(
            target=self._write_acks, name=f"put-acks-{request.stream}-{request.partition}", daemon=True
        )
        writing.start()
        try:
            while True:
                try:
                    chunk = self.reader.read_chunk()
                except StopIteration:
                    return
                except flight.FlightError as exc:  # the producer went away
                    logger.debug("a put to %s/%d ended: %s", request.stream, request.partition, exc)
                    return
                self._acks.put(self._store(chunk.data, chunk.app_metadata, limit))
        finally:
            self._acks.put(None)
            writing.join()

    def _store(
        self, data: pa.RecordBatch | None, metadata: pa.Buffer | None, limit: int
    ) -> concurrent.futures.Future[Ack]:
        """Hand one chunk to the broker once its size (at most ``limit`` decoded) and its columns
        are checked; a malformed or oversized one is refused at once."""
        sequence = -1
        try:
            if data is not None:  # a record batch of the empty schema: it holds nothing
                raise InvalidArgumentError(
                    "a put chunk travels in app_metadata (put wire version 2), not as a record batch"
                )
            sequence, stream = split_chunk(metadata)
            request = self.request
            batch = decode_chunk(stream, limit, f"{request.stream}/{request.partition}")
            check_chunk(batch)
            return self.target.put_chunk(self.request, sequence, batch)
        except JetStreamError as exc:
            refused: concurrent.futures.Future[Ack] = concurrent.futures.Future()
            refused.set_result(self._refusal(sequence, exc.code, str(exc)))
            return refused

    def _write_acks(self) -> None:
        while (future := self._acks.get()) is not None:
            try:
                ack = future.result(ACK_TIMEOUT)
            except concurrent.futures.TimeoutError:
                ack = self._refusal(-1, ErrorCode.TIMEOUT, f"a chunk was not stored within {ACK_TIMEOUT:g}s")
            except concurrent.futures.CancelledError:  # the broker's loop stopped
                ack = self._refusal(-1, ErrorCode.UNAVAILABLE, "the broker is stopping")
            except Exception as exc:  # a failure of the broker's own: not retried
                logger.exception("a put chunk failed")
                ack = self._refusal(-1, ErrorCode.STORAGE, f"the chunk could not be stored: {exc}")
            if self._gone:
                continue  # still drained: the reader never waits on a full queue
            try:
                self.writer.write(pa.py_buffer(encode_ack(ack)))
            except (flight.FlightError, pa.ArrowException) as exc:  # the producer went away
                logger.debug("cannot answer a put: %s", exc)
                self._gone = True

    def _refusal(self, sequence: int, error: ErrorCode, message: str) -> Ack:
        request = self.request
        return Ack(request.stream, request.partition, -1, -1, str(sequence), error, message)
