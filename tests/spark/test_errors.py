"""What a failed query shows last is ours, with the fix (issue 23, item 7).

Spark wraps a Python data source's error in its own: a traceback, then
``SQLSTATE: ...`` and, for a streaming query, the query's state.  What the
user reads as the error is the last exception line of that text.
"""

from __future__ import annotations

import re
import time

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.types import StructType
from pyspark.sql.utils import AnalysisException

from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.spark.options import check_option_names
from pyspark_jetstream.spark.source import JetStreamDataSource, RefusedStreamReader

from .frames import analysed, into_memory, read, read_stream

ERROR = "pyspark_jetstream.protocol.errors.InvalidArgumentError: "
UNKNOWN_STREAM = "pyspark_jetstream.protocol.errors.UnknownStreamError: "
UNAVAILABLE = "pyspark_jetstream.protocol.errors.UnavailableError: "


def last_error_line(exc: BaseException) -> str:
    """The last Python exception line of what Spark shows for ``exc``."""
    lines = [line for line in str(exc).splitlines() if re.match(r"[\w.]+(Error|Exception): ", line)]
    return lines[-1] if lines else ""


def run_stream(spark, deployment, tmp_path, **options) -> None:
    """A ``Trigger.AvailableNow`` query of the source into memory, to its end."""
    frame = read_stream(spark, deployment, **options)
    query = into_memory(frame, f"q{tmp_path.name.replace('-', '_')}", tmp_path / "ck", available_now=True)
    try:
        query.awaitTermination()
    finally:
        query.stop()


@pytest.mark.connect
def test_a_mistyped_option_is_refused_when_the_read_is_planned(spark, deployment, client, name):
    client.create_stream(name, name)
    typo = f"{ERROR}unknown option 'startingoffset' (Spark passes option names in lower case); "
    for reader in (spark.read, spark.readStream):
        # planning the read fails: no query starts, no reader is made
        with pytest.raises(AnalysisException) as failure:
            analysed(
                reader.format("jetstream")
                .option("servers", deployment.flight)
                .option("stream", name)
                .option("startingOffset", "earliest")
                .load()
            )
        assert last_error_line(failure.value) == typo + "did you mean 'startingOffsets'?"


def test_a_mistyped_sink_option_ends_with_the_closest_name(spark, deployment, client, name):
    client.create_stream(name, name)
    df = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(AnalysisException) as failure:
        df.write.format("jetstream").mode("append").option("servers", deployment.flight).option(
            "stream", name
        ).option("maxBatchByte", "100").save()
    assert last_error_line(failure.value) == (
        f"{ERROR}unknown option 'maxbatchbyte' (Spark passes option names in lower case); "
        "did you mean 'maxBatchBytes'?"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"endingOffsets": "latest"},
            "endingOffsets and endingTimestamp are for batch reads (spark.read), not streams",
        ),
        ({"maxBatchBytes": "100"}, "option 'maxBatchBytes' is for writes (df.write, df.writeStream) only"),
    ],
)
def test_a_stream_reader_spark_cannot_have_fails_the_query_with_our_line(
    spark, deployment, client, name, tmp_path, options, message
):
    """PySpark 4.2 stops a stream reader it failed to make: the error must not come from there.
    (Options the schema's description already refuses fail at ``load()``, with the same line.)"""
    client.create_stream(name, name)
    with pytest.raises((StreamingQueryException, AnalysisException)) as failure:
        run_stream(spark, deployment, tmp_path, stream=name, **options)
    assert last_error_line(failure.value) == ERROR + message


@pytest.mark.connect
def test_an_unknown_stream_ends_with_how_to_list_and_create_streams(
    spark, deployment, client, name, tmp_path
):
    real, typo = f"{name}-orders", f"{name}-ordres"
    client.create_stream(real, real)
    with pytest.raises(AnalysisException) as batch:
        spark.read.format("jetstream").option("servers", deployment.flight).option(
            "stream", typo
        ).load().collect()
    with pytest.raises(AnalysisException) as streaming:  # at load(): the schema is described there
        run_stream(spark, deployment, tmp_path, stream=typo)
    for failure in (batch, streaming):
        line = last_error_line(failure.value)
        assert line.startswith(f"{UNKNOWN_STREAM}no stream named '{typo}'; did you mean '{real}'? (streams: ")
        assert real in line.split("(streams: ")[1].split(";")[0].split(", ")
        assert line.endswith(
            "list them with `jetstream stream list`; "
            f"create one with `jetstream stream create {typo} --subject <subject>`)"
        )


@pytest.mark.connect
def test_a_missing_sink_stream_ends_with_how_to_create_it(spark, deployment, client, name, tmp_path):
    client.create_stream(name, name)
    missing = f"{name}-missing"
    ending = f"create it with `jetstream stream create {missing} --subject <subject>` first)"
    df = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(AnalysisException) as batch:
        df.write.format("jetstream").mode("append").option("servers", deployment.flight).option(
            "stream", missing
        ).save()
    query = (
        read_stream(spark, deployment, stream=name)
        .writeStream.format("jetstream")
        .option("servers", deployment.flight)
        .option("stream", missing)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException) as streaming:
        query.awaitTermination()
    query.stop()
    for failure in (batch, streaming):
        line = last_error_line(failure.value)
        assert line.startswith(f"{UNKNOWN_STREAM}no stream named '{missing}' to write to")
        assert line.endswith(ending)


DOWN = "grpc://127.0.0.1:1"
"""A broker address where nothing listens."""
CONNECT_TIMEOUT = 10.0
"""The default connect timeout (the options' ``timeout`` when given)."""


def unreachable(line: str) -> bool:
    """Whether ``line`` is our error for the broker at ``DOWN`` (gRPC's reason in the middle)."""
    return line.startswith(f"{UNAVAILABLE}broker at {DOWN} is unreachable: ") and line.endswith(
        "; is a broker running there?"
    )


@pytest.mark.connect
def test_a_broker_that_is_down_fails_a_read_within_the_connect_timeout(
    spark, deployment, client, name, tmp_path
):
    """Not after the query's 30 s ``timeout`` of retries (a read took 30 s, a classic stream
    query's planning 67 s).  Bounded loosely: the connect timeout and 10 s more than the same
    session takes to fail a read at planning with no I/O (Spark's own set-up: a Python worker)."""
    client.create_stream(name, name)
    started = time.monotonic()
    with pytest.raises(AnalysisException):
        read(spark, deployment, stream=name, startingOffset="earliest").collect()
    planning = time.monotonic() - started
    started = time.monotonic()
    with pytest.raises(AnalysisException) as batch:
        spark.read.format("jetstream").option("servers", DOWN).option("stream", name).load().collect()
    took = time.monotonic() - started
    assert unreachable(last_error_line(batch.value)), last_error_line(batch.value)
    assert took < planning + CONNECT_TIMEOUT + 10, f"{took:.1f}s (planning alone: {planning:.1f}s)"
    # The stream's and the sink's planning end the same way (2 s to connect here, for a short test).
    with pytest.raises(AnalysisException) as streaming:
        analysed(
            spark.readStream.format("jetstream")
            .option("servers", DOWN)
            .option("timeout", "2")
            .option("stream", name)
            .load()
        )
    with pytest.raises(AnalysisException) as written:
        spark.createDataFrame([("a",)], "value string").write.format("jetstream").mode("append").option(
            "servers", DOWN
        ).option("timeout", "2").option("stream", name).save()
    for failure in (streaming, written):
        assert unreachable(last_error_line(failure.value)), last_error_line(failure.value)


def test_option_names_are_checked_when_the_data_source_is_made():
    with pytest.raises(InvalidArgumentError, match=r"^unknown option 'startingoffset' \(Spark passes"):
        JetStreamDataSource({"stream": "a", "startingoffset": "earliest"})
    # Either side's names pass here; the reader or writer refuses the other side's.
    check_option_names({"stream": "a", "maxbatchbytes": "100", "startingoffsets": "earliest", "path": "x"})
    with pytest.raises(InvalidArgumentError, match=r"^option 'kafka.bootstrap.servers' is Kafka's"):
        check_option_names({"kafka.bootstrap.servers": "k:9092"})
    with pytest.raises(
        InvalidArgumentError, match=r"^unknown option 'zzz' \(Spark passes .*\(known: assign, "
    ):
        check_option_names({"zzz": "1"})


def test_a_stream_reader_that_cannot_be_made_raises_at_sparks_first_call():
    source = JetStreamDataSource({"stream": "a", "servers": "grpc://127.0.0.1:1", "endingoffsets": "latest"})
    reader = source.streamReader(StructType())
    assert isinstance(reader, RefusedStreamReader)
    for call in (reader.initialOffset, reader.getDefaultReadLimit, reader.prepareForTriggerAvailableNow):
        with pytest.raises(
            InvalidArgumentError, match="endingOffsets and endingTimestamp are for batch reads"
        ):
            call()
    reader.stop()  # what PySpark's runner calls last must not fail
