"""The broker after crashes and outages: its nats-server, lost connections, refused subscriptions."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

import pytest

from broker_node.broker import NATS_PID_FILE
from broker_node.data_dir import pid_alive
from broker_node.log import Log, Record
from broker_node.nats_server import NatsServer, nats_server_binary
from broker_node.zookeeper_server import free_port, port_is_free
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.client.connection import BrokerConnection
from pyspark_jetstream.protocol.errors import InvalidArgumentError, UnavailableError
from pyspark_jetstream.protocol.flight import ActionType, ReadRequest

from .harness import BrokerProcess, wait_until


def nats_servers_on(port: int) -> list[int]:
    """The pids of running nats-server processes started for ``port``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # it ended while we looked
            continue
        if any(arg.endswith("nats-server") for arg in argv) and any(
            argv[i : i + 2] == ["-p", str(port)] for i in range(len(argv) - 1)
        ):
            pids.append(int(entry.name))
    return pids


def health(broker) -> dict:
    connection = BrokerConnection(broker.flight)
    try:
        return connection.action(ActionType.HEALTH, {})
    finally:
        connection.close()


def nats_pid(broker) -> int | None:
    """The embedded nats-server's pid (``None`` while it is being replaced)."""
    try:
        return int((broker.data_dir / NATS_PID_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None


def test_the_embedded_nats_server_dies_with_a_killed_broker_and_the_broker_restarts(tmp_path):
    port = free_port()
    broker = BrokerProcess(tmp_path / "b", embedded_nats_port=port).start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        client.create_stream("kept", "kept")
        client.publish("kept", b"before")
    server = nats_pid(broker)
    broker.kill()
    wait_until(lambda: not pid_alive(server), timeout=10, message="the nats-server to die with its broker")
    broker.start()  # the same NATS port is free again
    assert broker.nats_url.endswith(f":{port}")
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        assert client.publish("kept", b"after").first_offset == 1
    assert broker.stop() == 0
    assert not (broker.data_dir / NATS_PID_FILE).exists()


def test_a_nats_server_that_outlived_its_broker_is_stopped_at_the_next_start(tmp_path):
    port = free_port()
    broker = BrokerProcess(tmp_path / "b", embedded_nats_port=port)
    broker.data_dir.mkdir(parents=True)
    # A survivor holding the port, as a broker killed on a system without a
    # parent-death signal would leave it.
    survivor = subprocess.Popen(
        [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: not port_is_free(port), message="the survivor to listen")
        (broker.data_dir / NATS_PID_FILE).write_text(f"{survivor.pid}\n")
        broker.start()
        assert survivor.wait(10) == -signal.SIGKILL
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
            client.create_stream("works", "works")
            assert client.publish("works", b"x").ok
        assert "left running by an earlier broker" in broker.log_path.read_text()
    finally:
        survivor.kill()
        survivor.wait()
        broker.stop()


def test_a_failed_start_stops_the_embedded_nats_server_it_started(tmp_path):
    nats_port = free_port()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        broker = BrokerProcess(
            tmp_path / "b",
            embedded_nats_port=nats_port,
            extra_config="",
        )
        # Flight cannot bind: the start fails after the nats-server is up.
        broker.config_path.write_text(
            broker.config_path.read_text().replace("port = 0", f"port = {taken.getsockname()[1]}")
        )
        with pytest.raises(Exception, match="exited with code 1"):
            broker.start()
        # By process, not by port: under parallel tests another process's outgoing connection
        # can be given the freed port as its local one, and a bind test would fail.
        assert nats_servers_on(nats_port) == []
        assert not (broker.data_dir / NATS_PID_FILE).exists()
    finally:
        taken.close()


def test_an_embedded_nats_server_that_dies_is_restarted_on_its_port(tmp_path):
    broker = BrokerProcess(tmp_path / "b").start()
    try:
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
            client.create_stream("on", "on")
        first = nats_pid(broker)
        subprocess.run(["kill", "-9", str(first)], check=True)
        wait_until(lambda: nats_pid(broker) not in (first, None), message="a new nats-server")
        wait_until(lambda: health(broker)["ok"], message="the broker to be healthy again")
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
            assert client.publish("on", b"after the restart").first_offset == 0
        assert "the embedded nats-server died; restarting it" in broker.log_path.read_text()
    finally:
        assert broker.stop() == 0


def test_health_and_status_say_when_the_broker_cannot_reach_nats(tmp_path):
    port = free_port()
    server = NatsServer(port=port).start()
    broker = BrokerProcess(tmp_path / "b", nats_url=server.url).start()
    try:
        assert health(broker) == {"ok": True, "problems": []}
        server.stop()
        wait_until(lambda: not health(broker)["ok"], message="the broker to report the outage")
        assert health(broker)["problems"] == [
            f"not connected to NATS at nats://127.0.0.1:{port}: nothing is ingested"
        ]
        server = NatsServer(port=port).start()
        wait_until(lambda: health(broker)["ok"], message="reconnected")
        with SyncClient(nats_urls=server.url, broker=broker.flight) as client:
            client.create_stream("back", "back")
            assert client.publish("back", b"x").ok
            assert client.status()["health"]["ok"]
    finally:
        broker.stop()
        server.stop()


LONG_SUBJECT = "s" * 300


def test_a_subscription_nats_refuses_is_undone_and_never_stops_the_others(tmp_path):
    # A nats-server that refuses (and disconnects over) a SUB line longer than 256 bytes.
    with NatsServer(config="max_control_line: 256\n") as server:
        broker = BrokerProcess(tmp_path / "b", nats_url=server.url).start()
        try:
            with SyncClient(nats_urls=server.url, broker=broker.flight) as client:
                client.create_stream("fine", "fine")
                with pytest.raises(InvalidArgumentError, match="was not created: NATS did not accept"):
                    client.create_stream("long", LONG_SUBJECT)
                assert [s.config["name"] for s in client.list_streams()] == ["__cursors", "fine"]
                assert client.publish("fine", b"still ingesting").ok
                assert health(broker)["ok"]
        finally:
            assert broker.stop() == 0


def test_a_stored_stream_nats_refuses_is_reported_at_restart_and_the_others_serve(tmp_path):
    with NatsServer() as roomy:
        broker = BrokerProcess(tmp_path / "b", nats_url=roomy.url).start()
        with SyncClient(nats_urls=roomy.url, broker=broker.flight) as client:
            client.create_stream("fine", "fine")
            client.create_stream("long", LONG_SUBJECT)
        assert broker.stop() == 0
    with NatsServer(config="max_control_line: 256\n") as strict:
        again = BrokerProcess(broker.data_dir, nats_url=strict.url).start()
        try:
            report = health(again)
            assert not report["ok"]
            assert len(report["problems"]) == 1 and report["problems"][0].startswith("long/0: NATS did not")
            with SyncClient(nats_urls=strict.url, broker=again.flight) as client:
                assert client.publish("fine", b"served").ok
        finally:
            assert again.stop() == 0


def _stored_stream(tmp_path, count: int):
    """A stopped broker whose stream ``dmg`` holds ``count`` messages; its partition directory."""
    broker = BrokerProcess(tmp_path / "b")
    broker.start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        client.create_stream("dmg", "dmg")
        for start in range(0, count, 1000):
            client.publish_batch("dmg", [{"value": b"%d" % i} for i in range(start, start + 1000)])
    assert broker.stop() == 0
    return broker, broker.data_dir / "streams" / "dmg" / "0"


def test_an_epoch_checkpoint_from_the_future_is_rebuilt_and_the_partition_serves(tmp_path):
    broker, directory = _stored_stream(tmp_path, 3000)
    (directory / "leader-epoch.checkpoint").write_text("1\n1\n99 0\n")
    broker.start()
    try:
        assert health(broker)["ok"], health(broker)
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
            result = client.fetch("dmg", start="earliest", max_records=5000)
            assert result.to_table().column("value").to_pylist() == [b"%d" % i for i in range(3000)]
            assert client.publish("dmg", b"after").first_offset == 3000
        assert "leader-epoch.checkpoint does not match the segments" in broker.log_tail()
    finally:
        assert broker.stop() == 0


def test_a_partition_that_cannot_take_its_role_says_why_instead_of_naming_itself_its_leader(tmp_path):
    broker, directory = _stored_stream(tmp_path, 1000)
    with Log.open(directory) as log:  # data of an epoch the coordinator never gave
        log.assign_leader_epoch(50)
        log.append([Record(b"from nowhere")])
        log.high_watermark = log.log_end_offset
    broker.start()
    try:
        problems = health(broker)["problems"]
        assert len(problems) == 1, problems
        assert problems[0].startswith("dmg/0: cannot take its role (leader in epoch ")
        assert "holds data of the newer epoch 50" in problems[0]
        connection = BrokerConnection(broker.flight)
        try:
            with pytest.raises(UnavailableError, match="leads dmg/0 but cannot serve it: cannot take its"):
                connection.read(ReadRequest("dmg", 0))
        finally:
            connection.close()
    finally:
        assert broker.stop() == 0
