"""pyspark-jetstream: a durable, replicated stream log for NATS that Spark reads and writes."""

__version__ = "0.1.0"
