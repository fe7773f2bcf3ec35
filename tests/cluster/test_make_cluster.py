"""``make cluster``: the three-broker cluster of conf/cluster/ comes up, serves, and stops on Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from broker_node.config import load_broker_config
from pyspark_jetstream.client import AckPolicy, SyncClient

from ..broker.harness import wait_until

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def readme_cluster_commands() -> list[str]:
    """The ``jetstream`` lines of docs/cluster.md's block (tests/test_readme.py leaves the block
    to this test), after checking that its ``make`` lines run what this test runs."""
    page = (ROOT / "docs" / "cluster.md").read_text()
    block = page.split("## Three brokers on this machine", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    lines = [line for line in re.sub(r"\\\n\s*", " ", block).splitlines() if line.strip()]
    makefile = (ROOT / "Makefile").read_text()
    assert shlex.split(lines[0], comments=True) == ["make", "cluster"], lines[0]
    assert "cluster: bootstrap\n\t$(PY) scripts/cluster.py\n" in makefile
    assert shlex.split(lines[-1], comments=True) == ["make", "cluster-clean"], lines[-1]
    assert "cluster-clean:\n\trm -rf .cluster\n" in makefile
    commands = lines[1:-1]
    assert commands and all(shlex.split(c)[0] == "jetstream" for c in commands), commands
    return commands


def test_the_local_cluster_comes_up_serves_survives_a_kill_and_stops_on_ctrl_c(tmp_path):
    state = tmp_path / ".cluster"
    process = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "scripts" / "cluster.py"), "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert process.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    out = ""
    try:
        wait_until(
            lambda: any(w in "".join(lines) for w in ("cluster: up", "did not start", "in use")),
            timeout=120,
            message="the cluster to come up",
        )
        assert "cluster: up" in "".join(lines), "".join(lines)
        for command in readme_cluster_commands():  # the page's own, against this cluster
            done = subprocess.run(
                [sys.executable, "-m", "pyspark_jetstream.cli", *shlex.split(command, comments=True)[1:]],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, (command, done.stderr)
        assert "orders" in done.stdout, done.stdout  # the last command is cluster status
        with SyncClient(nats_urls="nats://127.0.0.1:4222", timeout=30) as client:
            client.create_stream("made", "made", replication_factor=3, min_insync_replicas=2)
            assert client.publish("made", b"x", ack_policy=AckPolicy.ALL).ok
            wait_until(lambda: len(client.metadata()["brokers"]) == 3)

            # The README's "When something breaks" step: kill -9 a broker.  It stays down, the
            # others go on, and its partitions fail over (a leader it had moves within seconds).
            pid = json.loads((state / "broker-1" / "broker.json").read_text())["pid"]
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: "broker-1 exited (killed by SIGKILL); left down" in "".join(lines), timeout=30)
            wait_until(
                lambda: len(client.metadata()["brokers"]) == 2, timeout=60, message="its session to end"
            )
            wait_until(
                lambda: all(
                    p.leader in ("broker-2", "broker-3") for p in client.describe_stream("made").partitions
                ),
                timeout=60,
                message="its partitions to fail over",
            )
            assert client.publish("made", b"after", ack_policy=AckPolicy.ALL, timeout=30).ok
            assert process.poll() is None, "".join(lines)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=120)
            reader.join(timeout=30)
        finally:
            process.stdout.close()
            out = "".join(lines)
    assert process.returncode == 0, out
    assert "cluster: stopping" in out
    for n in (1, 2, 3):
        assert (state / f"broker-{n}" / "streams" / "made" / "0" / "partition.json").exists()


def test_a_port_in_use_is_named_with_what_to_stop(tmp_path):
    """A broker of conf/broker.toml left running holds 4222: the cluster names the port and says
    to stop it, in one line, before starting anything."""
    port = load_broker_config(ROOT / "conf" / "cluster" / "broker-1.toml").flight.port
    with socket.socket() as holder:
        # As a server binds (connections of the cluster test before it in TIME_WAIT do not count).
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):  # held already (by another test's cluster): as good
            holder.bind(("127.0.0.1", port))
            holder.listen()
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "cluster.py"), "--state-dir", str(tmp_path / "c")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, stderr = process.communicate(timeout=60)
        finally:
            if process.poll() is None:  # it started a cluster after all: stop all of it
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    assert process.returncode == 1, stderr
    (line,) = stderr.splitlines()
    assert f"{port}" in line and "in use: stop what holds them first" in line, line
    assert not (tmp_path / "c").exists()
