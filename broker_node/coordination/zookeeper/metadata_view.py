"""What a broker reads of the cluster's metadata: a snapshot of the whole tree, kept fresh.

Reads come from a snapshot of the whole tree (brokers, controller, streams,
tombstones, brokers shutting down), reloaded on the ``zk-metadata`` thread
whenever a watch fires, and at least every :data:`RELOAD_EVERY` seconds.
Listeners are called on that thread after each reload that changed anything.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import KazooException

from ..base import BrokerInfo, Listener, StreamMetadata
from ..errors import CoordinationError
from .znodes import DELETED, SHUTDOWN, read_brokers, read_controller, read_streams, why
from .zookeeper_session import ZooKeeperSession

logger = logging.getLogger(__name__)

RELOAD_EVERY = 10.0
"""Seconds between reloads when no watch fires (a safety net, not the mechanism)."""


@dataclass(frozen=True)
class Snapshot:
    """The cluster's metadata as one reload found it."""

    brokers: dict[str, BrokerInfo] = field(default_factory=dict)
    controller: str | None = None
    streams: dict[str, StreamMetadata] = field(default_factory=dict)
    deleted: frozenset[str] = frozenset()
    shutting_down: frozenset[str] = frozenset()
    registrations: dict[str, int] = field(default_factory=dict)
    """Each broker znode's creation id: a broker that restarted differs here alone."""


class MetadataView:
    """The latest :class:`Snapshot`, its reloads and the listeners told of its changes.

    ``reloaded(changed)`` is called after every reload (before the listeners), so
    that the controller can reconcile.
    """

    def __init__(self, session: ZooKeeperSession, reloaded: Callable[[bool], None]) -> None:
        self._session = session
        self._reloaded = reloaded
        self._reload = threading.Event()
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self.snapshot = Snapshot()
        """The latest snapshot (replaced whole, never changed)."""

    def start(self) -> None:
        """Read the snapshot (watching every znode of it), and reload from then on, on ``zk-metadata``."""
        self._session.start_thread(self._run_reloads, "zk-metadata")
        self.snapshot = self.read(watch=True)

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` after each reload that changed anything, on the ``zk-metadata`` thread."""
        self._listeners.append(listener)

    def wake(self) -> None:
        """Reload soon (on the ``zk-metadata`` thread); a closed session's thread stops instead."""
        self._reload.set()

    def refresh(self) -> None:
        """Reload the snapshot now (after losing a compare-and-set, say) and notify listeners.

        ``CoordinationError`` when ZooKeeper cannot be read now (the watches
        reload it once it can).
        """
        try:
            snapshot = self.read(watch=False)
        except KazooException as exc:
            raise CoordinationError(
                f"cannot read the metadata from {self._session.describe()}: {why(exc)}"
            ) from None
        self._apply(snapshot)

    def read(self, *, watch: bool) -> Snapshot:
        """A fresh snapshot from ZooKeeper (``watch``: every znode read is watched)."""
        client = self._session.connected_client()
        w = self._on_watch if watch else None
        brokers, registrations = read_brokers(client, w)
        return Snapshot(
            brokers=brokers,
            controller=read_controller(client, w),
            streams=read_streams(client, w),
            deleted=frozenset(client.get_children(DELETED, watch=w)),
            shutting_down=frozenset(client.get_children(SHUTDOWN, watch=w)),
            registrations=registrations,
        )

    def _on_watch(self, event: Any) -> None:
        self._reload.set()

    def _run_reloads(self) -> None:
        closed = self._session.closed
        while not closed.is_set():
            self._reload.wait(RELOAD_EVERY)
            if closed.is_set():
                return
            self._reload.clear()
            try:
                self._apply(self.read(watch=True))
            except KazooException as exc:
                logger.warning("reading the metadata from ZooKeeper failed (%s); retrying", why(exc))
                closed.wait(0.5)
                self._reload.set()

    def _apply(self, snapshot: Snapshot) -> None:
        with self._lock:
            changed = snapshot != self.snapshot
            self.snapshot = snapshot
        self._reloaded(changed)
        if changed:
            for listener in self._listeners:
                try:
                    listener()
                except Exception:
                    logger.exception("metadata listener failed")
