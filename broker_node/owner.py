"""A broker that ends with the process that started it (``--owner-fd``).

``LocalBroker`` (notebooks, ``make demo``, tests) starts the broker as its
child and hands it the read end of a pipe whose write end only the starting
process holds.  When that process ends, however it ends (a notebook kernel
killed with ``kill -9`` included), the pipe reads end-of-file: the broker stops
itself as if sent SIGTERM, and is killed outright if it has not exited within
:data:`GRACE` seconds; its embedded nats-server dies with it (see
:mod:`broker_node.nats_server`).  A pipe rather than Linux's parent-death
signal, because that signal fires when the parent *thread* that started the
child ends, and a broker may well be started from a thread that ends first.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

logger = logging.getLogger(__name__)

GRACE = 1.5
"""Seconds a broker whose owner is gone has to stop by itself before it is killed."""


def watch_owner(fd: int) -> int:
    """Stop this process once the pipe ``fd`` reads end-of-file (its owner is gone); returns the
    owner's pid (this process's parent now)."""
    owner = os.getppid()

    def watch() -> None:
        try:
            while os.read(fd, 4096):
                pass  # nothing is ever written: only the end counts
        except OSError as exc:
            logger.warning("cannot watch the owner (pid %d): %s", owner, exc)
            return
        logger.warning("the process that started this broker (pid %d) is gone: stopping", owner)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE)
        logger.error("not stopped within %gs of its owner's end: killed", GRACE)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()
    return owner
