"""Consumer cursors, stored in the log.

Cursors live in the internal, key-compacted stream ``__cursors``: each is a
message keyed ``<consumer>/<stream>/<partition>`` whose value is the offset in
decimal ASCII (so ``jetstream tail __cursors`` is readable).  The newest
message per key wins; an in-memory table, rebuilt from the stream by its
partition (when it opens, becomes leader, or is truncated), answers reads.
"""

from __future__ import annotations

import logging
import threading

import pyarrow as pa

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.streams import StreamConfig

logger = logging.getLogger(__name__)

MAX_OFFSET = 2**63 - 1
CURSOR_STREAM = "__cursors"
CURSOR_STREAM_CONFIG = StreamConfig(
    name=CURSOR_STREAM,
    subject="_PJS.cursors",
    compaction=True,
    segment_bytes=1024 * 1024,
    ack_reply=False,
)


def cursor_key(consumer: str, stream: str, partition: int) -> bytes:
    """The log key of a cursor."""
    if not isinstance(consumer, str) or not consumer or "/" in consumer:
        raise InvalidArgumentError(f"consumer id must be a non-empty string without '/', got {consumer!r}")
    return f"{consumer}/{stream}/{partition}".encode()


class CursorTable:
    """Latest cursor per key, as the cursor stream holds them."""

    def __init__(self) -> None:
        self._cursors: dict[bytes, int] = {}
        self._lock = threading.Lock()
        self.skipped = 0
        """Records seen that were not cursors."""

    def get(self, key: bytes) -> int | None:
        """The stored offset for ``key``, or ``None``."""
        with self._lock:
            return self._cursors.get(key)

    def put(self, key: bytes, offset: int) -> None:
        """Record a cursor just appended to the stream."""
        with self._lock:
            self._cursors[key] = offset

    def forget(self, key: bytes) -> None:
        """Drop ``key``'s offset (its tombstone was written)."""
        with self._lock:
            self._cursors.pop(key, None)

    def items(self) -> list[tuple[bytes, int]]:
        """Every cursor, sorted by key."""
        with self._lock:
            return sorted(self._cursors.items())

    def learn(self, batch: pa.RecordBatch) -> None:
        """Take in a batch of the cursor stream, in log order: the newest value per key wins.

        A record that is not a cursor (no key, or a value that is not a
        decimal offset in range) is skipped and logged, never fatal: anyone
        may have written to the cursor stream's log.
        """
        with self._lock:
            for offset, key, value in zip(
                batch.column("offset").to_pylist(),
                batch.column("key").to_pylist(),
                batch.column("value").to_pylist(),
                strict=True,
            ):
                if key is not None and value is None:
                    self._cursors.pop(key, None)
                    continue
                position = parse_cursor(value)
                if key is None or position is None:
                    self.skipped += 1
                    if self.skipped <= 10:
                        logger.warning(
                            "skipping record %d of the cursor stream: not a cursor (key %r, value %r)",
                            offset,
                            key,
                            value if value is None else value[:40],
                        )
                    continue
                self._cursors[key] = position


def parse_cursor(value: bytes | None) -> int | None:
    """The offset a cursor record's value holds, or ``None`` if it holds none."""
    if value is None or not 1 <= len(value) <= 19 or not value.isdigit():
        return None
    position = int(value)
    return position if position <= MAX_OFFSET else None
