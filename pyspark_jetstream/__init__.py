"""pyspark-jetstream: a durable, replicated stream log for NATS that Spark reads and writes."""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # Spark finds data sources in top-level ``pyspark_*`` modules that expose
    # ``DefaultSource``; importing Spark only when asked keeps the client light.
    if name == "DefaultSource":
        from pyspark_jetstream.spark.source import JetStreamDataSource

        return JetStreamDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
