"""DataFrames of ``format("jetstream")`` on the suite's deployment, for the Spark tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read(spark: Any, deployment: Any, **options: str) -> Any:
    """A batch read of the source with ``options`` (``servers`` is the deployment's)."""
    return spark.read.format("jetstream").option("servers", deployment.flight).options(**options).load()


def read_stream(spark: Any, deployment: Any, **options: str) -> Any:
    """A streaming read of the source with ``options`` (``servers`` is the deployment's)."""
    return spark.readStream.format("jetstream").option("servers", deployment.flight).options(**options).load()


def analysed(df: Any) -> Any:
    """``df``'s schema, which analyses its plan: a classic session plans a read at ``load()``, a
    Spark Connect one only when the plan is analysed or run."""
    return df.schema


def into_memory(frame: Any, table: str, checkpoint: Path, *, available_now: bool = False) -> Any:
    """The started query writing the streaming ``frame`` into the in-memory ``table`` (``available_now``:
    ``Trigger.AvailableNow``, else Spark's default trigger)."""
    writer = frame.writeStream.format("memory").queryName(table).option("checkpointLocation", str(checkpoint))
    return (writer.trigger(availableNow=True) if available_now else writer).start()
