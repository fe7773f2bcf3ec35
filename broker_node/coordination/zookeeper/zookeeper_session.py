"""A broker's session with ZooKeeper: connecting, the coordinator's threads, the lease.

Connecting waits however long ZooKeeper takes to come up (kazoo retries with
backoff), saying so every ``connect_timeout`` (:attr:`ZooKeeperSession.waiting`).

Sessions: ``SUSPENDED`` (the connection is lost; the session may live on) and
``LOST`` (it expired) are passed to session listeners on the ``zk-work``
thread, so a leader stops leading before anyone else can be elected (others
wait for the session to expire).  A broker also keeps a *lease*: the time
until which its session is surely alive, renewed by a round trip every
quarter of the session timeout (its registration's znode still owned by the
session); :meth:`ZooKeeperSession.lease_valid` is false once two thirds of the
session timeout have passed without one (after a process pause, say).  After
``LOST`` kazoo opens a new session; the broker registers again and reloads.

Threads: kazoo's own (connection state changes, watches); ``zk-work``, where
every reaction to ZooKeeper that writes runs, one at a time (:meth:`submit`);
``zk-lease``; and those the coordinator's other rooms start here
(:meth:`start_thread`), all stopped by :meth:`close`.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError, NodeExistsError

from .. import wire
from ..base import SessionListener, SessionState
from ..errors import CoordinationError
from ..zookeeper_config import ZooKeeperConfig
from .kazoo_client import new_client, tls_hint, warn_if_open
from .znodes import CONTROLLER_EPOCH, PERSISTENT, why

T = TypeVar("T")

logger = logging.getLogger(__name__)

RETRY_AFTER = 1.0
"""Seconds before campaigning or registering again after ZooKeeper failed us."""


class ZooKeeperSession:
    """The kazoo client, its session and lease, and the threads the coordinator runs on."""

    def __init__(self, settings: ZooKeeperConfig) -> None:
        self.settings = settings
        self.client: KazooClient | None = None
        """Connected under the cluster's chroot once :meth:`open` returns."""
        self.closed = threading.Event()
        """Set by :meth:`close` (and seen by every thread of the coordinator)."""
        self.waiting: str | None = None
        """While :meth:`open` waits for ZooKeeper: one line saying so."""
        self._work: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._listeners: list[SessionListener] = []
        self._lease_until = 0.0
        self._session_id: int | None = None
        self._lease_path: str | None = None

    def describe(self) -> str:
        """Where the metadata lives: ZooKeeper's hosts and the cluster's chroot."""
        return f"ZooKeeper at {self.settings.hosts}{self.settings.chroot}"

    # ---- opening and closing ------------------------------------------------------------------

    def open(self, then: Callable[[], None]) -> None:
        """Connect (retrying until connected or closed), make the chroot and the persistent folders,
        then run ``then`` (the broker's registration); on any failure the client is closed again."""
        settings = self.settings
        client = new_client(settings)
        self._connect(client)
        try:
            client.ensure_path(settings.chroot)
            if settings.digest:
                warn_if_open(client, settings.chroot)
            client.chroot = settings.chroot  # every path from here on is under the cluster's chroot
            self.client = client
            for path in PERSISTENT:
                client.ensure_path(path)
            with contextlib.suppress(NodeExistsError):
                client.create(CONTROLLER_EPOCH, wire.epoch_to_bytes(0))
            then()
        except BaseException as exc:
            self.client = None
            client.stop()
            client.close()
            if isinstance(exc, NoAuthError):
                raise CoordinationError(
                    f"ZooKeeper refused access to {self.describe()}: its znodes have an ACL that "
                    + (f"digest_user {settings.digest_user!r}" if settings.digest else "an anonymous client")
                    + " does not match (is [zookeeper] digest_user or its password file wrong?)"
                ) from None
            raise

    def _connect(self, client: KazooClient) -> None:
        """Connect ``client``, however long ZooKeeper takes to come up: kazoo retries with backoff,
        and every ``connect_timeout`` without a connection logs one line (and :attr:`waiting`
        says so, for the health check), so a whole site restarted in the wrong order heals
        itself.  ``CoordinationError`` if :meth:`close` is called meanwhile."""
        settings = self.settings
        connected = client.start_async()
        started = time.monotonic()
        next_line = started + settings.connect_timeout
        while not connected.wait(min(0.2, settings.connect_timeout)) or not client.connected:
            if self.closed.is_set():
                client.stop()
                client.close()
                self.waiting = None
                raise CoordinationError(f"stopped while waiting for ZooKeeper at {settings.hosts}")
            if time.monotonic() >= next_line:
                next_line += settings.connect_timeout
                self.waiting = (
                    f"waiting for ZooKeeper at {settings.hosts} for {time.monotonic() - started:.0f}s "
                    f"(retrying with backoff): is it running, and is [zookeeper] hosts right?"
                    f"{tls_hint(settings.tls)}"
                )
                logger.warning("%s", self.waiting)
        self.waiting = None

    def start_thread(self, target: Callable[[], None], name: str) -> None:
        """Run ``target`` on a daemon thread of its own, joined by :meth:`close`."""
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def start_work(self) -> None:
        """Start the ``zk-work`` and ``zk-lease`` threads."""
        self.start_thread(self._run_work, "zk-work")
        self.start_thread(self._run_lease, "zk-lease")

    def stop_work(self) -> None:
        """Mark the session closed (every thread winds down) and end the work queue."""
        self.closed.set()
        self._work.put(None)

    def close(self) -> None:
        """Close the connection (its ephemeral znodes go) and wait for the threads."""
        self.stop_work()
        if self.client is not None:
            try:
                self.client.stop()
                self.client.close()
            except KazooException:
                logger.exception("closing the ZooKeeper connection failed")
        for thread in self._threads:
            thread.join(5)

    def connected_client(self) -> KazooClient:
        """The client; ``CoordinationError`` before :meth:`open`."""
        if self.client is None:
            raise CoordinationError("the ZooKeeper coordinator is not started")
        return self.client

    def read(self, read: Callable[[], T]) -> T:
        """``read()``, its kazoo errors raised as ``CoordinationError`` naming ZooKeeper."""
        try:
            return read()
        except KazooException as exc:
            raise CoordinationError(f"cannot read {self.describe()}: {why(exc)}") from None

    # ---- the work thread --------------------------------------------------------------------

    def submit(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the ``zk-work`` thread, after what is queued there (a failure is logged)."""
        self._work.put(work)

    def retry_later(self, work: Callable[[], None]) -> None:
        """Queue ``work`` on the work thread after ``RETRY_AFTER`` seconds (unless closed by then)."""

        def queue_it() -> None:
            if not self.closed.is_set():
                self._work.put(work)

        timer = threading.Timer(RETRY_AFTER, queue_it)
        timer.daemon = True
        timer.start()

    def _run_work(self) -> None:
        while (work := self._work.get()) is not None:
            try:
                work()
            except Exception:
                logger.exception("coordinator work failed")

    # ---- session listeners --------------------------------------------------------------------

    def add_listener(self, listener: SessionListener) -> None:
        """Call ``listener`` with each new :class:`SessionState`, on the ``zk-work`` thread."""
        self._listeners.append(listener)

    def tell(self, state: SessionState) -> None:
        """Tell every session listener of ``state`` (one that raises is logged)."""
        for listener in self._listeners:
            try:
                listener(state)
            except Exception:
                logger.exception("session listener failed")

    # ---- the lease ----------------------------------------------------------------------------

    def session(self) -> tuple[int, bytes] | None:
        """The ZooKeeper session id and password (whoever holds them can expire the session)."""
        return self.client.client_id if self.client is not None else None

    def lease_valid(self) -> bool:
        """Whether this broker's session is surely alive now (see the module docstring)."""
        return time.monotonic() < self._lease_until

    def registered(self, path: str) -> None:
        """The current session now owns the broker's registration at ``path``: the lease begins."""
        self._session_id = self.connected_client().client_id[0]
        self._lease_path = path
        self.renew_lease()

    def is_new(self) -> bool:
        """Whether the session is another than the one the broker registered with (its
        ephemeral znodes are gone)."""
        return self.connected_client().client_id[0] != self._session_id

    def renew_lease(self, since: float | None = None) -> None:
        """The session was surely alive at ``since`` (now, by default)."""
        since = time.monotonic() if since is None else since
        self._lease_until = since + self.settings.session_timeout * 2 / 3

    def end_lease(self) -> None:
        """The session may be gone (the connection was lost): the lease ends now."""
        self._lease_until = 0.0

    def _run_lease(self) -> None:
        period = self.settings.session_timeout / 4
        while not self.closed.wait(period):
            client, path = self.client, self._lease_path
            if client is None or path is None:
                continue
            started = time.monotonic()
            try:
                stat = client.exists(path)
            except KazooException:
                continue
            session = client.client_id  # None once the connection is closed (a lost session)
            owner = None if stat is None else stat.ephemeralOwner
            if session is not None and owner == self._session_id == session[0]:
                self.renew_lease(started)
