"""format("jetstream") resolves in a plain Spark session: Spark finds pyspark_jetstream.DefaultSource,
from any directory, with a wheel or the development (editable) install.

``register`` leaves that registration alone where Spark made it, and registers
where it did not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

from pyspark_jetstream.spark import JetStreamDataSource, register


def run_script(script: str, directory: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``script`` run by this interpreter, in ``directory`` if given (else here)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=directory,
        check=False,
    )


def test_the_development_install_is_listed_where_spark_looks_from_any_directory(tmp_path):
    """Spark's lookup lists the modules on the Python path (``pkgutil.iter_modules``) and imports
    the ``pyspark_*`` ones.  An editable install through an import hook is not listed: outside the
    checkout (whose directory a Python worker has on its path) nothing was found (issue 44).
    Failing here, the environment predates pyproject's ``package-dir``: reinstall it."""
    result = run_script(
        "import pkgutil; print([m.name for m in pkgutil.iter_modules() if m.name.startswith('pyspark_')])",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "pyspark_jetstream" in result.stdout, result.stdout


def test_a_plain_session_finds_the_source_without_registering_it(deployment, client, name, tmp_path):
    client.create_stream(name, name)
    client.publish(name, b"found")
    script = textwrap.dedent(
        f"""
        from pyspark.sql import SparkSession
        spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
        rows = spark.read.format("jetstream").option("servers", "{deployment.flight}") \\
            .option("stream", "{name}").load().collect()
        print("VALUES", [r.value for r in rows])
        spark.stop()
        """
    )
    result = run_script(script, tmp_path)  # outside the checkout: found through the install alone
    assert result.returncode == 0, result.stderr[-3000:]
    assert "VALUES [bytearray(b'found')]" in result.stdout or "VALUES [b'found']" in result.stdout


def test_a_jetstream_session_logs_no_replaced_data_source(deployment, client, name, tmp_path):
    """Registering over Spark's own registration logged "WARN DataSourceManager: The data source
    jetstream replaced a statically registered data source." when the session was made and again
    when each streaming query started (issue 23, item 9)."""
    client.create_stream(name, name)
    client.publish(name, b"once")
    checkpoint = tmp_path / "ck"
    result = run_script(
        f"""
        from pyspark_jetstream.spark import jetstream_session, register
        spark = jetstream_session(master="local[1]")
        register(spark)  # as a notebook would again: still nothing to replace
        def reader(r):
            return r.format("jetstream").option("servers", "{deployment.flight}").option("stream", "{name}")
        print("BATCH", [bytes(r.value) for r in reader(spark.read).load().collect()])
        query = (
            reader(spark.readStream).option("startingOffsets", "earliest").load()
            .writeStream.format("memory").queryName("copied")
            .option("checkpointLocation", "{checkpoint}")
            .trigger(availableNow=True).start()
        )
        query.awaitTermination()
        print("STREAM", [bytes(r.value) for r in spark.table("copied").collect()])
        spark.stop()
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BATCH [b'once']" in result.stdout and "STREAM [b'once']" in result.stdout
    assert "DataSourceManager" not in result.stderr, result.stderr[-3000:]


def test_register_registers_where_spark_has_not_found_the_source():
    registered: list[type] = []

    def session(exists: bool | None) -> SimpleNamespace:
        """A session whose JVM answers ``dataSourceExists`` with ``exists``; none for ``None``."""
        fields = {}
        if exists is not None:
            manager = SimpleNamespace(dataSourceExists=lambda name: exists and name == "jetstream")
            state = SimpleNamespace(dataSourceManager=lambda: manager)
            fields["_jsparkSession"] = SimpleNamespace(sessionState=lambda: state)
        return SimpleNamespace(dataSource=SimpleNamespace(register=registered.append), **fields)

    register(session(None))  # Spark Connect: no JVM session here to ask
    register(session(False))  # Spark's lookup did not find it
    assert registered == [JetStreamDataSource, JetStreamDataSource]
    register(session(True))
    assert registered == [JetStreamDataSource, JetStreamDataSource]
