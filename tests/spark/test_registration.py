"""format("jetstream") resolves in a plain Spark session: Spark finds pyspark_jetstream.DefaultSource."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_a_plain_session_finds_the_source_without_registering_it(deployment, client, name):
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
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "VALUES [bytearray(b'found')]" in result.stdout or "VALUES [b'found']" in result.stdout
