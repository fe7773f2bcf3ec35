"""Choosing a partition for a message: by key hash, round-robin, or explicitly.

A partitioner is any callable ``(key, partitions) -> partition``.  The key
hash is CRC-32 (stable across processes and languages, unlike ``hash()``).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable

Partitioner = Callable[[bytes | None, int], int]


def key_hash(key: bytes | None, partitions: int) -> int:
    """Messages with the same key go to the same partition; no key goes to 0."""
    return 0 if key is None else zlib.crc32(key) % partitions


class RoundRobin:
    """Spread messages over partitions in turn, ignoring keys."""

    def __init__(self) -> None:
        self._next = itertools.count()

    def __call__(self, key: bytes | None, partitions: int) -> int:
        return next(self._next) % partitions
