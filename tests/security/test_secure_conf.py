"""``conf/secure/`` as shipped: every option real, and a broker started from it serves.

The files are copied into a temporary directory laid out like the repository
(``conf/secure/...``) and the broker runs there, so the relative paths the
files name are the ones checked.  The certificates come from
``scripts/make_certs.py``; only the ports (free ones) and the tokens (fresh
ones, hashed at bcrypt's lowest cost) differ from the committed files.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from broker_node.config import load_broker_config
from pyspark_jetstream.client import ClusterConnection, Credentials, SyncClient
from pyspark_jetstream.protocol.acl import parse_acl
from pyspark_jetstream.protocol.errors import PermissionDeniedError, UnavailableError
from pyspark_jetstream.protocol.flight import ActionType, ReadRequest

ROOT = Path(__file__).resolve().parents[2]
SECURE = ROOT / "conf" / "secure"
PRINCIPALS = ("broker", "producer-app", "consumer-app", "admin")
START_TIMEOUT = 30.0


def make_certs(out: Path) -> None:
    """The certificates the walkthrough in conf/secure/README.md makes."""
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "make_certs.py"),
            "--out",
            str(out),
            "--san",
            "localhost",
            "--san",
            "127.0.0.1",
            *(arg for name in PRINCIPALS[1:] for arg in ("--client", name)),
        ],
        check=True,
        capture_output=True,
    )


def replace_once(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` (which must occur exactly once) replaced by ``new``."""
    assert text.count(old) == 1, f"expected {old!r} once in the file"
    return text.replace(old, new)


def credentials_file(directory: Path, user: str, token: str, *, certificate: bool = False) -> Path:
    """conf/secure/client.toml as another principal would have it (its user and token)."""
    text = (SECURE / "client.toml").read_text()
    text = replace_once(text, 'user = "producer-app"', f'user = "{user}"')
    text = replace_once(text, 'token = "EXAMPLE-producer-token-replace-me"', f'token = "{token}"')
    if certificate:  # the mutual-TLS lines, uncommented, naming this principal's certificate
        text = replace_once(
            text,
            '# tls_cert = "conf/secure/certs/producer-app.pem"',
            f'tls_cert = "conf/secure/certs/{user}.pem"',
        )
        text = replace_once(
            text,
            '# tls_key = "conf/secure/certs/producer-app.key"',
            f'tls_key = "conf/secure/certs/{user}.key"',
        )
    path = directory / "conf" / "secure" / f"{user}.toml"
    path.write_text(text)
    return path


def copy_conf(directory: Path, *, verify_clients: bool = False) -> dict[str, str]:
    """conf/secure/ copied into ``directory`` with certificates, free ports and fresh tokens;
    returns each principal's token."""
    target = directory / "conf" / "secure"
    target.mkdir(parents=True)
    make_certs(target / "certs")
    tokens = {name: secrets.token_urlsafe(24) for name in PRINCIPALS}
    acl_text = (SECURE / "acl.toml").read_text()
    for name, user in parse_acl(acl_text).users.items():
        assert user.token_bcrypt is not None
        fresh = bcrypt.hashpw(tokens[name].encode(), bcrypt.gensalt(4)).decode()
        acl_text = replace_once(acl_text, user.token_bcrypt, fresh)
    (target / "acl.toml").write_text(acl_text)
    own = (SECURE / "broker-credentials.toml").read_text()
    own = replace_once(own, "EXAMPLE-broker-token-replace-me", tokens["broker"])
    (target / "broker-credentials.toml").write_text(own)
    config = (SECURE / "broker.toml").read_text()
    config = replace_once(config, "embedded_port = 4222", "embedded_port = -1")
    config = replace_once(config, "port = 9292", "port = 0")
    if verify_clients:
        config = replace_once(config, "verify_clients = false", "verify_clients = true")
    (target / "broker.toml").write_text(config)
    for name in PRINCIPALS[1:]:
        credentials_file(directory, name, tokens[name], certificate=verify_clients)
    return tokens


class BrokerProcess:
    """``python -m broker_node --config conf/secure/broker.toml`` run in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.log = directory / "broker.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "broker_node", "--config", "conf/secure/broker.toml"],
                cwd=directory,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        runtime = directory / "conf" / "secure" / "data" / "broker.json"
        deadline = time.monotonic() + START_TIMEOUT
        while not runtime.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the secured broker did not start: {self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        info = json.loads(runtime.read_text())
        self.flight: str = info["flight"]
        self.nats: str = info["nats"][0]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not stop."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def in_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory laid out like the repository, the working directory of the test."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def test_every_option_of_the_secure_conf_is_real(in_copy: Path) -> None:
    copy_conf(in_copy)
    config = load_broker_config("conf/secure/broker.toml")  # unknown keys or tables would raise
    security = config.security
    assert security.tls and security.acl_file == "conf/secure/acl.toml"
    assert security.credentials_file == "conf/secure/broker-credentials.toml"
    assert not security.verify_clients and not security.insecure
    assert config.flight.host == "0.0.0.0" and config.exposed_insecurely() == []
    # Without TLS or without the ACL the same file would be refused (it listens beyond loopback).
    text = Path("conf/secure/broker.toml").read_text()
    Path("no-acl.toml").write_text(replace_once(text, 'acl_file = "conf/secure/acl.toml"', 'acl_file = ""'))
    assert load_broker_config("no-acl.toml").exposed_insecurely() == ["[flight] 0.0.0.0"]
    # The committed credentials files load (their CA path too) and name principals of the ACL.
    acl = parse_acl((SECURE / "acl.toml").read_text())
    shutil.copy(SECURE / "client.toml", "conf/secure/client.toml")
    client = Credentials.load("conf/secure/client.toml")
    own = Credentials.load(SECURE / "broker-credentials.toml")
    assert client.user in acl.users and client.tls_ca == "conf/secure/certs/ca.pem"
    assert own.user is not None and acl.is_cluster(own.user)


def test_the_example_tokens_match_their_hashes() -> None:
    """The committed example tokens (published, named as examples) work with the committed ACL."""
    acl_text = (SECURE / "acl.toml").read_text()
    acl = parse_acl(acl_text)
    examples = dict(re.findall(r"# Example token: (\S+)\n\[users\.([\w-]+)\]", acl_text))
    assert sorted(examples.values()) == sorted(acl.users) == sorted(PRINCIPALS)
    for token, name in examples.items():
        assert token.startswith("EXAMPLE-") and token.endswith("-replace-me")
        hashed = acl.users[name].token_bcrypt
        assert hashed is not None and bcrypt.checkpw(token.encode(), hashed.encode()), name
    for path in ("client.toml", "broker-credentials.toml", "admin.toml"):
        document = tomllib.loads((SECURE / path).read_text())
        assert examples[document["token"]] == document["user"], path


def read_values(connection: ClusterConnection, stream: str) -> list[bytes]:
    return connection.read(ReadRequest(stream, 0)).to_table().column("value").to_pylist()


@pytest.mark.parametrize("verify_clients", [False, True], ids=["tls", "mutual-tls"])
def test_a_broker_from_the_secure_conf_serves_its_principals(in_copy: Path, verify_clients: bool) -> None:
    copy_conf(in_copy, verify_clients=verify_clients)
    broker = BrokerProcess(in_copy)
    try:
        assert broker.flight.startswith("grpc+tls://localhost:")

        def client(user: str) -> SyncClient:
            credentials = Credentials.load(f"conf/secure/{user}.toml")
            return SyncClient(nats_urls=broker.nats, credentials=credentials, timeout=15)

        with client("admin") as admin:
            admin.create_stream("orders", "orders")
        with client("producer-app") as producer:
            acks = [producer.publish("orders", f"order {i}".encode()) for i in range(3)]
            assert [a.first_offset for a in acks] == [0, 1, 2]
            with pytest.raises(PermissionDeniedError, match="'producer-app' may not read stream 'orders'"):
                producer.fetch("orders", start=0)
        with client("consumer-app") as consumer:
            result = consumer.fetch("orders", start=0)
            assert result.to_table().column("value").to_pylist() == [b"order 0", b"order 1", b"order 2"]
            consumer.set_cursor("consumer-app-billing", "orders", 0, result.next_offset)
            assert consumer.fetch_cursor("consumer-app-billing", "orders", 0) == 3
            with pytest.raises(PermissionDeniedError, match="may not cursor consumer 'someone-else'"):
                consumer.set_cursor("someone-else", "orders", 0, 1)

        ca = "conf/secure/certs/ca.pem"
        with pytest.raises(PermissionDeniedError):  # a valid principal, no grant to create
            ClusterConnection(
                broker.flight, timeout=5, credentials=Credentials.load("conf/secure/consumer-app.toml")
            ).action(ActionType.CREATE_STREAM, {"name": "x", "subject": "x"})
        if verify_clients:
            # No client certificate: the TLS handshake fails, a token does not help.
            consumer = Credentials.load("conf/secure/consumer-app.toml")
            bare = Credentials(user=consumer.user, token=consumer.token, tls_ca=ca)
            with pytest.raises(UnavailableError):
                read_values(ClusterConnection(broker.flight, timeout=1, credentials=bare), "orders")
            # A certificate naming a principal of the ACL authenticates it to Flight without a token.
            certificate = Credentials(tls_ca=ca, tls_cert=consumer.tls_cert, tls_key=consumer.tls_key)
            connection = ClusterConnection(broker.flight, timeout=5, credentials=certificate)
            assert read_values(connection, "orders") == [b"order 0", b"order 1", b"order 2"]
    finally:
        broker.stop()
    assert broker.process.returncode == 0, broker.log.read_text()[-3000:]
