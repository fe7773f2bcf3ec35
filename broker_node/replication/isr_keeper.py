"""Keeping the ISRs of the partitions led here, on a thread of its own.

It drops followers that have not caught up for ``replica_max_lag`` seconds and
adds back those that caught up (proposed by their fetches, see
:meth:`IsrKeeper.request`), each change a compare-and-set through the
coordinator; a refused one is dropped and the metadata read again.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping

from broker_node.coordination.base import Coordinator
from broker_node.coordination.errors import CoordinationError
from broker_node.log.logging_labels import Labels

from .partition import Partition

logger = logging.getLogger(__name__)


class IsrKeeper:
    """The thread that writes the ISR changes of the partitions led here (``leaders()``, by key)."""

    def __init__(
        self,
        coordinator: Coordinator,
        max_lag: float,
        leaders: Callable[[], Mapping[tuple[str, int], Partition]],
        stopped: threading.Event,
    ) -> None:
        """``stopped``: set when the broker closes (the keeper then ends; see :meth:`stop`)."""
        self._coordinator = coordinator
        self._max_lag = max_lag
        self._leaders = leaders
        self._stopped = stopped
        self._requests: queue.Queue[tuple[Partition, str] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="isr", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def request(self, partition: Partition, replica: str) -> None:
        """Ask for ``replica`` to join ``partition``'s ISR (it caught up); checked again when written."""
        self._requests.put((partition, replica))

    def stop(self) -> None:
        """Set ``stopped`` and wake the thread (it ends before its next change)."""
        self._stopped.set()
        self._requests.put(None)

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the thread to end, if it runs."""
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        interval = min(self._max_lag / 2, 1.0)
        while not self._stopped.is_set():
            try:
                item = self._requests.get(timeout=interval)
            except queue.Empty:
                item = None
            if self._stopped.is_set():
                return
            try:
                if item is not None:
                    partition, replica = item
                    expanded = partition.followers.expansion(replica)
                    if expanded is not None:
                        self._write(partition, expanded)
                for partition in list(self._leaders().values()):
                    shrunk = partition.followers.lagging_replicas(self._max_lag)
                    if shrunk is not None:
                        self._write(partition, shrunk)
            except Exception:
                logger.exception("keeping the ISRs failed")

    def _write(self, partition: Partition, isr: tuple[str, ...]) -> None:
        if isr == partition.state.isr:
            return
        proposal = partition.followers.propose_isr(isr)
        if proposal is None:
            return
        try:
            stored = self._coordinator.update_partition(
                partition.stream, partition.number, proposal.version, proposal
            )
        except CoordinationError as exc:
            Labels(partition.stream, partition.number).bind(logger).info(
                "ISR change to %s not written (%s); reading the metadata again", isr, exc
            )
            partition.followers.isr_written(None)
            refresh = getattr(self._coordinator, "refresh", None)
            if refresh is not None:
                try:
                    refresh()
                except CoordinationError as again:  # the watches reload it once they can
                    logger.info("reading the metadata again failed: %s", again)
            return
        partition.followers.isr_written(stored)
