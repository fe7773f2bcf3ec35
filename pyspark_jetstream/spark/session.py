"""Building a Spark session that can use ``format("jetstream")``.

Spark runs Python workers with ``PYSPARK_PYTHON``; if that interpreter lacks
pyspark-jetstream, tasks fail with "Python worker failed to connect back".
The helper points it at the interpreter running this code (which has the
project installed) unless the user set it.  On a cluster the executors'
Python is another machine's: the helper ships the package to them (see
``shipping.py``).

This module imports nothing that needs a JVM: :func:`register` also serves a
Spark Connect client (``pyspark-client``, which has no py4j); what only a
classic session has is imported where it is used.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql import SparkSession

from .shipping import is_connect, ship_to_executors, ships_by_default
from .source import JetStreamDataSource


def jetstream_session(
    app_name: str = "pyspark-jetstream",
    master: str = "local[2]",
    *,
    ship_package: bool | None = None,
    **conf: Any,
) -> SparkSession:
    """A Spark session (local by default) with the ``jetstream`` data source registered.

    ``ship_package``: send a zip of the installed package to the executors
    (:func:`~pyspark_jetstream.spark.ship_to_executors`), so that they need
    only its dependencies (pyarrow, nats-py) installed.  The default ships
    to every master but a local one; ``False`` where every executor has
    pyspark-jetstream installed.
    """
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
    if ships_by_default(spark.sparkContext.master or "") if ship_package is None else ship_package:
        ship_to_executors(spark)  # registers the source too
    else:
        register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """Make ``format("jetstream")`` available on an existing session (e.g. on Databricks).

    Spark registers this source by itself where it can: it looks for
    ``pyspark_*`` packages that expose ``DefaultSource`` (this one does) with
    the workers' Python.  Registering over that would log "The data source
    jetstream replaced a statically registered data source" here and again at
    the start of every streaming query, so the source is registered only
    where Spark has not found it (the lookup found nothing, or the session is
    a Spark Connect one, whose server this process cannot ask).

    Spark looks once per JVM, at the first query that names a data source: a
    package installed after that (``%pip install`` on a running cluster) is
    found only through this call, or after a restart.
    """
    if not _found_by_spark(spark):
        spark.dataSource.register(JetStreamDataSource)


def _found_by_spark(spark: SparkSession) -> bool:
    """Whether the session already resolves ``format("jetstream")`` (registered or found)."""
    session = getattr(spark, "_jsparkSession", None)
    if session is None or is_connect(spark):  # Spark Connect: no JVM here to ask
        return False
    from py4j.protocol import Py4JError  # a classic session has py4j; a Connect client may not

    try:
        manager = session.sessionState().dataSourceManager()
        return bool(manager.dataSourceExists(JetStreamDataSource.name()))
    except Py4JError:  # a JVM that does not let Python see its data sources: register to be sure
        return False
