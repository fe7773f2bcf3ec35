"""Whose cursors a streaming query stores: one consumer name per query, kept in its checkpoint.

A query's position is stored as cursors under a consumer name (see
:meth:`.source.JetStreamStreamReader.commit`).  Given with ``consumerId``, the
name is the user's.  Otherwise each query gets its own: Spark's Python data
source API tells a reader neither the query's checkpoint location nor its id
(PySpark 4.2 passes ``toMicroBatchStream``'s checkpoint path to no Python
code), so the name is made when a new query asks for its initial offset and
carried inside the offsets themselves, which Spark writes into the query's
checkpoint (its offset log) and hands back at every later call, restarts
included::

    {"#consumer": "spark-1f0c9a7e3b5d4c21", "orders": {"0": 17, "1": 12}}

So the name is stable across restarts of one query (same checkpoint), and a
query on a fresh checkpoint gets a fresh one, as Spark's Kafka source gives
each query its own consumer group.  ``#`` cannot start a stream name, so the
key never collides with a stream.  Offsets without it (a checkpoint written
before names were kept there) keep the name derived from the options, as
before (stable for that checkpoint, but shared by queries with the same options).

Two queries running at once with one ``consumerId`` would store cursors over
each other's: :func:`check_sole_writer` finds cursors that moved since this
query stored them and refuses to go on.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from pyspark_jetstream.protocol.errors import InvalidArgumentError

from .options import Offsets

CONSUMER_KEY = "#consumer"
"""The offsets' key holding the query's consumer name (when ``consumerId`` is not given)."""


def new_consumer() -> str:
    """A consumer name for a new query."""
    return "spark-" + uuid.uuid4().hex[:16]


def with_consumer(offsets: Offsets, consumer: str | None) -> dict[str, Any]:
    """``offsets`` carrying ``consumer`` (first, so equal positions serialize alike); unchanged
    for ``None``."""
    return offsets if consumer is None else {CONSUMER_KEY: consumer, **offsets}


def split_consumer(offsets: Mapping[str, Any]) -> tuple[str | None, Offsets]:
    """The consumer name ``offsets`` carry (``None`` if none), and the offsets without it."""
    consumer = offsets.get(CONSUMER_KEY)
    if consumer is not None and not isinstance(consumer, str):
        raise InvalidArgumentError(
            f"the checkpoint's offsets hold {CONSUMER_KEY!r} = {consumer!r}, not a consumer name"
        )
    return consumer, {stream: dict(parts) for stream, parts in offsets.items() if stream != CONSUMER_KEY}


def check_sole_writer(consumer: str, stored: Offsets, fetch: Callable[[str, int], int | None]) -> None:
    """Raise ``InvalidArgumentError`` if a cursor of ``consumer`` is not where this query stored it
    (``stored``; ``fetch(stream, partition)`` reads one, ``None`` for none): another query stores
    them too.  A cursor that is gone (deleted by hand, or its stream) is no other query's."""
    for stream, partitions in stored.items():
        for partition, offset in partitions.items():
            found = fetch(stream, int(partition))
            if found is not None and found != offset:
                raise InvalidArgumentError(
                    f"consumerId {consumer!r}: another query stores its cursors too ({stream}/{partition} "
                    f"is at {found}, this query stored {offset}); give each running query its own "
                    "consumerId (or leave it out: each query then gets its own)"
                )
