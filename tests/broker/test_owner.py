"""A ``LocalBroker`` ends with the process that started it (a notebook kernel killed with
``kill -9``), and a broker that outlived its owner gives its data directory up to the next one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.local import LocalBroker
from pyspark_jetstream.protocol.errors import UnavailableError

from .harness import wait_until

OWNER = textwrap.dedent(
    """
    import json, sys, threading
    from pyspark_jetstream.local import LocalBroker

    broker = LocalBroker(sys.argv[1])
    # Started from a thread that ends at once: the broker must outlive it (only its owner's end counts).
    threading.Thread(target=broker.start).start()
    """
).strip() + textwrap.dedent(
    """
    import time
    while broker.process is None or not broker.flight:
        time.sleep(0.05)
    nats = open(broker.data_dir / "nats-server.pid").read().split()[0]
    said = {"broker": broker.process.pid, "nats": int(nats), "flight": broker.flight, "url": broker.nats_url}
    print(json.dumps(said), flush=True)
    time.sleep(3600)
    """
)


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie not reaped yet counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture
def owner(tmp_path):
    """A process that starts a ``LocalBroker`` on ``tmp_path / "data"`` and waits; its pids."""
    process = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path / "data")], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, "the owner did not start its broker"
    pids = json.loads(line)
    yield process, pids
    process.kill()
    process.wait()
    process.stdout.close()
    for pid in (pids["broker"], pids["nats"]):
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_the_broker_and_its_nats_server_end_with_their_owner(tmp_path, owner):
    process, pids = owner
    with SyncClient(nats_urls=pids["url"], broker=pids["flight"]) as client:
        client.create_stream("kept", "kept")
    # Its owner alive, the directory stays its broker's: another broker is refused.
    with pytest.raises(UnavailableError, match="is in use by another broker"):
        LocalBroker(tmp_path / "data", start_timeout=30).start()
    process.kill()  # kill -9 of the notebook kernel
    wait_until(
        lambda: gone(pids["broker"]) and gone(pids["nats"]),
        timeout=2,
        message="the broker and its nats-server to end with their owner",
    )
    with LocalBroker(tmp_path / "data") as again:
        with SyncClient(nats_urls=again.nats_url, broker=again.flight) as client:
            assert [s.config["name"] for s in client.list_streams() if s.config["name"] == "kept"] == ["kept"]
        assert "taking the directory over" not in again.log_tail()


def test_a_broker_that_outlived_its_owner_is_stopped_and_its_directory_taken_over(tmp_path, owner):
    process, pids = owner
    os.kill(pids["broker"], signal.SIGSTOP)  # it cannot notice its owner's end
    process.kill()
    process.wait()
    with LocalBroker(tmp_path / "data") as again:
        lines = [line for line in again.log_tail().splitlines() if "taking the directory over" in line]
        assert len(lines) == 1 and (
            f"is held by broker pid {pids['broker']}, whose owner (pid {process.pid}) is gone" in lines[0]
        ), again.log_tail()
        assert gone(pids["broker"])
        with SyncClient(nats_urls=again.nats_url, broker=again.flight) as client:
            assert client.health()["ok"]
