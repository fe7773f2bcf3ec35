"""A secured cluster: TLS and tokens between brokers (replication, controller calls), the NATS
server run with the users and permissions generated from the ACL, ZooKeeper behind digest
authentication, and the ACL kept in ZooKeeper so every broker enforces the same one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from broker_node.security import AccessControl
from pyspark_jetstream.client import ClusterConnection, SyncClient
from pyspark_jetstream.local import LocalCluster
from pyspark_jetstream.protocol.envelope import AckPolicy
from pyspark_jetstream.protocol.errors import JetStreamError, PermissionDeniedError
from pyspark_jetstream.protocol.flight import ReadRequest

from .conftest import Secured, acl_text
from .pki import Pki

CHROOT = "/secured"
MALLORY_READS = '\n[[grants]]\nprincipal = "mallory"\nstreams = ["orders"]\nactions = ["read"]\n'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    directory: Path = tmp_path_factory.mktemp("secured-cluster")
    pki = Pki(directory / "pki")
    server = pki.issue("localhost", "127.0.0.1", "broker")
    text = acl_text()
    for n in (1, 2):  # each broker its own copy of the file: an edit of one reaches both through ZooKeeper
        (directory / f"acl-broker-{n}.toml").write_text(text)
    (directory / "zk-password").write_text("zookeeper-digest-secret\n")
    (directory / "broker-credentials.toml").write_text('user = "broker"\ntoken = "broker-token-1"\n')
    access = AccessControl(str(directory / "acl-broker-1.toml"), reload=False)
    nats_config = access.nats_config(
        {"orders": ["orders", "orders.1"]},
        {"cert_file": server.cert, "key_file": server.key, "ca_file": pki.ca, "timeout": 5},
    )
    security = (
        # First, keys of the cluster's [zookeeper] table (LocalCluster writes it just before):
        # ZooKeeper's digest identity, so every znode is the brokers' alone.
        f'digest_user = "broker"\ndigest_password_file = "{directory / "zk-password"}"\n'
        "[security]\n"
        f'tls_cert = "{server.cert}"\ntls_key = "{server.key}"\ntls_ca = "{pki.ca}"\n'
        f'acl_file = "{directory}/acl-{{broker_id}}.toml"\n'
        f'credentials_file = "{directory / "broker-credentials.toml"}"\n'
    )
    running = LocalCluster(
        2,
        base_dir=directory / "cluster",
        chroot=CHROOT,
        nats_config=nats_config,
        extra_config=security,
        cursor_replication_factor=2,
    )
    running.start()
    yield running, Secured(running.brokers[0], pki, server, directory / "acl-broker-1.toml", directory)
    running.stop()


def client(cluster: LocalCluster, secured: Secured, user: str) -> SyncClient:
    return SyncClient(
        nats_urls=cluster.nats_url, broker=cluster.flight, credentials=secured.credentials(user)
    )


def test_replication_between_brokers_runs_over_tls_with_their_own_credentials(cluster) -> None:
    running, secured = cluster
    with client(running, secured, "alice") as alice:
        alice.create_stream("orders", "orders", partitions=2, replication_factor=2)
        acks = [
            alice.publish("orders", f"m{i}".encode(), partition=i % 2, ack_policy=AckPolicy.ALL)
            for i in range(100)
        ]
        assert all(a.ok for a in acks)  # ALL: both replicas stored each, fetched over TLS as "broker"
        info = alice.describe_stream("orders")
    assert all(sorted(p.isr) == ["broker-1", "broker-2"] for p in info.partitions)
    for address in running.flights:  # each broker holds both partitions in full
        connection = ClusterConnection(address, credentials=secured.credentials("bob"))
        for partition in (0, 1):
            request = ReadRequest("orders", partition, from_replicas=True)
            # The log end: a follower learns the high watermark a fetch later than it stores.
            assert connection.connection(address).read(request).log_end_offset == 50
    for broker in running.brokers:
        log = broker.log_path.read_text()
        assert "denied" not in log and "refused credentials" not in log
        # Each broker probes both brokers' advertised addresses from its start, over TLS as "broker".
        assert "unreachable from" not in log


def orders_on_every_broker(running: LocalCluster, secured: Secured) -> None:
    """Create ``orders`` (a no-op if an earlier test of the module did) and wait until every
    broker serves it, so a test needing it runs alone or in any order."""
    with client(running, secured, "alice") as alice:
        alice.create_stream("orders", "orders", partitions=2, replication_factor=2)
    deadline = time.monotonic() + 15
    for address in running.flights:
        connection = ClusterConnection(address, credentials=secured.credentials("alice"))
        while True:
            try:
                connection.connection(address).read(ReadRequest("orders", 0, from_replicas=True))
                break
            except JetStreamError:
                assert time.monotonic() < deadline, f"{address} does not serve orders/0"
                time.sleep(0.1)


def test_an_acl_edited_on_one_broker_is_enforced_by_every_broker(cluster) -> None:
    running, secured = cluster
    orders_on_every_broker(running, secured)
    mallory = [ClusterConnection(a, credentials=secured.credentials("mallory")) for a in running.flights]
    for connection in mallory:
        with pytest.raises(PermissionDeniedError):
            connection.connection(connection.address).read(ReadRequest("orders", 0, from_replicas=True))
    secured.acl_file.write_text(acl_text(MALLORY_READS))  # broker-1's file only
    deadline = time.monotonic() + 15
    for connection in mallory:  # broker-2 learns it from ZooKeeper
        while True:
            try:
                connection.connection(connection.address).read(ReadRequest("orders", 0, from_replicas=True))
                break
            except PermissionDeniedError:
                assert time.monotonic() < deadline, f"{connection.address} still denies mallory"
                time.sleep(0.1)
    kazoo = KazooClient(
        hosts=running.zookeeper.hosts, auth_data=[("digest", "broker:zookeeper-digest-secret")]
    )
    kazoo.start(timeout=10)
    try:
        stored, _ = kazoo.get(f"{CHROOT}/acl")
    finally:
        kazoo.stop()
        kazoo.close()
    assert MALLORY_READS.strip() in stored.decode()


def test_zookeeper_refuses_clients_without_the_digest(cluster) -> None:
    running, _ = cluster
    kazoo = KazooClient(hosts=running.zookeeper.hosts)
    kazoo.start(timeout=10)
    try:
        with pytest.raises(NoAuthError):
            kazoo.get(f"{CHROOT}/acl")
        with pytest.raises(NoAuthError):
            kazoo.set(f"{CHROOT}/acl", b"[users]\n")
    finally:
        kazoo.stop()
        kazoo.close()
