"""A follower's writes: the frames it fetched from its leader, a diverged tail cut off, a fresh start.

Each is refused (``NotLeaderError``) unless the partition still follows the
leadership the write comes from (a fetcher that outlived its leader), checked
under the partition's role lock, so no write lands under the next role.  The
producer, message-id and cursor tables (:mod:`.partition_tables`) learn what
is appended and are rebuilt after a truncation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import pyarrow as pa

from broker_node.log import LogStore
from pyspark_jetstream.protocol.streams import StreamConfig

from .partition_tables import PartitionTables


class ReplicaWrites:
    """What a partition's fetcher writes to it as a follower (see the module docstring)."""

    def __init__(
        self,
        store: LogStore,
        tables: PartitionTables,
        *,
        role_lock: threading.Lock,
        lock: threading.RLock,
        advanced: threading.Condition,
        check_following: Callable[[int | None], None],
        config: Callable[[], StreamConfig],
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        """``store``, ``tables``: the partition's log and tables; ``role_lock``, ``lock``: the
        partition's (held for each write); ``advanced``: its condition on ``lock`` (notified when the high
        watermark moves); ``check_following(epoch)``: raises unless it follows that leadership;
        ``config()``: the stream's configuration now; ``log``: its labelled logger."""
        self._store = store
        self._tables = tables
        self._role_lock = role_lock
        self._advanced = advanced
        self._lock = lock
        self._check_following = check_following
        self._config = config
        self._log = log

    def append_replicated(
        self, frames: Iterable[pa.Buffer], leader_high_watermark: int, leader_epoch: int | None = None
    ) -> range:
        """Append frames fetched from the leader and take its high watermark (up to our log end).

        ``leader_epoch`` is the leadership the frames come from: ``NotLeaderError``
        if this replica follows another one by now (a fetcher that outlived its leader).
        """
        frames = list(frames)
        with self._role_lock:
            self._check_following(leader_epoch)
            offsets = self._store.append_replicated(frames)
            with self._lock:
                self._tables.learn_frames(frames)
                hw = min(leader_high_watermark, self._store.log_end_offset)
                if hw > self._store.high_watermark:
                    self._store.high_watermark = hw
                    self._advanced.notify_all()
        return offsets

    def truncate_to(self, offset: int, leader_epoch: int | None = None) -> None:
        """Drop everything from ``offset`` on (a diverged tail); the tables are rebuilt.
        ``leader_epoch`` as for :meth:`append_replicated`."""
        with self._role_lock, self._lock:
            self._check_following(leader_epoch)
            if offset < self._store.log_end_offset:
                self._log.warning("truncating from %d to %d", self._store.log_end_offset, offset)
                self._tables.forget_snapshot()
                self._store.truncate_to(offset)
                self._tables.rebuild(self._config())
            else:
                self._store.truncate_to(offset)  # forgets epochs begun at the end without data

    def reset_to(self, offset: int, leader_epoch: int | None = None) -> None:
        """Start over empty at ``offset`` (the leader no longer has what lies before).
        ``leader_epoch`` as for :meth:`append_replicated`."""
        with self._role_lock, self._lock:
            self._check_following(leader_epoch)
            self._log.warning("starting over at offset %d", offset)
            self._tables.forget_snapshot()
            self._store.reset_to(offset)
            self._tables.rebuild(self._config())
