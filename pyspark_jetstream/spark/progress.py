"""How far a query is behind, from its progress: Kafka's ``*OffsetsBehindLatest`` figures.

Spark's Kafka source adds ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest``
and ``avgOffsetsBehindLatest`` to each source's ``metrics`` in the query's
progress.  PySpark's Python data source API (4.2) has no way for a source to
report metrics (nor its own ``description``), so the same figures are
computed here from what the progress does carry: the source's ``endOffset``
(where the micro-batch ended) and ``latestOffset`` (the committed end the
source reported, through ``reportLatestOffset``).  ``jetstream status`` and
the broker's ``jetstream_cursor_lag`` metric show the same lag per partition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def offsets_behind(progress: Mapping[str, Any]) -> dict[str, float] | None:
    """``{"minOffsetsBehindLatest", "maxOffsetsBehindLatest", "avgOffsetsBehindLatest"}`` over
    every partition of the ``jetstream`` sources of one progress report
    (``query.lastProgress``), or ``None`` when it has no such source with both offsets."""
    behind: list[int] = []
    for source in progress.get("sources", []):
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        if end is None or latest is None:
            continue
        behind += [
            max(latest[stream][partition] - end.get(stream, {}).get(partition, 0), 0)
            for stream in latest
            for partition in latest[stream]
        ]
    if not behind:
        return None
    return {
        "minOffsetsBehindLatest": float(min(behind)),
        "maxOffsetsBehindLatest": float(max(behind)),
        "avgOffsetsBehindLatest": sum(behind) / len(behind),
    }


def _offsets(value: Any) -> dict[str, dict[str, int]] | None:
    """An offset of this source (a JSON string in the progress) or ``None`` for anything else."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict) or not value:
        return None
    for parts in value.values():
        if not isinstance(parts, dict) or not all(isinstance(o, int) for o in parts.values()):
            return None
    return value
