"""A leader's replication listener: followers' connections, served on the broker's event loop.

Each follower opens one connection per partition it follows (the wire:
:mod:`pyspark_jetstream.protocol.replication_wire`).  Its session checks who
asks (the ``authorization`` of its hello or its client certificate, as a
Flight call is checked, in a worker thread because a token's first check is a
bcrypt hash), then answers epoch questions and, once fetched from, sends
every batch the leader appends as soon as it is appended: the partition's
append listener schedules the send on the loop (at once when the append ran
on the loop itself), and the send writes what follows the last offset sent,
straight from the log's frames, without waiting for the acknowledgement of
the message before.  Each acknowledgement is recorded as a fetch on the loop
as it arrives, which moves the high watermark there: the commit's acks and
the live tail go out from the same loop.

Memory stays bounded when a follower stops reading (a paused process): once
more than :data:`WRITE_BUFFER_HIGH` bytes wait in the connection's buffer the
session sends nothing more until it drains (heartbeats included), and no
message carries more than that many bytes of batches (a larger batch goes
alone), so a session holds at most about twice the limit; the rest waits in
the log.  A session ends
when the follower closes, when the partition is no longer led here in the
session's epoch (checked at every send, acknowledgement and heartbeat), or
when an acknowledgement is refused; its refusal goes to the follower as an
``ERROR`` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
from collections.abc import Callable
from typing import Protocol, cast

from broker_node.log import LogError, ReplicaFrame
from broker_node.log.logging_labels import Labels
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    NotLeaderError,
    OffsetOutOfRangeError,
    UnavailableError,
)
from pyspark_jetstream.protocol.replication import LeaderOffsets
from pyspark_jetstream.protocol.replication_wire import (
    MAX_HELLO_BYTES,
    Fetch,
    Hello,
    Kind,
    MessageReader,
    data_message,
    epoch_end_message,
    error_message,
    message,
    parse_ack,
    parse_epoch,
    parse_fetch,
)

from .partition import Partition, Role

logger = logging.getLogger(__name__)

WRITE_BUFFER_HIGH = 1024 * 1024
"""Bytes waiting in a session's send buffer above which it sends nothing more until they drain."""
WRITE_BUFFER_LOW = 256 * 1024
MIN_HEARTBEAT = 0.05
"""The shortest silence (seconds) between heartbeats, whatever a follower asks."""
SILENT_BEATS = 20
"""Heartbeat intervals without a word from a follower streaming here (and at least
:data:`MIN_SILENCE` seconds) after which its session ends: a network partition may leave the
connection half-open, and the follower connects again anyway (it gives up sooner, see the
fetcher)."""
MIN_SILENCE = 6.0


class PeerAccess(Protocol):
    """Who may replicate: the broker's access control, as its Flight calls use it."""

    def authenticate(self, authorization: str | None, peer_identity: str) -> str:
        """The principal presenting ``authorization`` or a client certificate naming ``peer_identity``."""

    def check_cluster(self, principal: str, what: str) -> None:
        """Raise unless ``principal`` is one of the cluster's brokers."""


class Leading(Protocol):
    """What a session needs of the replica manager."""

    def led_for(self, stream: str, number: int, replica: str, leader_epoch: int) -> Partition:
        """The partition led here in ``leader_epoch`` that ``replica`` follows, or the refusal."""

    def request_isr(self, partition: Partition, replica: str) -> None:
        """Ask for ``replica`` to join ``partition``'s ISR (it caught up)."""


class ReplicaServer:
    """The listener; one :class:`_Session` per connection (see the module docstring)."""

    def __init__(
        self,
        leading: Leading,
        access: PeerAccess,
        *,
        host: str,
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        advertised_host: str | None = None,
    ) -> None:
        self.leading = leading
        self.access = access
        self._host, self._port, self._tls = host, port, tls
        self._advertised_host = advertised_host or host
        self._server: asyncio.Server | None = None
        self.sessions: set[_Session] = set()
        self.port = 0
        """The port bound (after :meth:`start`)."""

    @property
    def address(self) -> str:
        """Where followers reach it: ``tcp://host:port``, or ``tls://host:port`` with TLS."""
        return f"{'tls' if self._tls else 'tcp'}://{self._advertised_host}:{self.port}"

    async def start(self) -> None:
        """Listen (on the running loop, which serves every session)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Session(self), self._host, self._port, ssl=self._tls, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and end every session."""
        if self._server is not None:
            self._server.close()
        for session in list(self.sessions):
            session.end(None)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


class _Session(asyncio.Protocol):
    """One follower's connection (see the module docstring)."""

    def __init__(self, server: ReplicaServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.transport: asyncio.Transport | None = None
        self.reader = MessageReader(MAX_HELLO_BYTES)
        self.hello: Hello | None = None
        self.partition: Partition | None = None
        self._welcomed = False
        self._checking = False
        """The hello's credentials are being checked in a worker thread."""
        self._streaming = False
        self.sent = 0
        """The offset after the last one sent."""
        self.max_bytes = 0
        self.heartbeat = 0.0
        self._last_sent = 0.0
        self._heard = 0.0
        """When the follower last sent something (loop time)."""
        self._timer: asyncio.TimerHandle | None = None
        self._scheduled = False
        self._paused = False
        self._reading_frames = False
        """A read of the log runs in a worker thread (the log was busy): sends wait for it."""
        self._ended = False
        self._stop_listening: Callable[[], None] | None = None

    # ---- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not its subclasses
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        self.server.sessions.add(self)

    def data_received(self, data: bytes) -> None:
        self._heard = self.loop.time()
        self.reader.feed(data)
        self._handle_messages()

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended = True
        self._stop()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._schedule_send()

    # ---- messages -----------------------------------------------------------------------------

    def _handle_messages(self) -> None:
        try:
            while not self._ended and not self._checking and (got := self.reader.next()) is not None:
                kind, body = got
                if kind is Kind.HELLO and self.hello is None:
                    self._check_hello(Hello.parse(body))
                elif not self._welcomed:
                    raise InvalidArgumentError(
                        f"a replication connection must open with a hello, got {kind.name}"
                    )
                elif kind is Kind.EPOCH:
                    partition = self._led()
                    answer = partition.log.end_offset_for_epoch(parse_epoch(body))
                    self._write(epoch_end_message(answer.epoch, answer.end_offset))
                elif kind is Kind.FETCH and not self._streaming:
                    self._start_streaming(parse_fetch(body))
                elif kind is Kind.ACK and self._streaming:
                    self._acknowledged(parse_ack(body))
                else:
                    raise InvalidArgumentError(f"unexpected replication message {kind.name} here")
        except JetStreamError as exc:
            self.end(exc)
        except LogError as exc:
            self.end(UnavailableError(f"the leader's log cannot serve this replica now: {exc}"))
        except Exception:
            logger.exception("a replication session failed")
            self.end(UnavailableError("the leader failed to serve the replication connection (see its log)"))

    def _check_hello(self, hello: Hello) -> None:
        """Check the credentials in a worker thread (a bcrypt hash the first time), then answer."""
        self.hello = hello
        self._checking = True
        assert self.transport is not None
        self.transport.pause_reading()
        identity = _peer_identity(self.transport)
        checked = self.loop.run_in_executor(None, self._authorize, hello.authorization, identity)
        checked.add_done_callback(self._checked)

    def _authorize(self, authorization: str, identity: str) -> None:
        access = self.server.access
        principal = access.authenticate(authorization or None, identity)
        access.check_cluster(principal, "replicate")

    def _checked(self, future: asyncio.Future[None]) -> None:
        self._checking = False
        if self._ended:
            return
        try:
            future.result()
            hello = self.hello
            assert hello is not None
            self.partition = self.server.leading.led_for(
                hello.stream, hello.partition, hello.replica, hello.leader_epoch
            )
        except JetStreamError as exc:
            self.end(exc)
            return
        except Exception:
            logger.exception("checking a follower's hello failed")
            self.end(UnavailableError("the leader failed to check the follower's hello (see its log)"))
            return
        self.reader.limit = 64  # a follower sends small messages only from now on
        self._welcomed = True
        self._write(message(Kind.WELCOME))
        assert self.transport is not None
        self.transport.resume_reading()
        self._handle_messages()  # anything sent ahead of the welcome

    def _start_streaming(self, fetch: Fetch) -> None:
        self._acknowledged(fetch.fetch_offset)  # the first fetch acknowledges too, as a fetch did
        self._streaming = True
        self.sent = fetch.fetch_offset
        # One message at most the buffer's limit (a batch larger than that goes alone): what a
        # follower that stops reading costs stays within twice the limit.
        self.max_bytes = min(fetch.max_bytes, WRITE_BUFFER_HIGH)
        self.heartbeat = max(fetch.max_wait, MIN_HEARTBEAT)
        partition = self._led()
        self._stop_listening = partition.on_append(self._appended)
        self._last_sent = self.loop.time()
        self._send()
        self._timer = self.loop.call_at(self._last_sent + self.heartbeat, self._beat)

    def _acknowledged(self, offset: int) -> None:
        """The follower holds everything before ``offset``: record it as a fetch (the high
        watermark may move, here and now; a follower that caught up is asked into the ISR)."""
        partition, hello = self._led(), self.hello
        assert hello is not None
        log = partition.log
        start, end = log.log_start_offset, log.log_end_offset
        if not start <= offset <= end:
            raise OffsetOutOfRangeError(
                f"{hello.replica} fetches {hello.stream}/{hello.partition} from {offset}, but the "
                f"leader holds offsets {start} to {end}",
                stream=hello.stream,
                partition=hello.partition,
                offset=offset,
                log_start_offset=start,
                log_end_offset=end,
            )
        if partition.followers.record_fetch(hello.replica, offset):
            self.server.leading.request_isr(partition, hello.replica)

    def _led(self) -> Partition:
        """The partition, still led here in the session's epoch; ``NotLeaderError`` otherwise."""
        partition, hello = self.partition, self.hello
        assert partition is not None and hello is not None
        if partition.role is not Role.LEADER or partition.state.leader_epoch != hello.leader_epoch:
            raise NotLeaderError(
                f"{hello.replica} follows {hello.stream}/{hello.partition} in leader epoch "
                f"{hello.leader_epoch}, but broker {partition.broker_id} is {partition.role.value} "
                f"there in epoch {partition.state.leader_epoch}",
                stream=hello.stream,
                partition=hello.partition,
            )
        return partition

    # ---- sending ------------------------------------------------------------------------------

    def _appended(self) -> None:
        """The partition appended (on any thread): send soon, once per turn of the loop."""
        if self._scheduled or self._ended:
            return
        self._scheduled = True
        if threading.get_ident() == self._loop_thread:
            self.loop.call_soon(self._send)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the broker stopped
                self.loop.call_soon_threadsafe(self._send)

    def _schedule_send(self) -> None:
        if not self._scheduled and not self._ended:
            self._scheduled = True
            self.loop.call_soon(self._send)

    def _send(self) -> None:
        """Send what follows the last offset sent, as long as the buffer takes it."""
        self._scheduled = False
        if self._ended or self._paused or self._reading_frames:
            return
        try:
            partition = self._led()
            log = partition.log
            while not self._paused and self.sent < log.log_end_offset:
                frames = log.try_read_frames(self.sent, max_bytes=self.max_bytes)
                if frames is None:  # the log is busy (a compaction, a roll): read in a thread
                    self._read_in_thread(partition)
                    return
                if not frames:
                    return
                self._send_frames(partition, frames)
        except JetStreamError as exc:
            self.end(exc)
        except LogError as exc:
            self.end(UnavailableError(f"the leader's log cannot serve this replica now: {exc}"))

    def _read_in_thread(self, partition: Partition) -> None:
        self._reading_frames = True
        read = self.loop.run_in_executor(
            None, lambda: partition.log.read_frames(self.sent, max_bytes=self.max_bytes)
        )

        def done(future: asyncio.Future[list[ReplicaFrame]]) -> None:
            self._reading_frames = False
            if self._ended:
                return
            try:
                frames = future.result()
                if frames:
                    self._send_frames(self._led(), frames)
            except JetStreamError as exc:
                self.end(exc)
                return
            except LogError as exc:
                self.end(UnavailableError(f"the leader's log cannot serve this replica now: {exc}"))
                return
            self._schedule_send()

        read.add_done_callback(done)

    def _send_frames(self, partition: Partition, frames: list[ReplicaFrame]) -> None:
        self._write(data_message(self._offsets(partition), [f.data for f in frames]))
        self.sent = frames[-1].last_offset + 1

    def _offsets(self, partition: Partition) -> LeaderOffsets:
        log = partition.log
        assert self.hello is not None
        return LeaderOffsets(
            partition.high_watermark, log.log_start_offset, log.log_end_offset, self.hello.leader_epoch
        )

    def _beat(self) -> None:
        """A heartbeat when nothing was sent for the interval (the follower learns the high
        watermark and answers, which keeps it in sync while the partition is idle)."""
        if self._ended:
            return
        now = self.loop.time()
        silent = now - self._heard
        if silent > max(SILENT_BEATS * self.heartbeat, MIN_SILENCE):
            self.end(
                UnavailableError(f"the follower sent nothing for {silent:.1f}s: the connection is given up")
            )
            return
        due = self._last_sent + self.heartbeat
        if now >= due:
            self._send()  # what an append made without telling the listeners goes now
            if self._ended:
                return
            if not self._paused and self.loop.time() >= self._last_sent + self.heartbeat:
                try:
                    self._write(data_message(self._offsets(self._led()), []))
                except JetStreamError as exc:
                    self.end(exc)
                    return
            due = now + self.heartbeat
        self._timer = self.loop.call_at(due, self._beat)

    def _write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)
        self._last_sent = self.loop.time()

    # ---- ending -------------------------------------------------------------------------------

    def end(self, error: JetStreamError | None) -> None:
        """End the session, telling the follower why first (``error``)."""
        if self._ended:
            return
        self._ended = True
        hello = self.hello
        if error is not None:
            who = f"{hello.replica} on {hello.stream}/{hello.partition}" if hello else "a follower"
            fields = Labels(hello.stream, hello.partition).fields if hello else None
            logger.info("replication of %s ended: %s", who, error, extra=fields)
        if self.transport is not None:
            if error is not None:
                self.transport.write(error_message(error))
            self.transport.close()
        self._stop()

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening = None
        self.server.sessions.discard(self)


def _peer_identity(transport: asyncio.Transport) -> str:
    """A client certificate's principal as Flight reads it: its first subject alternative name
    (else its common name); ``""`` without one."""
    certificate = transport.get_extra_info("peercert")
    if not certificate:
        return ""
    for _, name in certificate.get("subjectAltName", ()):
        return str(name)
    for entry in certificate.get("subject", ()):
        for key, value in entry:
            if key == "commonName":
                return str(value)
    return ""
