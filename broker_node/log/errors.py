"""Errors raised by the commit log.

One root, :class:`LogError`, with a ``retriable`` flag: retry loops check the
flag rather than listing classes.  Every error names the value that caused it.
"""

from __future__ import annotations


class LogError(Exception):
    """Root of every error the commit log raises."""

    retriable = False


class InvalidRecordsError(LogError, ValueError):
    """The records given to ``append`` are empty or not in the log's input schema."""


class RecordTooLargeError(LogError, ValueError):
    """A message or a batch is over the configured size limit."""

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class OffsetOutOfRangeError(LogError, IndexError):
    """An offset lies outside ``[log_start_offset, log_end_offset]``.

    Carries the valid range so a consumer can reset: retriable, because the
    right reaction is to ask again from ``log_start_offset``.
    """

    retriable = True

    def __init__(self, offset: int, *, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(
            f"offset {offset} is out of range: the log holds offsets "
            f"{log_start_offset} to {log_end_offset} (exclusive end)"
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class CorruptSegmentError(LogError):
    """A stored batch failed its checksum or did not decode.

    Raised on reads of closed segments; the active segment's tail is repaired
    on open instead.
    """

    def __init__(self, path: str, offset: int, detail: str) -> None:
        super().__init__(f"corrupt batch at offset {offset} in {path}: {detail}")
        self.path = path
        self.offset = offset


class LogStorageError(LogError):
    """The file system refused a write, read or fsync (disk full, I/O error, ...).

    Retriable: the log is left as it was before the failed call.
    """

    retriable = True


class LogClosedError(LogError):
    """The log was used after ``close()``."""
