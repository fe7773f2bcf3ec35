"""Consumers' positions (cursors), stored in the log's compacted internal stream ``__cursors``.

A cursor is a record keyed ``consumer/stream/partition`` whose value is the
next offset to read (a tombstone forgets it), appended to ``__cursors``'
partition 0 by its leader, which keeps the newest of each key in a table
(:class:`~broker_node.replication.cursors.CursorTable`).  A write returns once it
is committed to the in-sync replicas, so a cursor read after it, from whichever
broker leads then, finds it.
"""

from __future__ import annotations

import threading

from broker_node.coordination.base import Coordinator
from broker_node.log import Record
from broker_node.replication.cursors import CURSOR_STREAM, cursor_key
from broker_node.replication.manager import ReplicaManager
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    RequestTimeoutError,
    UnknownStreamError,
)

CURSOR_COMMIT_TIMEOUT = 10.0
"""Seconds a cursor write waits for its commit."""


class CursorService:
    """Sets, deletes and reads cursors on the cursor stream's leader (Flight threads, any number
    at once: writes are ordered by a lock)."""

    def __init__(self, manager: ReplicaManager, coordinator: Coordinator) -> None:
        self._manager = manager
        self._coordinator = coordinator
        self._lock = threading.Lock()

    def set_cursor(self, consumer: str, stream: str, partition: int, offset: int) -> None:
        """Store ``consumer``'s position in the cursor stream, and return once it is committed."""
        if offset < 0:
            raise InvalidArgumentError(f"cursor offset must not be negative, got {offset}")
        self._write(consumer, stream, partition, offset)

    def delete_cursor(self, consumer: str, stream: str, partition: int) -> None:
        """Forget ``consumer``'s position (a tombstone in the cursor stream); return once committed."""
        self._write(consumer, stream, partition, None)

    def fetch_cursor(self, consumer: str, stream: str, partition: int) -> int | None:
        """The stored position, or ``None`` if the consumer never set one."""
        key = cursor_key(consumer, stream, partition)
        self._check_partition(stream, partition)
        cursors = self._manager.require(CURSOR_STREAM, 0, leader=True)
        return cursors.cursors.get(key) if cursors.cursors is not None else None

    def _write(self, consumer: str, stream: str, partition: int, offset: int | None) -> None:
        key = cursor_key(consumer, stream, partition)
        self._check_partition(stream, partition)
        cursors = self._manager.require(CURSOR_STREAM, 0, leader=True)
        committed = threading.Event()
        failure: list[JetStreamError] = []
        with self._lock:  # the log and the table see cursor writes in one order
            cursors.check_min_insync()
            value = None if offset is None else str(offset).encode()
            offsets = cursors.append([Record(value, key=key)])
            if cursors.cursors is not None:
                if offset is None:
                    cursors.cursors.forget(key)
                else:
                    cursors.cursors.put(key, offset)

        def done(error: JetStreamError | None) -> None:
            if error is not None:
                failure.append(error)
            committed.set()

        cursors.when_committed(offsets[-1], done)
        if not committed.wait(CURSOR_COMMIT_TIMEOUT):
            raise RequestTimeoutError(
                f"the cursor of {consumer} on {stream}/{partition} is stored but not committed to the "
                f"in-sync replicas within {CURSOR_COMMIT_TIMEOUT:g}s"
            )
        if failure:
            raise failure[0]

    def _check_partition(self, stream: str, number: int) -> None:
        metadata = self._coordinator.get_stream(stream)
        if not 0 <= number < len(metadata.partitions):
            raise UnknownStreamError(
                f"stream {stream!r} has partitions 0 to {len(metadata.partitions) - 1}, not {number}",
                stream=stream,
                partition=number,
            )
