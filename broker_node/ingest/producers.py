"""Idempotent producers: the sequences a partition has already stored.

A producer id with a sequence number makes a publish idempotent: a sequence
at or below the producer's last one is a duplicate and is not stored again.
It is acked as a duplicate with the original offsets when the sequence is one
of the producer's last ``WINDOW``, and with offsets -1 when it is older.  The table is rebuilt from the
log's ``producer_id`` and ``sequence`` columns when a partition opens, so it
survives restarts.
"""

from __future__ import annotations

from collections import deque

import pyarrow as pa
import pyarrow.compute as pc

from broker_node.log import Log

WINDOW = 8
"""Sequences remembered per producer, with their offsets (Kafka keeps 5)."""
UNKNOWN = (-1, -1)


class ProducerTable:
    """Last sequences per producer id, each with the offsets it was stored at."""

    def __init__(self) -> None:
        self._seen: dict[str, deque[tuple[int, int, int]]] = {}

    def duplicate_of(self, producer_id: str, sequence: int) -> tuple[int, int] | None:
        """Offsets of an earlier store of this sequence, ``UNKNOWN`` if too old, else ``None``."""
        seen = self._seen.get(producer_id)
        if not seen or sequence > seen[-1][0]:
            return None
        for stored, first, last in seen:
            if stored == sequence:
                return first, last
        return UNKNOWN

    def record(self, producer_id: str, sequence: int, first: int, last: int) -> None:
        """Remember that ``sequence`` was stored at offsets ``first``..``last``."""
        seen = self._seen.setdefault(producer_id, deque(maxlen=WINDOW))
        if seen and seen[-1][0] == sequence:  # one sequence written in several batches
            seen[-1] = (sequence, seen[-1][1], last)
        else:
            seen.append((sequence, first, last))

    @classmethod
    def rebuild(cls, log: Log) -> ProducerTable:
        """Read the whole log and remember what every producer stored."""
        table = cls()
        for batch in log.scan(max_bytes=64 * 1024 * 1024):
            producers = batch.column("producer_id")
            if producers.null_count < len(producers):
                stamped = pc.and_(pc.is_valid(producers), pc.is_valid(batch.column("sequence")))
                table._learn(batch.filter(stamped))
        return table

    def _learn(self, batch: pa.RecordBatch) -> None:
        grouped = (
            pa.table(
                {
                    "producer_id": batch.column("producer_id"),
                    "sequence": batch.column("sequence"),
                    "offset": batch.column("offset"),
                }
            )
            .group_by(["producer_id", "sequence"], use_threads=False)
            .aggregate([("offset", "min"), ("offset", "max")])
            .sort_by([("offset_min", "ascending")])
        )
        for producer, sequence, first, last in zip(
            *(grouped.column(c).to_pylist() for c in ("producer_id", "sequence", "offset_min", "offset_max")),
            strict=True,
        ):
            self.record(producer, sequence, first, last)
