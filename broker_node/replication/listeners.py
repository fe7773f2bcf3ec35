"""Who hears of a partition's news (an append, an advance of the high watermark), from any thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

Listener = Callable[[], None]


class Listeners:
    """Callbacks told of one kind of news.  The list is replaced, never changed in place, so
    :meth:`notify` runs without a lock on whatever thread has the news while others add and stop
    listeners; a listener must only hand the news on (wake a task, schedule a send), never block."""

    def __init__(self) -> None:
        self._listeners: tuple[Listener, ...] = ()
        self._lock = threading.Lock()

    def add(self, listener: Listener) -> Callable[[], None]:
        """Tell ``listener`` of the news from now on; return what stops it."""
        with self._lock:
            self._listeners = (*self._listeners, listener)

        def stop() -> None:
            with self._lock:
                self._listeners = tuple(each for each in self._listeners if each is not listener)

        return stop

    def notify(self) -> None:
        """Tell every listener."""
        for listener in self._listeners:
            listener()
