"""The Spark tests that matter, over Spark Connect (issue 44): the way Databricks shared and
serverless compute and every Spark 4 remote client run the source.

Two Connect servers of this venv's PySpark (``connect_server.py``), each with
its own Python for its workers:

- *installed*: the wheel is in the workers' environment before the server
  starts, as Databricks installs a cluster library: Spark finds the source by
  itself and the client does nothing;
- *late*: the workers' environment has no pyspark-jetstream when Spark looks
  for data sources (once per server, at the first query naming one); the
  wheel is installed after, as ``%pip install`` on a running cluster does,
  and the client calls ``register(spark)``.

The tests marked ``connect`` in this directory run against each, in a
pytest process of their own (a process with a Connect session cannot use a
classic one), with their ``spark`` fixture a Connect session
(tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pyspark_jetstream.protocol.errors import UnavailableError
from pyspark_jetstream.spark.local_connect import LocalConnectServer

from ..conftest import REGISTER, REMOTE
from ..test_packaging import build_wheel
from .connect_server import client_env, connect_server, failure_lines, pip_install, worker_env

pytestmark = pytest.mark.slow(seconds=210)  # the longest start first (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent.parent
MARKED = ("tests/spark/test_source.py", "tests/spark/test_sink.py", "tests/spark/test_errors.py")
RUN_TIMEOUT = 600.0
"""Seconds the marked tests may take over Connect on a loaded machine (about 1.5 minutes alone)."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel(ROOT, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def servers(tmp_path_factory, wheel):
    """The *installed* and the *late* server (see the module docstring), started side by side."""
    base = tmp_path_factory.mktemp("connect")
    installed_python, late_python = worker_env(base / "installed-env"), worker_env(base / "late-env")
    pip_install(installed_python, wheel)
    installed = connect_server(base / "installed", installed_python)
    late = connect_server(base / "late", late_python)
    try:
        installed.start()
        late.start()
        yield installed, late
    finally:
        late.stop()
        installed.stop()


def run_client(python: Path | str, directory: Path, script: str, **args: str) -> dict:
    """``script`` run by ``python`` in ``directory`` (outside the checkout) with ``args`` as JSON in
    ``sys.argv[1]``; the JSON object it prints last.  (From a file: pyspark-client 4.2 takes a
    ``python -c`` program for its own doctests and exits, wanting a Spark home.)"""
    program = directory / "client.py"
    program.write_text(textwrap.dedent(script))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "PYSPARK_", "SPARK_"))}
    done = subprocess.run(
        [str(python), "-W", "ignore::FutureWarning", str(program), json.dumps(args)],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, f"exited {done.returncode}:\n{done.stdout}\n{done.stderr[:5000]}"
    return json.loads(lines[-1])


def run_marked(directory: Path, server: LocalConnectServer, *, register: bool) -> str:
    """The tests marked ``connect`` against ``server`` in a pytest process of their own (one run
    at a time: two at once starved each other's Python workers on a loaded two-core machine), its
    output in ``directory``; pytest's summary line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYSPARK_", "SPARK_"))}
    env |= {REMOTE: server.url, "PYSPARK_PYTHON": sys.executable} | ({REGISTER: "1"} if register else {})
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "connect"]
    started = time.monotonic()
    with open(directory / "marked.out", "wb") as output:  # a file: a full pipe would stall the run
        done = subprocess.run(
            [*command, *MARKED],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT,
            check=False,
        )
    out = (directory / "marked.out").read_text(errors="replace")
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    assert done.returncode == 0, (
        f"over Spark Connect: {summary}\n" + "\n".join(failure_lines(out)) + f"\n{out[-8000:]}"
        f"\n--- the server's log ends:\n{server.log_tail()}"
    )
    assert re.search(r"\d+ passed", summary) and "skipped" not in summary, summary
    how = "registered" if register else "found"
    print(f"over Spark Connect ({how}): {summary}, {time.monotonic() - started:.0f}s")
    return summary


PROBE = """
    import json, sys
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession
    args = json.loads(sys.argv[1])
    spark = SparkSession.builder.remote(args["url"]).getOrCreate()
    def read():
        reader = spark.read.format("jetstream").option("servers", args["servers"])
        return [bytes(r.value).decode() for r in reader.option("stream", args["stream"]).load().collect()]
    try:
        read()
        unregistered = "found"
    except PySparkException as exc:  # over Connect an UnknownException, its condition Spark's
        unregistered = exc.getCondition()
"""


def test_a_package_installed_after_sparks_lookup_needs_register_then_the_tests_pass(
    servers, wheel, deployment, client, name, tmp_path
):
    """Before the wheel is in the workers' environment, ``ship_to_executors`` sends the package
    as the session's artifact; after, ``register(spark)`` alone makes it found -- also from a
    ``pyspark-client`` install, which has no py4j to import."""
    _, late = servers
    client.create_stream(name, name)
    client.publish(name, b"late")
    args = {"url": late.url, "servers": deployment.flight, "stream": name}
    shipped = run_client(
        sys.executable,
        tmp_path,
        PROBE
        + """
        from pyspark_jetstream.spark import ship_to_executors
        ship_to_executors(spark)
        print(json.dumps({"unregistered": unregistered, "shipped": read()}))
        """,
        **args,
    )
    assert shipped == {"unregistered": "DATA_SOURCE_NOT_FOUND", "shipped": ["late"]}
    pip_install(Path(late.python), wheel)
    python = client_env(tmp_path / "client-env", wheel)
    registered = run_client(
        python,
        tmp_path,
        PROBE
        + """
        import importlib.util
        from pyspark.util import is_remote_only
        from pyspark_jetstream.spark import register
        register(spark)
        print(json.dumps({
            "unregistered": unregistered, "registered": read(),
            "py4j": importlib.util.find_spec("py4j") is not None, "remote_only": is_remote_only(),
        }))
        """,
        **args,
    )
    assert registered == {
        "unregistered": "DATA_SOURCE_NOT_FOUND",  # installed now, but Spark looked before
        "registered": ["late"],
        "py4j": False,
        "remote_only": True,
    }


def test_the_spark_tests_pass_over_connect_with_the_wheel_installed_on_the_server(servers, tmp_path):
    """Installed before the server started, as a cluster library is: the client does nothing."""
    installed, _ = servers
    run_marked(tmp_path, installed, register=False)


def test_the_spark_tests_pass_over_connect_with_register_after_a_late_install(servers, wheel, tmp_path):
    """Installed after Spark's lookup, as ``%pip install`` on a running cluster: ``register(spark)``."""
    _, late = servers
    pip_install(Path(late.python), wheel)  # done already when the test above ran
    run_marked(tmp_path, late, register=True)


def test_a_connect_server_that_cannot_start_says_why(tmp_path):
    server = LocalConnectServer(directory=tmp_path, conf={"spark.connect.grpc.binding.port": "not-a-port"})
    with pytest.raises(UnavailableError) as failed:
        server.start()
    assert re.match(r"the Spark Connect server exited with code \d+: .* ERROR ", str(failed.value))
    assert "The value 'not-a-port' in the config \"spark.connect.grpc.binding.port\"" in str(failed.value)
    server.stop()  # nothing left to stop: harmless
