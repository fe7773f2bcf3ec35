"""The live tail: each partition led here publishes its committed batches once on NATS.

A consumer path, apart from ingestion: it reads the log and publishes on the
broker's NATS connection, which it is handed.
"""
