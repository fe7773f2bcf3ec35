"""Credentials' files read by the client and by the broker (the pure part is
``tests/protocol/test_credentials.py``): a file named that is not there is refused in one line
naming it, when the credentials are made."""

from __future__ import annotations

import pytest

from broker_node.config import SecurityConfig
from broker_node.peer_credentials import (
    flight_arguments,
    load_credentials,
    nats_arguments,
    own_credentials,
    peer_link,
)
from pyspark_jetstream.client import Credentials as ClientCredentials
from pyspark_jetstream.protocol.credentials import Credentials
from pyspark_jetstream.protocol.errors import InvalidArgumentError

TOKEN = "s3cret-token"


def test_a_missing_tls_file_is_refused_by_the_client_and_the_broker(tmp_path):
    missing = str(tmp_path / "none.pem")
    with pytest.raises(InvalidArgumentError, match=r"^tls.ca '.*none.pem' is not a readable file$"):
        ClientCredentials(tls_ca=missing)
    (tmp_path / "c.toml").write_text(f'tls_ca = "{missing}"\n')
    with pytest.raises(InvalidArgumentError, match=r"^tls.ca '.*none.pem' is not a readable file$"):
        load_credentials(tmp_path / "c.toml")
    with pytest.raises(InvalidArgumentError, match=r"^tls.ca '.*none.pem' is not a readable file$"):
        ClientCredentials.load(tmp_path / "c.toml")


def test_the_client_reads_a_credentials_file_and_its_options(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("not read until a connection")
    path = tmp_path / "c.toml"
    path.write_text(f'user = "alice"\ntoken = "{TOKEN}"\ntls_ca = "{ca}"\n')
    loaded = ClientCredentials.load(path)
    assert isinstance(loaded, ClientCredentials) and loaded.tls_ca == str(ca)
    assert ClientCredentials.from_options({"credentialsFile": str(path), "user": "bob", "token": "t"}) == (
        ClientCredentials(user="bob", token="t", tls_ca=str(ca))
    )
    assert flight_arguments(loaded)["tls_root_certs"] == loaded.flight_arguments()["tls_root_certs"]
    with pytest.raises(InvalidArgumentError, match=r"^cannot read credentials file '.*none.toml'"):
        ClientCredentials.load(tmp_path / "none.toml")


def test_the_broker_presents_its_own_or_its_security_tables_credentials(tmp_path):
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem"))
    for file in (ca, cert, key):
        file.write_text("-")
    security = SecurityConfig(tls_cert=str(cert), tls_key=str(key), tls_ca=str(ca), verify_clients=True)
    own = own_credentials(security)
    assert own == Credentials(tls_ca=str(ca), tls_cert=str(cert), tls_key=str(key))
    assert peer_link(Credentials()).tls is None and peer_link(Credentials()).authorization == ""
    assert nats_arguments(Credentials(user="alice", token=TOKEN))["password"] == TOKEN
    assert "tls" not in nats_arguments(Credentials(user="alice", token=TOKEN))
    arguments = flight_arguments(Credentials(user="alice", token=TOKEN))
    assert TOKEN not in repr(arguments) and len(arguments["middleware"]) == 1
    with pytest.raises(InvalidArgumentError, match=r"^cannot read credentials file '.*none.toml'"):
        load_credentials(tmp_path / "none.toml")
