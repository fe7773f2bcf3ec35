"""Controlled shutdown of a clustered broker: its leadership moves to other in-sync replicas first.

The broker asks the controller (through the coordinator) to move the
leadership of every partition it leads, then applies the metadata as it
changes until no partition led here has another in-sync replica to move to,
or until ``[zookeeper] controlled_shutdown_timeout`` has passed.  Nothing
here raises: a broker that cannot hand over still stops, saying why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from broker_node.coordination.base import Coordinator
from broker_node.replication.manager import ReplicaManager
from pyspark_jetstream.protocol.errors import JetStreamError

logger = logging.getLogger(__name__)


async def hand_over_leadership(
    coordinator: Coordinator,
    manager: ReplicaManager,
    broker_id: str,
    timeout: float,
    sync: Callable[[], Awaitable[None]],
) -> None:
    """Ask the controller to move ``broker_id``'s leadership; wait (at most ``timeout`` seconds,
    applying metadata with ``sync``) until it has moved.  Runs on the broker's event loop."""
    try:
        await asyncio.to_thread(coordinator.request_controlled_shutdown, broker_id)
    except JetStreamError as exc:  # the coordinator out of reach: its message says so
        logger.warning("cannot ask for a controlled shutdown (%s); stopping without it", exc)
        return
    except Exception:
        logger.exception("cannot ask for a controlled shutdown; stopping without it")
        return
    deadline = time.monotonic() + timeout
    while True:
        await sync()
        movable = [
            f"{p.stream}/{p.number}"
            for p in manager.leaders().values()
            if any(r != broker_id for r in p.state.isr)
        ]
        if not movable:
            logger.info("controlled shutdown: no partition led here can move to another replica")
            return
        if time.monotonic() > deadline:
            logger.warning("controlled shutdown timed out; still leading %s", ", ".join(movable))
            return
        await asyncio.sleep(0.1)
