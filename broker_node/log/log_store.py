"""The interface of a partition's log, as the rest of the broker uses it.

Two implementations satisfy it: :class:`~.log.Log`, segments of Arrow IPC
files in a directory, and :class:`~.memory.MemoryLog`, the same batches held in
memory (for tests that need no disk), as nats-server pairs its memstore with
its filestore.  Both store the same frames (:mod:`.segment` has the layout), so
either can replicate from the other, and both pass the same contract tests
(``tests/log/test_store_contract.py``).

Terms, as in Kafka: the **log start offset** is the first offset still
stored; the **log end offset** (LEO) is the offset the next append gets; the
**high watermark** (HW) is set by replication within ``[0, LEO]``, and
offsets below it are committed.  Offsets are contiguous from 0 as appended;
compaction removes messages but never renumbers them, so reads may skip gaps.
Every method is thread-safe.  This Protocol names what a caller may rely on
of any implementation; each method's full contract is stated once, where it is
written: in :class:`~.base.LogBase` for the methods both logs share (appends,
replicated appends, epochs, truncation) and in :class:`~.reads.LogReads` for
the reads they share (batches, frames, scans), in :class:`~.log.Log`
for the rest, and :class:`~.memory.MemoryLog` says only where it differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from pyspark_jetstream.protocol.typed_values import TypedValues

from .append_input import Records
from .damage import DamagedRange
from .epochs import EpochEndOffset
from .errors import CorruptSegmentError
from .log_config import LogConfig
from .reads import ReplicaFrame, TypedRead


class LogStore(Protocol):
    """One partition's commit log: appends, replicated appends, reads, epochs, truncation, upkeep."""

    @property
    def config(self) -> LogConfig:
        """How the log stores, retains and compacts (limits on messages and batches, compression)."""

    @property
    def directory(self) -> Path | None:
        """Where the log's files are, or ``None`` for a log with no files (nothing beside it is kept)."""

    # ---- offsets ---------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        """The first offset still stored."""

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended message will get."""

    @property
    def high_watermark(self) -> int:
        """The committed offset bound; within ``[0, log_end_offset]``."""

    @high_watermark.setter
    def high_watermark(self, offset: int) -> None:
        """Set by replication; ``ValueError`` past the log end offset."""

    @property
    def size_bytes(self) -> int:
        """Bytes the log's data takes."""

    @property
    def segment_base_offsets(self) -> list[int]:
        """Base offsets of the segments, oldest first (a log without segment files has one)."""

    @property
    def damaged(self) -> list[DamagedRange]:
        """Every offset range known to be unreadable, in offset order."""

    # ---- leader epochs ---------------------------------------------------------

    @property
    def leader_epoch(self) -> int:
        """The epoch new appends are stamped with (0 until one is assigned)."""

    @property
    def leader_epochs(self) -> tuple[tuple[int, int], ...]:
        """``(epoch, start offset)`` pairs, oldest first."""

    def assign_leader_epoch(self, epoch: int) -> None:
        """Stamp appends from now on with ``epoch``, which starts at the log end offset."""

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        """Largest known epoch <= ``epoch`` and one past its last offset (Kafka's OffsetForLeaderEpoch)."""

    # ---- writing ---------------------------------------------------------------

    def append(self, records: Records, *, typed: TypedValues | None = None) -> range:
        """Append messages as one batch in the current epoch; the offsets they got.  ``typed``:
        the batch's values parsed, stored in its frame (see :mod:`.typed_frames`)."""

    def try_append(self, records: Records, *, typed: TypedValues | None = None) -> range | None:
        """:meth:`append`, or ``None`` at once (nothing appended) if the log is busy."""

    def append_replicated(self, frames: Iterable[pa.Buffer | pa.RecordBatch]) -> range:
        """Append a leader's stored frames (or batches), keeping its offsets, timestamps and epochs."""

    def truncate_to(self, offset: int) -> None:
        """Remove every message at and after ``offset``; HW and epochs are cut back with it."""

    def reset_to(self, offset: int) -> None:
        """Remove everything and start empty at ``offset``."""

    # ---- reading ---------------------------------------------------------------

    def read(
        self,
        start_offset: int,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        upper_bound: int | None = None,
    ) -> list[pa.RecordBatch]:
        """Stored batches from ``start_offset`` on, stopping before ``upper_bound`` (default the
        log end offset) and within the limits, at least one batch when any is in range."""

    def read_typed(
        self,
        start_offset: int,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        upper_bound: int | None = None,
    ) -> list[TypedRead]:
        """:meth:`read`, each batch with the typed columns stored with its rows (or ``None``)."""

    def read_frames(
        self, start_offset: int, *, max_bytes: int | None = None, upper_bound: int | None = None
    ) -> list[ReplicaFrame]:
        """Stored frames from ``start_offset`` on, byte for byte, for a replica's
        :meth:`append_replicated`; bounds as :meth:`read`."""

    def try_read_frames(
        self, start_offset: int, *, max_bytes: int | None = None, upper_bound: int | None = None
    ) -> list[ReplicaFrame] | None:
        """:meth:`read_frames`, or ``None`` at once if the log is busy."""

    def scan(
        self,
        *,
        max_bytes: int = 16 * 1024 * 1024,
        on_damaged: Callable[[CorruptSegmentError], None] | None = None,
        start_offset: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Every stored batch from the log start (or ``start_offset``) to the log end as of the call."""

    def offset_for_timestamp(self, timestamp: datetime | float) -> int:
        """The first offset whose timestamp is >= ``timestamp``, or the log end offset if none."""

    def wait_for_end(self, offset: int, timeout: float, *, unless: Callable[[], bool] | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the log end offset to pass ``offset``, or until
        ``unless()`` is true when checked (at each append and each :meth:`wake_waiters`); whether
        the end passed ``offset``."""

    def wake_waiters(self) -> None:
        """Have every :meth:`wait_for_end` check its ``unless`` now."""

    # ---- upkeep ----------------------------------------------------------------

    def enforce_retention(self) -> int:
        """Delete what retention allows to go (only data below the HW); how many units went."""

    def compact(self) -> int:
        """Keep the newest message per key among committed data; the messages removed."""

    def verify(self, max_bytes: int) -> int:
        """Check up to ``max_bytes`` of data no read has checked yet; the bytes checked."""

    def repair(self, batches: Iterable[pa.RecordBatch | pa.Buffer]) -> list[DamagedRange]:
        """Replace damaged ranges with a good copy read from another replica; the ranges repaired."""

    def sync_if_due(self) -> bool:
        """Force appends to stable storage if the fsync policy's interval has passed; whether it did."""

    def close(self) -> None:
        """Release everything; idempotent.  Later calls raise ``LogClosedError``."""
