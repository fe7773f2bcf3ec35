"""The replication connection between a leader's listener and a follower's fetcher, in one process.

A real leader partition behind the real ``ReplicaServer``, a real follower
partition and its ``Fetcher``, both on memory-backed logs, on an event loop
of their own; only the replica manager around the leader is a small view
checking as the manager does (the cluster tests run the whole broker, on
file logs).  Some tests talk to the leader over a raw socket, as a follower
that misbehaves would.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
import uvloop

from broker_node.coordination.base import PartitionState
from broker_node.log import MemoryLog
from broker_node.replication import replica_server
from broker_node.replication.fetcher import BACKOFF, NOT_READY_PAUSE, Fetcher, PeerLink
from broker_node.replication.partition import Partition, Role
from broker_node.replication.replica_server import WRITE_BUFFER_HIGH, ReplicaServer
from pyspark_jetstream.protocol.errors import (
    NotLeaderError,
    UnauthenticatedError,
    UnavailableError,
)
from pyspark_jetstream.protocol.replication_wire import (
    Fetch,
    Hello,
    Kind,
    MessageReader,
    ack_message,
    epoch_end_message,
    fetch_message,
    message,
    parse_data,
)
from pyspark_jetstream.protocol.streams import StreamConfig

from ..log.helpers import values

CONFIG = StreamConfig(name="orders", subject="orders", replication_factor=2, min_insync_replicas=2)
STATE = PartitionState("a", ("a", "b"), ("a", "b"), 1, version=1)


class Leading:
    """The part of the replica manager a session calls: checks as the manager makes them."""

    def __init__(self, leader: Partition) -> None:
        self.leader = leader
        self.refusals = 0
        """Hellos answered "taking up the role" before one is welcomed."""
        self.isr_requests: list[str] = []

    def led_for(self, stream: str, number: int, replica: str, leader_epoch: int) -> Partition:
        if self.refusals > 0:
            self.refusals -= 1
            raise UnavailableError(
                "broker a leads orders/0 but cannot serve it: it is taking up the role",
                stream=stream,
                partition=number,
            )
        if leader_epoch != self.leader.state.leader_epoch or self.leader.role is not Role.LEADER:
            raise NotLeaderError(
                f"epoch {leader_epoch} is not this leader's", stream=stream, partition=number
            )
        return self.leader

    def request_isr(self, partition: Partition, replica: str) -> None:
        self.isr_requests.append(replica)


class Access:
    """Everyone may replicate, unless ``refuse`` is set."""

    def __init__(self) -> None:
        self.refuse = False
        self.checked: list[tuple[str | None, str]] = []

    def authenticate(self, authorization: str | None, peer_identity: str) -> str:
        self.checked.append((authorization, peer_identity))
        if self.refuse:
            raise UnauthenticatedError("wrong user or token (user 'broker')")
        return "broker"

    def check_cluster(self, principal: str, what: str) -> None:
        return None


class Loop:
    """An event loop in a thread of its own (the brokers' loops, here one for both sides): uvloop's,
    as the broker runs."""

    def __init__(self) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class Pair:
    """A leader with its listener, and a follower with its fetcher (started by :meth:`follow`)."""

    def __init__(self, loop: Loop, *, max_wait: float = 0.2) -> None:
        self.loop = loop
        self.leader = Partition(CONFIG, 0, MemoryLog(), "a", STATE)
        self.leader.become_leader(STATE)
        self.follower = Partition(CONFIG, 0, MemoryLog(), "b", STATE)
        self.follower.become_follower(STATE)
        self.leading = Leading(self.leader)
        self.access = Access()
        self.server = ReplicaServer(self.leading, self.access, host="127.0.0.1")
        loop.run(self.server.start())
        self.max_wait = max_wait
        self.fetcher: Fetcher | None = None
        self.pauses: list[float] = []

    @property
    def address(self) -> str:
        return self.server.address

    def follow(self, address: Callable[[str], str] | None = None, **options: Any) -> Fetcher:
        fetcher = Fetcher(
            self.follower,
            "a",
            1,
            address or (lambda _: self.address),
            lambda _: None,
            loop=self.loop.loop,
            max_wait=self.max_wait,
            **options,
        )

        async def pause(seconds: float) -> None:
            self.pauses.append(seconds)
            await asyncio.sleep(seconds)

        fetcher._pause = pause
        fetcher.start()
        self.fetcher = fetcher
        return fetcher

    def close(self) -> None:
        if self.fetcher is not None:
            self.fetcher.stop()
        self.loop.run(self.server.close())
        self.leader.close()
        self.follower.close()


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.close()


@pytest.fixture
def pair(loop: Loop) -> Iterator[Callable[..., Pair]]:
    made: list[Pair] = []

    def make(**options: Any) -> Pair:
        made.append(Pair(loop, **options))
        return made[-1]

    yield make
    for each in made:
        each.close()


def commit(leader: Partition, records: int, timeout: float = 20.0) -> None:
    """Append ``records`` as leader and wait for their commit."""
    done = threading.Event()
    offsets = leader.append(values(records))
    leader.when_committed(offsets[-1], lambda error: done.set() if error is None else None)
    assert done.wait(timeout), f"offsets up to {offsets[-1]} not committed within {timeout}s"


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def same_frames(a: Partition, b: Partition) -> bool:
    return [f.data.to_pybytes() for f in a.log.read_frames(0)] == [
        f.data.to_pybytes() for f in b.log.read_frames(0)
    ]


def test_a_follower_replicates_over_its_connection_and_its_acknowledgements_commit(pair):
    p = pair()
    p.follow()
    for _ in range(20):
        commit(p.leader, 3)
    assert p.follower.log.log_end_offset == p.leader.log.log_end_offset == 60
    assert same_frames(p.leader, p.follower)
    assert len(p.server.sessions) == 1  # one connection all along


def test_large_frames_and_many_at_once_arrive_whole_and_in_order(pair):
    p = pair()
    p.follow()
    commit(p.leader, 20_000)  # one frame of about 2 MB: appended in a worker thread on the follower
    for _ in range(30):  # many small frames, some sent and stored together
        p.leader.append(values(2))
    commit(p.leader, 1)
    assert p.follower.log.log_end_offset == p.leader.log.log_end_offset == 20_061
    assert same_frames(p.leader, p.follower)


def test_the_leader_pushes_heartbeats_so_an_idle_follower_stays_caught_up(pair):
    p = pair()
    fetcher = p.follow()
    commit(p.leader, 1)
    before = fetcher.fetches
    assert wait_until(lambda: fetcher.fetches >= before + 3)  # a heartbeat every max_wait (0.2 s)
    assert p.leader.followers.lagging_replicas(max_lag=1.0) is None
    # A heartbeat carries the high watermark: the follower learns the commit it made.
    assert wait_until(lambda: p.follower.high_watermark == 1)


def test_a_connection_of_an_earlier_leadership_is_refused(pair):
    p = pair()
    fetcher = p.follow()
    commit(p.leader, 2)
    newer = PartitionState("a", ("a", "b"), ("a", "b"), 2, version=2)
    p.leader.become_leader(newer)
    p.leader.append(values(2))
    assert wait_until(lambda: "in leader epoch 1" in (fetcher.last_error or ""))
    # Whatever the old connection carried, its acknowledgements no longer count: nothing of
    # epoch 2 is committed until the follower follows in epoch 2.
    assert p.follower.log.log_end_offset >= 2
    assert p.leader.high_watermark == 2


def test_closing_the_leaders_listener_ends_its_connections_at_once(pair):
    p = pair(max_wait=25.0)  # no heartbeat would end it for 25 s
    fetcher = p.follow()
    commit(p.leader, 1)
    p.loop.run(p.server.close())
    assert not p.server.sessions
    assert wait_until(lambda: "closed the connection" in (fetcher.last_error or ""), timeout=5)


def test_a_leader_taking_up_its_role_is_asked_again_at_a_short_pace_not_a_growing_backoff(pair):
    p = pair()
    p.leading.refusals = 8
    fetcher = p.follow()
    commit(p.leader, 3)
    # Eight answers of "taking up the role", each followed by the same short pause (a growing
    # backoff would have waited 0.05 + 0.1 + ... + 2 + 2 = 7.15 s in all).
    assert p.pauses[:8] == [NOT_READY_PAUSE] * 8
    assert "taking up the role" not in (fetcher.last_error or "")


def test_a_leader_that_cannot_be_reached_is_retried_with_a_growing_backoff(pair):
    p = pair()
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    fetcher = p.follow(lambda _: f"tcp://127.0.0.1:{port}")
    assert wait_until(lambda: len(p.pauses) >= 4, timeout=20)
    assert p.pauses[:4] == [BACKOFF[0] * 2**n for n in range(4)]
    assert "cannot be reached at tcp://127.0.0.1" in (fetcher.last_error or "")


def test_refused_credentials_are_reported_and_retried_with_a_growing_backoff(pair):
    p = pair()
    p.access.refuse = True
    fetcher = p.follow(link=PeerLink(authorization="Basic d3Jvbmc6dG9rZW4="))
    assert wait_until(lambda: len(p.pauses) >= 3)
    assert "wrong user or token" in (fetcher.last_error or "")
    assert p.pauses[:3] == [BACKOFF[0] * 2**n for n in range(3)]  # no tight loop
    assert p.access.checked[0] == ("Basic d3Jvbmc6dG9rZW4=", "")
    assert p.follower.log.log_end_offset == 0 and p.leader.followers.follower_log_ends() == {"b": -1}


def test_a_leader_of_the_old_transport_is_refused_with_one_line(pair, caplog):
    p = pair()
    old = UnavailableError(
        "leader a offers no replication listener: it runs an older version of the broker, which "
        "replicates over Flight; run the same version on every broker"
    )

    def no_listener(_: str) -> str:
        raise old

    with caplog.at_level(logging.INFO, logger="broker_node.replication.fetcher"):
        fetcher = p.follow(no_listener)
        assert wait_until(lambda: len(p.pauses) >= 4)
    assert fetcher.last_error == str(old)
    assert [r.getMessage() for r in caplog.records if "older version" in r.getMessage()] == [
        f"orders/0 following a: {old}; retrying"
    ]


def test_stopping_a_fetcher_ends_its_connection_at_once_not_at_the_next_message(pair):
    p = pair(max_wait=25.0)
    fetcher = p.follow()
    commit(p.leader, 1)
    assert len(p.server.sessions) == 1
    stopped = threading.Thread(target=fetcher.stop)
    stopped.start()
    stopped.join(5)  # the old fetcher waited for the leader's next message: up to 25 s here
    assert not stopped.is_alive()
    assert wait_until(lambda: not p.server.sessions, timeout=5)


class RawFollower:
    """A follower over a plain socket: it says hello and fetches, then does only what a test says."""

    def __init__(self, address: str, fetch_offset: int = 0, max_wait: float = 25.0) -> None:
        host, port = address.removeprefix("tcp://").rsplit(":", 1)
        self.socket = socket.create_connection((host, int(port)), timeout=10)
        self.reader = MessageReader()
        self.socket.sendall(Hello("orders", 0, "b", 1).encode())
        assert self.next()[0] is Kind.WELCOME
        self.socket.sendall(fetch_message(Fetch(fetch_offset, 8 * 1024 * 1024, max_wait)))

    def next(self) -> tuple[Kind, bytes]:
        while (got := self.reader.next()) is None:
            data = self.socket.recv(1 << 20)
            assert data, "the leader closed the connection"
            self.reader.feed(data)
        return got

    def offsets(self, count: int) -> int:
        """Read data messages until ``count`` offsets came; the offset after the last one."""
        end = 0
        while end < count:
            kind, body = self.next()
            assert kind is Kind.DATA
            data = parse_data(pa.py_buffer(body))
            if data.frames:
                end = data.offsets.log_end_offset
        return end


def test_the_leader_sends_each_append_without_waiting_for_an_acknowledgement(pair):
    p = pair()
    raw = RawFollower(p.address)
    try:
        for number in range(1, 13):
            p.leader.append(values(1))
            # Each append reaches the follower by itself, while it acknowledges nothing.
            assert raw.offsets(number) == number
        assert p.leader.high_watermark == 0
        raw.socket.sendall(ack_message(12))
        assert wait_until(lambda: p.leader.high_watermark == 12)
    finally:
        raw.socket.close()


def test_a_follower_that_stops_reading_holds_a_bounded_buffer_on_the_leader(pair):
    p = pair()
    raw = RawFollower(p.address)  # reads nothing from now on, as a paused (SIGSTOP) process
    try:
        (session,) = p.server.sessions
        for _ in range(200):  # 200 appends of ~110 KB: about 22 MB the follower does not take
            p.leader.append(values(1000, size=100))
        assert wait_until(lambda: session._paused)
        waiting = p.loop.run(_buffered(session))
        # The kernel's socket buffers hold some; the session's own buffer stays within its limit
        # plus the one message that crossed it (a message carries at most the limit).
        assert waiting <= 2 * WRITE_BUFFER_HIGH
        assert session.sent < p.leader.log.log_end_offset  # the rest waits in the log, not in memory
        assert p.leader.append(values(1)) is not None  # the leader goes on appending
        # Once the follower reads again, everything comes, in order.
        assert raw.offsets(p.leader.log.log_end_offset) == p.leader.log.log_end_offset
    finally:
        raw.socket.close()


async def _buffered(session: Any) -> int:
    return int(session.transport.get_write_buffer_size())


def test_a_hello_too_long_or_not_a_hello_ends_the_connection_with_the_reason(pair):
    p = pair()
    host, port = p.address.removeprefix("tcp://").rsplit(":", 1)
    for first in (b"\xff\xff\xff\x00\x01", ack_message(3)):
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(first)
            reader = MessageReader()
            received = b""
            while chunk := raw.recv(65536):
                received += chunk
            reader.feed(received)
            kind, body = reader.next() or (None, b"")
            assert kind is Kind.ERROR
            assert b"over the limit" in body or b"must open with a hello" in body
    assert not p.server.sessions


class SilentLeader:
    """A leader that welcomes, answers epoch questions, takes the fetch, then sends nothing more:
    a connection left half-open by a network partition (no reset ever arrives)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self._held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self._held.append(connection)
            reader = MessageReader()
            while True:
                got = reader.next()
                if got is None:
                    data = connection.recv(65536)
                    if not data:
                        break
                    reader.feed(data)
                    continue
                kind, _ = got
                if kind is Kind.HELLO:
                    connection.sendall(message(Kind.WELCOME))
                elif kind is Kind.EPOCH:
                    connection.sendall(epoch_end_message(-1, -1))
                elif kind is Kind.FETCH:
                    break  # silence from now on

    def close(self) -> None:
        self.listener.close()
        for connection in self._held:
            connection.close()


def test_a_follower_gives_up_a_connection_its_leader_went_silent_on_and_connects_again(pair):
    p = pair()
    silent = SilentLeader()
    try:
        fetcher = p.follow(lambda _: silent.address)
        assert wait_until(lambda: "sent nothing for" in (fetcher.last_error or ""), timeout=15)
        assert wait_until(lambda: silent.connections >= 2)
    finally:
        silent.close()


def test_a_leader_ends_the_session_of_a_follower_gone_silent(pair, monkeypatch):
    monkeypatch.setattr(replica_server, "MIN_SILENCE", 0.5)
    monkeypatch.setattr(replica_server, "SILENT_BEATS", 5)
    p = pair()
    raw = RawFollower(p.address, max_wait=0.1)  # fetches, then never answers a heartbeat
    try:
        assert len(p.server.sessions) == 1
        assert wait_until(lambda: not p.server.sessions, timeout=10)
    finally:
        raw.socket.close()


def test_what_the_log_took_without_telling_its_listeners_goes_at_the_next_heartbeat(pair):
    p = pair()
    p.follow()
    commit(p.leader, 1)
    p.leader.log.append(values(2))  # straight into the log: no append listener hears of it
    assert wait_until(lambda: p.follower.log.log_end_offset == 3, timeout=5)
    assert wait_until(lambda: p.leader.followers.follower_log_ends() == {"b": 3})
