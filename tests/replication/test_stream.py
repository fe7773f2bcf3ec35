"""The replication stream between a leader's Flight server and a follower's fetcher, in one process.

A real leader partition behind the real ``FlightApi``, a real follower
partition and its ``Fetcher``, both on memory-backed logs; only the broker
around the leader is a small view serving ``replica_fetch`` as the broker's
service does (the cluster tests run the whole broker, on file logs).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from pyarrow import flight

from broker_node.api.replica_stream import IN_FLIGHT, ReplicaFetchAnswer
from broker_node.api.server import FlightApi
from broker_node.coordination.base import PartitionState
from broker_node.log import MemoryLog, ReplicaFrame
from broker_node.replication.fetcher import BACKOFF, NOT_READY_PAUSE, Fetcher
from broker_node.replication.partition import Partition
from pyspark_jetstream.protocol.errors import InvalidArgumentError, NotLeaderError, UnavailableError
from pyspark_jetstream.protocol.flight import error_message
from pyspark_jetstream.protocol.replication import LeaderOffsets, ReplicaFetch
from pyspark_jetstream.protocol.streams import StreamConfig

from ..log.helpers import values

CONFIG = StreamConfig(name="orders", subject="orders", replication_factor=2, min_insync_replicas=2)
STATE = PartitionState("a", ("a", "b"), ("a", "b"), 1, version=1)


class LeaderView:
    """The part of the broker the server calls for replication: fetches checked as the service does."""

    def __init__(self, leader: Partition) -> None:
        self.leader = leader
        self.fetches = 0

    def replica_fetch(self, request: ReplicaFetch) -> ReplicaFetchAnswer:
        self.fetches += 1
        self.replica_acknowledge(request)
        return self.replica_read(request)

    def replica_acknowledge(self, request: ReplicaFetch) -> None:
        self._check(request)
        self.leader.record_fetch(request.replica, request.fetch_offset)

    def replica_read(
        self, request: ReplicaFetch, *, unless: Callable[[], bool] | None = None
    ) -> ReplicaFetchAnswer:
        self._check(request)
        log = self.leader.log
        if request.fetch_offset == log.log_end_offset and request.max_wait > 0:
            log.wait_for_end(request.fetch_offset, request.max_wait, unless=unless)
        frames = log.read_frames(request.fetch_offset, max_bytes=request.max_bytes)
        offsets = LeaderOffsets(
            high_watermark=self.leader.high_watermark,
            log_start_offset=log.log_start_offset,
            log_end_offset=log.log_end_offset,
            leader_epoch=self.leader.state.leader_epoch,
        )
        return ReplicaFetchAnswer(frames, offsets)

    def replica_wake(self, request: ReplicaFetch) -> None:
        self.leader.log.wake_waiters()

    def _check(self, request: ReplicaFetch) -> None:
        if request.leader_epoch != self.leader.state.leader_epoch:
            raise NotLeaderError(f"epoch {request.leader_epoch} is not this leader's")


class OlderLeaderApi(FlightApi):
    """A leader from before the stream: it refuses ``do_exchange`` as every Flight write."""

    def do_exchange(self, context, descriptor, reader, writer):  # type: ignore[no-untyped-def]
        raise flight.FlightServerError(
            error_message(InvalidArgumentError("Flight do_exchange is not supported: ..."))
        )


class UnpackedLeaderApi(FlightApi):
    """A leader from before packed messages: a stream opened with a ``replica_stream`` ticket is
    not a replica's to it, so it refuses it as every Flight write; one opened with a
    ``replica_fetch`` ticket gets record batches."""

    def do_exchange(self, context, descriptor, reader, writer):  # type: ignore[no-untyped-def]
        if descriptor.command.startswith(b'{"replica_stream"'):
            raise flight.FlightServerError(
                error_message(InvalidArgumentError("Flight do_exchange is not supported: ..."))
            )
        super().do_exchange(context, descriptor, reader, writer)


@pytest.fixture
def pair() -> Iterator[Callable[[type[FlightApi]], tuple[Partition, Partition, FlightApi, Fetcher]]]:
    opened: list[object] = []

    def start(
        api_class: type[FlightApi] = FlightApi, *, packed: bool = True
    ) -> tuple[Partition, Partition, FlightApi, Fetcher]:
        """``packed=False``: the follower asks for record batches, as one of an earlier version."""
        leader = Partition(CONFIG, 0, MemoryLog(), "a", STATE)
        leader.become_leader(STATE)
        follower = Partition(CONFIG, 0, MemoryLog(), "b", STATE)
        follower.become_follower(STATE)
        api = api_class("grpc://127.0.0.1:0", LeaderView(leader))  # type: ignore[arg-type]
        address = f"grpc://127.0.0.1:{api.port}"
        fetcher = Fetcher(follower, "a", 1, lambda _: address, max_wait=0.2)
        fetcher.packed = packed
        opened.extend([fetcher, api, leader, follower])
        fetcher.start()
        return leader, follower, api, fetcher

    yield start
    for thing in opened:
        if isinstance(thing, Fetcher):
            thing.stop()
        elif isinstance(thing, FlightApi):
            thing.shutdown()
        elif isinstance(thing, Partition):
            thing.close()


def commit(leader: Partition, records: int, timeout: float = 20.0) -> float:
    """Append ``records`` as leader and wait for their commit; return the seconds it took."""
    done = threading.Event()
    started = time.monotonic()
    offsets = leader.append(values(records))
    leader.when_committed(offsets[-1], lambda error: done.set() if error is None else None)
    assert done.wait(timeout), f"offsets up to {offsets[-1]} not committed within {timeout}s"
    return time.monotonic() - started


def test_a_follower_replicates_over_one_stream_and_its_acknowledgements_commit(pair):
    leader, follower, api, fetcher = pair()
    for _ in range(20):
        commit(leader, 3)
    assert follower.log.log_end_offset == leader.log.log_end_offset == 60
    assert [f.data.to_pybytes() for f in follower.log.read_frames(0)] == [
        f.data.to_pybytes() for f in leader.log.read_frames(0)
    ]
    assert fetcher.streaming and fetcher.packed
    # Every round trip was a turn of the stream: no fetch call at all.
    assert not [kind for kind, _ in api.requests if kind == "replica_fetch"]


@pytest.mark.parametrize(
    ("api_class", "packed"),
    [(UnpackedLeaderApi, True), (FlightApi, False)],
    ids=["a leader from before packing", "a follower from before packing"],
)
def test_a_stream_of_record_batches_still_replicates_between_versions(pair, api_class, packed):
    leader, follower, api, fetcher = pair(api_class, packed=packed)
    for size in (1, 3, 2000):  # one frame of 2,000 rows among them
        commit(leader, size)
    assert follower.log.log_end_offset == leader.log.log_end_offset == 2004
    assert [f.data.to_pybytes() for f in follower.log.read_frames(0)] == [
        f.data.to_pybytes() for f in leader.log.read_frames(0)
    ]
    assert fetcher.streaming and not fetcher.packed
    assert not [kind for kind, _ in api.requests if kind == "replica_fetch"]


def test_packed_messages_carry_large_frames_and_many_at_once(pair):
    leader, follower, _, fetcher = pair()
    commit(leader, 20_000)  # one frame of about 2 MB
    for _ in range(30):  # many small frames, some sent together
        leader.append(values(2))
    commit(leader, 1)
    assert follower.log.log_end_offset == leader.log.log_end_offset == 20_061
    assert [f.data.to_pybytes() for f in follower.log.read_frames(0)] == [
        f.data.to_pybytes() for f in leader.log.read_frames(0)
    ]
    assert fetcher.packed


def test_the_leader_pushes_heartbeats_so_an_idle_follower_stays_caught_up(pair):
    leader, _, _, fetcher = pair()
    commit(leader, 1)
    before = fetcher.fetches
    deadline = time.monotonic() + 10
    while fetcher.fetches < before + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fetcher.fetches >= before + 3  # heartbeats every max_wait (0.2 s)
    assert leader.lagging_replicas(max_lag=1.0) is None


def test_a_leader_without_the_stream_is_fetched_from(pair):
    leader, follower, api, fetcher = pair(OlderLeaderApi)
    commit(leader, 5)
    commit(leader, 5)
    assert follower.log.log_end_offset == 10
    assert not fetcher.streaming
    assert api.requests[("replica_fetch", "ok")] >= 2


def test_a_stream_of_an_earlier_leadership_is_refused(pair):
    leader, follower, _, fetcher = pair()
    commit(leader, 2)
    newer = PartitionState("a", ("a", "b"), ("a", "b"), 2, version=2)
    leader.become_leader(newer)
    leader.append(values(2))
    deadline = time.monotonic() + 10
    while "not this leader's" not in (fetcher.last_error or "") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "not this leader's" in (fetcher.last_error or "")
    # Whatever the old stream carried, its acknowledgements no longer count: nothing of
    # epoch 2 is committed until the follower fetches in epoch 2.
    assert follower.log.log_end_offset >= 2
    assert leader.high_watermark == 2


def test_shutting_the_leader_down_ends_its_open_streams(pair):
    leader, _, api, fetcher = pair()
    commit(leader, 1)
    stopped = threading.Thread(target=api.shutdown)
    started = time.monotonic()
    stopped.start()
    stopped.join(10)
    assert not stopped.is_alive(), "shutdown waited on an open replication stream"
    # At its next turn (a heartbeat every 0.2 s), not when the follower renews it (every 5 s).
    assert time.monotonic() - started < 2.5
    fetcher.stop()


class _Pauses(threading.Event):
    """A fetcher's stop event that records each pause the fetcher waits out."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.pauses.append(timeout)
        return super().wait(timeout)


class TakingUpLeaderView(LeaderView):
    """A leader that answers its first ``refusals`` fetches that it is still taking up the role."""

    def __init__(self, leader: Partition, refusals: int) -> None:
        super().__init__(leader)
        self.refusals = refusals

    def replica_fetch(self, request: ReplicaFetch) -> ReplicaFetchAnswer:
        if self.refusals > 0:
            self.refusals -= 1
            raise UnavailableError(
                "broker a leads orders/0 but cannot serve it: it is taking up the role",
                stream="orders",
                partition=0,
            )
        return super().replica_fetch(request)


def test_a_leader_taking_up_its_role_is_asked_again_at_a_short_pace_not_a_growing_backoff():
    leader = Partition(CONFIG, 0, MemoryLog(), "a", STATE)
    leader.become_leader(STATE)
    follower = Partition(CONFIG, 0, MemoryLog(), "b", STATE)
    follower.become_follower(STATE)
    api = FlightApi("grpc://127.0.0.1:0", TakingUpLeaderView(leader, refusals=8))  # type: ignore[arg-type]
    fetcher = Fetcher(follower, "a", 1, lambda _: f"grpc://127.0.0.1:{api.port}", max_wait=0.2)
    fetcher._stopped = stopped = _Pauses()
    fetcher.start()
    try:
        commit(leader, 3)
        # Eight answers of "taking up the role", each followed by the same short pause (a
        # growing backoff would have waited 0.05 + 0.1 + ... + 2 + 2 = 7.15 s in all).
        assert stopped.pauses[:8] == [NOT_READY_PAUSE] * 8
        assert "taking up the role" not in (fetcher.last_error or "")
    finally:
        fetcher.stop()
        api.shutdown()
        leader.close()
        follower.close()


def test_a_leader_that_cannot_be_reached_is_retried_with_a_growing_backoff():
    follower = Partition(CONFIG, 0, MemoryLog(), "b", STATE)
    follower.become_follower(STATE)
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    fetcher = Fetcher(follower, "a", 1, lambda _: f"grpc://127.0.0.1:{port}", max_wait=0.2)
    fetcher._stopped = stopped = _Pauses()
    fetcher.start()
    try:
        deadline = time.monotonic() + 20
        while len(stopped.pauses) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stopped.pauses[:4] == [BACKOFF[0] * 2**n for n in range(4)]
    finally:
        fetcher.stop()
        follower.close()


class HeldAcknowledgements(LeaderView):
    """A leader whose recording of acknowledgements on the stream (all but the first turn's, from
    offset 0) waits until ``release`` is set."""

    def __init__(self, leader: Partition) -> None:
        super().__init__(leader)
        self.release = threading.Event()
        self.acknowledged: list[int] = []

    def replica_acknowledge(self, request: ReplicaFetch) -> None:
        if request.fetch_offset > 0:
            self.release.wait(30)
            self.acknowledged.append(request.fetch_offset)
        super().replica_acknowledge(request)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_the_leader_sends_new_batches_without_waiting_for_the_acknowledgement_before():
    leader = Partition(CONFIG, 0, MemoryLog(), "a", STATE)
    leader.become_leader(STATE)
    follower = Partition(CONFIG, 0, MemoryLog(), "b", STATE)
    follower.become_follower(STATE)
    view = HeldAcknowledgements(leader)
    api = FlightApi("grpc://127.0.0.1:0", view)  # type: ignore[arg-type]
    # max_wait well above an append's trip: every message below carries one append, no heartbeat.
    fetcher = Fetcher(follower, "a", 1, lambda _: f"grpc://127.0.0.1:{api.port}", max_wait=2.0)
    appends = 3 * IN_FLIGHT
    leader.append(values(1))  # the first turn's answer
    fetcher.start()
    try:
        assert wait_until(lambda: follower.log.log_end_offset == 1)
        for number in range(1, appends):
            leader.append(values(1))
            # Each append reaches the follower by itself, while no acknowledgement is recorded,
            # until IN_FLIGHT messages travel ahead of the acknowledgements.
            expected = min(number + 1, IN_FLIGHT)
            assert wait_until(lambda expected=expected: follower.log.log_end_offset >= expected)
        assert follower.log.log_end_offset == IN_FLIGHT
        assert view.acknowledged == [] and leader.high_watermark == 0
        view.release.set()
        assert wait_until(lambda: leader.high_watermark == appends)
        assert follower.log.log_end_offset == appends
        assert view.acknowledged == sorted(view.acknowledged)
    finally:
        view.release.set()
        fetcher.stop()
        api.shutdown()
        leader.close()
        follower.close()


def test_a_stream_the_follower_ends_ends_on_the_leader_without_waiting_out_max_wait():
    leader = Partition(CONFIG, 0, MemoryLog(), "a", STATE)
    leader.become_leader(STATE)
    follower = Partition(CONFIG, 0, MemoryLog(), "b", STATE)
    follower.become_follower(STATE)
    api = FlightApi("grpc://127.0.0.1:0", LeaderView(leader))  # type: ignore[arg-type]
    fetcher = Fetcher(follower, "a", 1, lambda _: f"grpc://127.0.0.1:{api.port}", max_wait=25.0)
    fetcher.start()
    try:
        commit(leader, 1)
        fetcher.stop(wait=False)
        leader.append(values(1))  # the follower reads it, sees it is stopped and ends its stream
        # The leader's side was waiting up to 25 s for the next append: it is woken instead.
        assert wait_until(
            lambda: sum(n for (kind, _), n in api.requests.items() if kind == "replica_stream") == 1
        )
    finally:
        fetcher.stop()
        api.shutdown()
        leader.close()
        follower.close()


class BadFrameOnce(LeaderView):
    """A leader whose first read after the first turn answers a frame that cannot be sent."""

    def __init__(self, leader: Partition) -> None:
        super().__init__(leader)
        self.reads = 0

    def replica_read(
        self, request: ReplicaFetch, *, unless: Callable[[], bool] | None = None
    ) -> ReplicaFetchAnswer:
        answer = super().replica_read(request, unless=unless)
        self.reads += 1
        if self.reads == 1:
            return ReplicaFetchAnswer([ReplicaFrame(0, 0, 0, object())], answer.offsets)  # type: ignore[arg-type]
        return answer


def test_a_message_that_cannot_be_sent_ends_the_stream_at_once(pair):
    leader, _, api, _ = pair(lambda address, view: FlightApi(address, BadFrameOnce(view.leader)))
    leader.append(values(1))

    def failed_streams() -> int:
        return sum(n for (kind, code), n in api.requests.items() if kind == "replica_stream" and code != "ok")

    # The failed send is owed no acknowledgement: the call ends now, not at its deadline (15 s).
    assert wait_until(lambda: failed_streams() == 1, timeout=5)
    commit(leader, 1)  # the follower's next stream carries on
