"""The schema versions a typed stream's batches were stored with, read back from its log.

Each frame of a typed stream carries the version its values were parsed with
and that version's fields (see :mod:`.typed_frames`), so a stream's versions
can be found again from the data alone, when the metadata holding them is lost.
"""

from __future__ import annotations

import contextlib

import pyarrow as pa

from .errors import CorruptSegmentError
from .log_store import LogStore
from .typed_frames import version_of


def stored_versions(log: LogStore, *, max_bytes: int = 16 * 1024 * 1024) -> dict[int, pa.Schema]:
    """Every schema version the log's batches were parsed with, and its fields (the first batch of
    each version speaks for it): what a rebuild of lost metadata reads back from the data.
    Damaged ranges and frames whose typed columns do not decode are skipped."""
    versions: dict[int, pa.Schema] = {}
    offset, end = log.log_start_offset, log.log_end_offset
    while offset < end:
        try:
            frames = log.read_frames(offset, max_bytes=max_bytes, upper_bound=end)
        except CorruptSegmentError as exc:
            offset = max(offset, exc.last_offset) + 1
            continue
        if not frames:
            break  # the rest is a compaction gap
        for frame in frames:
            with contextlib.suppress(ValueError):
                found = version_of(frame.data)
                if found is not None:
                    versions.setdefault(*found)
        offset = frames[-1].last_offset + 1
    return versions
