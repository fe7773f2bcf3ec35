"""Durable file replacement: the one way the broker writes a small file that must survive a crash.

A file is written to ``<name>.tmp``, fsynced, renamed over ``<name>`` and its
directory fsynced, so a crash leaves either the old or the new file whole,
never a torn one.  The log's checkpoints, the coordinator's local metadata,
partition records, producer snapshots and the broker's runtime files all go
through :func:`atomic_write`; segment files use :func:`fsync_dir` after a
rename or deletion.  This module imports nothing of the project, so every
part may use it (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new file whole.

    Without ``sync`` the file is renamed into place unsynced: the caller owes an
    fsync of the file and of its directory (see ``broker_node.log.deferred_sync``),
    and a machine that loses power before they are paid may come back with the
    old file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make renames and deletions inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
