"""Consumer cursors of a mirrored partition, copied from the source's cursor stream.

A consumer group that stored its positions in the source cluster (the
compacted ``__cursors`` stream, keyed ``<consumer>/<stream>/<partition>``,
see :mod:`.cursors`) resumes on the mirror from the same positions: offsets
are the same on both, so a cursor is copied as it is, under the mirror's
stream name.  Each mirror partition's copier reads the source's cursor stream
(partition 0, committed rows, from where it read last) every few seconds,
keeps the newest value per consumer of its own partition, and writes to the
mirror cluster's cursor stream those that changed -- once the mirror holds
the offset they point at (a cursor past the mirror's high watermark would
skip messages the mirror has not copied yet, so it waits until it may be
followed).  A tombstone (a cursor deleted on the source) deletes it here.

A source principal without the right to read ``__cursors`` leaves cursors
uncopied (the error is reported in the mirror's status); the data is copied
all the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyspark_jetstream.protocol.errors import JetStreamError, OffsetOutOfRangeError

from .cursors import CURSOR_STREAM
from .partition import Partition
from .source_cluster import SourceCluster

logger = logging.getLogger(__name__)

WriteCursor = Callable[[str, str, int, "int | None"], None]
"""Stores (an offset) or deletes (``None``) a consumer's cursor in this cluster:
``write(consumer, stream, partition, offset)``."""
READ_BYTES = 4 * 1024 * 1024
_UNSET = object()


class CursorCopier:
    """Copies one mirrored partition's cursors from the source (see the module docstring)."""

    def __init__(
        self, source: SourceCluster, source_stream: str, partition: Partition, write: WriteCursor
    ) -> None:
        self._source = source
        self._source_stream = source_stream
        self._partition = partition
        self._write = write
        self._offset = 0
        """Where the next read of the source's cursor stream starts."""
        self._latest: dict[str, int | None] = {}
        """The newest value per consumer seen in the source (``None``: deleted)."""
        self._written: dict[str, int | None] = {}
        self.last_error: str | None = None
        self.copied = 0
        """Cursors written here since the copier began."""

    def copy(self) -> None:
        """Read what the source's cursor stream gained and write what changed (errors are kept in
        :attr:`last_error`, never raised: cursors must not hold up the data)."""
        try:
            self._read_source()
            self._write_changed()
        except JetStreamError as exc:
            if self.last_error != str(exc):
                logger.warning(
                    "%s/%d: cannot copy cursors from the source: %s",
                    self._partition.stream,
                    self._partition.number,
                    exc,
                )
            self.last_error = f"cursors: {exc}"
            return
        self.last_error = None

    def _read_source(self) -> None:
        address = self._source.leader_address(CURSOR_STREAM, 0)
        suffix = f"/{self._source_stream}/{self._partition.number}"
        while True:
            try:
                read = self._source.read(
                    address, CURSOR_STREAM, 0, self._offset, max_bytes=READ_BYTES, max_wait=0.0
                )
            except OffsetOutOfRangeError as exc:
                start = exc.fields.get("log_start_offset")
                if not isinstance(start, int) or start <= self._offset:
                    raise
                self._offset = start  # compaction or retention moved the start: read on from there
                continue
            for batch in read.batches:
                keys = batch.column("key").to_pylist()
                values = batch.column("value").to_pylist()
                for key, value in zip(keys, values, strict=True):
                    text = key.decode("utf-8", "replace") if key else ""
                    if not text.endswith(suffix):
                        continue
                    consumer = text[: -len(suffix)]
                    if not consumer or "/" in consumer:
                        continue
                    self._latest[consumer] = _offset_of(value)
            self._offset = max(self._offset, read.next_offset)
            if not read.batches or read.next_offset >= read.high_watermark:
                return

    def _write_changed(self) -> None:
        partition = self._partition
        high_watermark = partition.high_watermark
        for consumer, offset in sorted(self._latest.items()):
            before = self._written.get(consumer, _UNSET)
            if before == offset or (offset is None and before is _UNSET):
                continue
            if offset is not None and offset > high_watermark:
                continue  # not copied that far yet: written once it is
            self._write(consumer, partition.stream, partition.number, offset)
            self._written[consumer] = offset
            self.copied += 1


def _offset_of(value: bytes | None) -> int | None:
    """A cursor's offset from its stored value (``None`` for a tombstone or a value that is no offset)."""
    if value is None:
        return None
    try:
        offset = int(value.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return offset if offset >= 0 else None
