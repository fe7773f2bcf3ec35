"""One partition's live-tail publisher: its committed batches, published once on NATS.

NATS does the fan-out to every tailing consumer, so an idle consumer costs
the broker nothing but a subscription on the NATS server; Flight stays for
reads from any offset (the layout of a delivery is in
:mod:`pyspark_jetstream.protocol.tail`).

A :class:`TailPublisher` is woken by the partition each time its high
watermark advances, reads the stored frames from where it stopped up to the
high watermark (on the event loop when the log is free, else in a thread),
and publishes them as they are stored, without re-encoding.  What it cannot or
should not publish (a batch too large for NATS or over
:data:`MAX_DELIVERY_BYTES`, a damaged range, a connection being replaced) it
skips, announcing the high watermark with a mark instead:
consumers fill any gap from Flight, so publishing never holds up ingestion.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from nats.aio.client import Client as NatsClient

from broker_node.log import CorruptSegmentError, OffsetOutOfRangeError, ReplicaFrame
from pyspark_jetstream.protocol.tail import (
    HEADER_BYTES,
    HEARTBEAT_SECONDS,
    encode_delivery,
    encode_mark,
    tail_subject,
)

logger = logging.getLogger(__name__)

READ_BYTES = 4 * 1024 * 1024
"""At most this many stored bytes are read per pass before they are published."""
MAX_DELIVERY_BYTES = 256 * 1024
"""A stored batch larger than this is announced by a mark naming it, not published: a bulk write
(the Spark sink's chunks of up to 900 KiB) would cost the broker and NATS a second copy of every
byte whether or not anyone tails, and a consumer reads such a batch over Flight at once.  The live
tail is for latency, which small batches need and large ones do not."""


class TailPartition(Protocol):
    """What the live tail needs of a partition it leads."""

    stream: str
    number: int

    @property
    def high_watermark(self) -> int: ...
    @property
    def leader_epoch(self) -> int: ...
    def on_commit(self, listener: Callable[[], None]) -> Callable[[], None]: ...
    def committed_frames(self, offset: int, max_bytes: int) -> list[ReplicaFrame]: ...
    def try_committed_frames(self, offset: int, max_bytes: int) -> list[ReplicaFrame] | None: ...


class TailPublisher:
    """Publishes one partition's committed batches on its live-tail subject."""

    def __init__(self, partition: TailPartition, connection: Callable[[], NatsClient]) -> None:
        """Start at the partition's high watermark (earlier records are read over Flight)."""
        self.partition = partition
        self.subject = tail_subject(partition.stream, partition.number)
        self.next_offset = partition.high_watermark
        self.batches = 0
        """Batches published so far."""
        self.marks = 0
        """Marks published so far (heartbeats and stand-ins for what could not be published)."""
        self._connection = connection
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        self._woken = False
        self._last_sent = 0.0
        self._stop = partition.on_commit(self._committed)
        self._task = asyncio.ensure_future(self._run())

    def _committed(self) -> None:
        """The high watermark moved (on any thread): wake the task, once per pass."""
        if self._woken:
            return
        self._woken = True
        if threading.get_ident() == self._loop_thread:
            self._wake.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                self._loop.call_soon_threadsafe(self._wake.set)

    async def _run(self) -> None:
        await self.heartbeat(force=True)  # consumers learn of a new leader's high watermark at once
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._woken = False
            try:
                await self._publish()
            except Exception:
                logger.exception(
                    "live tail of %s/%d failed a pass", self.partition.stream, self.partition.number
                )

    async def _publish(self) -> None:
        partition = self.partition
        nc = self._connection()
        budget = min(max(nc.max_payload - HEADER_BYTES, 1), MAX_DELIVERY_BYTES)
        while self.next_offset < (hw := partition.high_watermark):
            try:
                frames = partition.try_committed_frames(self.next_offset, READ_BYTES)
                if frames is None:  # the log is busy (an append, a compaction): not on the loop
                    frames = await asyncio.to_thread(partition.committed_frames, self.next_offset, READ_BYTES)
            except OffsetOutOfRangeError as exc:
                # Retention passed us by (or we were never there): go on from what is kept.
                self.next_offset = max(exc.log_start_offset, min(self.next_offset, exc.log_end_offset))
                if self.next_offset >= exc.log_end_offset:
                    return
                continue
            except CorruptSegmentError as exc:
                self.marks += 1  # a stand-in for the damaged range: consumers read it over Flight
                await self._send(
                    encode_delivery(exc.first_offset, exc.last_offset, partition.leader_epoch, hw)
                )
                self.next_offset = exc.last_offset + 1
                continue
            if not frames:
                return
            # The read went up to the high watermark of its own moment, which may be past the
            # one this pass started from: the header names one its last batch is below.
            hw = max(hw, partition.high_watermark)
            for frame in frames:
                if frame.data.size > budget:  # too large for NATS or the tail: read over Flight
                    payload = encode_delivery(frame.base_offset, frame.last_offset, frame.leader_epoch, hw)
                    self.marks += 1
                else:
                    payload = encode_delivery(
                        frame.base_offset, frame.last_offset, frame.leader_epoch, hw, frame.data
                    )
                    self.batches += 1
                await self._send(payload)
            self.next_offset = frames[-1].last_offset + 1

    async def heartbeat(self, *, force: bool = False) -> None:
        """Publish a mark if nothing was sent for :data:`HEARTBEAT_SECONDS` (or at once with ``force``)."""
        if force or time.monotonic() - self._last_sent >= HEARTBEAT_SECONDS:
            self.marks += 1
            await self._send(encode_mark(self.partition.high_watermark, self.partition.leader_epoch))

    async def _send(self, payload: bytes) -> None:
        self._last_sent = time.monotonic()
        try:
            await self._connection().publish(self.subject, payload)
        except Exception as exc:  # noqa: BLE001 - a lost delivery is a gap consumers fill
            logger.debug(
                "live tail of %s/%d: not published: %s", self.partition.stream, self.partition.number, exc
            )

    async def close(self) -> None:
        """Stop publishing (the partition is no longer led here)."""
        self._stop()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
