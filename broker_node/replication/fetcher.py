"""A follower's fetcher: one thread per followed partition, pulling the leader's log over Flight.

It first truncates the follower's log where it may differ from the leader's
(:mod:`.truncation`: the leader says where the follower's latest epoch ends),
then keeps a replication stream open to the leader (a Flight ``do_exchange``,
see :mod:`pyspark_jetstream.protocol.replication`; its messages packed, or as
record batches from a leader that does not pack them): the leader pushes what it
appends, the fetcher appends it byte for byte, takes the leader's high
watermark and acknowledges its new log end offset on the same stream, which
is what lets the leader commit.  One stream lasts ``STREAM_SECONDS`` and the
next starts from the log end offset, so a stream never outlives a change of
role for long.  A leader that does not offer the stream is fetched from
instead, one Flight ``do_get`` per round trip.  A fetch offset below the leader's log
start (retention moved on) starts the follower over there; one past the
leader's log end means the logs diverged again, and truncation runs again.

Damaged batches of the follower's own log (:attr:`Log.damaged`) are fetched
again from the leader and repaired in place.

Errors never end the thread: a leader that cannot be reached is retried
with a growing backoff; one that answers it is not ready (it has not taken up
the epoch yet, or its metadata lags) is asked again after a short fixed
pause (:data:`NOT_READY_PAUSE`); the replica manager stops the fetcher when
leadership moves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable

import pyarrow as pa
from pyarrow import flight

from broker_node.log import DamagedRange, EpochEndOffset, InvalidRecordsError, LogError
from broker_node.log.logging_labels import Labels
from broker_node.log.typed_frames import frames_in_range
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    NotLeaderError,
    OffsetOutOfRangeError,
    UnavailableError,
)
from pyspark_jetstream.protocol.flight import ActionType, encode_json, error_from_message
from pyspark_jetstream.protocol.replication import (
    ReplicaFetch,
    parse_fetch_metadata,
    parse_packed_stream_message,
    parse_stream_message_metadata,
    stream_ack,
)

from .partition import Partition
from .throttle import Throttle
from .truncation import truncation_offset

logger = logging.getLogger(__name__)

BACKOFF = (0.05, 2.0)
"""First and longest pause (seconds) between failed attempts."""
NOT_READY_PAUSE = 0.1
"""Pause (seconds, never longer) after a broker answered about the partition that it is not ready
for us yet: it is taking up leadership, or its metadata lags behind ours.  Such an answer is
quick and the wait is short, so the follower asks again at this pace instead of backing off to
:data:`BACKOFF`'s longest pause, which once held a follower out of the ISR for 2.8 s after a
leader change."""
REPAIR_EVERY = 5.0
"""Seconds between attempts to repair damaged batches from the leader."""
STREAM_SECONDS = REPAIR_EVERY
"""How long one replication stream lasts before the follower opens the next."""


class Fetcher:
    """Keeps one follower partition in step with its leader (see the module docstring)."""

    def __init__(
        self,
        partition: Partition,
        leader: str,
        leader_epoch: int,
        address_of: Callable[[str], str | None],
        *,
        max_bytes: int = 8 * 1024 * 1024,
        max_wait: float = 0.5,
        connect: Callable[[str], flight.FlightClient] = flight.connect,
        throttle: Throttle | None = None,
    ) -> None:
        """``address_of(broker_id)`` gives a live broker's Flight address (``None`` if unknown);
        ``connect`` opens a Flight client to it (with the broker's TLS and credentials);
        ``throttle`` holds back fetches of a partition being moved here (its state's ``throttle``)."""
        self._connect_to = connect
        self._throttle = throttle
        self.partition = partition
        self.leader = leader
        self.leader_epoch = leader_epoch
        self._address_of = address_of
        self._max_bytes = max_bytes
        self._max_wait = max_wait
        self._stopped = threading.Event()
        self._client: flight.FlightClient | None = None
        self._address: str | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"fetch-{partition.stream}-{partition.number}", daemon=True
        )
        self.fetches = 0
        """Batches of frames (or heartbeats) received from the leader."""
        self.streaming = True
        """Whether the leader offers the replication stream (else: one fetch per round trip)."""
        self.packed = True
        """Whether the leader offers packed stream messages (else: record batches, as a leader of
        an earlier version sends them)."""
        self.last_error: str | None = None
        self._fields = Labels(partition.stream, partition.number).fields
        """``extra`` of its log lines: stream and partition as fields."""

    def start(self) -> None:
        """Begin fetching on its own thread."""
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Stop after the fetch under way (at most ``max_wait`` plus a round trip); with ``wait``,
        return once stopped.  The thread closes its connection as it ends."""
        self._stopped.set()
        if wait and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(self._max_wait + 10)

    # ---- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._disconnect()

    def _loop(self) -> None:
        backoff = BACKOFF[0]
        truncated = False
        next_repair = 0.0
        while not self._stopped.is_set():
            try:
                if not truncated:
                    self._truncate()
                    truncated = True
                self._fetch()
                if time.monotonic() >= next_repair:
                    next_repair = time.monotonic() + REPAIR_EVERY
                    if self.partition.log.damaged:
                        self._repair()
                backoff = BACKOFF[0]
                self.last_error = None
                continue
            except OffsetOutOfRangeError as exc:
                truncated = self._out_of_range(exc)
            except InvalidRecordsError as exc:
                logger.warning(
                    "%s: the leader's batches do not follow ours (%s); truncating again",
                    self,
                    exc,
                    extra=self._fields,
                )
                truncated = False
            except (JetStreamError, LogError, flight.FlightError, OSError) as exc:
                self._note(exc)
                if _not_ready(exc):
                    if self._stopped.wait(NOT_READY_PAUSE):
                        return
                    backoff = BACKOFF[0]
                    continue
            except Exception:
                logger.exception("%s: unexpected failure", self, extra=self._fields)
            if self._stopped.wait(backoff):
                return
            backoff = min(backoff * 2, BACKOFF[1])

    def _note(self, exc: BaseException) -> None:
        text = str(exc) or type(exc).__name__
        if text != self.last_error:
            logger.info("%s: %s; retrying", self, text, extra=self._fields)
        self.last_error = text
        if isinstance(exc, UnavailableError | flight.FlightUnavailableError):
            self._disconnect()

    def _truncate(self) -> None:
        log = self.partition.log
        latest = log.leader_epoch if log.leader_epochs else None

        def leader_end_for(epoch: int) -> EpochEndOffset:
            answer = self._action(
                ActionType.OFFSETS_FOR_LEADER_EPOCH,
                {"stream": self.partition.stream, "partition": self.partition.number, "epoch": epoch},
            )
            return EpochEndOffset(answer["epoch"], answer["end_offset"])

        cut = truncation_offset(latest, log.log_start_offset, leader_end_for, log.end_offset_for_epoch)
        self.partition.truncate_to(cut, self.leader_epoch)

    def _fetch(self) -> None:
        if self.streaming:
            self._stream()
        else:
            self._fetch_once()

    def _request(self, fetch_offset: int, max_wait: float) -> ReplicaFetch:
        partition = self.partition
        return ReplicaFetch(
            partition.stream,
            partition.number,
            partition.broker_id,
            fetch_offset,
            self.leader_epoch,
            Throttle.chunk(self._rate(), self._max_bytes),
            max_wait,
        )

    def _rate(self) -> int:
        """Bytes/s this partition may fetch: its reassignment's throttle while it is being added
        here and is not in sync yet (once in sync, acks wait for its fetches: no throttle)."""
        state = self.partition.state
        me = self.partition.broker_id
        if self._throttle is None or me not in state.adding or me in state.isr:
            return 0
        return state.throttle

    def _held_back(self, frames: list[pa.Buffer]) -> None:
        """Wait as the broker's replication throttle says after receiving ``frames``."""
        rate = self._rate()
        if self._throttle is not None and frames and rate > 0:
            self._throttle.add(sum(f.size for f in frames), rate)
            self._throttle.wait(self._rate, self._stopped)

    def _fetch_once(self) -> None:
        table = self._do_get(self._request(self.partition.log.log_end_offset, self._max_wait))
        offsets = parse_fetch_metadata(table.schema.metadata)
        frames = stored_frames(table)
        self.partition.append_replicated(frames, offsets.high_watermark, self.leader_epoch)
        self.fetches += 1
        self._held_back(frames)

    def _stream(self) -> None:
        """One replication stream, for ``STREAM_SECONDS`` or until stopped (see the module docstring)."""
        partition = self.partition
        request = self._request(partition.log.log_end_offset, self._max_wait)
        client = self._connect()
        # The deadline also ends the leader's side of a stream whose follower froze.
        options = flight.FlightCallOptions(timeout=STREAM_SECONDS + self._max_wait + 10)
        descriptor = flight.FlightDescriptor.for_command(request.to_ticket(packed=self.packed))
        packed = self.packed
        ends = time.monotonic() + STREAM_SECONDS
        try:
            writer, reader = client.do_exchange(descriptor, options)
        except flight.FlightError as exc:
            raise _error(exc, self._address) from None
        try:
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    return  # the leader ended the stream (it is stopping): open the next one
                if packed:
                    offsets, frames = parse_packed_stream_message(chunk.app_metadata)
                else:
                    offsets = parse_stream_message_metadata(chunk.app_metadata)
                    frames = [f.as_buffer() for f in chunk.data.column("frame")] if chunk.data else []
                partition.append_replicated(frames, offsets.high_watermark, self.leader_epoch)
                self.fetches += 1
                self._held_back(frames)
                self.last_error = None  # the stream works: an earlier failure is over (health shows it)
                if self._stopped.is_set() or time.monotonic() >= ends:
                    # Half-closed, then cancelled: the leader's side may be waiting for its next
                    # append (up to max_wait), which closing alone would wait out.
                    writer.done_writing()
                    reader.cancel()
                    return
                writer.write_metadata(pa.py_buffer(stream_ack(partition.log.log_end_offset)))
        except flight.FlightError as exc:
            error = _error(exc, self._address)
            if isinstance(error, InvalidArgumentError) and "do_exchange is not supported" in str(error):
                if packed:
                    logger.info("%s: the leader offers no packed stream; streaming record batches", self)
                    self.packed = False
                    return
                logger.info("%s: the leader offers no replication stream; fetching instead", self)
                self.streaming = False
                return
            raise error from None
        finally:
            with contextlib.suppress(flight.FlightError, OSError):
                writer.close()

    def _out_of_range(self, exc: OffsetOutOfRangeError) -> bool:
        """Return whether the log is still truncated correctly after handling ``exc``."""
        log = self.partition.log
        start = exc.fields.get("log_start_offset")
        end = exc.fields.get("log_end_offset")
        if isinstance(start, int) and log.log_end_offset < start:
            self.partition.reset_to(start, self.leader_epoch)
            return True
        if isinstance(end, int) and log.log_end_offset > end:
            return False  # we are ahead of the leader: truncate by epoch again
        self._note(exc)
        return True

    def _repair(self) -> None:
        """Repair the damaged ranges of the log from the leader's copies, one segment at a time:
        the log rewrites a segment whole, so every damaged range of a segment goes in one call."""
        log = self.partition.log
        by_segment: dict[str, list[DamagedRange]] = {}
        for damaged in log.damaged:
            by_segment.setdefault(damaged.path, []).append(damaged)
        for ranges in by_segment.values():
            try:
                copies: list[pa.Buffer] = []
                for damaged in ranges:
                    first, last = damaged.first_offset, damaged.last_offset
                    # The leader's frames as stored (a typed batch's typed columns with them).
                    frames = stored_frames(self._do_get(self._request(first, 0.0)))
                    found = frames_in_range(frames, first, last, log.config.compression)
                    if not found:
                        break  # the leader cannot give this range now: the segment waits
                    copies.extend(found)
                else:
                    for fixed in log.repair(copies):
                        logger.warning(
                            "%s: repaired offsets %d to %d from the leader",
                            self,
                            fixed.first_offset,
                            fixed.last_offset,
                            extra=self._fields,
                        )
            except (JetStreamError, LogError, flight.FlightError) as exc:
                what = ", ".join(f"{r.first_offset} to {r.last_offset}" for r in ranges)
                logger.warning("%s: cannot repair offsets %s yet: %s", self, what, exc, extra=self._fields)

    # ---- Flight ----------------------------------------------------------------------------

    def _connect(self) -> flight.FlightClient:
        address = self._address_of(self.leader)
        if address is None:
            raise UnavailableError(f"leader {self.leader} is not registered (not running?)")
        if self._client is None or address != self._address:
            self._disconnect()
            self._client = self._connect_to(address)
            self._address = address
        return self._client

    def _disconnect(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = None
        self._address = None

    def _do_get(self, request: ReplicaFetch) -> pa.Table:
        client = self._connect()
        options = flight.FlightCallOptions(timeout=request.max_wait + 10)
        try:
            return client.do_get(flight.Ticket(request.to_ticket()), options).read_all()
        except flight.FlightError as exc:
            raise _error(exc, self._address) from None

    def _action(self, action: ActionType, body: dict[str, object]) -> dict[str, int]:
        client = self._connect()
        options = flight.FlightCallOptions(timeout=10)
        try:
            results = list(client.do_action(flight.Action(action.value, encode_json(body)), options))
        except flight.FlightError as exc:
            raise _error(exc, self._address) from None
        answer: dict[str, int] = json.loads(results[0].body.to_pybytes())
        return answer

    def __str__(self) -> str:
        return f"{self.partition.stream}/{self.partition.number} following {self.leader}"


def stored_frames(table: pa.Table) -> list[pa.Buffer]:
    """The frames of a replica fetch's answer, as the replica stores them."""
    return [frame.as_buffer() for chunk in table.column("frame").chunks for frame in chunk]


def _not_ready(exc: BaseException) -> bool:
    """Whether ``exc`` is a broker's answer that it leads the partition but is still taking up
    the role, or that it does not lead it (yet or any more): both name the partition, which a
    failure to reach the broker does not."""
    return isinstance(exc, UnavailableError | NotLeaderError) and exc.fields.get("partition") is not None


def _error(exc: flight.FlightError, address: str | None) -> JetStreamError:
    known = error_from_message(str(exc), getattr(exc, "extra_info", None))
    if known is not None:
        return known
    return UnavailableError(f"leader at {address} failed: {exc}")
