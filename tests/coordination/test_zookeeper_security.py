"""ZooKeeper security against a real server: TLS, digest ACLs, and the cluster's ACL text."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import socket
import uuid
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import make_digest_acl

from broker_node.coordination.base import BrokerInfo, Coordinator
from broker_node.coordination.errors import CoordinationError
from broker_node.coordination.local import LocalCoordinator
from broker_node.coordination.zookeeper import ZooKeeperCoordinator
from broker_node.coordination.zookeeper.znodes import ACL_TEXT, STREAMS
from broker_node.coordination.zookeeper_config import ZooKeeperConfig
from broker_node.zookeeper_server import ZooKeeperError, ZooKeeperServer
from pyspark_jetstream.protocol.streams import StreamConfig

from ..broker.harness import wait_until
from .conftest import waits_for_zookeeper

PASSWORD = "s3cret:with-colon-Zq9"
B1 = BrokerInfo("b1", "grpc://127.0.0.1:1001", ())
B2 = BrokerInfo("b2", "grpc://127.0.0.1:1002", ())


@dataclasses.dataclass(frozen=True)
class Identity:
    """PEM files of one certificate: ``cert`` (with its chain) and an unencrypted PKCS#8 ``key``."""

    cert: str
    key: str


@dataclasses.dataclass(frozen=True)
class Pki:
    ca: str
    server: Identity
    client: Identity
    other_ca: str
    other_client: Identity


def _write_identity(cert: trustme.LeafCert, directory: Path, name: str) -> Identity:
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), password=None)
    (directory / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (directory / f"{name}.crt").write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
    return Identity(str(directory / f"{name}.crt"), str(directory / f"{name}.key"))


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    """A CA signing ZooKeeper's and a broker's certificates, and an unrelated CA with a client of its own."""
    directory = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    other.cert_pem.write_to_path(str(directory / "other-ca.pem"))
    return Pki(
        ca=str(directory / "ca.pem"),
        server=_write_identity(ca.issue_cert("127.0.0.1", "localhost"), directory, "server"),
        client=_write_identity(ca.issue_cert("broker-1.example"), directory, "client"),
        other_ca=str(directory / "other-ca.pem"),
        other_client=_write_identity(other.issue_cert("intruder.example"), directory, "intruder"),
    )


@pytest.fixture(scope="module")
def tls_zookeeper(pki):
    """A TLS-only ZooKeeper on a free port; the test fails (not skips) if it cannot start."""
    with ZooKeeperServer(tls_cert=pki.server.cert, tls_key=pki.server.key, tls_ca=pki.ca) as server:
        yield server


@pytest.fixture
def tls_settings(tls_zookeeper, pki) -> ZooKeeperConfig:
    return ZooKeeperConfig(
        hosts=tls_zookeeper.hosts,
        chroot=f"/tls-{uuid.uuid4().hex[:12]}",
        session_timeout=2.0,
        connect_timeout=10,
        tls_ca=pki.ca,
        tls_cert=pki.client.cert,
        tls_key=pki.client.key,
    )


@pytest.fixture
def password_file(tmp_path) -> Path:
    path = tmp_path / "zk-password"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def started():
    """Start coordinators; all closed at the end."""
    made: list[Coordinator] = []

    def start(coordinator: Coordinator, broker: BrokerInfo = B1) -> Coordinator:
        coordinator.start(broker)
        made.append(coordinator)
        return coordinator

    yield start
    for coordinator in reversed(made):
        coordinator.close()


def _kazoo(hosts: str, **kwargs) -> KazooClient:
    return KazooClient(hosts=hosts, timeout=2.0, logger=logging.getLogger("kazoo.test"), **kwargs)


# ---- TLS -----------------------------------------------------------------------------------------


def test_a_coordinator_works_over_tls_with_a_ca_signed_certificate(tls_settings, started):
    coordinator = started(ZooKeeperCoordinator(tls_settings))
    wait_until(lambda: coordinator.controller() == "b1", message="a controller over TLS")
    created = coordinator.create_stream(StreamConfig(name="tls", subject="tls"))
    assert coordinator.get_stream("tls") == created


def test_the_tls_server_answers_four_letter_commands_over_tls_only(tls_zookeeper):
    assert tls_zookeeper.four_letter("ruok") == "imok"
    with socket.create_connection((tls_zookeeper.host, tls_zookeeper.port), timeout=2) as plain:
        plain.sendall(b"ruok")
        # The same port without TLS: no answer (TLS waits for a whole record header, or drops us).
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            assert b"imok" not in plain.recv(100)


def test_a_client_without_tls_is_refused_by_the_secure_port(tls_settings, started):
    client = _kazoo(tls_settings.hosts)
    try:
        with pytest.raises(KazooTimeoutError):
            client.start(timeout=3)
    finally:
        client.stop()
        client.close()
    plain = dataclasses.replace(tls_settings, tls_ca="", tls_cert="", tls_key="", connect_timeout=1)
    waits_for_zookeeper(ZooKeeperCoordinator(plain), B1, "waiting for ZooKeeper at ")


@pytest.mark.parametrize("wrong", ["the client trusts another CA", "the client's cert is from another CA"])
def test_tls_with_the_wrong_ca_is_refused(tls_settings, pki, started, wrong):
    if wrong == "the client trusts another CA":
        settings = dataclasses.replace(tls_settings, tls_ca=pki.other_ca, connect_timeout=1)
    else:
        other = pki.other_client
        settings = dataclasses.replace(
            tls_settings, tls_cert=other.cert, tls_key=other.key, connect_timeout=1
        )
    waits_for_zookeeper(ZooKeeperCoordinator(settings), B1, "waiting for ZooKeeper at .* over TLS")


def test_tls_and_digest_together(tls_settings, password_file, started):
    settings = dataclasses.replace(
        tls_settings, digest_user="cluster", digest_password_file=str(password_file)
    )
    coordinator = started(ZooKeeperCoordinator(settings))
    coordinator.store_acl("[acl]\n")
    client = _kazoo(
        settings.hosts, use_ssl=True, ca=settings.tls_ca, certfile=settings.tls_cert, keyfile=settings.tls_key
    )
    client.start(timeout=10)
    try:
        with pytest.raises(NoAuthError):
            client.get(f"{settings.chroot}{ACL_TEXT}")
    finally:
        client.stop()
        client.close()


def test_a_server_key_zookeeper_cannot_read_is_refused_by_name(tmp_path, pki):
    key = serialization.load_pem_private_key(Path(pki.server.key).read_bytes(), password=None)
    traditional = tmp_path / "traditional.key"
    traditional.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    server = ZooKeeperServer(
        data_dir=tmp_path / "zk", tls_cert=pki.server.cert, tls_key=traditional, tls_ca=pki.ca
    )
    with pytest.raises(
        ZooKeeperError, match=r"traditional.key is not an unencrypted PKCS#8 PEM key.*openssl pkey"
    ):
        server.start()
    assert not server.running
    with pytest.raises(ZooKeeperError, match="go together"):
        ZooKeeperServer(tls_cert=pki.server.cert)


# ---- digest authentication and znode ACLs ------------------------------------------------------


@pytest.fixture
def digest_settings(zk_settings, password_file) -> ZooKeeperConfig:
    return dataclasses.replace(zk_settings, digest_user="cluster", digest_password_file=str(password_file))


def test_the_cluster_znodes_refuse_a_client_without_the_credentials(digest_settings, started, zookeeper):
    coordinator = started(ZooKeeperCoordinator(digest_settings))
    wait_until(lambda: coordinator.controller() == "b1", message="a controller")
    coordinator.create_stream(StreamConfig(name="secret", subject="secret"))
    coordinator.store_acl("[acl]\n")
    chroot = digest_settings.chroot
    for credentials in ([], [("digest", "cluster:wrong")], [("digest", f"intruder:{PASSWORD}")]):
        client = _kazoo(zookeeper.hosts, auth_data=credentials)
        client.start(timeout=10)
        try:
            for path in (chroot, f"{chroot}{STREAMS}", f"{chroot}{STREAMS}/secret/0", f"{chroot}{ACL_TEXT}"):
                with pytest.raises(NoAuthError):
                    client.get(path)
            with pytest.raises(NoAuthError):
                client.get_children(f"{chroot}{STREAMS}")
            with pytest.raises(NoAuthError):
                client.set(f"{chroot}{ACL_TEXT}", b"[acl]\nopen = true\n")
            with pytest.raises(NoAuthError):
                client.create(f"{chroot}{STREAMS}/mine", b"")
            with pytest.raises(NoAuthError):
                client.delete(f"{chroot}{STREAMS}/secret/0")
        finally:
            client.stop()
            client.close()
    # Every znode carries exactly the one digest entry; the right credentials read them.
    owner = _kazoo(zookeeper.hosts, auth_data=[("digest", f"cluster:{PASSWORD}")])
    owner.start(timeout=10)
    try:
        expected = [make_digest_acl("cluster", PASSWORD, all=True)]
        for path in (
            chroot,
            f"{chroot}{STREAMS}/secret",
            f"{chroot}{STREAMS}/secret/0",
            f"{chroot}{ACL_TEXT}",
        ):
            assert owner.get_acls(path)[0] == expected, path
        assert owner.get(f"{chroot}{ACL_TEXT}")[0] == b"[acl]\n"
    finally:
        owner.stop()
        owner.close()


def test_a_coordinator_with_the_wrong_password_is_refused_by_name(digest_settings, started, tmp_path):
    started(ZooKeeperCoordinator(digest_settings))
    wrong = tmp_path / "wrong"
    wrong.write_text("not-it\n")
    with pytest.raises(CoordinationError, match="refused access .* digest_user 'cluster'") as raised:
        started(
            ZooKeeperCoordinator(dataclasses.replace(digest_settings, digest_password_file=str(wrong))), B2
        )
    assert "not-it" not in str(raised.value)


def test_the_password_is_never_shown(digest_settings, started, caplog, tmp_path):
    assert PASSWORD not in repr(digest_settings)
    caplog.set_level(logging.DEBUG)
    started(ZooKeeperCoordinator(digest_settings))
    assert PASSWORD not in caplog.text
    assert "auth='<redacted>'" in caplog.text  # kazoo logs its Auth request, without the credentials
    missing = dataclasses.replace(digest_settings, digest_password_file=str(tmp_path / "missing"))
    with pytest.raises(CoordinationError, match=r"cannot read the ZooKeeper digest password file .*missing"):
        started(ZooKeeperCoordinator(missing), B2)
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff" + PASSWORD.encode())
    with pytest.raises(CoordinationError, match="is not UTF-8 text") as raised:
        started(
            ZooKeeperCoordinator(dataclasses.replace(digest_settings, digest_password_file=str(binary))), B2
        )
    assert "xff" not in str(raised.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tls_cert": "c.pem"}, "tls_cert and tls_key go together"),
        ({"tls_key": "k.pem"}, "tls_cert and tls_key go together"),
        ({"digest_user": "u"}, "digest_user and digest_password_file go together"),
        ({"digest_password_file": "p"}, "digest_user and digest_password_file go together"),
        ({"digest_user": "a:b", "digest_password_file": "p"}, "digest_user must have no ':'"),
        ({"tls_check_hostname": "no"}, "tls_check_hostname must be true or false"),
    ],
)
def test_security_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        ZooKeeperConfig(**options)


def test_the_defaults_are_plain_and_open():
    settings = ZooKeeperConfig()
    assert not settings.tls and not settings.digest


# ---- the cluster's ACL text ------------------------------------------------------------------------


def test_acl_text_stored_by_one_coordinator_reaches_anothers_watch(zk_settings, started):
    first = started(ZooKeeperCoordinator(zk_settings), B1)
    second = started(ZooKeeperCoordinator(zk_settings), B2)
    heard: queue.Queue[str | None] = queue.Queue()
    second.watch_acl(heard.put)
    assert heard.get(timeout=10) is None  # at once: nothing stored yet
    first.store_acl('[[acl.allow]]\nuser = "alice"\n')
    assert heard.get(timeout=10) == '[[acl.allow]]\nuser = "alice"\n'
    first.store_acl('[[acl.allow]]\nuser = "bob"\n')
    assert heard.get(timeout=10) == '[[acl.allow]]\nuser = "bob"\n'
    late: queue.Queue[str | None] = queue.Queue()
    first.watch_acl(late.put)
    assert late.get(timeout=10) == '[[acl.allow]]\nuser = "bob"\n'  # the current text, at once
    assert heard.empty()


@pytest.fixture(params=["local", "zookeeper"])
def make(request, tmp_path, started):
    """Coordinators of one kind sharing one store."""

    def factory(broker: BrokerInfo = B1) -> Coordinator:
        if request.param == "local":
            return started(LocalCoordinator(tmp_path / "data"), broker)
        return started(ZooKeeperCoordinator(request.getfixturevalue("zk_settings")), broker)

    return factory


def test_acl_text_is_kept_and_watched(make):
    coordinator = make()
    heard: queue.Queue[str | None] = queue.Queue()
    coordinator.watch_acl(heard.put)
    assert heard.get(timeout=10) is None
    coordinator.store_acl("version = 1\n")
    assert heard.get(timeout=10) == "version = 1\n"
    coordinator.store_acl("")  # an empty text is a text, not "none stored"
    assert heard.get(timeout=10) == ""
    coordinator.store_acl("version = 2 # ünïcode\n")
    assert heard.get(timeout=10) == "version = 2 # ünïcode\n"
    again: queue.Queue[str | None] = queue.Queue()
    make(B2).watch_acl(again.put)  # another coordinator of the same store, as after a restart
    assert again.get(timeout=10) == "version = 2 # ünïcode\n"


def test_a_failing_acl_watcher_keeps_hearing(make, caplog):
    coordinator = make()
    heard: queue.Queue[str | None] = queue.Queue()

    def watcher(text: str | None) -> None:
        heard.put(text)
        raise RuntimeError("boom")

    coordinator.watch_acl(watcher)
    assert heard.get(timeout=10) is None
    coordinator.store_acl("a = 1\n")
    assert heard.get(timeout=10) == "a = 1\n"
    coordinator.store_acl("a = 2\n")
    assert heard.get(timeout=10) == "a = 2\n"
    assert "ACL watcher failed" in caplog.text
