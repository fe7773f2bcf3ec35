"""The mirror copiers of this broker: one per mirrored partition it leads.

:meth:`Mirrors.sync` runs after every metadata change (with the partitions'
new roles applied): a partition of an active mirror led here gets a
:class:`~.mirror.MirrorCopier` for its leader epoch; one no longer led here,
led in a newer epoch, or promoted has its copier stopped (without waiting:
whatever it still tries is refused, since it names an epoch the partition no
longer leads in).  A copier stopped by a mismatch stays, for its status, until
the leadership changes.  Called from one thread at a time (the broker's sync).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from pyspark_jetstream.protocol.mirror import MirrorSource, MirrorStatus

from .mirror import FollowSchema, MirrorCopier
from .mirror_cursors import WriteCursor
from .partition import Partition
from .source_cluster import Connect

logger = logging.getLogger(__name__)

Key = tuple[str, int]


class Mirrors:
    """The copiers of the mirrored partitions led here (see the module docstring)."""

    def __init__(
        self,
        connector: Callable[[MirrorSource], Connect],
        write_cursor: WriteCursor,
        *,
        follow_schema: FollowSchema | None = None,
        max_bytes: int = 8 * 1024 * 1024,
        max_wait: float = 0.5,
    ) -> None:
        """``connector(source)`` gives what opens a Flight client to that source's brokers (with
        its credentials); ``write_cursor`` stores a copied cursor in this cluster; ``follow_schema``
        brings a source's newer schema versions over (see :class:`~.mirror.MirrorCopier`)."""
        self._connector = connector
        self._write_cursor = write_cursor
        self._follow_schema = follow_schema
        self._max_bytes = max_bytes
        self._max_wait = max_wait
        self._copiers: dict[Key, MirrorCopier] = {}
        self._lock = threading.Lock()

    def sync(self, leaders: Mapping[Key, Partition]) -> None:
        """Run a copier for each active mirror partition in ``leaders`` (those led here), and only those."""
        wanted = {
            key: partition
            for key, partition in leaders.items()
            if partition.config.mirror is not None and partition.config.mirror.active and partition.is_leader
        }
        with self._lock:
            for key, copier in list(self._copiers.items()):
                partition = wanted.get(key)
                current = (
                    partition is copier.partition
                    and partition.leader_epoch == copier.leader_epoch
                    and partition.config.mirror == copier.mirror
                )
                if current and (copier.running or copier.state == "stopped"):
                    continue
                copier.stop()
                del self._copiers[key]
            for key, partition in wanted.items():
                if key in self._copiers:
                    continue
                copier = MirrorCopier(
                    partition,
                    self._connector(partition.config.mirror),  # type: ignore[arg-type] # wanted: a mirror
                    self._write_cursor,
                    follow_schema=self._follow_schema,
                    max_bytes=self._max_bytes,
                    max_wait=self._max_wait,
                )
                self._copiers[key] = copier
                copier.start()

    def statuses(self) -> list[MirrorStatus]:
        """Each mirrored partition led here: how its copy stands."""
        with self._lock:
            copiers = sorted(self._copiers.items())
        return [copier.status() for _, copier in copiers]

    def close(self) -> None:
        """Stop every copier and wait for each (a read under way ends within its wait)."""
        with self._lock:
            copiers, self._copiers = list(self._copiers.values()), {}
        for copier in copiers:
            copier.stop()
        for copier in copiers:
            copier.stop(wait=True)
