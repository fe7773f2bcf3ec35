"""Building a Spark session that can use ``format("jetstream")``.

Spark runs Python workers with ``PYSPARK_PYTHON``; if that interpreter lacks
pyspark-jetstream, tasks fail with "Python worker failed to connect back".
The helper points it at the interpreter running this code (which has the
project installed) unless the user set it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql import SparkSession

from .source import JetStreamDataSource


def jetstream_session(
    app_name: str = "pyspark-jetstream", master: str = "local[2]", **conf: Any
) -> SparkSession:
    """A Spark session (local by default) with the ``jetstream`` data source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(master)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        **conf,
    }
    for key, value in settings.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """Register ``format("jetstream")`` on an existing session (e.g. on Databricks)."""
    spark.dataSource.register(JetStreamDataSource)
