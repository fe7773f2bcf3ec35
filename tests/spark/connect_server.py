"""A Spark Connect server from this venv's PySpark, and the Python environments around it.

The server is PySpark 4.2's own ``SparkConnectServer``, started by the
library's :class:`~pyspark_jetstream.spark.local_connect.LocalConnectServer`
in a working directory of its own: a Python worker has its working directory
on its path, and the checkout's would stand in for the package under test.

Its Python workers run a *worker environment*: a virtual environment made
without pip whose one extra path entry is this venv's site-packages (PySpark,
pyarrow, nats-py...).  A plain path entry runs none of the ``.pth`` files in
it, so this venv's editable install does not reach the workers: what
pyspark-jetstream they have is what is installed into the environment -- the
wheel, as Databricks installs a cluster library -- or nothing.

The *client environment* is what a user of ``pyspark-client`` has: that
package (Spark Connect's client, no JVM, no py4j) and the wheel, with the
rest of this venv's packages but PySpark, py4j, Delta and the project linked
in beside them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pyspark

from pyspark_jetstream.spark.local_connect import LocalConnectServer

SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])
NOT_IN_CLIENT = ("pyspark", "py4j", "delta", "pyspark_jetstream", "broker_node", "__editable__")
"""Names in this venv's site-packages a ``pyspark-client`` user does not have (or gets from the
wheel): every entry starting with one of them is left out of the client environment."""
PIP_TIMEOUT = 300.0


def _run(*argv: str | Path, cwd: Path) -> str:
    """Run ``argv``; its stdout, or an ``AssertionError`` with its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done.stdout


def _venv(directory: Path, *paths: Path) -> Path:
    """A virtual environment without pip at ``directory`` with ``paths`` after its own
    site-packages; its interpreter."""
    _run(sys.executable, "-m", "venv", "--without-pip", directory, cwd=directory.parent)
    python = directory / "bin" / "python"
    site = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=directory).strip()
    )
    (site / "jetstream-tests.pth").write_text("".join(f"{path}\n" for path in paths))
    return python


def pip_install(python: Path, *requirements: str | Path) -> None:
    """Install ``requirements`` (no dependencies) into ``python``'s environment with this venv's pip."""
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "--quiet",
        "--no-deps",
        *requirements,
        cwd=python.parent,
    )


def worker_env(directory: Path) -> Path:
    """A worker environment (see the module docstring) without pyspark-jetstream; its interpreter."""
    return _venv(directory, SITE_PACKAGES)


def client_env(directory: Path, wheel: Path) -> Path:
    """A ``pyspark-client`` user's environment with ``wheel`` installed; its interpreter."""
    linked = directory.parent / f"{directory.name}-packages"
    linked.mkdir()
    for entry in SITE_PACKAGES.iterdir():
        if not entry.name.startswith(NOT_IN_CLIENT) and entry.suffix != ".pth":
            (linked / entry.name).symlink_to(entry)
    python = _venv(directory, linked)
    pip_install(python, f"pyspark-client=={pyspark.__version__}", wheel)
    return python


def connect_server(directory: Path, python: Path) -> LocalConnectServer:
    """A Spark Connect server (not started) whose Python workers run ``python``, in ``directory``."""
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "1g",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    }
    return LocalConnectServer(python=python, directory=directory, conf=conf)


def failure_lines(text: str) -> list[str]:
    """The lines of pytest's output that say what failed (for an assertion's message)."""
    return [line for line in text.splitlines() if re.match(r"(FAILED|ERROR|E  )", line)]
