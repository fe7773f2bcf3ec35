"""A blocking facade over :class:`~.client.Client`, for scripts, notebooks and the CLI.

Admin, cursors and fetches are blocking Flight calls (:class:`~.admin.BlockingAdmin`,
:meth:`~.reading.Reader.fetch_blocking`) made in the caller's thread.  Publishing
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
from typing import Any, TypeVar

from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.envelope import AckPolicy
from pyspark_jetstream.protocol.flight import StreamInfo
from pyspark_jetstream.protocol.mirror import MirrorStatus
from pyspark_jetstream.protocol.streams import StreamConfig

from .admin import BlockingAdmin, mirror_request, stream_config
from .client import Client
from .connection import FetchResult
from .credentials import Credentials
from .putting import Putter
from .reading import Message, Start
from .routing import METADATA_MAX_AGE

T = TypeVar("T")


class SyncClient:
    """Blocking client: the same calls as :class:`Client`, without ``await``."""

    def __init__(
        self,
        *,
        nats_urls: str | Sequence[str] = "nats://127.0.0.1:4222",
        broker: str | None = None,
        timeout: float = 10.0,
        max_pending: int = 4000,
        credentials: Credentials | None = None,
        metadata_max_age: float = METADATA_MAX_AGE,
    ) -> None:
        self._loop = _new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="jetstream-client", daemon=True)
        self._thread.start()
        try:
            self._client = self._run(
                Client.connect(
                    nats_urls=nats_urls,
                    broker=broker,
                    timeout=timeout,
                    max_pending=max_pending,
                    credentials=credentials,
                    metadata_max_age=metadata_max_age,
                )
            )
        except BaseException:
            self._stop_loop()
            raise
        self._admin = self._client._admin.core
        self._reader = self._client._reader

    def _flight(self) -> BlockingAdmin:
        """The blocking admin, for a call in this thread; a closed client refuses as the loop would."""
        if self._loop.is_closed():
            raise RuntimeError("Event loop is closed")
        return self._admin

    def _on_loop(self, callback: Callable[..., object], *args: object) -> None:
        """Hand the publisher what an admin call changed, on its loop, without waiting: whatever is
        submitted to the loop after this (a publish) finds it done."""
        self._loop.call_soon_threadsafe(callback, *args)

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

    def create_stream(self, name: str, subject: str, **options: Any) -> StreamInfo:
        """See :meth:`Client.create_stream`."""
        config = stream_config(name, subject, options)
        info = self._flight().create_stream(config)
        self._on_loop(self._client._publisher.learn, info, config)
        return info

    def add_partitions(self, name: str, partitions: int) -> StreamInfo:
        """See :meth:`Client.add_partitions`."""
        info = self._flight().add_partitions(name, partitions)
        self._on_loop(self._client._publisher.learn, info, StreamConfig.from_json(info.config))
        return info

    def update_schema(self, name: str, schema: object) -> StreamInfo:
        """See :meth:`Client.update_schema`."""
        return self._flight().update_schema(name, schema)

    def delete_stream(self, name: str) -> None:
        """See :meth:`Client.delete_stream`."""
        self._flight().delete_stream(name)
        self._on_loop(self._client._publisher.forget, name)

    def create_mirror(self, name: str, source_stream: str, source_servers: Any, **options: Any) -> StreamInfo:
        """See :meth:`Client.create_mirror`."""
        return self._flight().create_mirror(mirror_request(name, source_stream, source_servers, **options))

    def promote_stream(self, name: str) -> StreamInfo:
        """See :meth:`Client.promote_stream`."""
        return self._flight().promote_stream(name)

    def mirror_status(self, name: str) -> list[MirrorStatus]:
        """See :meth:`Client.mirror_status`."""
        return self._flight().mirror_status(name)

    def describe_stream(self, name: str) -> StreamInfo:
        """See :meth:`Client.describe_stream`."""
        return self._flight().describe_stream(name)

    def list_streams(self) -> list[StreamInfo]:
        """See :meth:`Client.list_streams`."""
        return self._flight().list_streams()

    def status(self) -> dict[str, Any]:
        """See :meth:`Client.status`."""
        return self._flight().status()

    def metadata(self) -> dict[str, Any]:
        """See :meth:`Client.metadata`."""
        return self._flight().metadata()

    def cluster_status(self) -> dict[str, Any]:
        """See :meth:`Client.cluster_status`."""
        return self._flight().cluster_status()

    def elect_preferred_leaders(self) -> dict[str, Any]:
        """See :meth:`Client.elect_preferred_leaders`."""
        return self._flight().elect_preferred_leaders()

    def reassign(self, plan: object, *, throttle: int = 0) -> dict[str, Any]:
        """See :meth:`Client.reassign`."""
        return self._flight().reassign(plan, throttle)

    def cancel_reassignment(self, partitions: list[tuple[str, int]] | None = None) -> dict[str, Any]:
        """See :meth:`Client.cancel_reassignment`."""
        return self._flight().cancel_reassignment(partitions)

    def drain(self, broker: str, *, throttle: int = 0) -> dict[str, Any]:
        """See :meth:`Client.drain`."""
        return self._flight().drain(broker, throttle)

    def reassignments(self) -> list[dict[str, Any]]:
        """See :meth:`Client.reassignments`."""
        return self._flight().reassignments()

    def generate_reassignment(self, brokers: list[str], streams: list[str] | None = None) -> dict[str, Any]:
        """See :meth:`Client.generate_reassignment`."""
        return self._flight().generate_reassignment(brokers, streams)

    def health(self) -> dict[str, Any]:
        """See :meth:`Client.health`."""
        return self._flight().health()

    def publish(self, stream: str | None, value: bytes | None, **options: Any) -> Ack | None:
        """See :meth:`Client.publish`."""
        return self._run(self._client.publish(stream, value, **options))

    def publish_batch(self, stream: str | None, data: Any, **options: Any) -> Ack | None:
        """See :meth:`Client.publish_batch`."""
        return self._run(self._client.publish_batch(stream, data, **options))

    def publish_batch_nowait(
        self, stream: str | None, data: Any, **options: Any
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
        return Putter(self._admin.cluster, producer_id, producer_epoch, ack_policy)

    def fetch(self, stream: str, partition: int = 0, **options: Any) -> FetchResult:
        """See :meth:`Client.fetch`."""
        self._flight()
        return self._reader.fetch_blocking(stream, partition, **options)

    def subscribe(
        self,
        stream: str,
        partition: int = 0,
        *,
        start: Start = "earliest",
        follow: float = 30.0,
        live: bool = True,
    ) -> Iterator[Message]:
        """See :meth:`Client.subscribe`: a blocking iterator."""
        return self._blocking(
            self._client.subscribe(stream, partition, start=start, follow=follow, live=live)
        )

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

    def set_cursor(self, consumer: str, stream: str, partition: int, offset: int) -> None:
        """See :meth:`Client.set_cursor`."""
        self._flight().set_cursor(consumer, stream, partition, offset)

    def delete_cursor(self, consumer: str, stream: str, partition: int) -> None:
        """See :meth:`Client.delete_cursor`."""
        self._flight().delete_cursor(consumer, stream, partition)

    def fetch_cursor(self, consumer: str, stream: str, partition: int) -> int | None:
        """See :meth:`Client.fetch_cursor`."""
        return self._flight().fetch_cursor(consumer, stream, partition)


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """The client thread's loop: uvloop's where it is installed (faster on every NATS hop), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
