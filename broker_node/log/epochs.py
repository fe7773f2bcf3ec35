"""The leader-epoch cache: which leader epoch started at which offset.

Replication uses it to truncate a follower to the end of the leader's last
matching epoch rather than to its high watermark (the fix of Kafka KIP-101).
Checkpoint layout, ``leader-epoch.checkpoint`` (see :mod:`.checkpoint`)::

    1                    format version
    <count>
    <epoch> <start offset>   one line per entry, epochs and starts ascending
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from .checkpoint import read_int_pairs, write_int_pairs

UNDEFINED = -1
"""Epoch and end offset reported for an epoch older than anything the cache knows."""


class EpochEndOffset(NamedTuple):
    """Answer to "where does epoch *e* end?"."""

    epoch: int
    """The largest known epoch <= the requested one, or ``UNDEFINED``."""
    end_offset: int
    """One past the last offset written in ``epoch``, or ``UNDEFINED``."""


class LeaderEpochCache:
    """Ordered ``(epoch, start offset)`` entries, checkpointed on every change to ``path``
    (kept in memory only when ``path`` is ``None``, as a memory-backed log's are)."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._entries: list[tuple[int, int]] = (read_int_pairs(path) if path is not None else None) or []
        ordered = all(
            e1 < e2 and s1 <= s2 for (e1, s1), (e2, s2) in zip(self._entries, self._entries[1:], strict=False)
        )
        if not ordered:
            self._entries = []

    @property
    def entries(self) -> tuple[tuple[int, int], ...]:
        """All entries, oldest first."""
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int | None:
        """The newest epoch, or ``None`` before the first assignment."""
        return self._entries[-1][0] if self._entries else None

    def epoch_at(self, offset: int) -> int | None:
        """The epoch in force at ``offset`` (the newest one starting at or before it), or ``None``."""
        found = None
        for epoch, start in self._entries:
            if start > offset:
                break
            found = epoch
        return found

    def replace(self, entries: list[tuple[int, int]]) -> None:
        """Take ``entries`` (epochs and starts ascending) instead of what the cache holds."""
        if entries != self._entries:
            self._entries = list(entries)
            self._save()

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset``; a repeat of the latest is a no-op.

        A newer epoch starting where the latest one starts replaces it: that
        epoch holds no data, and nothing will ever be written in it.
        """
        if self._entries:
            latest, latest_start = self._entries[-1]
            if epoch == latest:
                return
            if epoch < latest:
                raise ValueError(f"leader epoch {epoch} is older than the current epoch {latest}")
            if start_offset < latest_start:
                raise ValueError(
                    f"epoch {epoch} cannot start at offset {start_offset}, before epoch "
                    f"{latest} which starts at {latest_start}"
                )
            if start_offset == latest_start:
                self._entries.pop()
        self._entries.append((epoch, start_offset))
        self._save()

    def end_offset_for(self, epoch: int, log_end_offset: int) -> EpochEndOffset:
        """The largest epoch <= ``epoch`` and the offset where it ends.

        The latest epoch ends at ``log_end_offset``; an older one ends where
        the next newer epoch starts.  An epoch older than every entry (or an
        empty cache) gives ``(UNDEFINED, UNDEFINED)``.
        """
        found = None
        for i, (e, _) in enumerate(self._entries):
            if e > epoch:
                break
            found = i
        if found is None:
            return EpochEndOffset(UNDEFINED, UNDEFINED)
        if found == len(self._entries) - 1:
            return EpochEndOffset(self._entries[found][0], log_end_offset)
        return EpochEndOffset(self._entries[found][0], self._entries[found + 1][1])

    def truncate_from_end(self, offset: int, *, inclusive: bool = True) -> None:
        """Forget epochs that start at ``offset`` or later (only later if not ``inclusive``)."""
        kept = [(e, s) for e, s in self._entries if s < offset or (not inclusive and s == offset)]
        if kept != self._entries:
            self._entries = kept
            self._save()

    def truncate_from_start(self, offset: int) -> None:
        """Forget what lies before ``offset``: the epoch in force there now starts at it."""
        below = [i for i, (_, s) in enumerate(self._entries) if s < offset]
        if not below:
            return
        rest = self._entries[below[-1] + 1 :]
        if rest and rest[0][1] == offset:
            self._entries = rest
        else:
            self._entries = [(self._entries[below[-1]][0], offset), *rest]
        self._save()

    def _save(self) -> None:
        if self._path is not None:
            write_int_pairs(self._path, self._entries)
