"""A real Spark standalone cluster (one master, one worker) whose executors lack pyspark-jetstream.

The master and the worker are the JVM daemons of the pyspark install
(``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``),
each in its own process group, on ports they choose themselves (the URLs are
read from their logs), stopped by process group.

Executors run Python through :func:`bare_python`: a wrapper that, in the
worker's environment only (``JETSTREAM_BARE_EXECUTOR`` is set there), starts
the venv's interpreter with ``-S`` and its site-packages on ``PYTHONPATH``.
Without ``site``, the editable install's ``.pth`` finder is never loaded, so
``pyspark_jetstream`` cannot be imported there while pyspark, pyarrow and
nats-py can: the executors are like a cluster's nodes where only the
dependencies were installed.  Spark also hands executors the driver's
``PYTHONPATH`` (for a data source it found by itself); on a real cluster
those are another machine's paths, so the wrapper drops every entry that
holds a ``pyspark_jetstream`` directory.  On the driver (Spark's planning
workers) the wrapper runs the interpreter as it is.

The driver is a process of its own (:func:`run_driver`), so that its JVM
starts with the wrapper as the Python of every function Spark makes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pyspark

import pyspark_jetstream

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
START_TIMEOUT = 60.0
"""Seconds a daemon has to log that it is up (a JVM start on a loaded two-core machine)."""
MARKER = "JETSTREAM_BARE_EXECUTOR"
DRIVER = Path(__file__).with_name("standalone_driver.py")
DRIVER_TIMEOUT = 300.0
"""Seconds the driver may take (two sessions, their executors, a few jobs) on a loaded machine."""


def bare_python(directory: Path) -> Path:
    """A ``PYSPARK_PYTHON`` whose executors (on the worker of :class:`Standalone`) lack the package."""
    site = sysconfig.get_paths()["purelib"]
    wrapper = directory / "bare-python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ -n "${MARKER}" ]; then\n'
        f'  kept="{site}"\n'
        "  old_ifs=$IFS; IFS=:\n"
        "  for entry in $PYTHONPATH; do\n"
        '    [ -d "$entry/pyspark_jetstream" ] || kept="$kept:$entry"\n'
        "  done\n"
        "  IFS=$old_ifs\n"
        f'  PYTHONPATH="$kept" exec "{sys.executable}" -S "$@"\n'
        "fi\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def run_driver(directory: Path, **args: str) -> dict:
    """Run ``standalone_driver.py`` in a driver process; its JSON result.

    The driver finds the package where this process does (its parent
    directory on ``PYTHONPATH``) and runs :func:`bare_python` as both
    ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON``; its working directory
    is ``directory``.
    """
    python = str(bare_python(directory))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_", MARKER))}
    env |= {
        "PYTHONPATH": str(Path(pyspark_jetstream.__file__).parent.parent),
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    done = subprocess.run(
        [sys.executable, str(DRIVER), json.dumps(args)],
        env=env,
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise AssertionError(f"the driver failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-5000:]}")
    return json.loads(lines[-1])


class Daemon:
    """One Spark daemon in its own process group, its output in a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], directory: Path) -> None:
        self.name = name
        self.log = directory / f"{name}.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [str(SPARK_CLASS), *args],
                env=env,
                cwd=directory,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_for(self, pattern: str) -> re.Match[str]:
        """The first match of ``pattern`` in the log; fails if the daemon exits or takes too long."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            found = re.search(pattern, self.log.read_text(errors="replace"))
            if found:
                return found
            if self.process.poll() is not None or time.monotonic() > deadline:
                state = "exited" if self.process.poll() is not None else f"not up after {START_TIMEOUT}s"
                tail = self.log.read_text(errors="replace")[-3000:]
                raise AssertionError(f"Spark {self.name} {state}; its log ends:\n{tail}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop the daemon's process group (TERM, then KILL after 20 s)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=20)


class Standalone:
    """A master and one worker (2 cores, 1 GiB) on 127.0.0.1; ``url`` is the master's."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.url = ""
        self.daemons: list[Daemon] = []

    def start(self) -> Standalone:
        """Start both and wait until the worker has registered with the master."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "PYSPARK_", "SPARK_"))}
        env |= {
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.directory),
            "SPARK_DAEMON_MEMORY": "256m",
        }
        try:
            ports = ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]  # chosen by each daemon
            master = self._start("master", ["org.apache.spark.deploy.master.Master", *ports], env)
            self.url = master.wait_for(r"Starting Spark master at (spark://\S+)").group(1)
            worker = self._start(
                "worker",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    *ports,
                    *("--cores", "2", "--memory", "1g", "--work-dir", str(self.directory / "work")),
                    self.url,
                ],
                env | {MARKER: "1"},
            )
            worker.wait_for(r"Successfully registered with master")
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, name: str, args: list[str], env: dict[str, str]) -> Daemon:
        daemon = Daemon(name, args, env, self.directory)
        self.daemons.append(daemon)
        return daemon

    def stop(self) -> None:
        """Worker first (its executors with it), then the master."""
        for daemon in reversed(self.daemons):
            daemon.stop()
