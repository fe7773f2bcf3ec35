"""Leadership under faults: session expiry, divergent logs, the controller, unclean election, bad input."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from kazoo.client import KazooClient

from pyspark_jetstream.client import AckPolicy, SyncClient
from pyspark_jetstream.local import LocalBroker, LocalCluster
from pyspark_jetstream.protocol.errors import InvalidArgumentError, NotEnoughReplicasError

from ..broker.harness import wait_until
from .conftest import FAST
from .helpers import (
    caught_up,
    leader_of,
    publish_all,
    registered_brokers,
    replica_table,
    status,
    stored_frames,
)

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)


def expire_session(cluster: LocalCluster, broker: LocalBroker) -> None:
    """Expire a broker's ZooKeeper session for real: another client takes it over and closes it."""
    session = json.loads((broker.data_dir / "zookeeper.session").read_text())
    thief = KazooClient(
        hosts=cluster.zookeeper.hosts, client_id=(session["session_id"], bytes.fromhex(session["password"]))
    )
    thief.start(10)
    thief.stop()
    thief.close()


def test_a_leader_whose_session_expires_stops_leading_and_nothing_acked_is_lost(cluster, client):
    client.create_stream("exp", "exp", replication_factor=3, min_insync_replicas=2)
    assert len(publish_all(client, "exp", [b"v%d" % i for i in range(20)], "p")) == 20
    leader = leader_of(client, "exp")
    epoch = client.describe_stream("exp").partitions[0].leader_epoch
    expire_session(cluster, cluster.broker(leader))
    # Leadership moves (a new epoch), and the old leader knows it no longer leads.
    wait_until(
        lambda: client.describe_stream("exp").partitions[0].leader_epoch > epoch,
        timeout=30,
        message="a new leader epoch",
    )
    acked = publish_all(client, "exp", [b"w%d" % i for i in range(20)], "p", first=20)
    assert len(acked) == 20
    wait_until(
        lambda: (
            next(
                p["role"] for p in status(cluster.broker(leader).flight)["partitions"] if p["stream"] == "exp"
            )
            == "follower"
            or leader_of(client, "exp") == leader
        ),
        timeout=30,
        message="the old leader to follow (or lead again in a newer epoch)",
    )
    log = cluster.broker(leader).log_path.read_text()
    assert "coordinator session lost: this broker stops acting as leader" in log
    wait_until(lambda: caught_up(cluster, "exp"), timeout=30, message="caught up")
    stored = client.fetch("exp", max_records=1000).to_table().column("value").to_pylist()
    assert stored == [b"v%d" % i for i in range(20)] + [b"w%d" % i for i in range(20)]


def test_replicas_that_diverged_converge_by_leader_epoch(tmp_path):
    """KIP-101's second case: a deposed leader's unreplicated write is cut by epoch, not kept."""
    with LocalCluster(2, base_dir=tmp_path / "c", extra_config=FAST, cursor_replication_factor=1) as cluster:
        from pyspark_jetstream.client import SyncClient

        def client_of(broker: str) -> SyncClient:
            """A client that finds the cluster through ``broker`` (the other one may be down)."""
            return SyncClient(nats_urls=cluster.nats_url, broker=cluster.broker(broker).flight, timeout=20)

        with SyncClient(nats_urls=cluster.nats_url, broker=cluster.flight, timeout=20) as client:
            client.create_stream("div", "div", replication_factor=2, unclean_leader_election=True)
            assert len(publish_all(client, "div", [b"a", b"b"], "p")) == 2
            wait_until(lambda: caught_up(cluster, "div"), message="both have a, b")
            first = leader_of(client, "div")
        other = next(b for b in ("broker-1", "broker-2") if b != first)
        # The follower dies and leaves the ISR; the leader takes one more write alone.  (Not a paused
        # follower: its socket would still take the leader's push, and it would hold the write when
        # it resumed.)
        cluster.broker(other).kill()
        with client_of(first) as client:
            wait_until(lambda: client.describe_stream("div").partitions[0].isr == (first,), timeout=30)
            assert client.publish("div", b"only-on-the-old-leader", ack_policy=AckPolicy.LEADER).ok
        # The leader dies; the stale follower is back and leads (unclean: the stream allows it).
        cluster.broker(first).kill()
        cluster.broker(other).start()
        with client_of(other) as client:
            wait_until(lambda: leader_of(client, "div") == other, timeout=60, message="the unclean leader")
            assert client.publish("div", b"on-the-new-leader", ack_policy=AckPolicy.LEADER).ok
            # The old leader comes back as a follower: its extra write goes, the logs agree.
            cluster.broker(first).start()
            wait_until(lambda: caught_up(cluster, "div"), timeout=60, message="the logs to agree")
            wait_until(lambda: len(client.describe_stream("div").partitions[0].isr) == 2, timeout=30)
            values = replica_table(cluster.broker(first).flight, "div").column("value").to_pylist()
            assert values == [b"a", b"b", b"on-the-new-leader"]
        cluster.stop()
        assert stored_frames(cluster.broker(first), "div") == stored_frames(cluster.broker(other), "div")


def test_without_unclean_election_a_partition_waits_for_an_in_sync_replica(cluster, client):
    client.create_stream("clean", "clean", replication_factor=2)
    assert len(publish_all(client, "clean", [b"committed"], "p")) == 1
    state = client.describe_stream("clean").partitions[0]
    leader = state.leader
    other = next(b for b in state.replicas if b != leader)
    cluster.broker(other).pause()
    wait_until(lambda: client.describe_stream("clean").partitions[0].isr == (leader,), timeout=30)
    cluster.broker(leader).kill()
    cluster.broker(other).resume()
    wait_until(lambda: client.describe_stream("clean").partitions[0].leader == "", timeout=30)
    # Once the controller's broker sees the stale replica registered, the controller has queued a
    # pass over it; a stream created after that is created after the pass (one event at a time).
    controller = cluster.broker(status(cluster.broker(other).flight)["controller"])
    wait_until(lambda: other in registered_brokers(controller.flight), timeout=30, message="its return")
    client.create_stream("after-the-pass", "after-the-pass")
    assert client.describe_stream("clean").partitions[0].leader == ""
    cluster.broker(leader).start()  # the last in-sync replica returns and leads again
    assert leader_of(client, "clean") == leader
    assert client.fetch("clean").to_table().column("value").to_pylist() == [b"committed"]


def test_the_controller_fails_over_and_finishes_its_work(cluster, client):
    controller = status(cluster.flight)["controller"]
    client.create_stream("c1", "c1", partitions=3, replication_factor=2)
    led_by_controller = [
        p.partition for p in client.describe_stream("c1").partitions if p.leader == controller
    ]
    cluster.broker(controller).kill()
    others = [b for b in cluster.brokers if b.broker_id != controller]
    wait_until(
        lambda: status(others[0].flight)["controller"] not in (None, controller),
        timeout=30,
        message="a new controller",
    )
    # The dead controller's partitions move too, and streams can be created again.
    wait_until(
        lambda: all(
            client.describe_stream("c1").partitions[p].leader not in ("", controller)
            for p in led_by_controller
        ),
        timeout=30,
    )
    client.create_stream("c2", "c2", replication_factor=2)
    assert client.publish("c2", b"x", ack_policy=AckPolicy.ALL).ok


def test_bad_cluster_input_is_refused_clearly(cluster, client):
    asked = time.monotonic()
    with pytest.raises(NotEnoughReplicasError, match="replication factor 4 needs 4 live brokers, but 3"):
        client.create_stream("big", "big", replication_factor=4)
    assert time.monotonic() - asked < 20, "refused at once, not retried for the client's timeout (20 s)"
    with pytest.raises(InvalidArgumentError, match=r"min_insync_replicas \(3\) cannot exceed"):
        client.create_stream("m", "m", replication_factor=2, min_insync_replicas=3)
    with pytest.raises(InvalidArgumentError, match="replication_factor must be"):
        client.create_stream("z", "z", replication_factor=0)
    # Nothing of the refused streams was created (the internal cursor stream may or may not exist yet).
    assert not {s.config["name"] for s in client.list_streams()} & {"big", "m", "z"}
    # A second broker with an id that is running: refused, naming the id.
    twin = LocalBroker(
        cluster.base_dir / "twin",
        nats_url=cluster.nats_url,
        broker_id="broker-1",
        extra_config=f'[zookeeper]\nhosts = "{cluster.zookeeper.hosts}"\nchroot = "{cluster.chroot}"\n'
        "session_timeout = 3.0\n",
    )
    with pytest.raises(Exception, match="broker id 'broker-1' is already registered"):
        twin.start()
    # Two brokers on one data directory: refused, the directory is locked.
    same_dir = LocalBroker(cluster.brokers[0].data_dir, nats_url=cluster.nats_url, broker_id="broker-9")
    with pytest.raises(Exception, match="is in use by another broker"):
        same_dir.start()


def _healthz(port: int) -> str:
    """The body of a broker's ``/healthz`` (a 503's included); ``""`` while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            return answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.read().decode()
    except OSError:
        return ""


def _waiting_broker(
    tmp_path, zookeeper_port: int, metrics_port: int
) -> tuple[LocalBroker, threading.Thread, list[BaseException]]:
    """A broker of a ZooKeeper that is not there yet, starting in a thread (it waits for it); the
    thread, and what its start raised (it ends when the broker joins, or fails, or stops)."""
    broker = LocalBroker(
        tmp_path / "b",
        extra_config=(
            f'[zookeeper]\nhosts = "127.0.0.1:{zookeeper_port}"\nconnect_timeout = 1.0\n'
            f"cursor_replication_factor = 1\n[metrics]\nport = {metrics_port}\n"
        ),
        start_timeout=180,
    )
    failed: list[BaseException] = []

    def start() -> None:
        try:
            broker.start()
        except BaseException as exc:
            failed.append(exc)

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    return broker, starting, failed


def test_a_broker_started_before_zookeeper_waits_for_it_then_joins_and_serves(tmp_path):
    from broker_node.zookeeper_server import ZooKeeperServer, free_port

    zookeeper_port, metrics_port = free_port(), free_port()
    broker, starting, failed = _waiting_broker(tmp_path, zookeeper_port, metrics_port)
    try:
        expected = f"waiting for ZooKeeper at 127.0.0.1:{zookeeper_port} for "
        wait_until(lambda: expected in _healthz(metrics_port), timeout=60, message="/healthz to say it waits")
        # One line per connect_timeout (1 s here), well past it: still waiting, not given up.
        wait_until(
            lambda: broker.log_path.read_text().count(expected) >= 3, timeout=60, message="three lines"
        )
        assert starting.is_alive() and broker.running, failed
        with ZooKeeperServer(port=zookeeper_port, data_dir=tmp_path / "zookeeper"):
            starting.join(120)
            assert not starting.is_alive() and not failed, failed
            with SyncClient(nats_urls=broker.nats_url, broker=broker.flight, timeout=20) as client:
                client.create_stream("late", "late")
                assert client.publish("late", b"x", ack_policy=AckPolicy.ALL).first_offset == 0
                assert client.fetch("late").num_rows == 1
            assert json.loads(_healthz(metrics_port)) == {"ok": True, "problems": []}
            assert broker.stop() == 0
    finally:
        broker.stop()


def test_a_broker_waiting_for_zookeeper_stops_at_once_when_told(tmp_path):
    from broker_node.zookeeper_server import free_port

    zookeeper_port, metrics_port = free_port(), free_port()
    broker, starting, failed = _waiting_broker(tmp_path, zookeeper_port, metrics_port)
    wait_until(lambda: "waiting for ZooKeeper at" in _healthz(metrics_port), timeout=60, message="it to wait")
    process = broker.process
    assert process is not None
    stopped = time.monotonic()
    process.terminate()
    assert process.wait(30) == 0, broker.log_tail()
    assert time.monotonic() - stopped < 10
    assert "Traceback" not in broker.log_tail()
    starting.join(30)
    assert "the broker exited with code 0" in str(failed[0])


def test_a_paused_follower_whose_session_expires_and_a_shutdown_log_no_traceback(tmp_path):
    with (
        LocalCluster(3, base_dir=tmp_path / "cluster", extra_config=FAST) as cluster,
        SyncClient(nats_urls=cluster.nats_url, broker=cluster.flight, timeout=20) as client,
    ):
        client.create_stream("paused", "paused", replication_factor=3)
        publish_all(client, "paused", [b"v%d" % i for i in range(10)], "p")
        leader = leader_of(client, "paused")
        follower = next(b for b in cluster.brokers if b.broker_id != leader)
        follower.pause()  # a stalled VM: its sockets stay open, its session expires
        at_leader = cluster.broker(leader).flight  # the client might ask the paused broker
        wait_until(
            lambda: follower.broker_id not in registered_brokers(at_leader),
            timeout=30,
            message="the paused follower's session to expire",
        )
        follower.resume()
        wait_until(lambda: caught_up(cluster, "paused"), timeout=30, message="the follower back")
        wait_until(
            lambda: follower.broker_id in client.describe_stream("paused").partitions[0].isr,
            timeout=30,
            message="the follower back in the ISR",
        )
    logs = {b.broker_id: b.log_path.read_text() for b in cluster.brokers}
    assert "ZooKeeper session expired" in logs[follower.broker_id]
    for broker_id, log in logs.items():
        assert "Traceback" not in log, f"{broker_id}: {log[log.index('Traceback') - 300 :][:2000]}"
