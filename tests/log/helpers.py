"""Helpers for commit-log tests."""

from __future__ import annotations

import pyarrow as pa

from broker_node.log import Log, Record


def values(n: int, size: int = 100, start: int = 0) -> list[Record]:
    """``n`` records with distinct values of ``size`` bytes."""
    return [Record(f"{start + i:0{size}d}".encode()) for i in range(n)]


def rows(
    log: Log, start: int | None = None, **kwargs: object
) -> list[tuple[int, bytes | None, bytes | None]]:
    """``(offset, key, value)`` of everything ``log.read`` returns from ``start``."""
    batches = log.read(log.log_start_offset if start is None else start, **kwargs)  # type: ignore[arg-type]
    if not batches:
        return []
    table = pa.Table.from_batches(batches)
    return list(
        zip(
            table.column("offset").to_pylist(),
            table.column("key").to_pylist(),
            table.column("value").to_pylist(),
            strict=True,
        )
    )


class FakeClock:
    """A settable clock (seconds since the epoch) for logs under test."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward (or back, with a negative value)."""
        self.now += seconds
