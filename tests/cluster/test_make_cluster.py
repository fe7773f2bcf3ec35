"""``make cluster``: the three-broker cluster of conf/cluster/ comes up, serves, and stops on Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pyspark_jetstream.client import AckPolicy, SyncClient

from ..broker.harness import wait_until

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def test_the_local_cluster_comes_up_serves_and_stops_on_ctrl_c(tmp_path):
    state = tmp_path / ".cluster"
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "cluster.py"), "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "cluster: up" in line or "did not start" in line or "in use" in line:
                break
        assert "cluster: up" in "".join(lines), "".join(lines)
        with SyncClient(nats_urls="nats://127.0.0.1:4222", timeout=30) as client:
            client.create_stream("made", "made", replication_factor=3, min_insync_replicas=2)
            assert client.publish("made", b"x", ack_policy=AckPolicy.ALL).ok
            wait_until(lambda: len(client.metadata()["brokers"]) == 3)
    finally:
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    assert "cluster: stopping" in out
    for n in (1, 2, 3):
        assert (state / f"broker-{n}" / "streams" / "made" / "0" / "partition.json").exists()
