"""A Spark driver on the standalone cluster of ``standalone.py``; what it saw, as JSON.

Run by ``test_standalone.py`` (through ``standalone.run_driver``) as a process
of its own; the tests assert on the JSON this prints last.  Two sessions,
one after the other (one driver JVM start for both):

- ``bare``: a session that does not ship the package: where executors find
  it, the errors of a read and a write, then ``ship_to_executors`` and a read;
- ``shipped``: ``jetstream_session`` on the cluster (it ships the package):
  a batch write, a batch read, and a ``Trigger.AvailableNow`` query from
  stream to stream.
"""

from __future__ import annotations

import importlib.util
import json
import sys

from pyspark_jetstream.spark import jetstream_session, ship_to_executors


def where_executors_import_the_package(spark) -> list[str | None]:
    """``pyspark_jetstream``'s origin in an executor's Python (None: not importable there)."""

    def origin(_):  # nested: pickled by value, since the executors cannot import this module
        spec = importlib.util.find_spec("pyspark_jetstream")
        return None if spec is None else spec.origin

    return spark.sparkContext.parallelize([0], 1).map(origin).collect()


def session(args: dict, **options):
    return jetstream_session(
        "pyspark-jetstream-standalone",
        master=args["master"],
        **options,
        **{
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "512m",
            "spark.cores.max": "2",
            "spark.task.maxFailures": "1",  # a failing task fails its job at once
        },
    )


def read(spark, args: dict, stream: str):
    return spark.read.format("jetstream").option("servers", args["flight"]).option("stream", stream).load()


def write(frame, args: dict, stream: str) -> None:
    frame.write.format("jetstream").mode("append").option("servers", args["flight"]).option(
        "nats", args["nats"]
    ).option("stream", stream).save()


def error_of(action) -> str | None:
    """The message of what ``action()`` raises (None if it raises nothing)."""
    try:
        action()
    except Exception as exc:
        return str(exc)
    return None


def bare(args: dict) -> dict:
    spark = session(args, ship_package=False)
    try:
        result = {"before": where_executors_import_the_package(spark)}
        result["read_error"] = error_of(lambda: read(spark, args, args["stream"]).collect())
        frame = spark.createDataFrame([("a",)], "value string")
        result["write_error"] = error_of(lambda: write(frame, args, args["stream"]))
        result["shipped"] = str(ship_to_executors(spark))
        result["after"] = where_executors_import_the_package(spark)
        result["count"] = read(spark, args, args["stream"]).count()
        return result
    finally:
        spark.stop()


def shipped(args: dict) -> dict:
    spark = session(args)  # not local: jetstream_session ships the package
    try:
        result = {"origin": where_executors_import_the_package(spark)}
        rows = [(f"k{i}", f"v{i}") for i in range(200)]
        write(spark.createDataFrame(rows, "key string, value string").repartition(2), args, args["source"])
        result["read"] = sorted(r.value.decode() for r in read(spark, args, args["source"]).collect())
        query = (
            spark.readStream.format("jetstream")
            .option("servers", args["flight"])
            .option("stream", args["source"])
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", "120")
            .load()
            .select("key", "value")
            .writeStream.format("jetstream")
            .option("servers", args["flight"])
            .option("nats", args["nats"])
            .option("stream", args["sink"])
            .option("checkpointLocation", args["checkpoint"])
            .trigger(availableNow=True)
            .start()
        )
        result["ended"] = query.awaitTermination(120)
        result["stream_error"] = None if query.exception() is None else str(query.exception())
        result["batches"] = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        return result
    finally:
        spark.stop()


if __name__ == "__main__":
    arguments = json.loads(sys.argv[1])
    print(json.dumps({"bare": bare(arguments), "shipped": shipped(arguments)}))
