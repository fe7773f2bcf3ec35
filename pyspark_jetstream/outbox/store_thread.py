"""The harvester's database connections, each on a thread of its own.

A database connection is not thread-safe, and its calls block: the harvester
keeps one :class:`StoreThread` for marking and one for purging and resets, so
that a mark runs while the event loop publishes and the purges of earlier
rows go on beside both.  A connection that fails as unavailable is closed and
opened again by the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .harvester_config import HarvesterConfig
from .outbox_table import Store, UnavailableDatabaseError, open_store


class StoreThread:
    """A store used from one thread of its own (database connections are not thread-safe)."""

    def __init__(self, config: HarvesterConfig, name: str) -> None:
        self.config = config
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"outbox-{name}")
        self._store: Store | None = None

    def run(self, call: str | Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """The store's method ``call``, or ``call(store, *args)``, on the connection's thread: handed
        to it now, not once the result is awaited."""
        return asyncio.get_running_loop().run_in_executor(self._pool, self._call, call, args)

    def _call(self, call: str | Callable[..., Any], args: tuple[Any, ...]) -> Any:
        if self._store is None:
            self._store = open_store(self.config.database, self.config.table)
        try:
            return getattr(self._store, call)(*args) if isinstance(call, str) else call(self._store, *args)
        except UnavailableDatabaseError:
            with contextlib.suppress(Exception):
                self._store.close()
            self._store = None
            raise

    async def close(self) -> None:
        """Close the store on its thread, then end the thread."""

        def close() -> None:
            if self._store is not None:
                self._store.close()
                self._store = None

        await asyncio.get_running_loop().run_in_executor(self._pool, close)
        self._pool.shutdown(wait=True)
