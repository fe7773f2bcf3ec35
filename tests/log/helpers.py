"""Helpers for commit-log tests."""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings

from broker_node.log import Log, Record
from broker_node.log import segment as segment_module
from pyspark_jetstream.protocol.schema import LOG_SCHEMA


@contextlib.contextmanager
def held_elsewhere(lock: Any) -> Iterator[None]:
    """``lock`` held by another thread for the ``with`` block, as a compaction or a worker thread's
    append holds it."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        yield
    finally:
        release.set()
        holder.join(10)


def machine_settings(variable: str, examples: int, steps: int) -> settings:
    """Hypothesis settings for a log state machine: ``examples`` runs (or as many as the
    environment's ``variable`` says) of up to ``steps`` steps, with no time limit per run."""
    return settings(
        max_examples=int(os.environ.get(variable, str(examples))),
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


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


class _NoSpaceFile:
    """A file whose writes fail as on a full disk; everything else goes to the real file."""

    def __init__(self, f: Any) -> None:
        self._f = f

    def write(self, data: bytes) -> int:
        if len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> _NoSpaceFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


def fill_the_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the file system behave as a full disk until ``monkeypatch.undo()``.

    Writes (to new files and to the files the log holds open), fsyncs and
    renames fail with ENOSPC; opening, reading, memory mapping, truncating and
    deleting still work, as they do on a real full disk.
    """
    real_open = builtins.open

    def open_no_space(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(file, mode, *args, **kwargs)
        return _NoSpaceFile(f) if set(mode) & set("wax+") else f

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(segment_module, "_write_all", no_space)  # files the log holds open
    monkeypatch.setattr(builtins, "open", open_no_space)
    monkeypatch.setattr(io, "open", open_no_space)
    for name in ("fsync", "replace", "rename"):
        monkeypatch.setattr(os, name, no_space)


def open_files_under(directory: Path) -> list[str]:
    """Files under ``directory`` this process holds open or memory-mapped."""
    prefix = str(directory.resolve())
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed while listing
        if target.startswith(prefix):
            found.add(target)
    with open("/proc/self/maps") as maps:
        found.update(line.split()[-1] for line in maps if prefix in line)
    return sorted(found)


def stored_batch(rows: int, first_offset: int = 0, leader_epoch: int = 0, **columns: Any) -> pa.RecordBatch:
    """A batch of the log's columns as the log stores it: ``rows`` rows from ``first_offset``,
    timestamp 0, ``leader_epoch``, the given ``columns`` (value lists by name), nulls elsewhere."""
    given = {
        "offset": range(first_offset, first_offset + rows),
        "timestamp": [0] * rows,
        "leader_epoch": [leader_epoch] * rows,
        **columns,
    }
    arrays = [pa.array(given.get(f.name, [None] * rows), f.type) for f in LOG_SCHEMA]
    return pa.RecordBatch.from_arrays(arrays, schema=LOG_SCHEMA)
