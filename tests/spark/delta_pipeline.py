"""The Delta pipeline of test_delta: JSON orders from a stream into a Delta table.

Run as a script (its own driver, so that a test can kill it with SIGKILL) or
started in a test's own session (the run that resumes after the kill).
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession, functions
from pyspark.sql.streaming import StreamingQuery


def start(
    spark: SparkSession, servers: str, stream: str, table: str, checkpoint: str, mode: str
) -> StreamingQuery:
    """``mode`` ``forever``: small batches every 100 ms until stopped; ``available-now``: what is there."""
    text = functions.col("value").cast("string")
    orders = (
        spark.readStream.format("jetstream")
        .option("servers", servers)
        .option("stream", stream)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "150" if mode == "forever" else "100000")
        .load()
        .select(
            "partition",
            "offset",
            functions.get_json_object(text, "$.order").cast("long").alias("order"),
            functions.get_json_object(text, "$.amount").cast("long").alias("amount"),
        )
    )
    writer = orders.writeStream.format("delta").option("checkpointLocation", checkpoint)
    if mode == "forever":
        writer = writer.trigger(processingTime="100 milliseconds")
    else:
        writer = writer.trigger(availableNow=True)
    return writer.start(table)


if __name__ == "__main__":
    from pyspark_jetstream.spark.delta import delta_session

    session = delta_session("delta-pipeline", **{"spark.sql.shuffle.partitions": "2"})
    query = start(session, *sys.argv[1:])
    print("STARTED", flush=True)
    query.awaitTermination()
    print("DONE", flush=True)
