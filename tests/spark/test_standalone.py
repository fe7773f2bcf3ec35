"""format("jetstream") on a real Spark standalone cluster whose executors lack pyspark-jetstream.

The cluster (a master and a worker, see ``standalone.py``) runs executors
whose Python can import pyspark, pyarrow and nats-py but not this package,
as on a cluster where only the dependencies were installed.  The driver is a
process of its own (``standalone_driver.py``), run once for the module.
Without shipping, a query fails with one line naming the fix; shipped by
``ship_to_executors`` or ``jetstream_session``, the source (batch and
``Trigger.AvailableNow``) and the sink work.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from .standalone import Standalone, run_driver

pytestmark = pytest.mark.slow(seconds=150)

FIX = "is not installed on this Spark executor"
"""What the one line says (pyspark_jetstream.spark.unpickle.missing_message)."""
BARE, SOURCE, SINK = "bare", "copied-from", "copied-to"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    standalone = Standalone(tmp_path_factory.mktemp("standalone")).start()
    try:
        yield standalone
    finally:
        standalone.stop()


@pytest.fixture(scope="module")
def driver(cluster, deployment, client, tmp_path_factory):
    """What the driver saw (both sessions), once the streams it uses exist."""
    client.create_stream(BARE, BARE, partitions=2)
    for p in range(2):
        client.publish_batch(BARE, pa.table({"value": [b"%d-%d" % (p, i) for i in range(10)]}), partition=p)
    client.create_stream(SOURCE, SOURCE, partitions=2)
    client.create_stream(SINK, SINK)
    directory = tmp_path_factory.mktemp("driver")
    return run_driver(
        directory,
        master=cluster.url,
        flight=deployment.flight,
        nats=deployment.nats_url,
        stream=BARE,
        source=SOURCE,
        sink=SINK,
        checkpoint=str(directory / "checkpoint"),
    )


def the_one_line(error: str | None) -> str:
    """The line of the error's message that names the fix; there must be exactly one."""
    assert error is not None, "the query did not fail"
    lines = [line for line in error.splitlines() if FIX in line]
    assert len(lines) == 1, error
    assert "No module named" not in error, error
    return lines[0]


def test_executors_without_the_package_fail_with_one_line_naming_the_fix(driver):
    result = driver["bare"]
    assert result["before"] == [None]  # the executors genuinely lack the package
    line = the_one_line(result["read_error"])
    assert "ship_to_executors(spark)" in line and "jetstream_session()" in line
    assert "install pyspark-jetstream there" in line and "Python " in line
    assert "ship_to_executors(spark)" in the_one_line(result["write_error"])
    # The helper for a session made elsewhere: the same session now reads.
    shipped = Path(result["shipped"])
    [after] = result["after"]  # the executor's copy of the zip, in its working directory
    assert after == f"./{shipped.name}/pyspark_jetstream/__init__.py"
    assert result["count"] == 20


def test_a_shipped_package_reads_and_writes_in_batches_and_streams(driver, client):
    result = driver["shipped"]
    [origin] = result["origin"]  # jetstream_session shipped it: the master is not local
    assert origin is not None and ".zip/pyspark_jetstream/" in origin
    values = sorted(f"v{i}" for i in range(200))
    assert result["read"] == values
    assert result["ended"] and result["stream_error"] is None
    batches = result["batches"]  # maxRecordsPerTrigger=120
    assert len(batches) == 2 and max(batches) <= 120 and sum(batches) == 200
    copied = client.fetch(SINK, 0).to_table()
    assert sorted(v.decode() for v in copied.column("value").to_pylist()) == values
