"""A blocking facade over :class:`~.client.Client`, for scripts, notebooks and the CLI.

Admin, cursors and fetches are blocking Flight calls (:attr:`SyncClient.admin`, a
:class:`~.admin.BlockingAdmin`, to which the client hands each of
:class:`~.admin.AdminActions` on; :meth:`~.reading.Reader.fetch_blocking`) made in the
caller's thread.  Publishing
and subscribing, which go through NATS, run the asynchronous client on an event
loop in a background thread; each such method blocks until its coroutine finishes.
Either way a call raises the same errors as the asynchronous client's.  Both sides
share the client's one :class:`~.cluster.ClusterConnection` (its metadata, its
channels), which is thread-safe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any, ParamSpec, TypeVar, Unpack

from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.envelope import AckPolicy
from pyspark_jetstream.protocol.flight import StreamInfo
from pyspark_jetstream.protocol.streams import StreamConfig

from .admin import AdminActions, BlockingAdmin
from .admin_faces import AdminAction, BlockingFace
from .client import Client, ConnectOptions
from .connection import FetchResult
from .publish_options import BatchOptions, MessageOptions
from .putting import Putter
from .reading import FetchOptions, Message, Start, TailOptions

T = TypeVar("T")
P = ParamSpec("P")


class SyncClient(AdminActions, BlockingFace):
    """Blocking client: the same calls as :class:`Client`, without ``await``; its admin calls
    (:class:`~.admin.AdminActions`) are :attr:`admin`'s."""

    def __init__(self, **options: Unpack[ConnectOptions]) -> None:
        """Connected as :meth:`Client.connect` connects (the same keyword arguments)."""
        self._loop = _new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="jetstream-client", daemon=True)
        self._thread.start()
        try:
            self._client = self._run(Client.connect(**options))
        except BaseException:
            self._stop_loop()
            raise
        self._reader = self._client._reader
        self.admin = BlockingAdmin(self._client._broker, _OnLoop(self._loop, self._client), self._check_open)
        """Streams, the cluster and cursors (see :class:`~.admin.AdminActions`), blocking."""

    def _check_open(self) -> None:
        """Before a call in this thread: a closed client refuses as the loop would."""
        if self._loop.is_closed():
            raise RuntimeError("Event loop is closed")

    def bind(self, action: AdminAction[P, T]) -> Callable[P, T]:
        """``action`` as :attr:`admin` runs it (the admin calls on the client hand each on)."""
        return action.__get__(self.admin)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @property
    def broker(self) -> str:
        """The Flight address in use."""
        return self._client.broker

    def close(self) -> None:
        """Close the connections and stop the background loop."""
        if self._loop.is_closed():
            return
        self._run(self._client.close())
        self._stop_loop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def publish(
        self, stream: str | None, value: bytes | None, **options: Unpack[MessageOptions]
    ) -> Ack | None:
        """See :meth:`Client.publish`."""
        return self._run(self._client.publish(stream, value, **options))

    def publish_batch(self, stream: str | None, data: Any, **options: Unpack[BatchOptions]) -> Ack | None:
        """See :meth:`Client.publish_batch`."""
        return self._run(self._client.publish_batch(stream, data, **options))

    def publish_batch_nowait(
        self, stream: str | None, data: Any, **options: Unpack[BatchOptions]
    ) -> concurrent.futures.Future[Ack | None]:
        """Like :meth:`publish_batch`, but returns at once: ``.result()`` waits for the ack.

        Thread-safe; the batches of calls made one after another (from one thread) leave in
        that order, so a producer's pipelined sequences reach the broker in order."""
        return asyncio.run_coroutine_threadsafe(
            self._client.publish_batch(stream, data, **options), self._loop
        )

    def putter(
        self, producer_id: str, producer_epoch: int = 0, ack_policy: AckPolicy = AckPolicy.LEADER
    ) -> Putter:
        """An idempotent producer's chunks put straight to partition leaders over Flight (see
        :mod:`.putting`); close it when done."""
        return Putter(self.admin.cluster, producer_id, producer_epoch, ack_policy)

    def fetch(self, stream: str, partition: int = 0, **options: Unpack[FetchOptions]) -> FetchResult:
        """See :meth:`Client.fetch`."""
        self._check_open()
        return self._reader.fetch_blocking(stream, partition, **options)

    def subscribe(self, stream: str, partition: int = 0, **options: Unpack[TailOptions]) -> Iterator[Message]:
        """See :meth:`Client.subscribe`: a blocking iterator."""
        return self._blocking(self._client.subscribe(stream, partition, **options))

    def subscribe_partitions(
        self, stream: str, partitions: Sequence[int], *, start: Start = "earliest", live: bool = True
    ) -> Iterator[Message]:
        """See :meth:`Client.subscribe_partitions`: a blocking iterator."""
        return self._blocking(self._client.subscribe_partitions(stream, partitions, start=start, live=live))

    def _blocking(self, iterator: AsyncIterator[Message]) -> Iterator[Message]:
        """Each item of an async iterator of the client's loop, waited for here."""

        async def step() -> Message:
            return await anext(iterator)

        while True:
            try:
                yield self._run(step())
            except StopAsyncIteration:
                return


class _OnLoop:
    """Hands the client's publisher what an admin call changed, on its loop, without waiting:
    whatever is submitted to the loop after this (a publish) finds it done."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: Client) -> None:
        self._loop = loop
        self._client = client

    def learn(self, info: StreamInfo, config: StreamConfig) -> None:
        """See :meth:`.Publisher.learn`."""
        self._loop.call_soon_threadsafe(self._client._publisher.learn, info, config)

    def forget(self, stream: str) -> None:
        """See :meth:`.Publisher.forget`."""
        self._loop.call_soon_threadsafe(self._client._publisher.forget, stream)


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """The client thread's loop: uvloop's where it is installed (faster on every NATS hop), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
