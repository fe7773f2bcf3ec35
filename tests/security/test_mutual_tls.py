"""Mutual TLS (client certificates as identities), the refusal to listen insecurely, the ACL
document's checks, and publishing refused by NATS failing at once."""

from __future__ import annotations

import time

import pytest

from pyspark_jetstream.client import ClusterConnection, Credentials
from pyspark_jetstream.local import FlightPlace, LocalBroker
from pyspark_jetstream.protocol.acl import parse_acl
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
)
from pyspark_jetstream.protocol.flight import ActionType, ReadRequest

from .conftest import Secured, start_secured
from .pki import Pki


@pytest.fixture(scope="module")
def mutual(tmp_path_factory):
    """A broker that requires client certificates (``verify_clients``)."""
    running = start_secured(tmp_path_factory.mktemp("mutual"), verify_clients=True)
    with running.client("alice", cert=running.pki.issue("alice")) as alice:
        alice.create_stream("orders", "orders", partitions=2)
        alice.publish("orders", b"one", partition=0)
    yield running
    running.broker.stop()


def read(secured: Secured, credentials: Credentials) -> int:
    connection = ClusterConnection(secured.broker.flight, timeout=3, credentials=credentials)
    return connection.read(ReadRequest("orders", 0)).num_rows


def test_a_client_certificate_is_the_principal(mutual: Secured) -> None:
    carol = mutual.pki.issue("carol")  # no token: the certificate alone says who she is
    assert read(mutual, Credentials(tls_ca=mutual.pki.ca, tls_cert=carol.cert, tls_key=carol.key)) == 1
    dave = mutual.pki.issue("dave")  # signed by the CA, but no principal of the ACL
    with pytest.raises(UnauthenticatedError, match="'dave' names no principal"):
        read(mutual, Credentials(tls_ca=mutual.pki.ca, tls_cert=dave.cert, tls_key=dave.key))


def test_without_a_client_certificate_the_connection_is_refused(mutual: Secured) -> None:
    with pytest.raises(UnavailableError):
        read(mutual, mutual.credentials("alice"))  # a valid token, but no certificate


def test_a_certificate_from_another_ca_is_refused(mutual: Secured, tmp_path) -> None:
    stranger = Pki(tmp_path / "other", "other-ca").issue("carol")
    with pytest.raises(UnavailableError):
        read(mutual, Credentials(tls_ca=mutual.pki.ca, tls_cert=stranger.cert, tls_key=stranger.key))


def test_an_expired_certificate_is_refused(mutual: Secured) -> None:
    expired = mutual.pki.issue("carol", expired=True)
    with pytest.raises(UnavailableError):
        read(mutual, Credentials(tls_ca=mutual.pki.ca, tls_cert=expired.cert, tls_key=expired.key))


def test_a_refused_publish_fails_at_once_naming_the_principal(mutual: Secured) -> None:
    bob = mutual.client("bob", cert=mutual.pki.issue("bob"))
    with bob:
        started = time.monotonic()
        with pytest.raises(PermissionDeniedError, match="principal 'bob' may not write stream 'orders'"):
            bob.publish("orders", b"not bob's", partition=0, timeout=30)
        assert time.monotonic() - started < 10  # not the 30 s ack timeout
    with mutual.client("alice", cert=mutual.pki.issue("alice")) as alice:
        ack = alice.publish("orders", b"two", partition=1)  # every partition's subject is alice's
        assert ack.ok and ack.partition == 1


def test_a_broker_refuses_to_listen_beyond_loopback_insecurely(tmp_path) -> None:
    broker = LocalBroker(tmp_path / "open", flight=FlightPlace(host="0.0.0.0"), start_timeout=20)
    with pytest.raises(
        UnavailableError, match=r"refusing to listen on \[flight\] 0.0.0.0 without TLS and an ACL"
    ):
        broker.start()
    broker.config_path.write_text(broker.config_path.read_text() + "[security]\ninsecure = true\n")
    broker.start()  # said explicitly: allowed
    try:
        connection = ClusterConnection(broker.flight.replace("0.0.0.0", "127.0.0.1"), timeout=5)
        assert connection.action(ActionType.HEALTH, {})["ok"]
    finally:
        broker.stop()


GRANT = "[users.a]\n[[grants]]\n"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("[users.a]\ntoken_bcrypt = 'plain'\n", "token_bcrypt of \\[users.a\\] .* is not a bcrypt hash"),
        ("[users.'a b']\n", "principal name 'a b' is invalid"),
        (
            GRANT + "principal = 'b'\nstreams = ['x']\nactions = ['read']\n",
            "names principal 'b'",
        ),
        (
            GRANT + "principal = 'a'\nstreams = ['x']\nactions = ['fly']\n",
            "actions of grant #1",
        ),
        (GRANT + "principal = 'a'\nactions = ['read']\n", "names no streams"),
        (
            GRANT + "principal = 'a'\nstreams = ['x']\nactions = ['cursor']\n",
            "names no consumers",
        ),
        ("[users.a]\nadmin = true\n", "unknown option\\(s\\) admin in \\[users.a\\]"),
        ("[user.a]\n", "unknown table\\(s\\) user"),
        ("[users\n", "not valid TOML"),
    ],
)
def test_a_bad_acl_is_refused_naming_the_entry(document: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        parse_acl(document, "acl.toml")


def test_grants_deny_by_default_and_match_patterns() -> None:
    acl = parse_acl(
        "[users.a]\n[users.ops]\n"
        "[[grants]]\nprincipal = 'a'\nstreams = ['orders.*']\nactions = ['read']\n"
        "[[grants]]\nprincipal = '*'\nstreams = ['public']\nactions = ['read']\n"
        "[[grants]]\nprincipal = 'ops'\nstreams = ['*']\nactions = ['admin']\n"
    )
    assert acl.allows("a", "read", stream="orders.eu")
    assert not acl.allows("a", "read", stream="orders")
    assert not acl.allows("a", "write", stream="orders.eu")
    assert acl.allows("ops", "read", stream="public") and acl.allows("a", "read", stream="public")
    assert not acl.allows("stranger", "read", stream="public")  # '*' is every *known* principal
    assert acl.allows("ops", "admin", stream="*") and not acl.allows("a", "admin", stream="*")
    nats = acl.nats_authorization({"orders.eu": ["orders.eu", "orders.eu.1"]}, {"a": "$2b$hash"})
    (a,) = nats["users"]
    assert a["permissions"]["publish"]["allow"] == ["_PJS.discover"]
    assert a["permissions"]["subscribe"]["allow"] == ["_INBOX_a.>", "_PJS.tail.*.orders.eu"]


def test_an_acl_with_no_token_users_locks_nats_rather_than_opening_it() -> None:
    acl = parse_acl("[users.carol]\n[[grants]]\nprincipal = 'carol'\nstreams = ['x']\nactions = ['read']\n")
    (only,) = acl.nats_authorization({"x": ["x"]}, {})["users"]
    assert only["user"] == "_nobody" and only["password"].startswith("$2b$10$")
