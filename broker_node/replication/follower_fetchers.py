"""The fetchers of the partitions this broker follows: one each, started and stopped as roles change.

Each :class:`~.fetcher.Fetcher` is a task on the event loop given as
:attr:`FollowerFetchers.loop` (the broker's); without one, a loop of their
own in a thread of its own is started at the first fetcher and stopped at
:meth:`FollowerFetchers.close_loop`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from pyarrow import flight

from broker_node.coordination.base import PartitionState

from .fetcher import Fetcher, PeerLink
from .partition import Partition
from .replication_config import ReplicationConfig
from .throttle import Throttle

Key = tuple[str, int]


class FollowerFetchers:
    """The running fetchers, by partition (see the module docstring)."""

    def __init__(
        self,
        config: ReplicationConfig,
        lock: threading.RLock,
        *,
        replication_address_of: Callable[[str], str],
        peer_address_of: Callable[[str], str | None],
        connect: Callable[[str], flight.FlightClient],
        throttle: Throttle,
    ) -> None:
        """``lock``: the replica manager's, which guards its partitions and these fetchers together;
        ``replication_address_of``, ``peer_address_of``, ``connect``: how a fetcher reaches its
        leader (see :class:`~.fetcher.Fetcher`); ``throttle``: the fetches held back."""
        self._config = config
        self._lock = lock
        self._replication_address_of = replication_address_of
        self._peer_address_of = peer_address_of
        self._connect = connect
        self._throttle = throttle
        self._fetchers: dict[Key, Fetcher] = {}
        self.link = PeerLink()
        """How fetchers present themselves to leaders (the broker sets its TLS and credentials)."""
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop fetchers run on (the broker's); without one, a loop of their own in a
        thread of its own is started at the first fetcher."""
        self._own_loop: threading.Thread | None = None

    def running(self) -> dict[Key, Fetcher]:
        """The running fetchers, by partition."""
        with self._lock:
            return dict(self._fetchers)

    def start(self, key: Key, partition: Partition, state: PartitionState) -> None:
        """Start fetching ``partition`` from ``state.leader`` in ``state.leader_epoch``."""
        fetcher = Fetcher(
            partition,
            state.leader,
            state.leader_epoch,
            self._replication_address_of,
            self._peer_address_of,
            loop=self._fetch_loop(),
            link=self.link,
            connect=self._connect,
            max_bytes=self._config.fetch_max_bytes,
            max_wait=self._config.fetch_max_wait,
            throttle=self._throttle,
        )
        with self._lock:
            self._fetchers[key] = fetcher
        fetcher.start()

    def stop(self, key: Key) -> None:
        """Stop a partition's fetcher without waiting for it: one blocked on a hung leader must not
        hold up the other partitions' changes, and whatever it still tries is refused (it names
        a leader epoch the partition no longer follows)."""
        with self._lock:
            fetcher = self._fetchers.pop(key, None)
        if fetcher is not None:
            fetcher.stop(wait=False)

    def take_all(self) -> list[Fetcher]:
        """Every fetcher, forgotten here (the caller stops them; it holds the manager's lock)."""
        fetchers, self._fetchers = list(self._fetchers.values()), {}
        return fetchers

    def close_loop(self) -> None:
        """Stop and close the loop of their own, if one was started."""
        if self._own_loop is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._own_loop.join(5)
            self._own_loop = None
            self.loop.close()
            self.loop = None

    def _fetch_loop(self) -> asyncio.AbstractEventLoop:
        """The loop fetchers run on: the broker's, else one of their own."""
        if self.loop is None:
            loop = asyncio.new_event_loop()
            self._own_loop = threading.Thread(target=loop.run_forever, name="fetchers", daemon=True)
            self._own_loop.start()
            self.loop = loop
        return self.loop
