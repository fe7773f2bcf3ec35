"""Brokers on several hosts: everyone reaches a broker only where it advertises, and an address
nobody reaches is reported.

Linux routes all of 127.0.0.0/8 to the loopback interface, so three addresses
of it stand for three machines: each broker binds only its own, so whoever
used another address than the one a broker advertises (127.0.0.1 for
broker-2, say) would find nothing there.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

from pyspark_jetstream.client import AckPolicy, BrokerConnection, SyncClient
from pyspark_jetstream.local import FlightPlace, LocalBroker, LocalCluster
from pyspark_jetstream.protocol.errors import JetStreamError
from pyspark_jetstream.protocol.flight import ActionType

from ..broker.harness import wait_until
from .conftest import FAST
from .helpers import caught_up, leader_of, publish_all, replica_table, status

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)

PLACES = [
    # broker-1 advertises a name, not the address it binds: clients must be told the name.
    FlightPlace(host="127.0.0.1", advertised_host="localhost"),
    FlightPlace(host="127.0.0.2", advertised_host="127.0.0.2"),
    FlightPlace(host="127.0.0.3", advertised_host="127.0.0.3"),
]


def answers_as(address: str, timeout: float = 5.0) -> str | None:
    """The id of the broker that answers at ``address``; ``None`` if nothing does."""
    connection = BrokerConnection(address, timeout=timeout)
    try:
        return connection.action(ActionType.IDENTIFY, {}, timeout)["broker_id"]
    except JetStreamError:
        return None
    finally:
        connection.close()


def jetstream(cluster: LocalCluster, broker: str, *args: str, timeout: float = 10) -> tuple[int, str]:
    """Run the ``jetstream`` command against ``broker``; its exit code and output."""
    env = {**os.environ, "JETSTREAM_NATS": cluster.nats_url, "JETSTREAM_BROKER": broker}
    run = subprocess.run(
        [sys.executable, "-m", "pyspark_jetstream.cli", "--timeout", str(timeout), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    return run.returncode, run.stdout + run.stderr


def values_of(client: SyncClient, stream: str, partition: int) -> list[bytes]:
    """Every value a partition holds, read from its leader."""
    read = client.fetch(stream, partition, start="earliest", max_records=10_000)
    return read.to_table().column("value").to_pylist()


def row(shown: str, *cells: str) -> bool:
    """Whether a line of a table in ``shown`` starts with ``cells`` (the last one may be a prefix)."""
    pattern = r"\s+".join(re.escape(c) for c in cells)
    return re.search(rf"^{pattern}", shown, re.MULTILINE) is not None


def probes_of(address: str) -> dict[str, str | None]:
    """What the broker at ``address`` found probing each broker's advertised address."""
    return {p["broker_id"]: p["error"] for p in status(address)["reachability"]}


@pytest.fixture
def spread(tmp_path):
    with LocalCluster(
        3, base_dir=tmp_path / "cluster", extra_config=FAST, log_level="DEBUG", flight=PLACES
    ) as running:
        yield running


def test_clients_followers_and_the_controller_use_only_advertised_addresses(spread):
    advertised = {}
    for n, (broker, place) in enumerate(zip(spread.brokers, PLACES, strict=True), start=1):
        port = int(broker.flight.rsplit(":", 1)[1])
        assert broker.flight == f"grpc://{place.advertised_host}:{port}"
        advertised[f"broker-{n}"] = broker.flight
        # Each binds only its own address: nothing of it answers at the others.
        for other in PLACES:
            if other.host != place.host:
                assert answers_as(f"grpc://{other.host}:{port}", timeout=2) != f"broker-{n}"

    # What every broker tells clients: the advertised Flight addresses, the NATS servers used.
    # (A broker learns of the others through ZooKeeper's watches: a moment after it started.)
    for address in advertised.values():
        with SyncClient(nats_urls=spread.nats_url, broker=address, timeout=20) as asking:

            def every_broker(asking: SyncClient = asking) -> list[dict] | None:
                brokers = asking.metadata()["brokers"]
                return brokers if len(brokers) == len(advertised) else None

            brokers = wait_until(every_broker, timeout=30, message=f"{address} to know every broker")
        assert {b["broker_id"]: b["flight"] for b in brokers} == advertised
        assert all(b["nats"] == [spread.nats_url] for b in brokers)

    # A client that starts from a broker other than the controller: creation is forwarded to it.
    controller = status(advertised["broker-1"])["controller"]
    bootstrap = next(b for b in advertised if b != controller)
    with SyncClient(nats_urls=spread.nats_url, broker=advertised[bootstrap], timeout=20) as client:
        client.create_stream("spread", "spread", partitions=3, replication_factor=3, min_insync_replicas=2)
        values = {p: [b"%d-%02d" % (p, i) for i in range(10)] for p in range(3)}
        for p in range(3):
            for v in values[p]:
                client.publish("spread", v, partition=p, ack_policy=AckPolicy.ALL)
        wait_until(lambda: caught_up(spread, "spread", 3), timeout=30, message="every replica caught up")
        for p in range(3):
            copies = [replica_table(a, "spread", p).column("value").to_pylist() for a in spread.flights]
            assert copies == [values[p]] * 3
            assert values_of(client, "spread", p) == values[p]

        # Every broker reaches every broker where it advertises; nothing is wrong anywhere.
        for address in advertised.values():
            wait_until(
                lambda a=address: probes_of(a) == dict.fromkeys(advertised),
                timeout=20,
                message=f"{address} to have reached every broker",
            )
            assert status(address)["health"] == {"ok": True, "problems": []}
        code, shown = jetstream(spread, advertised[bootstrap], "cluster", "status")
        assert code == 0, shown
        for broker_id, address in advertised.items():
            assert row(shown, broker_id, address, "broker-1,broker-2,broker-3", "ok"), shown
        assert "unreachable" not in shown

        # The controller (and whatever it leads) goes: a new controller, new leaders, all found
        # at their advertised addresses.
        spread.broker(controller).kill()
        wait_until(
            lambda: status(advertised[bootstrap])["controller"] not in (None, controller),
            timeout=30,
            message="a new controller",
        )
        for p in range(3):
            wait_until(
                lambda p=p: leader_of(client, "spread", p) != controller,
                timeout=30,
                message=f"spread/{p} led by a live broker",
            )
        more = [b"after-%02d" % i for i in range(10)]
        publish_all(client, "spread", more, "after")
        client.create_stream("later", "later", replication_factor=2)
        client.publish("later", b"x", ack_policy=AckPolicy.ALL)
        assert values_of(client, "later", 0) == [b"x"]
        stored = [v for p in range(3) for v in values_of(client, "spread", p)]
    assert sorted(stored) == sorted([v for p in range(3) for v in values[p]] + more)


def silent_listener(host: str) -> socket.socket:
    """A TCP socket on ``host`` that accepts connections (the kernel does) and never answers: an
    address whose packets go nowhere, as behind a firewall that drops them."""
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen(64)
    return sock


def test_an_advertised_address_nobody_reaches_is_reported(tmp_path):
    hole = silent_listener("127.0.0.4")
    port = hole.getsockname()[1]
    # broker-2 serves at 127.0.0.2 but tells everyone 127.0.0.4, where nothing answers.
    places = [
        FlightPlace(host="127.0.0.1"),
        FlightPlace(host="127.0.0.2", port=port, advertised_host="127.0.0.4"),
    ]
    bad = f"grpc://127.0.0.4:{port}"
    try:
        with LocalCluster(
            2, base_dir=tmp_path / "cluster", extra_config=FAST, log_level="DEBUG", flight=places
        ) as cluster:
            good = cluster.brokers[0].flight
            assert cluster.brokers[1].flight == bad
            expected = (
                f"advertised address {bad} of broker-2 is unreachable from broker-1: no answer within 2s"
            )

            # The brokers find it: broker-1 reports it, and so does broker-2 of itself.
            def reported() -> bool:
                code, shown = jetstream(cluster, good, "health")
                return code == 1 and expected in shown

            wait_until(reported, timeout=30, message="jetstream health to report broker-2's address")
            itself = BrokerConnection(f"grpc://127.0.0.2:{port}", timeout=10)
            try:
                wait_until(
                    lambda: (
                        f"advertised address {bad} of broker-2 is unreachable from broker-2: "
                        "no answer within 2s" in itself.action(ActionType.HEALTH, {})["problems"]
                    ),
                    timeout=30,
                    message="broker-2 to find its own address unreachable",
                )
            finally:
                itself.close()

            # The probes run beside the requests: a health check answers well within a probe's time.
            near = BrokerConnection(good, timeout=1.0)
            try:
                started = time.monotonic()
                assert expected in near.action(ActionType.HEALTH, {}, 1.0)["problems"]
                assert time.monotonic() - started < 1.0
            finally:
                near.close()

            # The cluster's status says which broker is not reached, by whom, and why; asking every
            # broker at once, the silent one costs one timeout, not one each call.
            with SyncClient(nats_urls=cluster.nats_url, broker=good, timeout=3) as client:
                started = time.monotonic()
                statuses = client.cluster_status()
                assert time.monotonic() - started < 6
            assert "error" in statuses["broker-2"] and "error" not in statuses["broker-1"]
            code, shown = jetstream(cluster, good, "cluster", "status", timeout=3)
            assert code == 0, shown
            assert row(shown, "broker-2", bad, "none (NOT broker-1)", "unreachable from here: "), shown
            assert row(shown, "broker-1", good, "broker-1", ""), shown
            assert expected in shown
    finally:
        hole.close()


def test_an_embedded_nats_server_on_every_address_is_advertised_at_the_advertised_host(tmp_path):
    broker = LocalBroker(
        tmp_path / "b",
        flight=FlightPlace(host="127.0.0.1", advertised_host="localhost"),
        extra_config="[security]\ninsecure = true\n",  # NATS on every address, no TLS: a test's own
    )
    broker.config_path.write_text(
        broker.config_path.read_text().replace("[nats]\n", '[nats]\nembedded_host = "0.0.0.0"\n')
    )
    with broker:
        port = int(broker.nats_url.rsplit(":", 1)[1])
        # Not nats://127.0.0.1 (which the broker itself uses): only its own machine reaches that.
        assert broker.nats_url == f"nats://localhost:{port}"
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight, timeout=20) as client:
            assert client.status()["nats"] == [broker.nats_url]
            assert [b["nats"] for b in client.metadata()["brokers"]] == [[broker.nats_url]]
            client.create_stream("named", "named")
            assert client.publish("named", b"x").first_offset == 0
