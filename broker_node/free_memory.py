"""Memory the broker has freed, handed back to the system (glibc's ``malloc_trim``).

glibc keeps what a thread frees in that thread's arena for the thread to
reuse, and hands back only the free space at the top of an arena.  A broker
frees from many threads (Flight's call threads, the loop, the worker
threads), so holes between live blocks add up: in an hour-long soak the
leader serving the live tail and a Spark query grew from 213 to 250 MB of
anonymous memory while holding no more data, and one ``malloc_trim(0)``
took it from 221 to 123 MB.  ``malloc_trim`` also releases the free pages
inside each arena, so calling it now and then keeps the broker's resident
memory near what it uses, which is what an operator watching it (and a
container's memory limit) counts.

Where the C library is not glibc (musl, macOS) there is nothing to call:
:meth:`FreeMemory.release` does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # no such library, or a C library without malloc_trim
        return None


def _anonymous_bytes() -> int:
    """This process's anonymous resident memory (``RssAnon``), 0 where ``/proc`` does not say."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class FreeMemory:
    """Hands the free pages of every malloc arena back to the system when asked, and counts it
    (what the metrics show as ``memory_releases`` and ``memory_released_bytes``)."""

    def __init__(self) -> None:
        self.releases = 0
        """Times the free memory was handed back."""
        self.released_bytes = 0
        """Anonymous resident memory those times took away, summed."""

    def release(self) -> None:
        """Hand the free memory back (nothing where the C library has no ``malloc_trim``).  Takes
        each arena's lock in turn: call it off the event loop."""
        trim = _malloc_trim()
        if trim is None:
            return
        before = _anonymous_bytes()
        trim(0)
        self.released_bytes += max(0, before - _anonymous_bytes())
        self.releases += 1
