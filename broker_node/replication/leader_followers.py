"""A leader's side of its followers: their fetches recorded, the ISR changes it proposes, writes and
asks for, and how far each has fetched.

The bookkeeping is :mod:`.in_sync`'s; this is what the replication listener
(each fetch), the ISR keeper (:mod:`.isr_keeper`) and the broker's status call
on a partition, each under the partition's lock and only while it leads, the
high watermark moved after any change that may move it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from broker_node.coordination.base import PartitionState
from broker_node.log import LogStore
from pyspark_jetstream.protocol.errors import NotLeaderError

from .in_sync import InSyncReplicas, UnknownReplicaError


class LeaderFollowers:
    """What a partition's followers ask of it as their leader (see the module docstring)."""

    def __init__(
        self,
        stream: str,
        number: int,
        store: LogStore,
        in_sync: InSyncReplicas,
        *,
        lock: threading.RLock,
        leading: Callable[[], bool],
        not_leader: Callable[[], NotLeaderError],
        advance: Callable[[], None],
        clock: Callable[[], float],
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        """``store``: the partition's log; ``lock``: the partition's; ``leading()``: whether it
        holds the leader's role (fenced or not); ``not_leader()``: the error when it does not;
        ``advance()``: move the high watermark (holding ``lock``); ``log``: its labelled logger."""
        self._stream = stream
        self._number = number
        self._name = f"{stream}/{number}"
        self._store = store
        self._in_sync = in_sync
        self._lock = lock
        self._leading = leading
        self._not_leader = not_leader
        self._advance = advance
        self._clock = clock
        self._log = log

    def record_fetch(self, replica: str, fetch_offset: int) -> bool:
        """A follower fetched from ``fetch_offset`` (so it holds everything before it).

        Returns whether it caught up while out of the ISR (see :meth:`expansion`).
        ``NotLeaderError`` if this broker does not lead or ``replica`` does not follow it.
        """
        with self._lock:
            if not self._leading():
                raise self._not_leader()
            high_watermark = self._store.high_watermark
            try:
                lost = self._in_sync.fetched(
                    replica, fetch_offset, self._store.log_end_offset, high_watermark, self._clock()
                )
            except UnknownReplicaError:
                raise NotLeaderError(
                    f"{replica} is not a replica of {self._name} in epoch {self._in_sync.state.leader_epoch}",
                    stream=self._stream,
                    partition=self._number,
                ) from None
            if lost:
                # A crash cut its unsynced tail and it restarted quick enough to stay in the ISR.
                self._log.warning(
                    "%s fetched from %d, below the high watermark %d: it lost committed data and "
                    "leaves the ISR",
                    replica,
                    fetch_offset,
                    high_watermark,
                )
            self._advance()
            return self.expansion(replica) is not None

    def expansion(self, replica: str) -> tuple[str, ...] | None:
        """The ISR with ``replica`` added, if it is out of the ISR and caught up (it had the high
        watermark and this leader's whole epoch, and the high watermark has waited for it since);
        else ``None``.  Asked again when the change is about to be written, so a queued request
        never revives a stale view (a replica dropped meanwhile, another leadership)."""
        with self._lock:
            if not self._leading():
                return None
            return self._in_sync.expansion(
                replica,
                self._store.high_watermark,
                lambda: self._store.end_offset_for_epoch(self._in_sync.state.leader_epoch - 1).end_offset,
            )

    def lagging_replicas(self, max_lag: float) -> tuple[str, ...] | None:
        """A proposed ISR without the followers not caught up for ``max_lag`` seconds, or ``None``."""
        with self._lock:
            if not self._leading():
                return None
            proposal, shrank = self._in_sync.lagging(max_lag, self._clock())
            if shrank:
                self._advance()
            return proposal

    def propose_isr(self, isr: tuple[str, ...]) -> PartitionState | None:
        """Mark ``isr`` as being written; the state to write, or ``None`` if not leader any more."""
        with self._lock:
            if not self._leading():
                return None
            return self._in_sync.propose(isr)

    def isr_written(self, state: PartitionState | None) -> None:
        """The coordinator stored ``state`` (or refused the proposal: ``None``)."""
        with self._lock:
            change = self._in_sync.written(state, self._leading())
            if change is not None:
                self._log.info("%s", change)
            self._advance()

    def follower_log_ends(self) -> dict[str, int]:
        """Each follower's last fetch offset as this leader knows it (-1: not heard from)."""
        with self._lock:
            return self._in_sync.log_ends()
