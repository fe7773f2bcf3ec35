"""The outbox harvester: mark-purge/reset from a database table into streams.

One leader at a time (:mod:`.election`) runs a term:

1. **Mark** a batch: the first rows by id not marked by this term's
   ``leader_id`` (rows of a dead leader are salvaged this way); while marks
   come back full, those above the last mark's rows (:class:`.marks.Marks`).
2. For each row in id order: wait while ``max_in_flight`` rows are in flight
   (the throttle) and while a row of the same key is in flight (the barrier);
   then, unless a failure has been seen since the mark, add it to the batch
   of its stream and partition, each row with the message id
   ``<table>:<id>``.  A batch is **published** asynchronously as one Arrow
   batch (:meth:`Client.publish_batch` with ``message_ids``) when it is full
   (:data:`.in_flight.MAX_BATCH_ROWS`, :data:`.in_flight.MAX_BATCH_BYTES`), when a row must wait
   for a key or for the throttle, and when the marked rows are all placed.
   Rows of one key in the same batch keep their order in it, and the
   broker stores a batch whole or not at all.
3. On an ack (a duplicate ack too), **purge** the batch's rows (purges are
   batched).  On a failure, **reset** every row of the batch (``leader_id``
   back to NULL), raise ``force_remark``, then lower the barrier of its keys:
   the mark loop, which checks the flag after passing the barrier, starts a
   new ``leader_id``, so every unacknowledged row is marked again, in order.

Per-key order holds across failures and failovers because the rows of a key
in flight are always in one batch, in id order, and because a mark takes no
row while a lower id may still be committed (:mod:`.outbox_table`: on PostgreSQL,
transactions commit out of id order).  A row published twice (its
ack lost, or a new leader salvaging it) is stored once, because the broker
drops each row whose message id it stored within the stream's
``duplicate_window`` and stores the others: exactly once into the log within
that window.  Rows with a ``subject`` instead of a stream are published one
at a time, as are the rows of a batch the broker refused (below).

A batch the broker refuses (an error that is not retriable: unknown stream,
too large, not permitted) is taken apart: its rows are reset without counting
an attempt and published one at a time from then on, so that only the row at
fault is refused.  A row the broker refuses is retried with exponential backoff, and after
``max_attempts`` refusals moved to the dead-letter table.  While it is
retried, later rows of its key wait; once it is dead-lettered they move on
(the dead letter is out of order if requeued: it gets a new id, after them).
Timeouts and unreachable brokers are retried without limit and never
dead-letter a row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from pyspark_jetstream.client import Client
from pyspark_jetstream.protocol.errors import JetStreamError

from .election import (
    AdvisoryLockLeadership,
    FileLockLeadership,
    Leadership,
    ZooKeeperLeadership,
)
from .harvester_config import HarvesterConfig, HarvesterStatus
from .in_flight import InFlight
from .marks import Marks
from .outbox_table import SQLiteStore, UnavailableDatabaseError, open_store, sqlite_path
from .store_thread import StoreThread

logger = logging.getLogger(__name__)


class Harvester:
    """Publishes an outbox table's rows into streams, exactly once within the duplicate window."""

    def __init__(self, config: HarvesterConfig, *, identifier: str | None = None) -> None:
        self.config = config
        self.identifier = identifier or uuid.uuid4().hex[:12]
        self.status = HarvesterStatus()
        self._stop = asyncio.Event()
        self._client: Client | None = None
        self._marker = StoreThread(config, "mark")
        self._purger = StoreThread(config, "purge")
        self._purges: asyncio.Queue[list[int]] = asyncio.Queue()
        """The ids of each acked unit, to delete."""
        self._leadership = self._election()
        self.status.election = self._leadership.description
        self._in_flight = InFlight(
            config,
            self.status,
            self._purger,
            self._purges,
            stop=self._stop,
            confirmed=self._leadership.confirmed,
        )

    def _election(self) -> Leadership:
        config = self.config
        if config.zookeeper:
            return ZooKeeperLeadership(config.zookeeper, config.table, self.identifier, config.deadline)
        if config.database.startswith("sqlite:"):
            return FileLockLeadership(sqlite_path(config.database), config.table, config.deadline)
        return AdvisoryLockLeadership(config.database, config.table, config.deadline)

    def stop(self) -> None:
        """Ask :meth:`run` to finish (in-flight acks are waited for, up to ``shutdown_timeout``)."""
        self._stop.set()

    async def run(self) -> None:
        """Stand by, lead when elected, until :meth:`stop`."""
        config = self.config
        self._client = self._in_flight.client = await Client.connect(
            nats_urls=[u.strip() for u in config.nats.split(",") if u.strip()],
            broker=config.servers or None,
            timeout=config.ack_timeout,
            max_pending=max(config.max_in_flight, 4000),
            credentials=config.credentials(),
        )
        purging = asyncio.create_task(self._purging())
        reporting = asyncio.create_task(self._reporting())
        try:
            while not self._stop.is_set():
                if not await self._until_stopped(self._leadership.acquire()):
                    break
                try:
                    await self._term()
                finally:
                    await self._leadership.release()
                    self.status.role = "standby"
        finally:
            await self._in_flight.drain()
            purging.cancel()
            reporting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await purging
            await self._purge_now()
            with contextlib.suppress(asyncio.CancelledError):
                await reporting
            await self._client.close()
            await self._marker.close()
            await self._purger.close()

    async def _until_stopped(self, work: Any) -> bool:
        """Run ``work`` unless :meth:`stop` comes first; whether it finished."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            stopping.cancel()
            task.result()
            return True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False

    async def _term(self) -> None:
        """Lead: mark and publish while leadership is confirmed."""
        status = self.status
        status.role, status.terms = "leader", status.terms + 1
        leader_id = self._new_leader_id()
        self._in_flight.new_term()
        logger.info("outbox harvester %s leads (%s)", self.identifier, self._leadership.description)
        marks = Marks(self._marker, self.config.batch_size)
        try:
            while not self._stop.is_set() and self._leadership.confirmed():
                if self._in_flight.force_remark:
                    self._in_flight.force_remark = False
                    leader_id = self._new_leader_id()
                try:
                    records = await marks.next(leader_id)
                except UnavailableDatabaseError as exc:
                    status.last_error = str(exc)
                    logger.warning("outbox: %s", exc)
                    # The mark may have been committed before the connection was lost: its rows are
                    # marked by this leader id, and only a new one marks them again.
                    self._in_flight.force_remark = True
                    await self._pause(self.config.backoff)
                    continue
                if not records:
                    await self._pause(self.config.poll)
                    continue
                await self._in_flight.publish_all(records)
        finally:
            await marks.drop()  # their rows stay marked by this term: the next leader marks them again
        if not self._leadership.confirmed() and not self._stop.is_set():
            logger.warning(
                "outbox harvester %s cannot confirm its leadership: it stops publishing", self.identifier
            )
        await self._in_flight.drain()

    def _new_leader_id(self) -> str:
        self._in_flight.new_leader_id()
        self.status.leader_id = f"{self.identifier}-{uuid.uuid4().hex[:12]}"
        return self.status.leader_id

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _purging(self) -> None:
        """Delete acked rows in batches."""
        while True:
            first = await self._purges.get()
            await self._purge_now(first)

    async def _purge_now(self, ids: list[int] | None = None) -> None:
        ids = list(ids or [])
        while not self._purges.empty() and len(ids) < 5000:
            ids.extend(self._purges.get_nowait())
        while ids:
            try:
                await self._purger.run("purge", ids)
                return
            except JetStreamError as exc:  # keep them: a row not purged is published again, then dropped
                self.status.last_error = str(exc)
                logger.warning("outbox: cannot purge %d rows yet: %s", len(ids), exc)
                if self._stop.is_set():
                    return
                await asyncio.sleep(self.config.backoff)

    async def _reporting(self) -> None:
        while True:
            await asyncio.sleep(self.config.report_every)
            try:
                self.status.backlog = await self._purger.run("backlog")
            except JetStreamError as exc:
                self.status.last_error = str(exc)
            s = self.status
            logger.info(
                "outbox %s: %s, backlog %s, in flight %d, published %d (duplicates %d), failures %d, "
                "dead letters %d",
                self.identifier,
                s.role,
                s.backlog,
                s.in_flight,
                s.published,
                s.duplicates,
                s.failures,
                s.dead_lettered,
            )


def init_outbox(database: str, table: str = "outbox") -> None:
    """Create the outbox and dead-letter tables (``jetstream outbox init``)."""
    store = open_store(database, table)
    try:
        store.init()
    finally:
        store.close()


__all__ = ["Harvester", "HarvesterConfig", "HarvesterStatus", "SQLiteStore", "init_outbox"]
