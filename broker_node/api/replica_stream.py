"""A leader's side of one replication stream, pipelined (wire: protocol.replication).

The call's own thread sends: what follows the last offset *sent* as soon as it
is appended (or a heartbeat after ``max_wait``), without waiting for the
follower's acknowledgement of the message before, up to :data:`IN_FLIGHT`
messages ahead.  A second thread reads the acknowledgements and records each
as a fetch, which is what moves the high watermark.  So a commit waits for
one trip to the follower and back, never for the turn before it to finish.

The follower answers every message, so the reader ends by itself after the
acknowledgement of the last message sent (a heartbeat is sent when the
sender stops with none owed, to draw one), or when the follower closes its
side; the call returns only after both
threads are done, because the call's reader and writer die with it.  When the
follower goes or an acknowledgement is refused (a stale leader epoch, an
offset out of range), the reader wakes the sender from its wait for appends,
and the call ends at once, with the refusal as its error.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Protocol

import pyarrow as pa
from pyarrow import flight

from broker_node.log import ReplicaFrame
from pyspark_jetstream.protocol.array_builders import large_binary_of
from pyspark_jetstream.protocol.errors import JetStreamError
from pyspark_jetstream.protocol.replication import (
    STREAM_SCHEMA,
    LeaderOffsets,
    ReplicaFetch,
    packed_stream_message,
    parse_stream_ack,
    stream_message_metadata,
)

logger = logging.getLogger(__name__)

IN_FLIGHT = 4
"""Messages the leader sends ahead of the follower's acknowledgements on one stream.  One is the
turn-by-turn stream; more lets a batch appended while an acknowledgement travels go at once."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaFetchAnswer:
    """A leader's answer to a follower's fetch or on its stream: the stored frames from the fetch
    offset on, and where the leader's log stands (sent beside them, see
    :mod:`pyspark_jetstream.protocol.replication`)."""

    frames: list[ReplicaFrame]
    offsets: LeaderOffsets


class ReplicaLeader(Protocol):
    """What a stream needs of the broker: the three steps of a follower's fetch, each checked as
    a fetch is (the leader epoch, the offset range)."""

    def replica_fetch(self, request: ReplicaFetch) -> ReplicaFetchAnswer:
        """Acknowledge ``request.fetch_offset`` and answer what follows it (the first turn)."""

    def replica_read(
        self, request: ReplicaFetch, *, unless: Callable[[], bool] | None = None
    ) -> ReplicaFetchAnswer:
        """What follows ``request.fetch_offset``, waiting up to ``max_wait`` for it or until
        ``unless()`` is true when checked; records nothing."""

    def replica_wake(self, request: ReplicaFetch) -> None:
        """Have waiting reads of the partition check their ``unless`` now."""

    def replica_acknowledge(self, request: ReplicaFetch) -> None:
        """Record that the follower holds everything before ``request.fetch_offset``."""


@dataclasses.dataclass(eq=False)
class ReplicaStream:
    """One follower's stream, served by :meth:`run` on the call's thread (module docstring)."""

    leader: ReplicaLeader
    request: ReplicaFetch
    reader: flight.MetadataRecordBatchReader
    writer: flight.MetadataRecordBatchWriter
    stopping: threading.Event
    packed: bool = False
    """Send each message packed in its ``app_metadata`` (the follower asked for it), else as a
    record batch of :data:`STREAM_SCHEMA` with JSON metadata (see
    :mod:`pyspark_jetstream.protocol.replication`)."""
    in_flight: int = IN_FLIGHT
    _changed: threading.Condition = dataclasses.field(default_factory=threading.Condition)
    _owed: int = 0
    """Messages sent and not acknowledged yet."""
    _sending: bool = True
    _ended: bool = False
    """The follower closed its side or the call failed: nothing more is sent."""
    _refusal: JetStreamError | None = None

    def run(self) -> None:
        """Serve the stream until the server stops, the follower ends it, or a check fails."""
        if not self.packed:
            self.writer.begin(STREAM_SCHEMA)
        answer = self.leader.replica_fetch(self.request)
        acknowledgements = threading.Thread(
            target=self._read_acknowledgements,
            name=f"replica-acks-{self.request.replica}-{self.request.stream}-{self.request.partition}",
            daemon=True,
        )
        acknowledgements.start()
        try:
            sent = self.request.fetch_offset
            while True:
                if not self._send(answer):
                    return
                if answer.frames:
                    sent = answer.frames[-1].last_offset + 1
                if not self._room():
                    return
                answer = self.leader.replica_read(
                    dataclasses.replace(self.request, fetch_offset=sent), unless=self._over
                )
        finally:
            with self._changed:
                self._sending = False
                # The reader waits in a read for an acknowledgement only while one is owed; if
                # none is, one more message draws the acknowledgement that lets it end.
                draw = self._owed == 0 and not self._ended and self._refusal is None
            if draw:
                self._send(ReplicaFetchAnswer([], answer.offsets), last=True)
            acknowledgements.join()
            if self._refusal is not None:
                raise self._refusal

    def _send(self, answer: ReplicaFetchAnswer, *, last: bool = False) -> bool:
        """Send ``answer`` (with ``last``, even though the stream is over); whether it goes on."""
        with self._changed:
            if self._over() and not last:
                return False
            self._owed += 1
        try:
            frames = [f.data for f in answer.frames]
            if self.packed:
                self.writer.write_metadata(pa.py_buffer(packed_stream_message(answer.offsets, frames)))
            else:
                self.writer.write_with_metadata(
                    pa.record_batch([large_binary_of(frames)], schema=STREAM_SCHEMA),
                    pa.py_buffer(stream_message_metadata(answer.offsets)),
                )
        except flight.FlightError as exc:  # the follower went away (stopped, crashed, timed out)
            logger.debug("replication stream of %s ended: %s", self.request.replica, exc)
            with self._changed:
                self._owed -= 1
                self._ended = True
                self._changed.notify_all()
            return False
        except BaseException:
            # Not sent: no acknowledgement is owed for it (the reader would wait for it forever).
            with self._changed:
                self._owed -= 1
            raise
        return True

    def _room(self) -> bool:
        """Wait until fewer than the limit are in flight; whether the stream goes on."""
        with self._changed:
            self._changed.wait_for(lambda: self._owed < self.in_flight or self._over())
            return not self._over()

    def _read_acknowledgements(self) -> None:
        request = self.request
        while True:
            try:
                chunk = self.reader.read_chunk()
                offset = parse_stream_ack(chunk.app_metadata)
                self.leader.replica_acknowledge(dataclasses.replace(request, fetch_offset=offset))
            except StopIteration:  # the follower ended this stream; it opens another
                self._end()
                return
            except flight.FlightError as exc:  # the follower went away
                logger.debug("replication stream of %s ended: %s", request.replica, exc)
                self._end()
                return
            except JetStreamError as exc:
                with self._changed:
                    self._refusal = exc
                self._wake_sender()
                return
            with self._changed:
                self._owed -= 1
                self._changed.notify_all()
                if not self._sending and self._owed == 0:
                    return  # the sender stopped and every message it sent is acknowledged

    def _end(self) -> None:
        with self._changed:
            self._ended = True
        self._wake_sender()

    def _over(self) -> bool:
        """Whether the sender should stop: the follower is gone, an acknowledgement was refused,
        or the server is stopping."""
        return self._ended or self._refusal is not None or self.stopping.is_set()

    def _wake_sender(self) -> None:
        with self._changed:
            self._changed.notify_all()
        self.leader.replica_wake(self.request)
