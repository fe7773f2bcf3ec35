"""Real servers for broker tests: nats-server and broker processes on free ports."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from broker_node.broker import RUNTIME_FILE

START_TIMEOUT = 30.0


class BrokerProcess:
    """A broker run as ``python -m broker_node`` with its own data directory."""

    def __init__(self, data_dir: Path, *, nats_url: str | None, extra_config: str = "") -> None:
        self.data_dir = data_dir
        self.nats_url = nats_url
        self.config_path = data_dir.parent / f"{data_dir.name}.toml"
        nats_table = f'servers = ["{nats_url}"]' if nats_url else "embedded_port = -1"
        self.config_path.write_text(
            f'[broker]\ndata_dir = "{data_dir}"\nmaintenance_interval = 0.2\n'
            f"[nats]\n{nats_table}\n[flight]\nport = 0\n{extra_config}"
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.flight = ""
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    def start(self) -> BrokerProcess:
        """Start and wait until it serves; raise (never skip) if it does not."""
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
                    "DEBUG",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited with {self.process.returncode}: {self.log_tail()}")
            if runtime.exists():
                info = json.loads(runtime.read_text())
                self.flight = info["flight"]
                self.nats_url = info["nats"][0]
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"broker did not start within {START_TIMEOUT}s: {self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the broker and wait for it to exit; return its exit code."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self.process = None
        return code

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self.stop(signal.SIGKILL)

    def log_tail(self) -> str:
        """The end of the broker's log, for failure messages."""
        try:
            return self.log_path.read_text()[-3000:]
        except OSError:
            return "(no log)"


def wait_until(condition, timeout: float = 15.0, interval: float = 0.02, message: str = "condition"):
    """Poll ``condition`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)
