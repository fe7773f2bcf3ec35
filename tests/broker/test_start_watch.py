"""A start-up step that does not end is named in a warning, with where it is stuck."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from broker_node.start_watch import StartWatch
from pyspark_jetstream.local import LocalBroker


class _Warnings(logging.Handler):
    """Collects the watch's warnings; ``seen`` is set at the first."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.seen.set()


@pytest.fixture
def warnings():
    handler = _Warnings()
    watch_logger = logging.getLogger("broker_node.start_watch")
    watch_logger.addHandler(handler)
    try:
        yield handler
    finally:
        watch_logger.removeHandler(handler)


def _held_in_a_worker_thread(release: threading.Event) -> None:
    release.wait(30)


def _held_on_the_event_loop(warnings: _Warnings) -> None:
    warnings.seen.wait(30)


async def _waiting_for_the_worker(release: threading.Event) -> None:
    await asyncio.to_thread(_held_in_a_worker_thread, release)


def test_a_step_held_in_a_worker_thread_is_named_with_both_stacks(warnings):
    release = threading.Event()
    releaser = threading.Thread(target=lambda: release.set() if warnings.seen.wait(30) else None)
    releaser.start()

    async def start() -> None:
        with StartWatch("b7", slow_after=0.2, check_every=0.05) as watch:
            watch.step("quick")
            watch.step("loading the partitions")
            await _waiting_for_the_worker(release)  # held until the warning came

    asyncio.run(start())
    releaser.join()
    [message] = warnings.messages
    assert "broker b7 has spent" in message and "step 'loading the partitions'" in message
    coroutine, threads = message.split("start-up coroutine:")[1].split("thread ", 1)
    assert "_waiting_for_the_worker" in coroutine  # the await it is suspended in
    assert "_held_in_a_worker_thread" in threads  # and the thread doing the step's work


def test_a_step_that_blocks_the_event_loop_is_still_named(warnings):
    async def start() -> None:
        with StartWatch("b7", slow_after=0.2, check_every=0.05) as watch:
            watch.step("joining the coordinator")
            _held_on_the_event_loop(warnings)  # the loop itself is stuck, the watch is not

    asyncio.run(start())
    [message] = warnings.messages
    assert "step 'joining the coordinator'" in message
    assert "_held_on_the_event_loop" in message


def test_steps_that_end_in_time_warn_nothing_and_the_watch_stops(warnings):
    async def start() -> None:
        with StartWatch("b7", slow_after=30) as watch:
            for name in ("locking the data directory", "starting NATS", "opening to clients"):
                watch.step(name)
                await asyncio.sleep(0)

    asyncio.run(start())
    assert warnings.messages == []
    assert not any(thread.name == "start-watch" for thread in threading.enumerate())


def test_a_local_brokers_log_tail_leaves_out_debug_lines_so_warnings_show(tmp_path):
    broker = LocalBroker(data_dir=tmp_path / "data")
    debug = "2026-11-27 10:00:00,001 DEBUG kazoo.client: Received response(xid=7): ZnodeStat(...)"
    warning = "2026-11-27 10:00:10,002 WARNING broker_node.start_watch: broker b7 has spent 10.0 s starting"
    stack = '  File "broker_node/broker.py", line 380, in sync'
    broker.log_path.write_text("\n".join([debug] * 200 + [warning, stack] + [debug] * 200) + "\n")
    tail = broker.log_tail()
    assert warning in tail and stack in tail
    assert "DEBUG" not in tail
