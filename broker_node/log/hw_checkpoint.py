"""A file log's high-watermark checkpoint: the file that lets the high watermark survive a restart.

Replication moves the high watermark on its commit path (a broker's event
loop), and a checkpoint's fsync can take a second while the disk writes back
other data: so the periodic checkpoint is written on the background thread of
:mod:`.deferred_sync`, at most once per ``high_watermark_checkpoint_interval``,
one at a time.  A truncation's, a flush's and close's checkpoints are written
on the caller's thread, after the one in flight (if any) is done, so the file
never goes back to an older value.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from .checkpoint import read_checkpoint, write_checkpoint
from .deferred_sync import background
from .errors import LogStorageError

HIGH_WATERMARK_CHECKPOINT = "high-watermark.checkpoint"


class HighWatermarkCheckpoint:
    """One log's high-watermark checkpoint file, when it was last written, and the value it holds."""

    def __init__(
        self,
        directory: Path,
        interval: float,
        clock: Callable[[], float],
        current: Callable[[], int | None],
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        """``interval``: seconds between periodic checkpoints; ``current()``: the high watermark
        to write now, or ``None`` once the log is closed (close writes its own)."""
        self.directory = directory
        self._path = directory / HIGH_WATERMARK_CHECKPOINT
        self._interval = interval
        self._clock = clock
        self._current = current
        self._log = log
        self._last = clock()
        self._write_lock = threading.Lock()
        """Held while the checkpoint file is written, by whichever thread writes it."""
        self._queued = False
        saved = read_checkpoint(self._path)
        try:
            hw = int(saved[0]) if saved else None
        except ValueError:
            hw = None
        self.saved = hw
        """The value the checkpoint file holds: close() writes only a changed one."""

    def changed(self, high_watermark: int) -> bool:
        """Whether ``high_watermark`` differs from the file's (after a write in flight is done)."""
        with self._write_lock:
            return high_watermark != self.saved

    def moved(self) -> None:
        """The high watermark moved: queue a checkpoint on the background thread if the interval
        passed and none is queued."""
        if self._queued or self._clock() - self._last < self._interval:
            return
        self._queued = True
        self._last = self._clock()
        background().submit(self._write_in_background)

    def write(self, high_watermark: int) -> None:
        """Write ``high_watermark`` now, on this thread (after a write in flight is done)."""
        with self._write_lock:
            self._write(high_watermark)
        self._last = self._clock()

    def _write_in_background(self) -> None:
        """Write the high watermark as it is now (not as it was when queued: a truncation since
        may have lowered it, and its own checkpoint waits for this one to finish)."""
        try:
            with self._write_lock:
                hw = self._current()
                if hw is not None:  # else close() wrote the checkpoint itself
                    self._write(hw)
        except LogStorageError as exc:  # tried again at the next interval; close() reports a failure
            self._log.warning("%s", exc)
        finally:
            self._queued = False

    def _write(self, hw: int) -> None:
        """Write the checkpoint file; the caller holds ``_write_lock``."""
        try:
            write_checkpoint(self._path, [str(hw)])
        except OSError as exc:
            raise LogStorageError(
                f"could not checkpoint the high watermark of {self.directory}: {exc}"
            ) from exc
        self.saved = hw
