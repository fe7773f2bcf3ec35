"""The fsyncs a log owes, done on a background thread rather than on the appending thread.

An append is often made on a broker's event loop; an ``fsync`` there can take
0.1 s to a second while the disk writes back other data, and every partition
the loop serves waits that long.  So where the fsync policy allows it (not
``always``, whose appends are never made on a loop), a log only notes what it
owes -- the segment manifest written at a roll (renamed into place, its file
and directory not yet synced), the files of a segment sealed at a roll, and
its active segment's files once ``fsync_interval`` has passed -- and the
shared background thread syncs them, in that order: the manifest that lists
a segment reaches the disk before that segment's data does, as a roll wrote
it before.  Files are synced by path (opened, synced, closed), so a segment
sealed or deleted meanwhile is no trouble (a deleted file needs no sync).

One sync runs at a time per log; :meth:`DeferredSync.finished` lets a caller
(closing, truncation, retention) wait for one in flight, as the
high-watermark checkpoint's writes are waited for.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from broker_node.durable import fsync_dir


@functools.cache
def background() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that writes every log's checkpoints and owed fsyncs, in submission order."""
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="log-sync")


class DeferredSync:
    """What one log owes the disk (see the module docstring).  Its methods may be called from any
    thread; :meth:`run` is called on the background thread."""

    def __init__(self, directory: Path, manifest: Path) -> None:
        self.directory = directory
        self.manifest = manifest
        self._lock = threading.Lock()
        self._running = threading.Lock()
        self._manifest_owed = False
        self._files: list[Path] = []
        self._queued = False

    def owe_manifest(self) -> None:
        """The manifest was renamed into place without a sync."""
        with self._lock:
            self._manifest_owed = True

    def owe_files(self, paths: Iterator[Path] | list[Path] | tuple[Path, ...]) -> None:
        """``paths`` hold appended data no fsync has covered yet."""
        with self._lock:
            self._files.extend(p for p in paths if p not in self._files)

    def submit(self) -> None:
        """Have the background thread pay what is owed (once, however often it is asked)."""
        with self._lock:
            if self._queued:
                return
            self._queued = True
        background().submit(self.run)

    def run(self) -> None:
        """Pay what is owed now: the manifest first, then the files.  ``OSError`` (a failing
        disk) is raised after the debt is taken back, so the next run tries again."""
        with self._running:
            with self._lock:
                self._queued = False
                manifest, self._manifest_owed = self._manifest_owed, False
                files, self._files = self._files, []
            try:
                if manifest:
                    _fsync_path(self.manifest)
                    fsync_dir(self.directory)
                for path in files:
                    _fsync_path(path)
            except OSError:
                with self._lock:
                    self._manifest_owed = self._manifest_owed or manifest
                    self._files = [*files, *(p for p in self._files if p not in files)]
                raise

    @property
    def owed(self) -> bool:
        """Whether anything is owed."""
        with self._lock:
            return self._manifest_owed or bool(self._files)

    @contextlib.contextmanager
    def finished(self) -> Iterator[None]:
        """Hold off runs (waiting for one in flight first) for the duration of the block."""
        with self._running:
            yield


def _fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return  # deleted since (retention, truncation): nothing to keep
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
