"""The live-tail publishers of a broker: one per partition it leads, and their heartbeats.

The broker keeps them in line with the partitions it leads (:meth:`LiveTails.sync`,
after each change of leadership), and closes them before the NATS connection
they publish on.  Every partition's tail publishes a mark when it published
nothing for a while, so consumers know the tail is alive (see
:data:`pyspark_jetstream.protocol.tail.HEARTBEAT_SECONDS`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from nats.aio.client import Client as NatsClient

from pyspark_jetstream.protocol.streams import INTERNAL_PREFIX
from pyspark_jetstream.protocol.tail import HEARTBEAT_SECONDS

from .tail_publisher import TailPartition, TailPublisher


class LiveTails:
    """One :class:`TailPublisher` per partition led here; internal streams have none."""

    def __init__(self, connection: Callable[[], NatsClient]) -> None:
        """``connection``: the broker's NATS connection as it is now (it may be replaced)."""
        self._connection = connection
        self._tails: dict[tuple[str, int], TailPublisher] = {}
        self._heartbeats: asyncio.Task[None] | None = None

    @property
    def tails(self) -> dict[tuple[str, int], TailPublisher]:
        """The publishers, one per partition led here."""
        return dict(self._tails)

    async def sync(self, leading: Mapping[tuple[str, int], TailPartition]) -> None:
        """A publisher for each partition newly led here; those no longer led (or reopened) stop."""
        for key in sorted(self._tails):
            if leading.get(key) is not self._tails[key].partition:
                await self._tails.pop(key).close()
        for key in sorted(set(leading) - set(self._tails)):
            if not key[0].startswith(INTERNAL_PREFIX):
                self._tails[key] = TailPublisher(leading[key], self._connection)
        if self._heartbeats is None:
            self._heartbeats = asyncio.ensure_future(self._beat())

    async def _beat(self) -> None:
        """Marks on the live tail of every partition that published nothing for a while."""
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS / 4)
            for tail in list(self._tails.values()):
                await tail.heartbeat()

    async def close(self) -> None:
        """Stop every publisher (before the connection closes)."""
        if self._heartbeats is not None:
            self._heartbeats.cancel()
        for key in sorted(self._tails):
            await self._tails.pop(key).close()
