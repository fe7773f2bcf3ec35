"""Small record batches joined into fewer, larger ones before they are sent or handed on.

A stream published a message at a time is stored a message or a few per
batch, and every batch costs its reader the same whatever its rows: an IPC
message to decode (a Flight read), a conversion and a hand-over to the JVM (a
Spark task).  Thousands of one-message batches made a read of a few thousand
messages cost hundreds of milliseconds.  The broker joins what it reads before
sending it, and the Spark reader joins what a read brought back (batches
older brokers sent as stored, or a compacted log's).

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa


def joined(batches: Iterable[pa.RecordBatch], *, small_rows: int, most_rows: int) -> list[pa.RecordBatch]:
    """``batches`` in order without empty ones, each run of consecutive small ones (under
    ``small_rows`` rows) joined into batches of at most ``most_rows`` rows; the others as they
    are (joining them would only copy them).  The batches must share one schema."""
    out: list[pa.RecordBatch] = []
    run: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        if batch.num_rows >= small_rows or rows + batch.num_rows > most_rows:
            out.extend(_one(run))
            run, rows = [], 0
        if batch.num_rows >= small_rows:
            out.append(batch)
            continue
        run.append(batch)
        rows += batch.num_rows
    out.extend(_one(run))
    return out


def _one(run: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    return run if len(run) <= 1 else [pa.concat_batches(run)]
