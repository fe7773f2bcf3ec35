"""DataFrames of ``format("jetstream")`` on the suite's deployment, for the Spark tests."""

from __future__ import annotations

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
