"""Delta Lake beside ``format("jetstream")``: a session with delta-spark's jars, and the archive.

Jars.  delta-spark's Python package needs two jars on Spark's class path
(``io.delta:delta-spark_<spark>_2.13`` and ``io.delta:delta-storage``, the
version of the installed ``delta-spark``).  :func:`fetch_jars` copies them
into a local cache with Maven (``mvn``, which honours the mirrors of
``~/.m2/settings.xml``); :func:`delta_session` hands Spark the cached files
(no network needed once they are there) or, with an empty cache and no Maven,
lets Spark's own resolver fetch them from Maven Central (``spark.jars.packages``).
The cache is ``$PYSPARK_JETSTREAM_JARS`` or ``~/.cache/pyspark-jetstream/jars``.

Archive ("tiering").  :func:`archive` copies a stream's messages below a
chosen offset (by default everything committed) into a Delta table, appended
where the table ends, so that retention can delete old segments while the
history stays queryable with Spark SQL.  Each run writes one Delta commit
tagged with Delta's idempotent-write options (``txnAppId`` names the stream,
``txnVersion`` is the sum of the archived end offsets, which only grows), so
a run that is repeated, or retried after a crash, never writes a row twice.
Run one archiver per stream at a time: two archivers started together would
both append from the same place.  :func:`read_with_archive` reads archive and
log as one DataFrame: a Python data source cannot read a Delta table itself,
so this is a function rather than a ``format("jetstream")`` option.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from pyspark_jetstream.client.cluster import ClusterConnection
from pyspark_jetstream.protocol.errors import InvalidArgumentError, JetStreamError

from .options import SourceOptions, parse_source_options
from .planning import plan_source
from .range_reads import PartitionState, describe
from .session import jetstream_session

logger = logging.getLogger(__name__)

SCALA_VERSION = "2.13"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CONF = {
    "spark.sql.extensions": DELTA_EXTENSION,
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
ARCHIVE_APP_ID = "pyspark-jetstream-archive:{stream}"


def delta_coordinates() -> list[str]:
    """Maven coordinates of the jars the installed ``delta-spark`` needs, for this PySpark."""
    import pyspark

    try:
        version = metadata.version("delta-spark")
    except metadata.PackageNotFoundError:
        raise InvalidArgumentError(
            "delta-spark is not installed: pip install 'pyspark-jetstream[spark]'"
        ) from None
    spark = ".".join(pyspark.__version__.split(".")[:2])
    return [f"io.delta:delta-spark_{spark}_{SCALA_VERSION}:{version}", f"io.delta:delta-storage:{version}"]


def jar_cache() -> Path:
    """Where the Delta jars are kept: ``$PYSPARK_JETSTREAM_JARS`` or ``~/.cache/pyspark-jetstream/jars``."""
    configured = os.environ.get("PYSPARK_JETSTREAM_JARS")
    return Path(configured) if configured else Path.home() / ".cache" / "pyspark-jetstream" / "jars"


def _jar_name(coordinate: str) -> str:
    _group, artifact, version = coordinate.split(":")
    return f"{artifact}-{version}.jar"


def cached_jars(cache: Path | None = None) -> list[Path] | None:
    """The cached jar files, or ``None`` when any is missing."""
    folder = cache or jar_cache()
    paths = [folder / _jar_name(c) for c in delta_coordinates()]
    return paths if all(p.is_file() and p.stat().st_size > 0 for p in paths) else None


def fetch_jars(cache: Path | None = None, *, mvn: str | None = None) -> list[Path]:
    """Copy the Delta jars into the cache with Maven (once); returns their paths.

    Raises ``JetStreamError`` naming the artifact when Maven is missing or
    fails (its output is in the message).
    """
    folder = cache or jar_cache()
    found = cached_jars(folder)
    if found:
        return found
    command = mvn or shutil.which("mvn")
    if command is None:
        raise JetStreamError(
            "Maven (mvn) is not installed, so the Delta jars cannot be fetched into "
            f"{folder}; install Maven, or let Spark fetch them (spark.jars.packages)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as staging:
        for coordinate in delta_coordinates():
            done = subprocess.run(
                [
                    command,
                    "-q",
                    "-B",
                    "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy",
                    f"-Dartifact={coordinate}",
                    f"-DoutputDirectory={staging}",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise JetStreamError(
                    f"mvn could not fetch {coordinate} (exit {done.returncode}): "
                    f"{(done.stdout + done.stderr).strip()[-2000:]}"
                )
        for coordinate in delta_coordinates():  # whole files appear in the cache, or none
            os.replace(Path(staging) / _jar_name(coordinate), folder / _jar_name(coordinate))
    paths = cached_jars(folder)
    assert paths is not None
    logger.info("Delta jars cached in %s", folder)
    return paths


def delta_conf(cache: Path | None = None) -> dict[str, str]:
    """Spark settings for Delta: the cached jars (offline) or, failing that, Spark's resolver."""
    jars = cached_jars(cache)
    if jars is None and shutil.which("mvn"):
        try:
            jars = fetch_jars(cache)
        except JetStreamError as exc:
            logger.warning("%s; Spark will try to fetch the jars itself", exc)
    where = (
        {"spark.jars": ",".join(str(p) for p in jars)}
        if jars
        else {
            "spark.jars.packages": ",".join(delta_coordinates()),
            "spark.jars.ivy": str((cache or jar_cache()).parent / "ivy"),
        }
    )
    return {**DELTA_CONF, **where}


def delta_session(app_name: str = "pyspark-jetstream", master: str = "local[2]", **conf: Any) -> SparkSession:
    """A Spark session with ``format("jetstream")`` registered and Delta Lake enabled.

    Spark's JVM starts with the first session of a Python process and keeps the
    class path it started with: if that session had no Delta jars, no later
    one can have them, and this raises ``InvalidArgumentError`` saying so.
    """
    _check_jvm_can_load_delta()
    return jetstream_session(app_name, master, **{**delta_conf(), **conf})


def _check_jvm_can_load_delta() -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    if jvm is None:
        return  # no JVM yet: this session starts it with the jars
    try:
        lang = jvm.java.lang
        lang.Class.forName(DELTA_EXTENSION, False, lang.Thread.currentThread().getContextClassLoader())
    except Py4JJavaError:  # the JVM's ClassNotFoundException
        raise InvalidArgumentError(
            "this Python process already started Spark's JVM without Delta Lake's jars (a session made "
            "before, e.g. by jetstream_session or SparkSession.builder), and a JVM keeps the class path "
            "it started with: make delta_session the process's first session, or restart the kernel"
        ) from None


@dataclass(frozen=True, slots=True)
class ArchiveRun:
    """What one :func:`archive` call did."""

    stream: str
    path: str
    start: dict[str, int]
    """Per partition: where this run began (the table's end before it)."""
    end: dict[str, int]
    """Per partition: the end of the archive after it."""
    rows: int
    written: bool
    """False when there was nothing new, or Delta skipped an already-written run."""


def archive(
    spark: SparkSession,
    stream: str,
    path: str,
    *,
    below: Mapping[int, int] | int | None = None,
    options: Mapping[str, str] | None = None,
) -> ArchiveRun:
    """Append ``stream``'s messages from the archive's end up to ``below`` into the Delta table at ``path``.

    ``below`` is an offset for every partition, a ``{partition: offset}``
    mapping, or ``None`` for everything committed now.  ``options`` are the
    source's options (``servers`` or ``nats``, ``timeout``, credentials...).  The table is
    partitioned by ``partition`` and ``date`` (UTC day of the message's
    timestamp) and holds the source's columns.  Raises ``InvalidArgumentError``
    if the stream has already dropped offsets the archive has not copied (the
    archive would have a gap), naming the partition and both offsets.
    """
    read_options = {**(options or {}), "stream": stream}
    parsed = parse_source_options(read_options, streaming=False)
    layout = _layout(parsed, stream)
    done = _archived_ends(spark, path)
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    for partition, state in sorted(layout.items(), key=lambda item: int(item[0])):
        begin = done.get(partition, 0)
        limit = below if isinstance(below, int) or below is None else below.get(int(partition))
        stop = state.high_watermark if limit is None else min(int(limit), state.high_watermark)
        stop = max(stop, begin)
        if stop > begin and begin < state.log_start_offset:
            raise InvalidArgumentError(
                f"stream {stream!r} partition {partition} starts at offset {state.log_start_offset} but "
                f"its archive at {path} ends at {begin}: offsets {begin} to {state.log_start_offset - 1} "
                "are gone (archive before retention deletes them)"
            )
        start[partition], end[partition] = begin, stop
    total = sum(end[p] - start[p] for p in end)
    if total == 0:
        return ArchiveRun(stream, path, start, end, 0, written=False)
    frame = (
        spark.read.format("jetstream")
        .options(**read_options)
        .option("startingOffsets", json.dumps({stream: start}))
        .option("endingOffsets", json.dumps({stream: end}))
        .load()
        .withColumn("date", sf.to_date(sf.col("timestamp")))
    )
    version = sum(end.values())
    before = _table_version(spark, path)
    (
        frame.write.format("delta")
        .mode("append")
        .partitionBy("partition", "date")
        .option("txnAppId", ARCHIVE_APP_ID.format(stream=stream))
        .option("txnVersion", version)
        .save(path)
    )
    written = _table_version(spark, path) != before  # Delta skips a txnVersion it has seen
    logger.info("archived %s partitions %s: offsets %s to %s into %s", stream, sorted(end), start, end, path)
    return ArchiveRun(stream, path, start, end, total if written else 0, written=written)


def _archived_ends(spark: SparkSession, path: str) -> dict[str, int]:
    """Per partition (as a string): one past the newest archived offset; empty for a new table."""
    if not _is_delta(spark, path):
        return {}
    rows = spark.read.format("delta").load(path).groupBy("partition").agg(sf.max("offset").alias("last"))
    return {str(r["partition"]): int(r["last"]) + 1 for r in rows.collect()}


def _table_version(spark: SparkSession, path: str) -> int | None:
    """The Delta table's newest version, or ``None`` when there is no table yet."""
    if not _is_delta(spark, path):
        return None
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, path).history(1).collect()[0]["version"])


def _is_delta(spark: SparkSession, path: str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def read_with_archive(spark: SparkSession, path: str, options: Mapping[str, str]) -> DataFrame:
    """One DataFrame of a stream's archive (``path``) and what its log still holds after it.

    ``options`` are a batch read's options naming one ``stream``; rows come
    from the archive below each partition's archived end and from the log
    from there on (``startingOffsets`` and ``endingOffsets`` apply to the log
    part only), so no offset appears twice.
    """
    parsed = parse_source_options(options, streaming=False)
    if len(parsed.streams) != 1:
        raise InvalidArgumentError("read_with_archive reads one stream: give the option 'stream'")
    stream = parsed.streams[0]
    ends = _archived_ends(spark, path)
    log = spark.read.format("jetstream").options(**options)
    if ends:
        log = log.option("startingOffsets", json.dumps({stream: _log_start_after(ends, parsed, stream)}))
    live = log.load()
    if not ends:
        return live
    old = spark.read.format("delta").load(path).drop("date").select(*live.columns)
    return old.unionByName(live)


def _layout(parsed: SourceOptions, stream: str) -> dict[str, PartitionState]:
    """``stream``'s partitions (by number, as text) as its brokers describe them now."""
    connection = ClusterConnection(
        plan_source(parsed).broker, timeout=parsed.timeout, credentials=parsed.credentials
    )
    try:
        return describe(connection, parsed)[stream]
    finally:
        connection.close()


def _log_start_after(ends: Mapping[str, int], parsed: SourceOptions, stream: str) -> dict[str, int]:
    layout = _layout(parsed, stream)
    return {p: max(ends.get(p, 0), state.log_start_offset) for p, state in layout.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyspark_jetstream.spark.delta --fetch-jars``: fill the jar cache (the set-up runs it)."""
    parser = argparse.ArgumentParser(prog="python -m pyspark_jetstream.spark.delta")
    parser.add_argument("--fetch-jars", action="store_true", help="copy the Delta jars into the cache")
    parser.add_argument("--print-coordinates", action="store_true", help="print the Maven coordinates")
    args = parser.parse_args(argv)
    if args.print_coordinates:
        print("\n".join(delta_coordinates()))  # noqa: T201
    if args.fetch_jars:
        try:
            paths = fetch_jars()
        except JetStreamError as exc:
            print(f"error: {exc}", file=sys.stderr)  # noqa: T201
            return 1
        print("\n".join(str(p) for p in paths))  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
