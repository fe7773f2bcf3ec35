"""A Spark Connect server on this machine, for notebooks, demos and tests.

Databricks shared and serverless compute, and every Spark 4 remote client,
run a query on Spark Connect: the user's process holds a thin client
(``SparkSession.builder.remote("sc://...")``) and the server's Python workers
run the data source.  :class:`LocalConnectServer` starts PySpark's own
server (``SparkConnectServer``, whose jar ships with PySpark 4) as a child
process, so that code written for such a session runs here as written::

    with LocalConnectServer() as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()

PySpark's ``remote("local")`` starts one inside this process instead, on the
fixed port 15002 (unless testing PySpark itself), and not after a classic
session of the same process has stopped: neither suits a shared machine or
a notebook.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyspark

from pyspark_jetstream.lifecycle import StartStop
from pyspark_jetstream.protocol.errors import UnavailableError

logger = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_STARTED = re.compile(r"Spark Connect server started at: (\S+):(\d+)")


class LocalConnectServer(StartStop):
    """A Spark Connect server child process on 127.0.0.1 and a port it picks; ``start()`` and
    ``stop()``, or a ``with`` block.

    ``python`` runs its Python workers (default: this interpreter, so they
    import what this process can); ``directory`` holds its log and is its
    working directory (default: a new temporary one -- a Python worker has
    its working directory on its path); ``conf`` are more Spark settings.
    """

    def __init__(
        self,
        *,
        python: str | Path | None = None,
        directory: str | Path | None = None,
        master: str = "local[2]",
        conf: dict[str, str] | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        self.python = str(python or sys.executable)
        self.directory = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="spark-connect-"))
        self.master = master
        self.conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": "0",  # a free one, read from the log
            "spark.ui.enabled": "false",
            **(conf or {}),
        }
        self.start_timeout = start_timeout
        self.log_path = self.directory / "connect-server.log"
        self.url = ""
        """``sc://127.0.0.1:<port>`` once started: for ``SparkSession.builder.remote``."""
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> LocalConnectServer:
        """Start the server and wait until it listens; raise ``UnavailableError`` (with its log's
        end) if it exits or does not within ``start_timeout``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "PYSPARK_", "SPARK_"))}
        env["PYSPARK_PYTHON"] = self.python
        settings = [part for key, value in self.conf.items() for part in ("--conf", f"{key}={value}")]
        submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the handle
            self.process = subprocess.Popen(
                [str(submit), "--class", SERVER_CLASS, "--master", self.master, *settings],
                cwd=self.directory,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends the JVM's children too
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            found = _STARTED.search(self.log_tail(chars=None))
            if found:
                self.url = f"sc://127.0.0.1:{found.group(2)}"
                logger.info("Spark Connect server at %s (log: %s)", self.url, self.log_path)
                return self
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise UnavailableError(f"the Spark Connect server exited with code {code}: {self.problem()}")
            time.sleep(0.1)
        self.stop()
        raise UnavailableError(
            f"the Spark Connect server did not start within {self.start_timeout:g}s: {self.log_tail()}"
        )

    def stop(self, timeout: float = 30.0) -> None:
        """Stop this process's Spark Connect sessions on the server, then the server's process
        group (TERM, then KILL after ``timeout``); safe to repeat."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        self._stop_sessions()
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def _stop_sessions(self) -> None:
        """Stop this process's default and active Spark Connect sessions if they are on this server.
        A session left open when its server goes makes the interpreter's exit hang: PySpark's exit
        hook asks the server to clean up, and retries for minutes while nothing answers."""
        module = sys.modules.get("pyspark.sql.connect.session")
        if module is None or not self.url:
            return
        sessions = module.SparkSession
        port = int(self.url.rsplit(":", 1)[1])
        for session in {sessions._default_session, getattr(sessions._active_session, "session", None)}:
            if session is None or session.is_stopped:
                continue
            url = getattr(getattr(session.client, "_builder", None), "url", None)
            if getattr(url, "port", None) == port:
                session.stop()

    def problem(self) -> str:
        """The log's first error and the line after it (the exception), else the log's end."""
        lines = self.log_tail(chars=None).splitlines()
        first = next((n for n, line in enumerate(lines) if " ERROR " in line), None)
        return " ".join(lines[first : first + 2]) if first is not None else self.log_tail()

    def log_tail(self, chars: int | None = 4000) -> str:
        """The end of the server's log (all of it for ``chars=None``)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return text if chars is None else text[-chars:]
