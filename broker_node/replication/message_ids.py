"""Message ids: which ids one partition stored within its stream's duplicate window.

Every stored message whose record carries a ``Nats-Msg-Id`` header (see
:mod:`pyspark_jetstream.protocol.headers`) is remembered with its offset and
timestamp, whoever stored it: the leader's ingestion, a follower's replicated
appends, the rebuild of a partition that opens.  The ingestion asks
:meth:`MessageIdTable.offset_of` before storing a message with an id, and
acks it as a duplicate of that offset instead when the id is remembered.

An id is forgotten once its message is older than ``duplicate_window``
seconds, or when more than ``duplicate_max_ids`` are remembered (oldest
first: the cap bounds memory -- about 170 bytes per id plus the id itself --
and beats the window).
Ids are per partition: the same id in two partitions is two messages.

The table is rebuilt from the log -- no file of its own: a partition that
opens reads the log from the first message of the window on (found through
the log's time index), never the whole log, and not even that when its
producer snapshot says where the oldest id it remembered was (a stream
without ids reads nothing for them).  A follower keeps its table up to date
from what it replicates, so a new leader has its predecessor's ids at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

import pyarrow as pa

from pyspark_jetstream.protocol.headers import message_ids_in


class MessageIdTable:
    """The message ids one partition stored within its window, oldest first.  Thread-safe."""

    def __init__(self, window: float, max_ids: int, clock: Callable[[], float]) -> None:
        """``window`` in seconds (0: remember nothing); ``clock`` gives seconds since the epoch,
        the clock the log stamps its messages with."""
        self.window = window
        self.max_ids = max_ids
        self._clock = clock
        self._ids: OrderedDict[str, tuple[int, int]] = OrderedDict()
        """id -> (offset, timestamp in microseconds), in log order."""
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether ids are remembered at all (a window above 0)."""
        return self.window > 0

    def __len__(self) -> int:
        return len(self._ids)

    def horizon(self) -> int:
        """Microseconds since the epoch: ids of messages stored before are forgotten."""
        return int((self._clock() - self.window) * 1_000_000)

    def oldest_offset(self, end: int) -> int:
        """The offset of the oldest message whose id is remembered (``end`` when none is)."""
        with self._lock:
            for offset, _ in self._ids.values():
                return min(offset, end)
            return end

    def offset_of(self, message_id: str) -> int | None:
        """The offset the message with ``message_id`` was stored at within the window, or ``None``."""
        with self._lock:
            entry = self._ids.get(message_id)
            if entry is None:
                return None
            if entry[1] < self.horizon():
                self._expire()
                return None
            return entry[0]

    def remember(self, entries: Iterable[tuple[str, int]], timestamp: int | None = None) -> None:
        """Remember ids just stored, ``(id, offset)`` in log order, stored at ``timestamp``
        (microseconds since the epoch; default now)."""
        if not self.enabled:
            return
        now = int(self._clock() * 1_000_000) if timestamp is None else timestamp
        with self._lock:
            for message_id, offset in entries:
                self._put(message_id, offset, now)
            self._expire()

    def learn(self, batch: pa.RecordBatch) -> None:
        """Take in a stored batch, in log order: remember the ids its messages carry."""
        if not self.enabled:
            return
        rows, ids = message_ids_in(batch.column("headers"))
        if not rows:
            return
        offsets = batch.column("offset").to_numpy()
        stamps = batch.column("timestamp").cast(pa.int64()).to_numpy()
        horizon = self.horizon()
        with self._lock:
            for row, message_id in zip(rows, ids, strict=True):
                stamp = int(stamps[row])
                if stamp >= horizon:
                    self._put(message_id, int(offsets[row]), stamp)
            self._expire()

    def _put(self, message_id: str, offset: int, stamp: int) -> None:
        known = self._ids.get(message_id)
        if known is not None and known[1] >= stamp - self.window * 1_000_000:
            return  # stored twice within the window (a batch, say): the first one is the original
        if known is not None:
            del self._ids[message_id]  # stored again after its window: now the newest
        self._ids[message_id] = (offset, stamp)

    def _expire(self) -> None:
        """Forget ids past the window, and the oldest beyond the cap."""
        ids = self._ids
        while len(ids) > self.max_ids:
            ids.popitem(last=False)
        horizon = self.horizon()
        while ids:
            oldest = next(iter(ids.values()))
            if oldest[1] >= horizon:
                break
            ids.popitem(last=False)
