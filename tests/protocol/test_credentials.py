"""Credentials as the protocol holds them: their checks and parsing, with no file read (the client's
and the broker's reading: ``tests/security/test_credentials_files.py``)."""

from __future__ import annotations

import pytest

from pyspark_jetstream.protocol.credentials import Credentials, basic_authorization
from pyspark_jetstream.protocol.errors import InvalidArgumentError

TOKEN = "s3cret-token"


def test_the_protocol_checks_fields_and_reads_no_file(tmp_path):
    missing = str(tmp_path / "none.pem")
    pure = Credentials(user="alice", token=TOKEN, tls_ca=missing)  # no file is looked at
    assert pure.files() == {"tls.ca": missing}
    assert pure.flight_files() == {"tls_root_certs": missing}
    assert pure.authorization == basic_authorization("alice", TOKEN) == "Basic YWxpY2U6czNjcmV0LXRva2Vu"
    assert pure.nats_user()["user"] == "alice" and pure.nats_user()["password"] == TOKEN
    assert TOKEN not in repr(pure) and "*****" in repr(pure)
    assert Credentials().empty and not pure.empty and Credentials().authorization is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"user": "alice"}, "give user and token together"),
        ({"token": TOKEN}, "give user and token together"),
        ({"user": "alice", "token": ""}, "token must be a non-empty string"),
        ({"tls_cert": "c.pem"}, "give tls.cert and tls.key together"),
    ],
)
def test_bad_fields_are_refused_in_one_line(fields, message):
    with pytest.raises(InvalidArgumentError, match=message) as refused:
        Credentials(**fields)
    assert "\n" not in str(refused.value) and TOKEN not in str(refused.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'user = "alice"\ntoken = "s3cret-token"\npassword = "x"\n',
            r"unknown key\(s\) password in .*'f.toml'",
        ),
        ('user = "alice"\ntoken = 7\n', r"every value in credentials file 'f.toml' must be a string"),
        ('user = "alice\n', r"cannot read credentials file 'f.toml'"),
    ],
)
def test_a_bad_credentials_file_is_named_not_quoted(text, message):
    with pytest.raises(InvalidArgumentError, match=message) as refused:
        Credentials.parse(text, "f.toml")
    assert TOKEN not in str(refused.value)


def test_options_given_override_the_files_values():
    base = Credentials.parse(f'user = "alice"\ntoken = "{TOKEN}"\ntls_ca = "a.pem"\n', "f.toml")
    assert base == Credentials(user="alice", token=TOKEN, tls_ca="a.pem")
    changed = base.overridden({"tls.ca": "b.pem", "user": "", "credentialsFile": "f.toml", "other": "x"})
    assert changed == Credentials(user="alice", token=TOKEN, tls_ca="b.pem")
