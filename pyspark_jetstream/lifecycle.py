"""Things that start processes on this machine and stop them: a ``with`` block does both."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self


class StartStop(ABC):
    """``with x:`` calls ``x.start()`` and, on leaving, ``x.stop()``.

    A ``start()`` that fails part of the way is followed by ``stop()`` too, so
    nothing it started is left running; ``stop()`` must therefore cope with a
    half-started object.
    """

    @abstractmethod
    def start(self) -> Self:
        """Start everything; returns this object."""

    @abstractmethod
    def stop(self) -> object:
        """Stop whatever is running; safe to call when nothing is."""

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
