"""A broker on this machine, for notebooks, demos, tests and benchmarks.

``LocalBroker`` runs ``python -m broker_node`` as a child process with its own
data directory, either with an embedded nats-server (the default) or against
given NATS servers, and waits until it serves::

    with LocalBroker() as broker:
        client = SyncClient(nats_urls=broker.nats_url, broker=broker.flight)
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyspark_jetstream.protocol.errors import UnavailableError

RUNTIME_FILE = "broker.json"


class LocalBroker:
    """A broker child process; ``start()``/``stop()`` or use it as a context manager."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        nats_url: str | None = None,
        embedded_nats_port: int = -1,
        extra_config: str = "",
        maintenance_interval: float = 30.0,
        log_level: str = "INFO",
        start_timeout: float = 30.0,
    ) -> None:
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="jetstream-")) / "data"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.nats_url = nats_url
        self.flight = ""
        self.log_level = log_level
        self.start_timeout = start_timeout
        stem = self.data_dir.parent / self.data_dir.name
        self.config_path = stem.with_suffix(".toml")
        self.log_path = stem.with_suffix(".log")
        nats_table = f'servers = ["{nats_url}"]' if nats_url else f"embedded_port = {embedded_nats_port}"
        self.config_path.write_text(
            f'[broker]\ndata_dir = "{self.data_dir}"\nmaintenance_interval = {maintenance_interval}\n'
            f"[nats]\n{nats_table}\n[flight]\nport = 0\n{extra_config}"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> LocalBroker:
        """Start the broker and wait until it serves; raise ``UnavailableError`` if it does not."""
        runtime = self.data_dir / RUNTIME_FILE
        runtime.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the handle
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "broker_node",
                    "--config",
                    str(self.config_path),
                    "--log-level",
                    self.log_level,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise UnavailableError(
                    f"the broker exited with code {self.process.returncode}: {self.log_tail()}"
                )
            if runtime.exists():
                info = json.loads(runtime.read_text())
                self.flight = info["flight"]
                self.nats_url = info["nats"][0]
                return self
            time.sleep(0.05)
        self.stop(signal.SIGKILL)
        raise UnavailableError(f"the broker did not start within {self.start_timeout:g}s: {self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the broker (SIGTERM: graceful) and wait for it; return its exit code."""
        process, self.process = self.process, None
        if process is None:
            return 0
        if process.poll() is None:
            process.send_signal(sig)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self.stop(signal.SIGKILL)

    def log_tail(self) -> str:
        """The end of the broker's log."""
        try:
            return self.log_path.read_text()[-3000:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
