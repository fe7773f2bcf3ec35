"""Who harvests: one leader at a time, through ZooKeeper or the database's own lock.

Each kind gives :class:`Leadership`: ``acquire`` returns once this process
leads, ``confirmed`` says whether it may still mark and publish, ``release``
gives leadership up.  The rule that keeps two leaders from publishing at once
(NELI, from goharvest's design): a leader that cannot confirm its leadership
within ``deadline`` seconds stops by itself, and a new leader waits
``deadline`` seconds after winning before it marks anything, by which time the
old one has stopped.

- ZooKeeper (kazoo's ``Election`` recipe under ``/pyspark-jetstream/outbox/<table>``):
  a suspended session stops publishing at once; a lost one ends the term.
- PostgreSQL: ``pg_try_advisory_lock`` held on a connection of its own,
  confirmed every ``deadline / 3`` seconds; a failed or late confirmation ends
  the term (the server drops the lock with the connection).
- SQLite: an exclusive ``flock`` on ``<database>.harvester-lock`` (the file
  lock goes with the process, so it cannot be lost while held).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import threading
import time
from typing import Any, Protocol

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.2
"""How often a standby tries to become leader."""


class Leadership(Protocol):
    """One harvester's claim to lead."""

    description: str

    async def acquire(self) -> None: ...
    def confirmed(self) -> bool: ...
    async def release(self) -> None: ...


class FileLockLeadership:
    """SQLite's election: an exclusive lock on a file beside the database."""

    def __init__(self, database_path: str, table: str, deadline: float) -> None:
        self.path = f"{database_path}.{table}.harvester-lock"
        self.deadline = deadline
        self.description = f"file lock {self.path}"
        self._fd: int | None = None

    async def acquire(self) -> None:
        """Wait for the lock, then the takeover wait."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(POLL_SECONDS)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        await asyncio.sleep(self.deadline)

    def confirmed(self) -> bool:
        """A held file lock cannot be taken away."""
        return self._fd is not None

    async def release(self) -> None:
        """Unlock."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class AdvisoryLockLeadership:
    """PostgreSQL's election: an advisory lock on a connection held for the term."""

    def __init__(self, dsn: str, table: str, deadline: float) -> None:
        self.dsn = dsn
        self.deadline = deadline
        digest = hashlib.sha256(f"pyspark-jetstream-outbox:{table}".encode()).digest()
        self.key = int.from_bytes(digest[:8], "big", signed=True)
        self.description = f"PostgreSQL advisory lock {self.key}"
        self._db: Any = None
        self._confirmed_at = 0.0
        self._lost = True
        self._watch: asyncio.Task[None] | None = None

    async def acquire(self) -> None:
        """Take the lock (retrying while another holds it or the database is down), then wait."""
        import psycopg

        while True:
            try:
                if self._db is None:
                    self._db = await asyncio.to_thread(
                        psycopg.connect, self.dsn, autocommit=True, connect_timeout=max(1, int(self.deadline))
                    )
                held = await asyncio.to_thread(self._query, "SELECT pg_try_advisory_lock(%s)", self.key)
                if held:
                    break
            except psycopg.Error as exc:
                logger.warning("outbox election: %s: %s", self.description, exc)
                self._drop()
            await asyncio.sleep(POLL_SECONDS)
        self._lost = False
        self._confirmed_at = time.monotonic()
        self._watch = asyncio.create_task(self._confirming())
        await asyncio.sleep(self.deadline)

    def confirmed(self) -> bool:
        """The lock's connection answered within the deadline."""
        return not self._lost and time.monotonic() - self._confirmed_at < self.deadline

    async def release(self) -> None:
        """Stop confirming and close the connection (which drops the lock)."""
        self._lost = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        self._drop()

    async def _confirming(self) -> None:
        import psycopg

        while not self._lost:
            await asyncio.sleep(self.deadline / 3)
            try:
                held = await asyncio.wait_for(
                    asyncio.to_thread(
                        self._query,
                        "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' "
                        "AND pid = pg_backend_pid() AND granted",
                    ),
                    timeout=self.deadline / 2,
                )
            except (psycopg.Error, TimeoutError) as exc:
                logger.warning(
                    "outbox election: cannot confirm the %s: %s", self.description, exc or "timeout"
                )
                self._lost = True
                return
            if not held:
                logger.warning("outbox election: the %s is no longer held", self.description)
                self._lost = True
                return
            self._confirmed_at = time.monotonic()

    def _query(self, sql: str, *params: object) -> object:
        row = self._db.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def _drop(self) -> None:
        if self._db is not None:
            with contextlib.suppress(Exception):
                self._db.close()
            self._db = None


class ZooKeeperLeadership:
    """ZooKeeper's election: kazoo's ``Election`` recipe, its term run in a thread."""

    def __init__(self, hosts: str, table: str, identifier: str, deadline: float) -> None:
        self.hosts = hosts
        self.deadline = deadline
        self.path = f"/pyspark-jetstream/outbox/{table}"
        self.description = f"ZooKeeper election {hosts}{self.path}"
        self._zk: Any = None
        self._election: Any = None
        self._identifier = identifier
        self._elected = threading.Event()
        self._step_down = threading.Event()
        self._connected = False
        self._thread: threading.Thread | None = None

    async def acquire(self) -> None:
        """Join the election; return once elected and past the takeover wait.

        A ZooKeeper that cannot be reached, or a session lost before this
        process is elected, means trying again after a pause.
        """
        while not await self._campaign_once():
            await self.release()
            await asyncio.sleep(POLL_SECONDS)
        await asyncio.sleep(self.deadline)

    async def _campaign_once(self) -> bool:
        from kazoo.client import KazooClient
        from kazoo.handlers.threading import KazooTimeoutError

        self._elected.clear()
        self._step_down.clear()
        self._zk = KazooClient(hosts=self.hosts, timeout=max(self.deadline, 1.0))
        self._zk.add_listener(self._on_state)
        try:
            await asyncio.to_thread(self._zk.start, self.deadline * 4)
        except KazooTimeoutError as exc:
            logger.warning("outbox election: %s: %r", self.description, exc)
            return False
        self._connected = True
        self._election = self._zk.Election(self.path, self._identifier)
        self._thread = threading.Thread(
            target=self._campaign, args=(self._election,), daemon=True, name="outbox-election"
        )
        self._thread.start()
        while not await asyncio.to_thread(self._elected.wait, POLL_SECONDS):
            if self._step_down.is_set():
                return False
        return True

    def confirmed(self) -> bool:
        """Elected, and the session connected now."""
        return self._elected.is_set() and self._connected and not self._step_down.is_set()

    async def release(self) -> None:
        """Leave the election (and close the session)."""
        self._step_down.set()
        if self._election is not None:
            with contextlib.suppress(Exception):
                self._election.cancel()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, self.deadline * 4)
        if self._zk is not None:
            zk, self._zk = self._zk, None
            await asyncio.to_thread(zk.stop)
            await asyncio.to_thread(zk.close)

    def _campaign(self, election: Any) -> None:
        """Run the election recipe; a session that breaks under it ends the term, logged."""
        from kazoo.exceptions import KazooException

        try:
            election.run(self._term)
        except KazooException as exc:
            logger.warning("outbox election: %s: %r", self.description, exc)
        finally:
            self._elected.clear()
            self._step_down.set()

    def _term(self) -> None:
        self._elected.set()
        self._step_down.wait()
        self._elected.clear()

    def _on_state(self, state: str) -> None:
        from kazoo.protocol.states import KazooState

        if state == KazooState.SUSPENDED:
            self._connected = False
        elif state == KazooState.CONNECTED:
            self._connected = True
        elif state == KazooState.LOST:
            self._connected = False
            self._step_down.set()
