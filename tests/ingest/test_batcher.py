"""The batcher's rules: when a flush runs, what a batch holds, which ids wait to be stored."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from broker_node.ingest.batcher import Batcher
from broker_node.ingest.replies import AckTarget


@dataclass(frozen=True)
class Limits:
    max_batch_messages: int = 3
    max_batch_bytes: int = 100
    max_delay: float = 0.0


class Flushes:
    """A batcher's flush that takes the pending batch, as the partition's ingest does."""

    def __init__(self) -> None:
        self.batches: list[list[object]] = []
        self.done = asyncio.Event()
        self.batcher: Batcher | None = None

    async def __call__(self) -> None:
        assert self.batcher is not None
        batch = self.batcher.take()
        if batch is not None:
            self.batches.append(batch.records)
            self.batcher.stored(batch)
        self.done.set()


@dataclass
class Queue:
    pending_msgs: int


def batcher(limits: Limits, drained: bool = True) -> tuple[Batcher, Flushes]:
    flushes = Flushes()
    flushes.batcher = Batcher(limits, flushes, "s/0", {})
    flushes.batcher.queue = Queue(0 if drained else 5)
    return flushes.batcher, flushes


def test_a_batch_flushes_at_once_when_full_by_count_or_by_bytes():
    async def run():
        by_count, _ = batcher(Limits(max_delay=60), drained=False)
        assert [by_count.add(i, 1, None, None) for i in range(3)] == [False, False, True]
        by_bytes, _ = batcher(Limits(max_delay=60), drained=False)
        assert by_bytes.add("a", 60, None, None) is False
        assert by_bytes.add("b", 40, None, None) is True  # reaches max_batch_bytes
        by_count.close()
        by_bytes.close()

    asyncio.run(run())


def test_a_message_that_would_overflow_the_bytes_limit_asks_for_a_flush_first():
    async def run():
        b, _ = batcher(Limits(max_delay=60), drained=False)
        assert not b.overflows(1000)  # an empty batch takes even an oversized message
        b.add("a", 60, None, None)
        assert not b.overflows(40)
        assert b.overflows(41)
        b.close()

    asyncio.run(run())


def test_with_no_delay_a_drained_queue_flushes_now_and_a_busy_one_a_loop_iteration_later():
    async def run():
        now, _ = batcher(Limits(), drained=True)
        assert now.add("a", 1, None, None) is True
        later, flushes = batcher(Limits(), drained=False)
        assert later.add("a", 1, None, None) is False
        assert later.add("b", 1, None, None) is False  # one timed flush for both
        await asyncio.wait_for(flushes.done.wait(), 5)
        assert flushes.batches == [["a", "b"]]

    asyncio.run(run())


def test_with_a_delay_the_flush_waits_for_more_and_close_cancels_it():
    async def run():
        b, flushes = batcher(Limits(max_delay=0.05), drained=True)  # a delay: drained does not matter
        assert b.add("a", 1, None, None) is False
        await asyncio.wait_for(flushes.done.wait(), 5)
        assert flushes.batches == [["a"]]
        closed, never = batcher(Limits(max_delay=60))
        closed.add("a", 1, None, None)
        closed.close()
        assert not never.done.is_set() and closed.pending.records == ["a"]  # left to the caller's flush

    asyncio.run(run())


def test_ids_wait_in_the_pending_batch_and_in_those_being_stored_until_stored():
    async def run():
        b, _ = batcher(Limits(max_delay=60), drained=False)
        target = AckTarget("_INBOX.x", "1", False, 0.0)
        b.add("a", 1, target, "m-a")
        b.add("b", 1, None, None)
        assert b.waiting("m-a") == (b.pending, 0)
        taken = b.take()
        assert taken is not None and taken.records == ["a", "b"] and taken.targets == [target, None]
        assert b.pending.records == [] and b.take() is None
        assert b.waiting("m-a") == (taken, 0)  # being stored: still waits there
        held = b.hold([("m-x", 0), ("m-y", 2), ("m-x", 3)])
        assert b.waiting("m-y") == (held, 2) and b.waiting("m-x") == (held, 0)  # its first row
        b.stored(taken)
        b.stored(held)
        assert b.waiting("m-a") is None and b.waiting("m-y") is None
        b.close()

    asyncio.run(run())
