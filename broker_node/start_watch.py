"""A broker's start-up in named steps, and a warning that names a step that does not end.

A broker that hangs while it starts registers with the coordinator and then
says nothing: the runtime file never appears, and whoever started it sees a
timeout.  :class:`StartWatch` is told each step as it begins; a thread of its
own checks once a second and, when one step has run for
:data:`SLOW_STEP_SECONDS`, logs one WARNING naming the step with the stacks
of the start-up's coroutine and of the process's threads, so the log of a
stuck start says where it is stuck.  Each step is also logged at DEBUG as it
begins.

The check runs on its own thread, so it warns even when the step blocks the
event loop itself.  Reading another thread's stacks is a snapshot taken
without stopping it; good enough to name a hang, not to time one.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from types import FrameType, TracebackType

logger = logging.getLogger(__name__)

SLOW_STEP_SECONDS = 10.0
"""A start-up step running this long gets the warning (once per step)."""
_FRAMES_PER_STACK = 8
"""The innermost frames shown of each stack."""


class StartWatch:
    """Used as ``with StartWatch(id) as watch: watch.step("..."); ...`` in the start-up coroutine."""

    def __init__(
        self, broker_id: str, slow_after: float = SLOW_STEP_SECONDS, check_every: float = 1.0
    ) -> None:
        self.broker_id = broker_id
        self.slow_after = slow_after
        self._check_every = check_every
        self._lock = threading.Lock()
        self._step: str | None = None
        self._since = 0.0
        self._warned: str | None = None
        self._ended = threading.Event()
        self._task: asyncio.Task[object] | None = None
        self._thread = threading.Thread(target=self._watch, name="start-watch", daemon=True)

    def __enter__(self) -> StartWatch:
        try:
            self._task = asyncio.current_task()
        except RuntimeError:  # not on an event loop: only the threads' stacks are shown
            self._task = None
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._ended.set()
        self._thread.join()
        step, since = self._step, self._since
        if kind is not None and step is not None:
            logger.info(
                "broker %s start failed in step %r after %.1f s",
                self.broker_id,
                step,
                time.monotonic() - since,
            )

    def step(self, name: str) -> None:
        """The start-up begins ``name`` (and ended the step before)."""
        with self._lock:
            self._step, self._since = name, time.monotonic()
        logger.debug("broker %s start: %s", self.broker_id, name)

    def _watch(self) -> None:
        while not self._ended.wait(self._check_every):
            with self._lock:
                step, since = self._step, self._since
            if step is None or step == self._warned:
                continue
            spent = time.monotonic() - since
            if spent >= self.slow_after:
                self._warned = step
                logger.warning(
                    "broker %s has spent %.1f s starting in step %r and is still in it; where it is:\n%s",
                    self.broker_id,
                    spent,
                    step,
                    self._stacks(),
                )

    def _stacks(self) -> str:
        parts = []
        task = self._task
        if task is not None and not task.done():
            summary = traceback.StackSummary.extract((frame, frame.f_lineno) for frame in _awaits(task))
            lines = summary.format()
            parts.append("start-up coroutine:\n" + "".join(lines[-_FRAMES_PER_STACK:]).rstrip())
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == threading.get_ident():
                continue  # this watch itself
            lines = traceback.format_list(traceback.extract_stack(frame))
            parts.append(
                f"thread {names.get(ident, ident)}:\n" + "".join(lines[-_FRAMES_PER_STACK:]).rstrip()
            )
        return "\n".join(parts)


def _awaits(task: asyncio.Task[object]) -> list[FrameType]:
    """The frames of the coroutines ``task`` is suspended in, outermost first (a suspended
    coroutine's frame has no ``f_back``: the chain is its ``cr_await``)."""
    frames: list[FrameType] = []
    awaited: object = task.get_coro()
    while awaited is not None and len(frames) < 64:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is not None:
            frames.append(frame)
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return frames
