"""A follower's fetcher: one task per followed partition, on the broker's event loop.

It opens a connection to its leader's replication listener (the wire:
:mod:`pyspark_jetstream.protocol.replication_wire`), says who it is, first
truncates the follower's log where it may differ from the leader's (it asks
where its latest epoch ends, :mod:`.truncation`), then asks for the stream
from its log end: the leader pushes what it appends, and the fetcher appends
everything that arrived together in one replicated append (on the loop for
a small batch, in a worker thread for a large one or when every append is
synced), takes the leader's high watermark and acknowledges its new log end
offset on the same connection, which is what lets the leader commit.  The
connection lasts until either side ends it; the replica manager stops the
fetcher (at once: the task is cancelled and its connection closed) when
leadership moves.  A fetch offset below the leader's log start (retention
moved on) starts the follower over there; one past the leader's log end
means the logs diverged again, and truncation runs again.

Damaged batches of the follower's own log (:attr:`Log.damaged`) are fetched
again from the leader over Flight (``replica_fetch``, see
:mod:`pyspark_jetstream.protocol.replication`) and repaired in place.

Errors never end the task: a leader that cannot be reached is retried with a
growing backoff; one that answers it is not ready (it has not taken up the
epoch yet, or its metadata lags) is asked again after a short fixed pause
(:data:`NOT_READY_PAUSE`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

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
from pyspark_jetstream.protocol.flight import error_from_message
from pyspark_jetstream.protocol.replication import ReplicaFetch
from pyspark_jetstream.protocol.replication_wire import (
    Fetch,
    Hello,
    Kind,
    MessageReader,
    ack_message,
    epoch_message,
    fetch_message,
    parse_data,
    parse_epoch_end,
    parse_error,
)

from .partition import Partition
from .throttle import SLICE, Throttle
from .truncation import truncation

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
CONNECT_TIMEOUT = 10.0
"""Seconds to open the connection (TLS included) and to get each answer before the stream starts."""
SILENT_BEATS = 10
"""Heartbeat intervals (``max_wait``) without a message from the leader, and at least
:data:`MIN_SILENCE` seconds, after which the connection is given up for a new one: a network
partition may drop packets without resetting anything, and a half-open connection would wait
forever."""
MIN_SILENCE = 3.0
INLINE_BYTES = 256 * 1024
"""Arrivals up to this size are appended on the event loop (a page-cache write of microseconds);
larger ones in a worker thread, so the loop goes on serving meanwhile."""


@dataclass(frozen=True)
class PeerLink:
    """How this broker presents itself to its peers' replication listeners: its TLS trust (and
    client certificate, for mutual TLS) and its ``authorization`` (``Basic``, as on Flight)."""

    tls: ssl.SSLContext | None = None
    authorization: str = ""


class Fetcher:
    """Keeps one follower partition in step with its leader (see the module docstring)."""

    def __init__(
        self,
        partition: Partition,
        leader: str,
        leader_epoch: int,
        replication_address_of: Callable[[str], str],
        flight_address_of: Callable[[str], str | None],
        *,
        loop: asyncio.AbstractEventLoop,
        link: PeerLink | None = None,
        connect: Callable[[str], flight.FlightClient] = flight.connect,
        max_bytes: int = 8 * 1024 * 1024,
        max_wait: float = 0.5,
        throttle: Throttle | None = None,
    ) -> None:
        """``replication_address_of(broker_id)``: where a leader's replication listener is
        (``UnavailableError`` naming why when it has none); ``flight_address_of``: its Flight
        address, for repairs, and ``connect`` a Flight client to it (with the broker's TLS and
        credentials); ``loop``: the event loop the fetcher runs on; ``throttle`` holds back a
        partition being moved here (its state's ``throttle``)."""
        self.partition = partition
        self.leader = leader
        self.leader_epoch = leader_epoch
        self._replication_address_of = replication_address_of
        self._flight_address_of = flight_address_of
        self._loop = loop
        self._link = link or PeerLink()
        self._connect_flight = connect
        self._max_bytes = max_bytes
        self._max_wait = max_wait
        self._throttle = throttle
        self._stopped = False
        self._done = threading.Event()
        self._future: concurrent.futures.Future[None] | None = None
        self._truncated = False
        self._pause: Callable[[float], Awaitable[None]] = asyncio.sleep
        """Waits out a pause between attempts (a test records them)."""
        self.fetches = 0
        """Messages of frames (or heartbeats) received from the leader."""
        self.last_error: str | None = None
        self._fields = Labels(partition.stream, partition.number).fields
        """``extra`` of its log lines: stream and partition as fields."""

    def start(self) -> None:
        """Begin fetching (from any thread): a task on the fetcher's loop."""
        self._future = asyncio.run_coroutine_threadsafe(self._run(), self._loop)

    def stop(self, wait: bool = True) -> None:
        """Stop now (from any thread): the task is cancelled and its connection closed.  With
        ``wait`` (not on the loop's thread), return once it ended."""
        self._stopped = True
        future = self._future
        if future is None:
            return
        future.cancel()
        if wait and not _on(self._loop):
            self._done.wait(10)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the fetcher runs on."""
        return self._loop

    # ---- the loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = BACKOFF[0]
        try:
            while not self._stopped:
                try:
                    await self._follow()
                except OffsetOutOfRangeError as exc:
                    self._truncated = await self._out_of_range(exc)
                    continue
                except InvalidRecordsError as exc:
                    logger.warning(
                        "%s: the leader's batches do not follow ours (%s); truncating again",
                        self,
                        exc,
                        extra=self._fields,
                    )
                    self._truncated = False
                    continue
                except (JetStreamError, LogError, OSError, TimeoutError) as exc:
                    if self._stopped:
                        return
                    self._note(exc)
                    if _not_ready(exc):
                        await self._pause(NOT_READY_PAUSE)
                        backoff = BACKOFF[0]
                        continue
                except Exception:
                    logger.exception("%s: unexpected failure", self, extra=self._fields)
                await self._pause(backoff)
                backoff = min(backoff * 2, BACKOFF[1])
        finally:
            self._done.set()

    def _note(self, exc: BaseException) -> None:
        text = str(exc) or type(exc).__name__
        if text != self.last_error:
            logger.info("%s: %s; retrying", self, text, extra=self._fields)
        self.last_error = text

    async def _follow(self) -> None:
        """One connection to the leader, until it ends (it always ends with an error)."""
        address = self._replication_address_of(self.leader)
        connection = await self._connect(address)
        try:
            partition = self.partition
            await connection.ask(
                Hello(
                    partition.stream,
                    partition.number,
                    partition.broker_id,
                    self.leader_epoch,
                    self._link.authorization,
                ).encode(),
                Kind.WELCOME,
            )
            if not self._truncated:
                await self._truncate(connection)
                self._truncated = True
            fetch = Fetch(
                partition.log.log_end_offset,
                Throttle.chunk(self._rate(), self._max_bytes),
                self._max_wait,
            )
            connection.start(fetch_message(fetch))
            silence = max(SILENT_BEATS * self._max_wait, MIN_SILENCE)
            next_repair = self._loop.time() + REPAIR_EVERY
            while True:
                try:
                    await asyncio.wait_for(asyncio.shield(connection.ended), min(silence, REPAIR_EVERY) / 2)
                except TimeoutError:
                    now = self._loop.time()
                    if now - connection.heard > silence:
                        raise UnavailableError(
                            f"leader {self.leader} at {connection.address} sent nothing for "
                            f"{now - connection.heard:.1f}s, not even a heartbeat: connecting again"
                        ) from None
                    if now >= next_repair:
                        next_repair = now + REPAIR_EVERY
                        if partition.log.damaged:
                            await asyncio.to_thread(self._repair)
                    continue
                connection.ended.result()  # raises why it ended
        finally:
            connection.close()

    async def _connect(self, address: str) -> _Connection:
        scheme, _, where = address.partition("://")
        host, _, port = where.rpartition(":")
        host = host.strip("[]")
        tls = None
        if scheme == "tls":
            tls = self._link.tls or ssl.create_default_context()
        elif scheme != "tcp":
            raise UnavailableError(
                f"leader {self.leader}'s replication address {address!r} is not tcp:// or tls://"
            )
        try:
            _, connection = await asyncio.wait_for(
                self._loop.create_connection(
                    lambda: _Connection(self, address),
                    host,
                    int(port),
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                ),
                CONNECT_TIMEOUT,
            )
        except (OSError, TimeoutError, ValueError) as exc:
            raise UnavailableError(
                f"leader {self.leader} cannot be reached at {address}: {exc or type(exc).__name__}"
            ) from None
        return connection

    async def _truncate(self, connection: _Connection) -> None:
        log = self.partition.log
        latest = log.leader_epoch if log.leader_epochs else None
        steps = truncation(latest, log.log_start_offset, log.end_offset_for_epoch)
        try:
            epoch = next(steps)
            while True:
                body = await connection.ask(epoch_message(epoch), Kind.EPOCH_END)
                epoch = steps.send(EpochEndOffset(*parse_epoch_end(body)))
        except StopIteration as done:
            cut: int = done.value
        await asyncio.to_thread(self.partition.replica.truncate_to, cut, self.leader_epoch)

    def _rate(self) -> int:
        """Bytes/s this partition may fetch: its reassignment's throttle while it is being added
        here and is not in sync yet (once in sync, acks wait for its fetches: no throttle)."""
        state = self.partition.state
        me = self.partition.broker_id
        if self._throttle is None or me not in state.adding or me in state.isr:
            return 0
        return state.throttle

    def held_back(self, received: int) -> float:
        """Seconds to wait after receiving ``received`` bytes, as the broker's throttle says."""
        rate = self._rate()
        if self._throttle is None or rate <= 0:
            return 0.0
        self._throttle.add(received, rate)
        return self._throttle.delay(rate)

    @property
    def throttled(self) -> bool:
        """Whether the broker's replication throttle holds this partition back now."""
        return self._throttle is not None and self._rate() > 0

    def still_held_back(self) -> float:
        """Seconds still to wait (the rate read again)."""
        rate = self._rate()
        return 0.0 if self._throttle is None or rate <= 0 else self._throttle.delay(rate)

    async def _out_of_range(self, exc: OffsetOutOfRangeError) -> bool:
        """Return whether the log is still truncated correctly after handling ``exc``."""
        log = self.partition.log
        start = exc.fields.get("log_start_offset")
        end = exc.fields.get("log_end_offset")
        if isinstance(start, int) and log.log_end_offset < start:
            await asyncio.to_thread(self.partition.replica.reset_to, start, self.leader_epoch)
            return True
        if isinstance(end, int) and log.log_end_offset > end:
            return False  # we are ahead of the leader: truncate by epoch again
        self._note(exc)
        await asyncio.sleep(BACKOFF[0])
        return True

    # ---- repairs (Flight, in a worker thread) ----------------------------------------------

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
                    frames = stored_frames(self._do_get(first))
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

    def _do_get(self, start: int) -> pa.Table:
        address = self._flight_address_of(self.leader)
        if address is None:
            raise UnavailableError(f"leader {self.leader} is not registered (not running?)")
        partition = self.partition
        request = ReplicaFetch(
            partition.stream,
            partition.number,
            partition.broker_id,
            start,
            self.leader_epoch,
            self._max_bytes,
            0.0,
        )
        client = self._connect_flight(address)
        try:
            options = flight.FlightCallOptions(timeout=CONNECT_TIMEOUT)
            return client.do_get(flight.Ticket(request.to_ticket()), options).read_all()
        except flight.FlightError as exc:
            known = error_from_message(str(exc), getattr(exc, "extra_info", None))
            raise known or UnavailableError(f"leader at {address} failed: {exc}") from None
        finally:
            client.close()

    def __str__(self) -> str:
        return f"{self.partition.stream}/{self.partition.number} following {self.leader}"


class _Connection(asyncio.Protocol):
    """The follower's side of one replication connection (see the module docstring)."""

    def __init__(self, fetcher: Fetcher, address: str) -> None:
        self.fetcher = fetcher
        self.address = address
        self.loop = fetcher.loop
        self.transport: asyncio.Transport | None = None
        self.reader = MessageReader()
        self.ended: asyncio.Future[None] = self.loop.create_future()
        self.ended.add_done_callback(_retrieved)
        self._answer: asyncio.Future[tuple[Kind, bytes]] | None = None
        self._streaming = False
        self._storing = False
        """An append runs in a worker thread: what arrives meanwhile waits."""
        self._throttled = False
        self.heard = self.loop.time()
        """When the leader last sent something (loop time)."""

    # ---- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not its subclasses

    def data_received(self, data: bytes) -> None:
        self.heard = self.loop.time()
        self.reader.feed(data)
        self._process()

    def connection_lost(self, exc: Exception | None) -> None:
        why = f": {exc}" if exc else ""
        self._end(
            UnavailableError(f"leader {self.fetcher.leader} at {self.address} closed the connection{why}")
        )

    # ---- requests before the stream ------------------------------------------------------------

    async def ask(self, request: bytes, answer: Kind) -> bytes:
        """Send ``request`` and return the body of the leader's answer, which must be ``answer``."""
        if self.ended.done():
            self.ended.result()
        waiting: asyncio.Future[tuple[Kind, bytes]] = self.loop.create_future()
        waiting.add_done_callback(_retrieved)
        self._answer = waiting
        self._write(request)
        kind, body = await asyncio.wait_for(asyncio.shield(waiting), CONNECT_TIMEOUT)
        if kind is not answer:
            raise InvalidArgumentError(f"the leader answered {kind.name} where {answer.name} was due")
        return body

    def start(self, fetch: bytes) -> None:
        """Ask for the stream (``FETCH``)."""
        self._streaming = True
        self._write(fetch)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._end(UnavailableError("the follower closed the connection"))

    # ---- arrivals -----------------------------------------------------------------------------

    def _process(self) -> None:
        """Take every whole message received; store the data together, then answer once.  While
        the throttle holds the partition back, one message at a time: the leader may have sent
        more than the rate allows into the socket's buffers, and only what is stored counts."""
        if self._storing or self._throttled or self.ended.done():
            return
        one_at_a_time = self.fetcher.throttled
        frames: list[pa.Buffer] = []
        high_watermark = -1
        messages = 0
        failure: BaseException | None = None
        try:
            while (got := self.reader.next()) is not None:
                kind, body = got
                if kind is Kind.DATA and self._streaming:
                    data = parse_data(pa.py_buffer(body))
                    frames.extend(data.frames)
                    high_watermark = data.offsets.high_watermark
                    messages += 1
                    if one_at_a_time:
                        break
                elif kind is Kind.ERROR:
                    failure = parse_error(body)
                    break
                elif self._answer is not None and not self._answer.done():
                    self._answer.set_result((kind, body))
                    self._answer = None
                else:
                    raise InvalidArgumentError(f"unexpected replication message {kind.name} from the leader")
        except JetStreamError as exc:
            failure = exc
        if messages:
            self._store(frames, high_watermark, messages)
        if failure is not None:
            self._end(failure)

    def _store(self, frames: list[pa.Buffer], high_watermark: int, messages: int) -> None:
        fetcher = self.fetcher
        partition = fetcher.partition
        size = sum(f.size for f in frames)
        if size <= INLINE_BYTES and not partition.appends_sync:
            try:
                partition.replica.append_replicated(frames, high_watermark, fetcher.leader_epoch)
            except Exception as exc:  # noqa: BLE001 - the fetcher's loop sorts it out
                self._end(exc)
                return
            self._stored(size, messages)
            return
        self._storing = True
        assert self.transport is not None
        self.transport.pause_reading()
        appending = self.loop.run_in_executor(
            None, partition.replica.append_replicated, frames, high_watermark, fetcher.leader_epoch
        )

        def done(future: asyncio.Future[range]) -> None:
            self._storing = False
            error = future.exception()
            if error is not None:
                self._end(error)
                return
            self._stored(size, messages)
            self._resume()

        appending.add_done_callback(done)

    def _stored(self, size: int, messages: int) -> None:
        fetcher = self.fetcher
        fetcher.fetches += messages
        fetcher.last_error = None  # the stream works: an earlier failure is over (health shows it)
        self._write(ack_message(fetcher.partition.log.log_end_offset))
        pause = fetcher.held_back(size)
        if pause > 0:
            self._hold(pause)
        elif self.reader.buffered:
            self.loop.call_soon(self._process)  # what waits behind a message taken alone

    def _hold(self, pause: float) -> None:
        """Read nothing for ``pause`` seconds (the throttle), then look at the rate again."""
        self._throttled = True
        assert self.transport is not None
        self.transport.pause_reading()

        def again() -> None:
            left = self.fetcher.still_held_back()
            if left > 0 and not self.ended.done():
                self.loop.call_later(min(left, SLICE), again)
                return
            self._throttled = False
            self._resume()

        self.loop.call_later(min(pause, SLICE), again)

    def _resume(self) -> None:
        if self._storing or self._throttled or self.ended.done() or self.transport is None:
            return
        self.transport.resume_reading()
        self._process()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _end(self, error: BaseException) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)
        if not self.ended.done():
            self.ended.set_exception(error)
        if self.transport is not None:
            self.transport.close()


def stored_frames(table: pa.Table) -> list[pa.Buffer]:
    """The frames of a replica fetch's answer, as the replica stores them."""
    return [frame.as_buffer() for chunk in table.column("frame").chunks for frame in chunk]


def _not_ready(exc: BaseException) -> bool:
    """Whether ``exc`` is a broker's answer that it leads the partition but is still taking up
    the role, or that it does not lead it (yet or any more): both name the partition, which a
    failure to reach the broker does not."""
    return isinstance(exc, UnavailableError | NotLeaderError) and exc.fields.get("partition") is not None


def _on(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (nobody may await it once the connection is given up)."""
    if not future.cancelled():
        future.exception()
