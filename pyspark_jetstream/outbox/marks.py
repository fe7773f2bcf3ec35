"""The marks of a harvester's term: which rows it takes next, each mark taken ahead of time.

A mark sets a term's ``leader_id`` on the next rows of the outbox (see
:meth:`.store.Store.mark`); :class:`Marks` takes them in order on the mark
connection's thread, bounded below by the last full mark (see its docstring
for why, and for when a mark starts from the table's first row again).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from .outbox_table import Record, Store
from .store_thread import StoreThread

RESCAN_EVERY = 100
"""While marks come back full, a mark takes the rows above the last one's, except every this many
marks, which takes them from the table's first row again (see :class:`Marks`)."""


class Marks:
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

    def __init__(self, connection: StoreThread, limit: int) -> None:
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
