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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_jetstream.protocol.envelope import producer_position, split_position

WINDOW = 8
"""Sequences remembered per producer with their offsets (Kafka keeps 5)."""


SMALL_ROWS = 64
"""Up to this many rows, batches' producers are learnt row by row in Python (no grouping)."""


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
        self.learn_many([batch])

    def _learn_rows(self, whole: pa.RecordBatch, numbers: list[int]) -> None:
        """:meth:`learn_many` row by row in Python: quicker than a grouping for a few rows (a
        follower learns each replicated frame as it appends it)."""
        spans: dict[tuple[str, int, int], list[int]] = {}
        for producer, position, offset, number in zip(
            whole.column("producer_id").to_pylist(),
            whole.column("sequence").to_pylist(),
            whole.column("offset").to_pylist(),
            numbers,
            strict=True,
        ):
            if producer is None or position is None:
                continue
            span = spans.get((producer, position, number))
            if span is None:
                spans[(producer, position, number)] = [offset, offset]
            else:
                span[0], span[1] = min(span[0], offset), max(span[1], offset)
        for (producer, position, _), (first, last) in sorted(spans.items(), key=lambda item: item[1][0]):
            self.record(producer, *split_position(position), first, last)

    def learn_many(self, batches: Sequence[pa.RecordBatch]) -> None:
        """Take in stored batches, in log order, as :meth:`learn` one by one would (a position is
        grouped within its own batch), with one grouping for all of them."""
        if not batches:
            return
        whole = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        producers = whole.column("producer_id")
        if producers.null_count == len(producers):
            return
        if whole.num_rows <= SMALL_ROWS:
            self._learn_rows(whole, [n for n, b in enumerate(batches) for _ in range(b.num_rows)])
            return
        numbers = pa.concat_arrays(
            [pa.repeat(pa.scalar(n, pa.int32()), b.num_rows) for n, b in enumerate(batches)]
        )
        stamped = pc.and_(pc.is_valid(producers), pc.is_valid(whole.column("sequence")))
        columns = {
            "producer_id": producers.filter(stamped),
            "sequence": whole.column("sequence").filter(stamped),
            "offset": whole.column("offset").filter(stamped),
            "batch": numbers.filter(stamped),
        }
        grouped = (
            pa.table(columns)
            .group_by(["producer_id", "sequence", "batch"], use_threads=False)
            .aggregate([("offset", "min"), ("offset", "max")])
            .sort_by([("offset_min", "ascending")])
        )
        for producer, position, first, last in zip(
            *(grouped.column(c).to_pylist() for c in ("producer_id", "sequence", "offset_min", "offset_max")),
            strict=True,
        ):
            self.record(producer, *split_position(position), first, last)
