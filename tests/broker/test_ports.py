"""A broker started on a port another process holds says so in one line: the port, the option
that sets it, and the fix (the README's walkthroughs start a second broker on 4222 and 9292)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from broker_node.zookeeper_server import free_port
from pyspark_jetstream.local import LocalBroker

ROOT = Path(__file__).resolve().parents[2]


def start_second(tmp_path: Path, nats_port: int, flight_port: int, extra: str = "") -> str:
    """Run a broker on these ports until it exits (it must: they are taken); its stderr."""
    config = tmp_path / "second.toml"
    config.write_text(
        f'[broker]\ndata_dir = "{tmp_path / "second"}"\n[nats]\nembedded_port = {nats_port}\n'
        f"[flight]\nport = {flight_port}\n{extra}"
    )
    done = subprocess.run(
        [sys.executable, "-m", "broker_node", "--config", str(config), "--log-level", "WARNING"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip()


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """A broker with its embedded nats-server, on fixed ports a second one will ask for."""
    broker = LocalBroker(
        tmp_path_factory.mktemp("first") / "data", embedded_nats_port=free_port(), flight_port=free_port()
    ).start()
    yield broker
    broker.stop()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_a_second_broker_on_the_first_ones_nats_port_names_it(first, tmp_path):
    nats_port = port_of(str(first.nats_url))
    said = start_second(tmp_path, nats_port, free_port())
    assert said.splitlines()[-1] == (
        f"jetstream broker: port {nats_port} on 127.0.0.1 ([nats] embedded_port) is in use, probably by "
        "another broker: stop that one (Ctrl-C in its terminal), or give this one another "
        "[nats] embedded_port"
    )


def test_a_second_broker_on_the_first_ones_flight_port_names_it(first, tmp_path):
    flight_port = port_of(first.flight)
    said = start_second(tmp_path, free_port(), flight_port)
    assert said.splitlines()[-1].startswith(
        f"jetstream broker: port {flight_port} on 127.0.0.1 ([flight] port) is in use"
    ), said


@pytest.mark.parametrize("section", ["metrics", "replication"])
def test_a_port_in_use_names_its_option(tmp_path, section):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        said = start_second(tmp_path, free_port(), free_port(), f"[{section}]\nport = {taken}\n")
    assert said.splitlines()[-1].startswith(
        f"jetstream broker: port {taken} on 127.0.0.1 ([{section}] port) is in use"
    ), said
