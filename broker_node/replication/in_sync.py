"""A leader's view of its followers: how far each has fetched, and who the high watermark waits for.

High watermark: the lowest log end offset among the in-sync replicas, the
leader's own included.  A follower's log end offset is what it last
acknowledged (an acknowledgement, like a fetch offset, covers everything
before it); one not yet heard from since this broker became leader holds the
high watermark back.

In-sync replicas: a follower whose fetch offset reached the leader's log end
offset within the last ``replica_max_lag`` seconds is caught up (Kafka's
rule: caught up to the log end as of its previous fetch counts too).  The
leader proposes ISR changes; the replica manager writes them through the
coordinator and applies the result.  While a removal is being written the
follower still counts (a larger ISR only holds the high watermark back);
an addition counts once it is written, or as soon as the follower caught up
while out of the ISR (it *joins*: Kafka's "maximal ISR", so one that keeps up
with a busy partition is not overtaken between catching up and being written
in).

Not thread-safe: the partition calls it holding its lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from broker_node.coordination.base import PartitionState


@dataclass
class FollowerProgress:
    """What the leader knows of one follower."""

    log_end_offset: int = -1
    """Its last fetch offset; -1 until it fetched from this leader."""
    last_caught_up: float = 0.0
    """When it last was caught up (monotonic seconds)."""
    previous_fetch_leader_end: int = -1
    previous_fetch_time: float = 0.0


class UnknownReplicaError(Exception):
    """A fetch from a broker that is not a follower of this leadership (the caller says so)."""


class InSyncReplicas:
    """The followers of one leadership and the ISR the high watermark waits for (module docstring)."""

    def __init__(self, broker_id: str, state: PartitionState) -> None:
        self.broker_id = broker_id
        self.state = state
        self.followers: dict[str, FollowerProgress] = {}
        self.isr: tuple[str, ...] = state.isr
        """The ISR the high watermark waits for: stored, being written, and joining together."""
        self._pending: tuple[str, ...] | None = None
        self._joining: set[str] = set()

    def lead(self, state: PartitionState, now: float) -> None:
        """A new leadership here: every follower counts as caught up now, none heard from yet."""
        self.state = state
        self.isr = state.isr
        self._pending = None
        self._joining = set()
        self.followers = {
            r: FollowerProgress(last_caught_up=now) for r in state.replicas if r != self.broker_id
        }

    def follow(self, state: PartitionState) -> None:
        """Not leading: nothing is tracked."""
        self.state = state
        self.followers = {}
        self.isr = state.isr
        self._pending = None
        self._joining = set()

    def update(self, state: PartitionState, now: float) -> None:
        """A newer version of the same leadership (a reassignment adds and drops replicas)."""
        self.state = state
        self.followers = {
            r: self.followers.get(r) or FollowerProgress(last_caught_up=now)
            for r in state.replicas
            if r != self.broker_id
        }
        self._joining = {r for r in self._joining if r in state.replicas and r not in state.isr}
        if self._pending is not None and state.isr == self._pending:
            self._pending = None
        self.isr = self._merged()

    def fetched(
        self, replica: str, fetch_offset: int, leader_end: int, high_watermark: int, now: float
    ) -> bool:
        """``replica`` holds everything before ``fetch_offset``; whether it lost committed data
        (an in-sync replica fetching from below the high watermark: it leaves the ISR at the next
        pass, so it is never elected with less than was acknowledged).  ``UnknownReplicaError`` if it
        is not a follower of this leadership."""
        progress = self.followers.get(replica)
        if progress is None:
            raise UnknownReplicaError(replica)
        if fetch_offset >= leader_end:
            progress.last_caught_up = now
        elif fetch_offset >= progress.previous_fetch_leader_end >= 0:
            progress.last_caught_up = max(progress.last_caught_up, progress.previous_fetch_time)
        progress.previous_fetch_leader_end = leader_end
        progress.previous_fetch_time = now
        progress.log_end_offset = fetch_offset
        if fetch_offset < high_watermark and replica in self.isr:
            self._joining.discard(replica)
            self.isr = self._merged()
            progress.last_caught_up = float("-inf")
            return True
        return False

    def expansion(
        self, replica: str, high_watermark: int, epoch_start: Callable[[], int]
    ) -> tuple[str, ...] | None:
        """The ISR with ``replica`` added, if it is out of the ISR and caught up (it has the high
        watermark and this leader's whole epoch, ``epoch_start()`` where it began, and the high
        watermark has waited for it since); else ``None``."""
        progress = self.followers.get(replica)
        wanted = self._pending or self.state.isr
        if progress is None or replica in wanted:
            return None
        if replica not in self._joining:
            if progress.log_end_offset < max(high_watermark, epoch_start(), 0):
                return None
            self._joining.add(replica)  # the high watermark waits for it from now on
            self.isr = self._merged()
        return tuple(r for r in self.state.replicas if r in wanted or r == replica)

    def lagging(self, max_lag: float, now: float) -> tuple[tuple[str, ...] | None, bool]:
        """A proposed ISR without the followers not caught up for ``max_lag`` seconds (or ``None``),
        and whether the ISR the high watermark waits for shrank (joiners that fell behind)."""
        stale = {
            r
            for r in self._joining
            if (progress := self.followers.get(r)) is None or now - progress.last_caught_up > max_lag
        }
        if stale:  # caught up once, and fell behind again before being written in
            self._joining -= stale
            self.isr = self._merged()
        current = self._pending or self.state.isr
        lagging = {
            r
            for r in current
            if r != self.broker_id
            and (progress := self.followers.get(r)) is not None
            and now - progress.last_caught_up > max_lag
        }
        proposal = tuple(r for r in current if r not in lagging) if lagging else None
        return proposal, bool(stale)

    def propose(self, isr: tuple[str, ...]) -> PartitionState:
        """``isr`` is being written: it counts from now on; the state to write."""
        self._pending = isr
        self.isr = self._merged()
        return dataclasses.replace(self.state, isr=isr)

    def written(self, state: PartitionState | None, leading: bool) -> str | None:
        """The coordinator stored ``state`` (``None``: refused the proposal); the ISR change to log,
        if any.  A newer state that arrived first (a move that this very write let finish) is not
        rolled back by the stored answer to the write."""
        self._pending = None
        change = None
        if state is not None and leading and state.version > self.state.version:
            if state.isr != self.state.isr:
                change = f"ISR {self.state.isr} -> {state.isr}"
            self.state = state
        self._joining -= set(self.state.isr)
        self.isr = self._merged()
        return change

    def high_watermark(self, leader_end: int) -> int | None:
        """The lowest log end in the ISR (the leader's is ``leader_end``), or ``None`` while an
        in-sync follower was not heard from since this leadership began."""
        ends = [leader_end]
        for replica in self.isr:
            if replica == self.broker_id:
                continue
            progress = self.followers.get(replica)
            if progress is None or progress.log_end_offset < 0:
                return None
            ends.append(progress.log_end_offset)
        return min(ends)

    def log_ends(self) -> dict[str, int]:
        """Each follower's last fetch offset (-1: not heard from)."""
        return {r: p.log_end_offset for r, p in self.followers.items()}

    def _merged(self) -> tuple[str, ...]:
        """The stored ISR, a pending proposal and the replicas joining, together (a replica being
        added counts as soon as it caught up, one being removed until the removal is stored), so
        whoever the coordinator may name in sync has everything acknowledged."""
        stored, pending, joining = self.state.isr, self._pending or (), self._joining
        return tuple(r for r in self.state.replicas if r in stored or r in pending or r in joining)
