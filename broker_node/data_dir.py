"""The broker's own files in its data directory: the lock, the runtime file, the session file.

``broker.lock`` holds an exclusive ``flock`` for the broker's life (and its
pid, to name it to a second broker refused the directory, then ``owner
<pid>`` for a broker that ends with the process that started it).  ``broker.json``
appears once the broker serves and goes at shutdown; ``zookeeper.session``
exists while a clustered broker runs.  Both are written atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import time
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
TAKE_OVER_WAIT = 10.0
"""Seconds a broker whose owner is gone has to let go of the directory, after SIGTERM then SIGKILL."""

logger = logging.getLogger(__name__)


class DataDirLock:
    """Exclusive use of a data directory by one broker process."""

    def __init__(self, handle: IO[str]) -> None:
        self._handle = handle

    @classmethod
    def acquire(cls, data_dir: Path, *, owner: int | None = None) -> DataDirLock:
        """Lock ``data_dir`` (made if missing); ``ConfigError`` if another broker holds it.

        ``owner``: the pid of the process that started this broker and that it ends with (see
        :mod:`broker_node.owner`), recorded beside the broker's own.  A broker holding the lock
        whose recorded owner is gone (it outlived its owner: it was paused, say, or of a version
        that did not end with it) is stopped and the directory taken over, said in one line;
        never while its owner lives, nor a holder that records none.
        """
        data_dir.mkdir(parents=True, exist_ok=True)
        handle = open(data_dir / LOCK_FILE, "a+")  # noqa: SIM115 - held for the broker's life
        if not _lock(handle):
            handle.seek(0)
            holder, holder_owner = _holder(handle.read())
            if holder is None or holder_owner is None or pid_alive(holder_owner) or not _is_broker(holder):
                handle.close()
                raise ConfigError(
                    f"the data directory {data_dir} is in use by another broker (pid {holder or 'unknown'}): "
                    "two brokers cannot share one data directory; give each its own data_dir"
                )
            logger.warning(
                "the data directory %s is held by broker pid %d, whose owner (pid %d) is gone: stopping "
                "it and taking the directory over",
                data_dir,
                holder,
                holder_owner,
            )
            if not _take_over(handle, holder):
                handle.close()
                raise ConfigError(
                    f"the data directory {data_dir} is held by broker pid {holder}, whose owner is gone, "
                    "and it did not let go: stop it by hand"
                )
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n" + (f"owner {owner}\n" if owner is not None else ""))
        handle.flush()
        return cls(handle)

    def release(self) -> None:
        """Let another broker have the directory."""
        self._handle.close()


def _lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _holder(text: str) -> tuple[int | None, int | None]:
    """The holder's pid and its owner's from the lock file's text (``None`` for either not said)."""
    lines = text.split("\n")
    pid = int(lines[0]) if lines[0].strip().isdigit() else None
    owner = next((int(x[6:]) for x in lines[1:] if x.startswith("owner ") and x[6:].strip().isdigit()), None)
    return pid, owner


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, already ended, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _is_broker(pid: int) -> bool:
    """Whether ``pid`` runs a broker (never stop anything else)."""
    try:
        return b"broker_node" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _take_over(handle: IO[str], holder: int) -> bool:
    """Stop ``holder`` (SIGTERM, and SIGCONT in case it is paused; SIGKILL after
    :data:`TAKE_OVER_WAIT` seconds) and take the lock; whether it was taken."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder, sig)
            os.kill(holder, signal.SIGCONT)
        deadline = time.monotonic() + TAKE_OVER_WAIT
        while time.monotonic() < deadline:
            if _lock(handle):
                return True
            time.sleep(0.05)
    return _lock(handle)


def write_runtime_files(
    data_dir: Path, runtime: dict[str, object], session: tuple[int, bytes] | None
) -> None:
    """``broker.json`` with ``runtime``; ``zookeeper.session`` (owner-only) when there is a session."""
    atomic_write(data_dir / RUNTIME_FILE, json.dumps(runtime).encode())
    if session is not None:
        path = data_dir / SESSION_FILE
        atomic_write(path, json.dumps({"session_id": session[0], "password": session[1].hex()}).encode())
        path.chmod(0o600)
