"""One partition as this broker holds it: the log, its high watermark and its readers.

With replication factor 1 the leader alone is the ISR, so an append is
committed at once: the high watermark moves to the log end offset.  Readers
that long-poll wait on a condition that every advance of the high watermark
signals.
"""

from __future__ import annotations

import threading

from broker_node.coordination.base import PartitionState
from broker_node.log import Log
from broker_node.log.records import Records


class Partition:
    """A partition's log plus the committed-offset bookkeeping around it."""

    def __init__(self, stream: str, number: int, log: Log, state: PartitionState) -> None:
        self.stream = stream
        self.number = number
        self.log = log
        self.state = state
        self._advanced = threading.Condition()
        self._closed = False
        if log.leader_epoch < state.leader_epoch:
            log.assign_leader_epoch(state.leader_epoch)
        # Alone in the ISR, everything stored is committed.
        if state.isr == (state.leader,):
            log.high_watermark = log.log_end_offset

    @property
    def closed(self) -> bool:
        """Whether the partition is shutting down (readers should stop waiting)."""
        return self._closed

    @property
    def high_watermark(self) -> int:
        """Offsets below this are committed and visible to consumers."""
        return self.log.high_watermark

    def append(self, records: Records) -> range:
        """Append as leader and commit (single replica); return the offsets."""
        offsets = self.log.append(records)
        self.log.high_watermark = self.log.log_end_offset
        with self._advanced:
            self._advanced.notify_all()
        return offsets

    def wait_for_data(self, offset: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until an offset >= ``offset`` is committed."""
        with self._advanced:
            return (
                self._advanced.wait_for(lambda: self._closed or self.log.high_watermark > offset, timeout)
                and not self._closed
            )

    def maintain(self) -> None:
        """Apply retention, and key compaction if the stream has it."""
        self.log.enforce_retention()
        if self.log.config.compaction:
            self.log.compact()

    def wake_readers(self) -> None:
        """Release every long-polling reader now and from now on (shutdown is coming)."""
        with self._advanced:
            self._closed = True
            self._advanced.notify_all()

    def close(self) -> None:
        """Wake every waiting reader and close the log."""
        self.wake_readers()
        self.log.close()
