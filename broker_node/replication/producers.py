"""Idempotent producers: what each producer has stored in a partition, and what it may store next.

A producer numbers its messages with an ``epoch`` and a ``sequence`` (see
:mod:`pyspark_jetstream.protocol.envelope`).  In the partition a message
targets, the rules are Kafka's, so that nothing is acked that was not stored:

* a new epoch (or a producer not seen before) starts at sequence 0;
* in the current epoch, the next sequence is the last stored one plus one;
* a sequence at or below the last stored one was stored (sequences are
  contiguous), so it is acked as a duplicate, with its offsets while it is one
  of the producer's last :data:`WINDOW`, with offsets -1 when older;
* a gap (the message before it failed or is still in flight) is refused as
  out of order, and nothing is stored: the producer resends in order;
* an epoch older than the stored one is refused as fenced (a zombie).

Other partitions that listen on the same subject store their copy with the
lenient rule: anything after the producer's last stored position is stored,
repeats are dropped, nothing is refused (they send no ack).

The table is rebuilt from the log's ``producer_id`` and ``sequence`` columns
(``sequence`` holds ``epoch << 32 | sequence``) by the partition, so it
survives restarts and leader changes.  The partition also writes it out
(:meth:`ProducerTable.snapshot`) with the log offset it covers, so that an
open reads only the log after that offset.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_jetstream.protocol.envelope import producer_position, split_position

WINDOW = 8
"""Sequences remembered per producer with their offsets (Kafka keeps 5)."""


class Verdict(enum.Enum):
    """What to do with a producer's message."""

    STORE = "store"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"
    FENCED = "fenced"


class Check(NamedTuple):
    """A verdict, with the original offsets of a duplicate or the reason for a refusal."""

    verdict: Verdict
    first: int = -1
    last: int = -1
    reason: str = ""


@dataclass
class _Producer:
    position: int
    """``epoch << 32 | sequence`` of the last stored message."""
    window: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    """``(position, first offset, last offset)`` of the last stored messages."""


class ProducerTable:
    """The last stored position of every producer in one partition."""

    def __init__(self) -> None:
        self._producers: dict[str, _Producer] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def check(self, producer_id: str, epoch: int, sequence: int, *, target: bool = True) -> Check:
        """Judge ``(epoch, sequence)`` of ``producer_id``: see the module docstring.

        ``target`` is whether this partition is the one the message names
        (strict rules) or one storing a fan-out copy (lenient rules).
        """
        position = producer_position(epoch, sequence)
        known = self._producers.get(producer_id)
        if known is not None and position <= known.position:
            if target and epoch < split_position(known.position)[0]:
                return Check(
                    Verdict.FENCED,
                    reason=f"producer {producer_id!r} already wrote with epoch "
                    f"{split_position(known.position)[0]}, newer than {epoch}",
                )
            for stored, first, last in known.window:
                if stored == position:
                    return Check(Verdict.DUPLICATE, first, last)
            return Check(Verdict.DUPLICATE)
        if not target:
            return Check(Verdict.STORE)
        last_epoch, last_sequence = split_position(known.position) if known else (-1, -1)
        expected = last_sequence + 1 if epoch == last_epoch else 0
        if sequence != expected:
            where = f"in epoch {epoch}" if epoch == last_epoch else f"to start epoch {epoch}"
            return Check(
                Verdict.OUT_OF_ORDER,
                reason=f"producer {producer_id!r} sent sequence {sequence}, but sequence {expected} "
                f"comes next {where}; nothing was stored: resend from sequence {expected}",
            )
        return Check(Verdict.STORE)

    def record(self, producer_id: str, epoch: int, sequence: int, first: int, last: int) -> None:
        """Remember that ``(epoch, sequence)`` was stored at offsets ``first``..``last``."""
        position = producer_position(epoch, sequence)
        known = self._producers.get(producer_id)
        if known is None:
            known = self._producers[producer_id] = _Producer(position)
        known.position = max(known.position, position)
        known.window.append((position, first, last))

    def snapshot(self) -> dict[str, list[list[int]]]:
        """The table as JSON-ready data: for each producer, its stored windows (oldest first),
        each ``[position, first offset, last offset]``, the last at the producer's position."""
        out: dict[str, list[list[int]]] = {}
        for producer_id, known in self._producers.items():
            window = [list(entry) for entry in known.window]
            if not window or window[-1][0] != known.position:
                window.append([known.position, -1, -1])
            out[producer_id] = window
        return out

    @classmethod
    def from_snapshot(cls, data: object) -> ProducerTable:
        """The table :meth:`snapshot` wrote; ``ValueError`` naming what is wrong with bad data."""
        if not isinstance(data, dict):
            raise ValueError(f"producers must be an object, got {type(data).__name__}")
        table = cls()
        for producer_id, window in data.items():
            if not isinstance(window, list) or not window:
                raise ValueError(f"producer {producer_id!r}: its window must be a non-empty list")
            for entry in window:
                if (
                    not isinstance(entry, list)
                    or len(entry) != 3
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry)
                ):
                    raise ValueError(f"producer {producer_id!r}: bad window entry {entry!r}")
                position, first, last = entry
                if position < 0 or first < -1 or last < first:
                    raise ValueError(f"producer {producer_id!r}: bad window entry {entry!r}")
                known = table._producers.get(producer_id)
                if known is None:
                    known = table._producers[producer_id] = _Producer(position)
                known.position = max(known.position, position)
                if first >= 0:
                    known.window.append((position, first, last))
        return table

    def learn(self, batch: pa.RecordBatch) -> None:
        """Take in a stored batch, in log order: remember what its producers stored."""
        producers = batch.column("producer_id")
        if producers.null_count == len(producers):
            return
        stamped = batch.filter(pc.and_(pc.is_valid(producers), pc.is_valid(batch.column("sequence"))))
        grouped = (
            pa.table(
                {
                    "producer_id": stamped.column("producer_id"),
                    "sequence": stamped.column("sequence"),
                    "offset": stamped.column("offset"),
                }
            )
            .group_by(["producer_id", "sequence"], use_threads=False)
            .aggregate([("offset", "min"), ("offset", "max")])
            .sort_by([("offset_min", "ascending")])
        )
        for producer, position, first, last in zip(
            *(grouped.column(c).to_pylist() for c in ("producer_id", "sequence", "offset_min", "offset_max")),
            strict=True,
        ):
            self.record(producer, *split_position(position), first, last)
