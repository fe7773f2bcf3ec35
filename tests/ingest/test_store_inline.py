"""An idempotent producer's small message is stored on the event loop when the log is free.

Each such message is its own append (the broker cannot join one producer's
sequences into a batch); a hop to a worker thread and back for each made an
idempotent producer's pipeline 40 times slower than a plain one's.  A busy
log is still never waited for on the loop: the append goes to a thread.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pyarrow as pa

from broker_node.ingest.decoding import Whole
from broker_node.ingest.partition_store import INLINE_BYTES, PartitionStore
from broker_node.log_terms import LOG_TERMS
from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.envelope import Envelope


class StubPartition:
    """Records the thread and ``wait`` of each idempotent append; busy: refuses ``wait=False``."""

    appends_sync = False

    def __init__(self, *, busy: bool = False) -> None:
        self.busy = busy
        self.calls: list[tuple[bool, bool]] = []
        """(called on the event loop's thread, wait) per call."""
        self.loop_thread = threading.get_ident()

    def append_idempotent(
        self, table: Any, producer: str, epoch: int, sequence: int, **kw: Any
    ) -> Ack | None:
        wait = kw.get("wait", True)
        self.calls.append((threading.get_ident() == self.loop_thread, wait))
        if self.busy and not wait:
            return None
        return Ack("s", 0, sequence, sequence)


def whole(size: int) -> Whole:
    envelope = Envelope(value=b"v", producer_id="p", sequence=3, producer_epoch=0)
    table = pa.table({"value": pa.array([b"x" * size], pa.binary())})
    return Whole(envelope, table, [], None, True)


def store(partition: StubPartition) -> PartitionStore:
    return PartitionStore(partition, LOG_TERMS, "s/0", {})  # type: ignore[arg-type]


def test_a_small_idempotent_message_is_stored_on_the_loop_without_a_thread():
    partition = StubPartition()
    ack = asyncio.run(store(partition).whole(whole(100)))
    assert isinstance(ack, Ack) and ack.ok and ack.first_offset == 3
    assert partition.calls == [(True, False)]


def test_a_busy_log_sends_the_append_to_a_thread_where_it_may_wait():
    partition = StubPartition(busy=True)
    ack = asyncio.run(store(partition).whole(whole(100)))
    assert isinstance(ack, Ack) and ack.ok
    assert partition.calls == [(True, False), (False, True)]


def test_a_large_idempotent_message_goes_to_a_thread_at_once():
    partition = StubPartition()
    ack = asyncio.run(store(partition).whole(whole(INLINE_BYTES + 1)))
    assert isinstance(ack, Ack) and ack.ok
    assert partition.calls == [(False, True)]
