"""The pyspark-jetstream broker: NATS ingestion, the commit log, replication and the Flight API."""
