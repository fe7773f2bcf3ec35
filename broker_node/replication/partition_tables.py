"""The tables that follow a partition's log, and the producer snapshot that spares reading all of it.

* **Producers** (:mod:`.producers`): each idempotent producer's last
  sequences, so a retry is acked as a duplicate and a gap is refused;
* **message ids** (:mod:`.message_ids`): the ids stored within the stream's
  ``duplicate_window``, read back from the log's last window only;
* **cursors** (:mod:`.cursors`): the internal cursor stream's latest positions.

They are built when the partition opens, kept up to date by every append (a
follower's and a mirror's included) and rebuilt after a truncation, so a new
leader de-duplicates retries of what its predecessor stored.  Kafka keeps
the same apart from its partition as ``ProducerStateManager``.

The producer snapshot (:data:`PRODUCER_SNAPSHOT`, in the partition's
directory) holds the producer table as of a log offset, so an open reads
only the log after it; see :meth:`PartitionTables.snapshot`.  Not
thread-safe: the partition calls it under its locks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from broker_node.durable import atomic_write
from broker_node.log import CorruptSegmentError, LogStore
from broker_node.log.frames import decode
from pyspark_jetstream.protocol.streams import StreamConfig

from .cursors import CURSOR_STREAM, CursorTable
from .message_ids import MessageIdTable
from .producers import ProducerTable

LEARN_ROWS = 65_536
"""Rows of stored batches the producer, message-id and cursor tables take in at once when they
are rebuilt from the log."""
PRODUCER_SNAPSHOT = "producer-snapshot.json"
"""The producer table as of an offset, in the partition's directory (see ``snapshot``)."""
SNAPSHOT_VERSION = 1


class PartitionTables:
    """The producer, message-id and cursor tables of one partition (see the module docstring)."""

    def __init__(
        self,
        config: StreamConfig,
        log: LogStore,
        logger: logging.Logger | logging.LoggerAdapter,
        wall_clock: Callable[[], float],
    ) -> None:
        """``logger``: the partition's (its lines name it); ``wall_clock``: seconds since the epoch,
        as the log's timestamps count them."""
        self.log = log
        self._log = logger
        self._wall_clock = wall_clock
        self.producers = ProducerTable()
        self.message_ids = self._new_message_ids(config)
        self.cursors: CursorTable | None = CursorTable() if config.name == CURSOR_STREAM else None
        self._snapshot_path = None if log.directory is None else log.directory / PRODUCER_SNAPSHOT
        """Where the producer snapshot goes: beside the log's files (a log without files has none)."""
        self.snapshot_end = -1
        """The log end offset the last snapshot written or read covers (-1: none)."""

    def learn_frames(self, frames: list[pa.Buffer]) -> None:
        """Keep the tables in step with stored frames appended (a follower's, a mirror's)."""
        self.learn_batches([decode(frame) for frame in frames])

    def learn_batches(self, batches: Sequence[pa.RecordBatch]) -> None:
        """Keep the tables in step with batches appended, in log order."""
        for batch in batches:
            self.producers.learn(batch)
            self.message_ids.learn(batch)
            if self.cursors is not None:
                self.cursors.learn(batch)

    def rebuild(self, config: StreamConfig, *, from_snapshot: bool = False) -> None:
        """Read the producer, message-id (and cursor) tables from the log; ``from_snapshot``:
        start the producers from their snapshot when it still fits the log, and read only
        what follows it.  Message ids are read from the start of the window on."""

        def skipped(error: CorruptSegmentError) -> None:
            self._log.error(
                "%s; rebuilding without it (duplicates of what it held may be stored again)", error
            )

        self.producers = ProducerTable()
        producers_from = 0
        ids_from: int | None = 0
        loaded = self._load_snapshot() if from_snapshot and self.cursors is None else None
        if loaded is not None:
            self.producers, producers_from, ids_from = loaded
            self.snapshot_end = producers_from
        message_ids = self._new_message_ids(config)
        # Ids stored before the window are forgotten; the snapshot says where its ids began.
        ids_from = max(self._window_start(message_ids), ids_from or 0) if message_ids.enabled else None
        start = producers_from if ids_from is None else min(producers_from, ids_from)
        cursors = CursorTable() if self.cursors is not None else None

        def learn(batches: list[pa.RecordBatch]) -> None:
            self.producers.learn_many(
                [
                    _from_offset(b, producers_from)
                    for b in batches
                    if b.column(0)[-1].as_py() >= producers_from
                ]
            )
            if ids_from is None and cursors is None:
                return  # the producers alone: their learn_many joins the batches itself
            batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
            if ids_from is not None:
                message_ids.learn(batch)  # ids older than the window are left out by timestamp
            if cursors is not None:
                cursors.learn(batch)

        # The tables learn many stored batches at once: a log of single-message batches (one
        # publish each) took ~1 ms a batch to learn one by one (a grouping each), which kept a
        # restarted broker's partition from serving for 10 s and more.
        pending: list[pa.RecordBatch] = []
        rows = 0
        for batch in self.log.scan(max_bytes=64 * 1024 * 1024, on_damaged=skipped, start_offset=start):
            pending.append(batch)
            rows += batch.num_rows
            if rows >= LEARN_ROWS:
                learn(pending)
                pending, rows = [], 0
        if pending:
            learn(pending)
        self.message_ids = message_ids
        self.cursors = cursors

    def _new_message_ids(self, config: StreamConfig) -> MessageIdTable:
        return MessageIdTable(config.duplicate_window, config.duplicate_max_ids, self._wall_clock)

    def _window_start(self, message_ids: MessageIdTable) -> int:
        """The first offset stored within the duplicate window, found through the time index."""
        try:
            return self.log.offset_for_timestamp(message_ids.horizon() / 1_000_000)
        except CorruptSegmentError as exc:
            return exc.first_offset  # the scan skips the damaged batch and goes on after it

    def epoch_below(self, end: int) -> list[int] | None:
        """``[epoch, start offset]`` of the leader epoch that holds offset ``end - 1`` (if any)."""
        entries = [entry for entry in self.log.leader_epochs if entry[1] < end]
        return list(entries[-1]) if entries else None

    @property
    def snapshots(self) -> bool:
        """Whether this partition keeps a producer snapshot: not an internal stream (the cursor
        table is rebuilt from its whole compacted log), nor a log without files."""
        return self.cursors is None and self._snapshot_path is not None

    def snapshot_data(self) -> dict[str, object]:
        """What the snapshot holds now (the caller holds the partition's locks): the producer table
        with the log offset it covers and, beside it, ``message_ids_from``: the offset of the
        oldest message id remembered (the end offset when there is none), so that an open reads
        message ids back from there at the earliest: a stream that stores no ids reads nothing
        more than the producers need."""
        end = self.log.log_end_offset
        return {
            "version": SNAPSHOT_VERSION,
            "end_offset": end,
            "epoch": self.epoch_below(end),
            "producers": self.producers.snapshot(),
            "message_ids_from": self.message_ids.oldest_offset(end),
        }

    def write_snapshot(self, data: dict[str, object]) -> None:
        """Write ``data`` (from :meth:`snapshot_data`) atomically; ``OSError`` if the disk refuses."""
        assert self._snapshot_path is not None
        atomic_write(self._snapshot_path, json.dumps(data, separators=(",", ":")).encode())
        end = data["end_offset"]
        assert isinstance(end, int)
        self.snapshot_end = end

    def _load_snapshot(self) -> tuple[ProducerTable, int, int | None] | None:
        """The producer snapshot, the offset it covers and its ``message_ids_from`` (``None`` if
        it has none), if it is readable and fits the log: the log still reaches that offset,
        in the same leader epoch as when it was written."""
        path = self._snapshot_path
        if path is None:
            return None
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._log.warning("cannot read %s (%s); reading the whole log", path, exc)
            return None
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("version") != SNAPSHOT_VERSION:
                raise ValueError(f"not a version {SNAPSHOT_VERSION} producer snapshot")
            end, epoch = data["end_offset"], data["epoch"]
            if isinstance(end, bool) or not isinstance(end, int) or end < 0:
                raise ValueError(f"bad end_offset {end!r}")
            table = ProducerTable.from_snapshot(data["producers"])
            ids_from = data.get("message_ids_from")
            if ids_from is not None and (
                isinstance(ids_from, bool) or not isinstance(ids_from, int) or not 0 <= ids_from <= end
            ):
                raise ValueError(f"bad message_ids_from {ids_from!r}")
        except (ValueError, KeyError, RecursionError) as exc:
            self._log.warning("ignoring %s (%s); reading the whole log", path, exc)
            return None
        if end > self.log.log_end_offset or epoch != self.epoch_below(end):
            self._log.info(
                "the producer snapshot at offset %d no longer fits the log; reading the whole log", end
            )
            return None
        return table, end, ids_from

    def forget_snapshot(self) -> None:
        """Remove the producer snapshot before the log below its offset changes."""
        self.snapshot_end = -1
        if self._snapshot_path is None:
            return
        try:
            self._snapshot_path.unlink(missing_ok=True)
        except OSError as exc:
            self._log.warning("cannot remove %s: %s", self._snapshot_path, exc)


def _from_offset(batch: pa.RecordBatch, offset: int) -> pa.RecordBatch:
    """The rows of ``batch`` at and after ``offset`` (offsets ascend, with gaps after compaction)."""
    if batch.column(0)[0].as_py() >= offset:
        return batch
    return batch.slice(pc.sum(pc.less(batch.column(0), offset)).as_py() or 0)
