"""The broker's own files in its data directory: the lock, the runtime file, the session file.

``broker.lock`` holds an exclusive ``flock`` for the broker's life (and its
pid, to name it to a second broker refused the directory).  ``broker.json``
appears once the broker serves and goes at shutdown; ``zookeeper.session``
exists while a clustered broker runs.  Both are written atomically.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import IO

from broker_node.config import ConfigError
from broker_node.durable import atomic_write

RUNTIME_FILE = "broker.json"
"""Written in the data directory once the broker serves: its addresses and pid."""
SESSION_FILE = "zookeeper.session"
"""In a cluster, the broker's ZooKeeper session (id and password, readable by its user only):
whoever holds it can expire the session, fencing the broker (operators, fault tests)."""
LOCK_FILE = "broker.lock"


class DataDirLock:
    """Exclusive use of a data directory by one broker process."""

    def __init__(self, handle: IO[str]) -> None:
        self._handle = handle

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Lock ``data_dir`` (made if missing); ``ConfigError`` if another broker holds it."""
        data_dir.mkdir(parents=True, exist_ok=True)
        handle = open(data_dir / LOCK_FILE, "a+")  # noqa: SIM115 - held for the broker's life
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ConfigError(
                f"the data directory {data_dir} is in use by another broker (pid {holder}): "
                "two brokers cannot share one data directory; give each its own data_dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        return cls(handle)

    def release(self) -> None:
        """Let another broker have the directory."""
        self._handle.close()


def write_runtime_files(
    data_dir: Path, runtime: dict[str, object], session: tuple[int, bytes] | None
) -> None:
    """``broker.json`` with ``runtime``; ``zookeeper.session`` (owner-only) when there is a session."""
    atomic_write(data_dir / RUNTIME_FILE, json.dumps(runtime).encode())
    if session is not None:
        path = data_dir / SESSION_FILE
        atomic_write(path, json.dumps({"session_id": session[0], "password": session[1].hex()}).encode())
        path.chmod(0o600)
