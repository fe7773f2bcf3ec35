"""The rows a leading harvester has handed to the client and not yet settled.

Rows are placed in id order (:meth:`InFlight.publish_all`): each waits while
``max_in_flight`` rows are in flight (the throttle) and while a row of its key
is in flight in another batch (the barrier), joins the batch of its stream
and partition (a row with a subject, or one of a refused batch, goes alone),
and a batch is published when it is full (:data:`MAX_BATCH_ROWS`,
:data:`MAX_BATCH_BYTES`), when a row must wait, and when the marked rows are
all placed.  Each ack or failure is then settled: an ack queues the rows'
purge; a refused batch is taken apart; a refused row is reset and retried with
backoff until ``max_attempts``, then dead-lettered; any failure raises
:attr:`InFlight.force_remark`, so the term marks every unacknowledged row
again under a new leader id, in order (see :mod:`.harvester`).

Everything here runs on the harvester's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pyspark_jetstream.client import AckPolicy, Client
from pyspark_jetstream.protocol.errors import JetStreamError, UnavailableError, error_from_code
from pyspark_jetstream.protocol.schema import HEADER_TYPE

from .harvester_config import HarvesterConfig, HarvesterStatus
from .outbox_table import Record
from .store_thread import StoreThread

logger = logging.getLogger(__name__)

ACKED_MEMORY = 100_000
"""Ids acked in this term that a re-mark will not publish again (the broker would drop them anyway)."""
MAX_BATCH_ROWS = 1000
"""Rows published as one batch at most."""
MAX_BATCH_BYTES = 512 * 1024
"""A batch is published once its rows hold this many bytes (NATS's default max_payload is 1 MiB)."""


@dataclass(eq=False)
class _Unit:
    """Rows published together (one batch, or one row), and the barrier of their keys."""

    records: list[Record]
    target: tuple[str, int] | None
    """The batch's stream and partition; ``None``: one row published on its own."""
    released: asyncio.Event = field(default_factory=asyncio.Event)
    size: int = 0


class InFlight:
    """The rows in flight: their batches, the key barrier and the throttle, and their settling."""

    def __init__(
        self,
        config: HarvesterConfig,
        status: HarvesterStatus,
        purger: StoreThread,
        purges: asyncio.Queue[list[int]],
        *,
        stop: asyncio.Event,
        confirmed: Callable[[], bool],
    ) -> None:
        """Resets and dead letters go through ``purger``; the ids of each acked unit into ``purges``;
        placing rows stops once ``stop`` is set or leadership is not ``confirmed()``."""
        self.config = config
        self.status = status
        self.client: Client | None = None
        """Set before the first term."""
        self._purger = purger
        self._purges = purges
        self._stop = stop
        self._confirmed = confirmed
        self.force_remark = False
        """A row went back into the outbox: the term marks again from the top, under a new leader id."""
        self._count = 0
        """Rows in flight now."""
        self._keys: dict[bytes, _Unit] = {}
        """The unit each key in flight (or waiting in a batch about to be published) is in."""
        self._solo: set[int] = set()
        """Rows of refused batches: published one at a time until acked or dead-lettered."""
        self._space = asyncio.Condition()
        self._retry_at: dict[bytes | None, float] = {}
        self._held: set[bytes | None] = set()
        """Keys whose refused row waits for its retry under this leader id: their later rows wait
        too, in this mark and the next ones, until a new leader id marks the refused row again."""
        self._acked: OrderedDict[int, None] = OrderedDict()
        self._settling: set[asyncio.Task[None]] = set()

    def new_term(self) -> None:
        """A term begins: no remark pending, and no id acked in it yet."""
        self.force_remark = False
        self._acked.clear()

    def new_leader_id(self) -> None:
        """Rows are marked under a new leader id: every row held back is marked again, in order."""
        self._held.clear()

    async def publish_all(self, records: list[Record]) -> None:
        """Publish a marked batch in id order, within the throttle and the per-key barrier."""
        held_back: set[bytes | None] = set()
        filling: dict[tuple[str, int], _Unit] = {}
        try:
            for record, target in zip(records, await self._targets(records), strict=True):
                if record.id in self._acked:
                    continue
                if self._count >= self.config.max_in_flight:
                    await self._send_all(filling)
                    async with self._space:
                        await self._space.wait_for(lambda: self._count < self.config.max_in_flight)
                if record.key is not None:
                    while (holder := self._keys.get(record.key)) is not None:
                        if target is not None and holder is filling.get(target):
                            break  # the key's rows are in this batch: the row joins them, in order
                        await self._send_all(filling)
                        await holder.released.wait()
                if self.force_remark or self._stop.is_set() or not self._confirmed():
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
                self._count += 1
                self.status.in_flight = self._count
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
        assert self.client is not None
        targets: list[tuple[str, int] | None] = [None] * len(records)
        rows_of: dict[str, list[int]] = {}
        for row, record in enumerate(records):
            if record.stream is not None and record.subject is None and record.id not in self._solo:
                rows_of.setdefault(record.stream, []).append(row)
        for stream, rows in rows_of.items():
            try:
                partitions = await self.client.partitions_for(stream, [records[r].key for r in rows])
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
        self.force_remark = True

    async def _send(self, unit: _Unit) -> None:
        assert self.client is not None
        ack_policy = AckPolicy.ALL if self.config.ack_policy == "all" else AckPolicy.LEADER
        table = self.config.table
        try:
            if unit.target is None:
                (record,) = unit.records
                future = await self.client.publish_async(
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
                future = await self.client.publish_batch_async(
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
        self._count -= len(unit.records)
        self.status.in_flight = self._count
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
        self.force_remark = True

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
        self.force_remark = True

    async def drain(self) -> None:
        """Wait (up to ``shutdown_timeout``) for every in-flight ack."""
        deadline = time.monotonic() + self.config.shutdown_timeout
        while (self._count or self._settling) and time.monotonic() < deadline:
            async with self._space:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._space.wait(), max(deadline - time.monotonic(), 0.01))
            if self._settling:
                await asyncio.wait(set(self._settling), timeout=max(deadline - time.monotonic(), 0.01))
        if self._count:
            logger.warning(
                "outbox: %d rows still in flight at shutdown; the next leader publishes them", self._count
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
