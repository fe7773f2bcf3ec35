"""The counters the broker's metrics read (at scrape time, from the metrics thread).

:class:`BrokerCounts` satisfies :class:`broker_node.metrics.Counts`: each
count is read from the part that keeps it (the Flight server, the NATS
ingestion, the partitions held here) when Prometheus scrapes.
"""

from __future__ import annotations

from broker_node.log import LogError
from broker_node.metrics import PartitionFiles
from broker_node.replication.manager import ReplicaManager
from broker_node.runtime import Runtime


class BrokerCounts:
    """A broker's counters, read from its running parts (metrics thread)."""

    def __init__(self, runtime: Runtime, manager: ReplicaManager) -> None:
        self._runtime = runtime
        self._manager = manager

    def flight_requests(self) -> dict[tuple[str, str], int]:
        """Flight calls served so far, by kind and outcome code."""
        flight = self._runtime.flight
        return dict(flight.requests) if flight is not None else {}

    def follow_readers(self) -> int:
        """Flight follow reads open now."""
        flight = self._runtime.flight
        return flight.follow_readers if flight is not None else 0

    def waiting_readers(self) -> int:
        """Follow and long-polling reads holding a Flight thread now."""
        flight = self._runtime.flight
        return flight.waiting_readers.taken if flight is not None else 0

    def open_puts(self) -> int:
        """Producers' puts open now."""
        flight = self._runtime.flight
        return flight.open_puts.taken if flight is not None else 0

    def memory_released(self) -> tuple[int, int]:
        """Times free memory was handed back to the system, and the bytes it took away."""
        free = self._runtime.free_memory
        return free.releases, free.released_bytes

    def live_tail_batches(self) -> dict[tuple[str, int], int]:
        """Batches each partition led here has published on its live tail."""
        tails = self._runtime.tails
        if tails is None:
            return {}
        return {key: tail.batches for key, tail in tails.tails.items()}

    def ack_latency(self) -> dict[str, tuple[list[tuple[float, int]], float]]:
        """Each stream's ack latency: cumulative counts per bucket bound (``inf`` last), and the sum."""
        ingestor = self._runtime.ingestor
        if ingestor is None:
            return {}
        return {stream: h.snapshot() for stream, h in ingestor.ack_latency().items()}

    def partition_messages_in(self) -> dict[tuple[str, int], int]:
        """Messages each partition held here has appended as leader since it was opened."""
        return {(p.stream, p.number): p.messages_in for p in self._manager.held()}

    def producer_not_stored(self) -> dict[tuple[str, int, str], int]:
        """Idempotent appends to each partition held here that stored nothing, by verdict."""
        return {
            (p.stream, p.number, verdict.value): count
            for p in self._manager.held()
            for verdict, count in p.producer_not_stored.items()
        }

    def nats_connected(self) -> bool:
        """Whether the NATS connection is up."""
        ingestor = self._runtime.ingestor
        return ingestor is not None and ingestor.connected

    def partition_files(self) -> dict[tuple[str, int], PartitionFiles]:
        """Bytes on disk and segment count of every partition held here."""
        out = {}
        for partition in self._manager.held():
            try:
                out[(partition.stream, partition.number)] = PartitionFiles(
                    size_bytes=partition.log.size_bytes,
                    segments=len(partition.log.segment_base_offsets),
                )
            except LogError:  # closed meanwhile
                continue
        return out
