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

from ..conftest import REGISTER, REMOTE
from ..test_packaging import build_wheel
from .connect_server import ConnectServer, client_env, failure_lines, pip_install, worker_env

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)

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
    installed = ConnectServer(base / "installed", installed_python)
    late = ConnectServer(base / "late", late_python)
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


def run_marked(directory: Path, runs: dict[str, tuple[ConnectServer, bool]]) -> dict[str, str]:
    """The tests marked ``connect`` against each named ``(server, register)`` at once, each run
    in a pytest process of its own, its output in ``directory``; pytest's summary line of each."""
    started = time.monotonic()
    processes: dict[str, subprocess.Popen] = {}
    for label, (server, register) in runs.items():
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYSPARK_", "SPARK_"))}
        env |= {REMOTE: server.url, "PYSPARK_PYTHON": sys.executable} | ({REGISTER: "1"} if register else {})
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "connect"]
        with open(directory / f"{label}.out", "wb") as output:  # a file: a full pipe would stall the run
            processes[label] = subprocess.Popen(
                [*command, *MARKED], cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT
            )
    try:
        for process in processes.values():
            process.wait(timeout=max(1.0, RUN_TIMEOUT - (time.monotonic() - started)))
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    summaries = {}
    for label, process in processes.items():
        out = (directory / f"{label}.out").read_text(errors="replace")
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        assert process.returncode == 0, (
            f"over Spark Connect ({label}): {summary}\n" + "\n".join(failure_lines(out)) + f"\n{out[-8000:]}"
            f"\n--- the server's log ends:\n{runs[label][0].log_tail()}"
        )
        assert re.search(r"\d+ passed", summary) and "skipped" not in summary, summary
        summaries[label] = summary
    print(f"over Spark Connect: {summaries}, {time.monotonic() - started:.0f}s")
    return summaries


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
    pip_install(late.python, wheel)
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


def test_the_spark_tests_pass_over_connect_found_by_spark_or_registered(servers, wheel, tmp_path):
    """The marked tests with the wheel installed before the server started (nothing done by the
    client), and with it installed after Spark's lookup (``register(spark)``), both at once."""
    installed, late = servers
    pip_install(late.python, wheel)  # done already when the test above ran
    run_marked(tmp_path, {"found": (installed, False), "registered": (late, True)})
