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
    """Stored data failed its checks: a batch's checksum, decoding or offsets, or a lost file.

    Names the file and the range of offsets that cannot be read,
    ``first_offset`` to ``last_offset`` inclusive; offsets outside it are
    unaffected, so a reader that may skip lost data resumes at
    ``last_offset + 1``.  Not retriable: the range stays unreadable until it
    is repaired (see ``Log.repair``).
    """

    def __init__(self, path: str, first_offset: int, last_offset: int, detail: str) -> None:
        super().__init__(
            f"corrupt batch at offset {first_offset} in {path} (offsets {first_offset} to "
            f"{last_offset} cannot be read): {detail}"
        )
        self.path = path
        self.first_offset = first_offset
        self.last_offset = last_offset
        self.detail = detail

    @property
    def offset(self) -> int:
        """The first offset that cannot be read."""
        return self.first_offset


class LogStorageError(LogError):
    """The file system refused a write, read or fsync (disk full, I/O error, ...).

    Retriable: the log is left as it was before the failed call.
    """

    retriable = True


class LogClosedError(LogError):
    """The log was used after ``close()``."""
