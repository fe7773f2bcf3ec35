"""A broker with TLS and an ACL (real certificates from a throwaway CA, real bcrypt tokens)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from pyspark_jetstream.client import Credentials, SyncClient
from pyspark_jetstream.local import LocalBroker

from .pki import Pair, Pki

TOKENS = {
    "broker": "broker-token-1",
    "alice": "alice-token-2",
    "bob": "bob-token-3",
    "mallory": "mallory-token-4",
}
"""Each principal's token (the ACL stores only their bcrypt hashes)."""


def acl_text(extra: str = "") -> str:
    """The ACL the secured broker starts with: alice owns ``orders*``, bob may read it, mallory
    may do nothing, carol (a certificate, no token) may read ``orders``."""
    users = "".join(
        f'[users.{name}]\ntoken_bcrypt = "{bcrypt.hashpw(token.encode(), bcrypt.gensalt(4)).decode()}"\n'
        + ("cluster = true\n" if name == "broker" else "")
        + ("max_follow_readers = 2\n" if name == "bob" else "")
        for name, token in TOKENS.items()
    )
    return (
        users
        + "[users.carol]\n"
        + """
[[grants]]
principal = "alice"
streams = ["orders*"]
actions = ["read", "write", "admin"]

[[grants]]
principal = "alice"
consumers = ["alice-*"]
actions = ["cursor"]

[[grants]]
principal = "bob"
streams = ["orders"]
actions = ["read"]

[[grants]]
principal = "bob"
consumers = ["bob-*"]
actions = ["cursor"]

[[grants]]
principal = "carol"
streams = ["orders"]
actions = ["read"]
"""
        + extra
    )


@dataclass
class Secured:
    """A running secured broker and what its tests need."""

    broker: LocalBroker
    pki: Pki
    server: Pair
    acl_file: Path
    directory: Path

    def credentials(
        self, user: str | None = None, *, cert: Pair | None = None, ca: str | None = None
    ) -> Credentials:
        """Credentials of ``user`` (its token), trusting the test CA (or ``ca``)."""
        return Credentials(
            user=user,
            token=TOKENS[user] if user else None,
            tls_ca=ca or self.pki.ca,
            tls_cert=cert.cert if cert else None,
            tls_key=cert.key if cert else None,
        )

    def client(self, user: str | None = None, **kwargs: object) -> SyncClient:
        """A client of ``user``."""
        return SyncClient(
            nats_urls=self.broker.nats_url,
            broker=self.broker.flight,
            credentials=self.credentials(user, **kwargs),
        )


def secure_config(directory: Path, pki: Pki, server: Pair, acl_file: Path, *, verify_clients: bool) -> str:
    """The ``[security]`` table of a secured broker (its own credentials file written beside)."""
    own = directory / "broker-credentials.toml"
    own.write_text(f'user = "broker"\ntoken = "{TOKENS["broker"]}"\n')
    return (
        "[security]\n"
        f'tls_cert = "{server.cert}"\ntls_key = "{server.key}"\ntls_ca = "{pki.ca}"\n'
        f"verify_clients = {'true' if verify_clients else 'false'}\n"
        f'acl_file = "{acl_file}"\ncredentials_file = "{own}"\nmax_streams = 6\n'
    )


def start_secured(directory: Path, *, verify_clients: bool = False) -> Secured:
    """Start a broker with TLS (mutual with ``verify_clients``) and the ACL of :func:`acl_text`."""
    pki = Pki(directory / "pki")
    server = pki.issue("localhost", "127.0.0.1", "broker")
    acl_file = directory / "acl.toml"
    acl_file.write_text(acl_text())
    broker = LocalBroker(
        directory / "data",
        extra_config=secure_config(directory, pki, server, acl_file, verify_clients=verify_clients),
    )
    broker.start()
    return Secured(broker, pki, server, acl_file, directory)


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """One secured broker (TLS, tokens, the ACL) for a module's tests."""
    running = start_secured(tmp_path_factory.mktemp("secured"))
    yield running
    running.broker.stop()
