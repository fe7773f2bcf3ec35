"""The outbox harvester: mark-purge/reset from a database table into streams.

One leader at a time (:mod:`.election`) runs a term:

1. **Mark** a batch: the first rows by id not marked by this term's
   ``leader_id`` (rows of a dead leader are salvaged this way); while marks
   come back full, those above the last mark's rows (:class:`_Marks`).
2. For each row in id order: wait while ``max_in_flight`` rows are in flight
   (the throttle) and while a row of the same key is in flight (the barrier);
   then, unless a failure has been seen since the mark, add it to the batch
   of its stream and partition, each row with the message id
   ``<table>:<id>``.  A batch is **published** asynchronously as one Arrow
   batch (:meth:`Client.publish_batch` with ``message_ids``) when it is full
   (:data:`MAX_BATCH_ROWS`, :data:`MAX_BATCH_BYTES`), when a row must wait
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
row while a lower id may still be committed (:mod:`.store`: on PostgreSQL,
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
import time
import tomllib
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pyarrow as pa

from pyspark_jetstream.client import AckPolicy, Client, Credentials
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    UnavailableError,
    error_from_code,
)
from pyspark_jetstream.protocol.schema import HEADER_TYPE

from .election import (
    AdvisoryLockLeadership,
    FileLockLeadership,
    Leadership,
    ZooKeeperLeadership,
)
from .store import (
    Record,
    SQLiteStore,
    Store,
    UnavailableDatabaseError,
    checked_table,
    open_store,
    sqlite_path,
)

logger = logging.getLogger(__name__)

ACKED_MEMORY = 100_000
"""Ids acked in this term that a re-mark will not publish again (the broker would drop them anyway)."""
RESCAN_EVERY = 100
"""While marks come back full, a mark takes the rows above the last one's, except every this many
marks, which takes them from the table's first row again (see :class:`_Marks`)."""
MAX_BATCH_ROWS = 1000
"""Rows published as one batch at most."""
MAX_BATCH_BYTES = 512 * 1024
"""A batch is published once its rows hold this many bytes (NATS's default max_payload is 1 MiB)."""


@dataclass(frozen=True, slots=True)
class HarvesterConfig:
    """What ``jetstream outbox run --config FILE`` reads from the file's ``[outbox]`` table."""

    database: str
    """``sqlite:///path/outbox.db`` or ``postgresql://user@host:port/db``."""
    table: str = "outbox"
    nats: str = ""
    """NATS servers, comma-separated (required): rows are published there, and a broker is found there."""
    servers: str = ""
    """A broker's Flight address (grpc://host:port), if it cannot be found through NATS."""
    zookeeper: str = ""
    """ZooKeeper hosts: elect the leader there instead of with the database's lock."""
    batch_size: int = 500
    max_in_flight: int = 1000
    max_attempts: int = 5
    backoff: float = 0.5
    max_backoff: float = 30.0
    deadline: float = 5.0
    """NELI: a leader that cannot confirm its leadership for this long stops; a new one waits this long."""
    poll: float = 0.05
    """Seconds between marks while the outbox is empty."""
    ack_timeout: float = 30.0
    shutdown_timeout: float = 10.0
    ack_policy: str = "all"
    report_every: float = 10.0
    credentials_file: str = ""
    """A credentials file (TOML: ``user``, ``token``, ``tls_ca``, ``tls_cert``, ``tls_key``) for a
    secured deployment; the keys below override its values."""
    user: str = ""
    token: str = field(default="", repr=False)
    """The user's token; better kept in ``credentials_file``, readable by the harvester alone."""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""

    def __post_init__(self) -> None:
        checked_table(self.table)
        self.credentials()  # a missing file or a user without its token fails here, naming it
        if not self.nats.strip():
            raise InvalidArgumentError(
                "outbox: 'nats' is required (nats://host:port[,...]): rows are published through NATS"
            )
        for name, low, high in (
            ("batch_size", 1, 100_000),
            ("max_in_flight", 1, 1_000_000),
            ("max_attempts", 1, 1_000),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise InvalidArgumentError(
                    f"outbox: {name} must be an integer from {low} to {high}, got {value!r}"
                )
        for name in (
            "backoff",
            "max_backoff",
            "deadline",
            "poll",
            "ack_timeout",
            "shutdown_timeout",
            "report_every",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 3600:
                raise InvalidArgumentError(f"outbox: {name} must be seconds from 0 to 3600, got {value!r}")
        if self.ack_policy not in ("leader", "all"):
            raise InvalidArgumentError(f"outbox: ack_policy must be leader or all, got {self.ack_policy!r}")

    def credentials(self) -> Credentials:
        """What the harvester presents to NATS and the brokers (empty: an unsecured deployment)."""
        for name in ("credentials_file", "user", "token", "tls_ca", "tls_cert", "tls_key"):
            if not isinstance(getattr(self, name), str):
                raise InvalidArgumentError(f"outbox: {name} must be a string")
        try:
            return Credentials.from_options(
                {
                    "credentialsFile": self.credentials_file,
                    "user": self.user,
                    "token": self.token,
                    "tls.ca": self.tls_ca,
                    "tls.cert": self.tls_cert,
                    "tls.key": self.tls_key,
                }
            )
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"outbox: {exc}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> HarvesterConfig:
        """The ``[outbox]`` table of a TOML file; unknown keys are errors naming them."""
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgumentError(f"outbox config {path}: {exc}") from None
        section = data.get("outbox")
        if not isinstance(section, dict):
            raise InvalidArgumentError(f"outbox config {path}: no [outbox] table")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise InvalidArgumentError(
                f"outbox config {path}: unknown key(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        if "database" not in section:
            raise InvalidArgumentError(f"outbox config {path}: 'database' is required")
        return cls(**section)


@dataclass(slots=True)
class HarvesterStatus:
    """What the harvester reports (``status()``, and its log every ``report_every`` seconds)."""

    role: str = "standby"
    leader_id: str = ""
    backlog: int | None = None
    in_flight: int = 0
    published: int = 0
    duplicates: int = 0
    failures: int = 0
    dead_lettered: int = 0
    terms: int = 0
    election: str = ""
    last_error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class _Connection:
    """A store used from one thread of its own (database connections are not thread-safe)."""

    def __init__(self, config: HarvesterConfig, name: str) -> None:
        self.config = config
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"outbox-{name}")
        self._store: Store | None = None

    def run(self, call: str | Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """The store's method ``call``, or ``call(store, *args)``, on the connection's thread: handed
        to it now, not once the result is awaited."""
        return asyncio.get_running_loop().run_in_executor(self._pool, self._call, call, args)

    def _call(self, call: str | Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if self._store is None:
            self._store = open_store(self.config.database, self.config.table)
        try:
            return getattr(self._store, call)(*args) if isinstance(call, str) else call(self._store, *args)
        except UnavailableDatabaseError:
            with contextlib.suppress(Exception):
                self._store.close()
            self._store = None
            raise

    async def close(self) -> None:
        def close() -> None:
            if self._store is not None:
                self._store.close()
                self._store = None

        await asyncio.get_running_loop().run_in_executor(self._pool, close)
        self._pool.shutdown(wait=True)


class _Marks:
    """The marks of a term, in order, each taken on the mark connection's thread as soon as the one
    before it is done while marks come back full: the database takes the next rows while the
    event loop publishes these (a mark waiting for the loop to ask for it lost a third of the time).

    A mark takes the rows above the last row of the mark before it under the same leader id, when
    that one was full.  Below that, every row was marked by this leader id, except one a transaction
    held locked when a mark passed it (SKIP LOCKED) or another harvester marked meanwhile: those
    wait for a mark from the first row, which follows a mark that was not full, follows every
    :data:`RESCAN_EVERY`-th mark, and comes with each new leader id.  (A row passed while locked
    is published after the later rows of its key marked meanwhile, as it was before the bound, only
    with more of them: the marks until the next one from the first row.)  Without the bound, each
    mark passed again the rows in flight and the dead row versions that marks and purges leave
    until PostgreSQL vacuums them: 500 rows took 6-7 ms to mark on a fresh table, 14-23 ms after
    400,000.

    A mark queued behind one that was not full, or under a leader id no longer current, is skipped
    if it has not started (no rows are marked for nothing, and the loop does not wait a poll for a
    mark taken before the last rows were committed); one that has started is awaited.
    """

    AHEAD = 2
    """Marks queued at most: the one the loop waits for next, and the one after it."""

    def __init__(self, connection: _Connection, limit: int) -> None:
        self._connection = connection
        self._limit = limit
        self._queued: deque[tuple[str, asyncio.Future[list[Record] | None]]] = deque()
        self._tickets = 0
        """Marks queued so far; each carries its number."""
        self._skip_through = 0
        """Marks numbered up to this one are skipped if they have not started (set on the loop)."""
        # Read and written on the mark connection's thread alone:
        self._leader_id = ""
        self._after = 0
        self._count = 0

    async def next(self, leader_id: str) -> list[Record]:
        """The next rows marked for ``leader_id`` (marks queued under an older one are dropped)."""
        while True:
            if self._queued and self._queued[0][0] != leader_id:
                await self.drop()
            if not self._queued:
                self._queue(leader_id)
            _, marked = self._queued[0]
            try:
                records = await marked
            finally:
                self._queued.popleft()
            if records is not None:
                break
        if len(records) == self._limit:
            while len(self._queued) < self.AHEAD:
                self._queue(leader_id)
        else:
            self._skip_through = self._tickets
        return records

    async def drop(self) -> None:
        """Skip the marks queued that have not started; wait for the others, and drop their rows
        (marked by a leader id that is no longer current, or by a term that ends: they are
        marked again under the next)."""
        self._skip_through = self._tickets
        while self._queued:
            _, marked = self._queued.popleft()
            await asyncio.wait({marked})

    def _queue(self, leader_id: str) -> None:
        self._tickets += 1
        marked = self._connection.run(self._mark, leader_id, self._tickets)
        marked.add_done_callback(_retrieved)
        self._queued.append((leader_id, marked))

    def _mark(self, store: Store, leader_id: str, ticket: int) -> list[Record] | None:
        """On the connection's thread: the mark after the last one (``None``: skipped)."""
        if ticket <= self._skip_through:
            return None
        if leader_id != self._leader_id:
            self._leader_id, self._after = leader_id, 0
        self._after, after = 0, self._after  # a mark that fails leaves the next to start from the first row
        records = store.mark(leader_id, self._limit, after)
        self._count += 1
        self._after = next_mark_after(records, self._limit, self._count)
        return records


def next_mark_after(records: list[Record], limit: int, count: int) -> int:
    """Where the mark after ``records`` (the ``count``-th mark of at most ``limit`` rows) starts:
    above their last row if they were a full mark, else (0) from the table's first row, as after
    every :data:`RESCAN_EVERY`-th mark."""
    return records[-1].id if len(records) == limit and count % RESCAN_EVERY else 0


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A mark's failure is reported by the one awaiting it; one dropped is not reported at all."""
    if not future.cancelled():
        future.exception()


@dataclass(eq=False)
class _Unit:
    """Rows published together (one batch, or one row), and the barrier of their keys."""

    records: list[Record]
    target: tuple[str, int] | None
    """The batch's stream and partition; ``None``: one row published on its own."""
    released: asyncio.Event = field(default_factory=asyncio.Event)
    size: int = 0


class Harvester:
    """Publishes an outbox table's rows into streams, exactly once within the duplicate window."""

    def __init__(self, config: HarvesterConfig, *, identifier: str | None = None) -> None:
        self.config = config
        self.identifier = identifier or uuid.uuid4().hex[:12]
        self.status = HarvesterStatus()
        self._stop = asyncio.Event()
        self._client: Client | None = None
        self._marker = _Connection(config, "mark")
        self._purger = _Connection(config, "purge")
        self._in_flight = 0
        self._keys: dict[bytes, _Unit] = {}
        """The unit each key in flight (or waiting in a batch about to be published) is in."""
        self._solo: set[int] = set()
        """Rows of refused batches: published one at a time until acked or dead-lettered."""
        self._space = asyncio.Condition()
        self._force_remark = False
        self._retry_at: dict[bytes | None, float] = {}
        self._held: set[bytes | None] = set()
        """Keys whose refused row waits for its retry under this leader id: their later rows wait
        too, in this mark and the next ones, until a new leader id marks the refused row again."""
        self._acked: OrderedDict[int, None] = OrderedDict()
        self._purges: asyncio.Queue[list[int]] = asyncio.Queue()
        """The ids of each acked unit, to delete."""
        self._settling: set[asyncio.Task[None]] = set()
        self._leadership = self._election()
        self.status.election = self._leadership.description

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
        self._client = await Client.connect(
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
            await self._drain()
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
        self._force_remark = False
        self._acked.clear()
        logger.info("outbox harvester %s leads (%s)", self.identifier, self._leadership.description)
        marks = _Marks(self._marker, self.config.batch_size)
        try:
            while not self._stop.is_set() and self._leadership.confirmed():
                if self._force_remark:
                    self._force_remark = False
                    leader_id = self._new_leader_id()
                try:
                    records = await marks.next(leader_id)
                except UnavailableDatabaseError as exc:
                    status.last_error = str(exc)
                    logger.warning("outbox: %s", exc)
                    # The mark may have been committed before the connection was lost: its rows are
                    # marked by this leader id, and only a new one marks them again.
                    self._force_remark = True
                    await self._pause(self.config.backoff)
                    continue
                if not records:
                    await self._pause(self.config.poll)
                    continue
                await self._publish_all(records)
        finally:
            await marks.drop()  # their rows stay marked by this term: the next leader marks them again
        if not self._leadership.confirmed() and not self._stop.is_set():
            logger.warning(
                "outbox harvester %s cannot confirm its leadership: it stops publishing", self.identifier
            )
        await self._drain()

    def _new_leader_id(self) -> str:
        self._held.clear()  # every row held back is marked again under the new id, in order
        self.status.leader_id = f"{self.identifier}-{uuid.uuid4().hex[:12]}"
        return self.status.leader_id

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _publish_all(self, records: list[Record]) -> None:
        """Publish a marked batch in id order, within the throttle and the per-key barrier."""
        held_back: set[bytes | None] = set()
        filling: dict[tuple[str, int], _Unit] = {}
        try:
            for record, target in zip(records, await self._targets(records), strict=True):
                if record.id in self._acked:
                    continue
                if self._in_flight >= self.config.max_in_flight:
                    await self._send_all(filling)
                    async with self._space:
                        await self._space.wait_for(lambda: self._in_flight < self.config.max_in_flight)
                if record.key is not None:
                    while (holder := self._keys.get(record.key)) is not None:
                        if target is not None and holder is filling.get(target):
                            break  # the key's rows are in this batch: the row joins them, in order
                        await self._send_all(filling)
                        await holder.released.wait()
                if self._force_remark or self._stop.is_set() or not self._leadership.confirmed():
                    return  # an older row is back in the outbox: mark again from the top
                wait_until = self._retry_at.get(record.key)
                if record.key in self._held or (wait_until is not None and wait_until > time.monotonic()):
                    # This key's refused row waits, and so do the rows after it, also those of the
                    # next marks: its retry may come due before the remark below, and a later row
                    # published then would overtake the rows still marked by this leader id.
                    self._held.add(record.key)
                    held_back.add(record.key)
                    continue
                unit = filling.get(target) if target is not None else None
                if unit is None:
                    unit = _Unit([], target)
                    if target is not None:
                        filling[target] = unit
                self._in_flight += 1
                self.status.in_flight = self._in_flight
                unit.records.append(record)
                unit.size += len(record.value) + len(record.key or b"")
                if record.key is not None:
                    self._keys[record.key] = unit
                if target is None:
                    await self._send(unit)
                elif len(unit.records) >= MAX_BATCH_ROWS or unit.size >= MAX_BATCH_BYTES:
                    del filling[target]
                    await self._send(unit)
            await self._send_all(filling)
        finally:
            for unit in filling.values():  # left unpublished, still marked: a new leader id marks them again
                self._release(unit)
        if held_back:
            # Rows held back stay marked by this term; come back to them when the first wait ends.
            soonest = min(self._retry_at.get(k, 0.0) for k in held_back)
            asyncio.get_running_loop().call_later(max(soonest - time.monotonic(), 0.0), self._remark)

    async def _targets(self, records: list[Record]) -> list[tuple[str, int] | None]:
        """The stream and partition of the batch each row joins (``None``: published alone), each
        stream looked up once."""
        assert self._client is not None
        targets: list[tuple[str, int] | None] = [None] * len(records)
        rows_of: dict[str, list[int]] = {}
        for row, record in enumerate(records):
            if record.stream is not None and record.subject is None and record.id not in self._solo:
                rows_of.setdefault(record.stream, []).append(row)
        for stream, rows in rows_of.items():
            try:
                partitions = await self._client.partitions_for(stream, [records[r].key for r in rows])
            except JetStreamError:
                continue  # published alone, their publishes fail with the reason, naming each row
            for row, partition in zip(rows, partitions, strict=True):
                targets[row] = (stream, partition)
        return targets

    async def _send_all(self, filling: dict[tuple[str, int], _Unit]) -> None:
        units = list(filling.values())
        filling.clear()
        for unit in units:
            await self._send(unit)

    def _remark(self) -> None:
        self._force_remark = True

    async def _send(self, unit: _Unit) -> None:
        assert self._client is not None
        ack_policy = AckPolicy.ALL if self.config.ack_policy == "all" else AckPolicy.LEADER
        table = self.config.table
        try:
            if unit.target is None:
                (record,) = unit.records
                future = await self._client.publish_async(
                    record.stream,
                    record.value,
                    key=record.key,
                    subject=record.subject,
                    headers={k: v.encode() for k, v in record.headers.items()},
                    message_id=f"{table}:{record.id}",
                    ack_policy=ack_policy,
                    timeout=self.config.ack_timeout,
                )
            else:
                stream, partition = unit.target
                future = await self._client.publish_batch_async(
                    stream,
                    _batch_of(unit.records),
                    partition=partition,
                    message_ids=[f"{table}:{r.id}" for r in unit.records],
                    ack_policy=ack_policy,
                    timeout=self.config.ack_timeout,
                )
        except JetStreamError as exc:
            self._settle_later(unit, None, exc)
            return
        except Exception as exc:  # noqa: BLE001 - anything else that refuses these rows is a refusal too
            self._settle_later(unit, None, JetStreamError(f"{type(exc).__name__}: {exc}"))
            return
        assert future is not None
        future.add_done_callback(lambda done: self._settle_later(unit, done, None))

    def _settle_later(
        self, unit: _Unit, done: asyncio.Future[Any] | None, error: JetStreamError | None
    ) -> None:
        if done is not None and done.cancelled():
            error = UnavailableError("the publish was cancelled")
        elif done is not None:
            failure = done.exception()
            if failure is not None:
                error = failure if isinstance(failure, JetStreamError) else JetStreamError(str(failure))
            elif not done.result().ok:  # a negative ack: the broker refused the rows
                ack = done.result()
                error = error_from_code(ack.error.value, f"{ack.stream}/{ack.partition}: {ack.message}")
        task = asyncio.ensure_future(self._settle(unit, None if error else done, error))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(
        self, unit: _Unit, done: asyncio.Future[Any] | None, error: JetStreamError | None
    ) -> None:
        """Purge on an ack; on a failure reset the rows, raise ``force_remark``, then lower the barrier."""
        status = self.status
        try:
            if error is None:
                assert done is not None
                ack = done.result()
                status.published += len(unit.records)
                status.duplicates += len(ack.duplicates) or (len(unit.records) if ack.duplicate else 0)
                ids = [record.id for record in unit.records]
                self._acked.update(dict.fromkeys(ids))
                if self._solo:
                    self._solo.difference_update(ids)
                if self._retry_at:
                    for record in unit.records:
                        self._retry_at.pop(record.key, None)
                self._purges.put_nowait(ids)
                while len(self._acked) > ACKED_MEMORY:
                    self._acked.popitem(last=False)
            elif len(unit.records) > 1 and not error.retriable:
                await self._take_apart(unit, error)
            else:
                for record in unit.records:
                    await self._failed(record, error)
        finally:
            self._release(unit)
            async with self._space:
                self._space.notify_all()

    def _release(self, unit: _Unit) -> None:
        """The unit's rows are no longer in flight: lower the barrier of its keys."""
        self._in_flight -= len(unit.records)
        self.status.in_flight = self._in_flight
        for record in unit.records:
            if record.key is not None and self._keys.get(record.key) is unit:
                del self._keys[record.key]
        unit.released.set()

    async def _take_apart(self, unit: _Unit, error: JetStreamError) -> None:
        """A refused batch: its rows go back, uncounted, to be published one at a time."""
        self.status.failures += 1
        self.status.last_error = f"a batch of {len(unit.records)} rows: {error}"
        logger.warning(
            "outbox: a batch of %d rows (ids %d to %d) was refused; publishing them one at a time: %s",
            len(unit.records),
            unit.records[0].id,
            unit.records[-1].id,
            error,
        )
        for record in unit.records:
            self._solo.add(record.id)
            try:
                await self._purger.run("reset", record.id, None)
            except JetStreamError as exc:  # the database is down: the new leader id re-marks it anyway
                self.status.last_error = f"row {record.id}: {exc}"
        self._force_remark = True

    async def _failed(self, record: Record, error: JetStreamError) -> None:
        status = self.status
        status.failures += 1
        status.last_error = f"row {record.id}: {error}"
        refused = not error.retriable
        try:
            attempts = await self._purger.run("reset", record.id, str(error)[:2000] if refused else None)
            if refused and attempts >= self.config.max_attempts:
                await self._purger.run("dead_letter", record.id, str(error)[:2000])
                status.dead_lettered += 1
                self._solo.discard(record.id)
                self._retry_at.pop(record.key, None)
                logger.warning(
                    "outbox: row %d (stream %s, key %r) moved to %s_dead_letters after %d refusals: %s",
                    record.id,
                    record.stream,
                    record.key,
                    self.config.table,
                    attempts,
                    error,
                )
            elif refused:
                delay = min(self.config.backoff * 2 ** (attempts - 1), self.config.max_backoff)
                self._retry_at[record.key] = time.monotonic() + delay
                logger.warning(
                    "outbox: row %d refused (attempt %d, retry in %.1f s): %s",
                    record.id,
                    attempts,
                    delay,
                    error,
                )
            else:
                logger.info("outbox: row %d not acked, publishing again: %s", record.id, error)
        except JetStreamError as exc:  # the database is down: the new leader id re-marks the row anyway
            status.last_error = f"row {record.id}: {exc}"
            logger.warning("outbox: cannot reset row %d: %s", record.id, exc)
        self._force_remark = True

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

    async def _drain(self) -> None:
        """Wait (up to ``shutdown_timeout``) for every in-flight ack."""
        deadline = time.monotonic() + self.config.shutdown_timeout
        while (self._in_flight or self._settling) and time.monotonic() < deadline:
            async with self._space:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._space.wait(), max(deadline - time.monotonic(), 0.01))
            if self._settling:
                await asyncio.wait(set(self._settling), timeout=max(deadline - time.monotonic(), 0.01))
        if self._in_flight:
            logger.warning(
                "outbox: %d rows still in flight at shutdown; the next leader publishes them", self._in_flight
            )

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


def _batch_of(records: list[Record]) -> pa.RecordBatch:
    """Rows as the Arrow batch published for them (``key``, ``value``, ``headers``)."""
    if any(r.headers for r in records):
        headers = pa.array(
            [[{"key": k, "value": v.encode()} for k, v in r.headers.items()] or None for r in records],
            HEADER_TYPE,
        )
    else:
        headers = pa.nulls(len(records), HEADER_TYPE)
    return pa.record_batch(
        {
            "key": pa.array([r.key for r in records], pa.binary()),
            "value": pa.array([r.value for r in records], pa.binary()),
            "headers": headers,
        }
    )


def init_outbox(database: str, table: str = "outbox") -> None:
    """Create the outbox and dead-letter tables (``jetstream outbox init``)."""
    store = open_store(database, table)
    try:
        store.init()
    finally:
        store.close()


__all__ = ["Harvester", "HarvesterConfig", "HarvesterStatus", "SQLiteStore", "init_outbox"]
