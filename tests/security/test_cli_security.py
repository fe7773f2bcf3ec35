"""``jetstream`` against a secured broker, run as a user would: credentials from a file, the
environment or options; every refusal one line naming what is missing; the token never printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest

from .conftest import TOKENS, Secured

ROOT = Path(__file__).resolve().parents[2]


def jetstream(
    secured: Secured, *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the CLI of this checkout against ``secured``, with nothing from the environment but
    ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JETSTREAM_")}
    return subprocess.run(
        [sys.executable, "-m", "pyspark_jetstream.cli", "--nats", secured.broker.nats_url, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**clean, **(env or {})},
        input=stdin,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line on stderr of a failed command."""
    assert result.returncode != 0, result.stdout
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), result.stderr
    line = result.stderr.rstrip("\n")
    assert line.startswith("jetstream: ") and "Traceback" not in line, line
    return line


def no_token_in(result: subprocess.CompletedProcess[str]) -> None:
    for token in [*TOKENS.values(), "guessed-token"]:
        assert token not in result.stdout + result.stderr


@pytest.fixture(scope="module")
def files(secured: Secured, tmp_path_factory) -> dict[str, str]:
    """A credentials file per principal, and the stream ``orders`` with one message."""
    directory = tmp_path_factory.mktemp("credentials")
    out = {}
    for user in ("alice", "bob", "mallory"):
        path = directory / f"{user}.toml"
        path.write_text(f'user = "{user}"\ntoken = "{TOKENS[user]}"\ntls_ca = "{secured.pki.ca}"\n')
        out[user] = str(path)
    with secured.client("alice") as alice:
        alice.create_stream("orders", "orders")
        alice.publish("orders", b"first")
    return out


def test_list_publish_and_tail_with_credentials(secured, files):
    listed = jetstream(secured, "--credentials", files["bob"], "stream", "list")
    assert listed.returncode == 0 and "orders" in listed.stdout, listed.stderr
    published = jetstream(secured, "--credentials", files["alice"], "publish", "orders", "second")
    assert published.returncode == 0, published.stderr
    assert "stored in orders/0 at offset 1" in published.stdout
    # bob: the file from the environment; alice: user and token from options and the environment
    tailed = jetstream(secured, "tail", "orders", "--count", "2", env={"JETSTREAM_CREDENTIALS": files["bob"]})
    assert tailed.returncode == 0, tailed.stderr
    assert [line.split("\t")[-1] for line in tailed.stdout.splitlines()] == ["first", "second"]
    fetched = jetstream(
        secured,
        *("--user", "alice", "--tls-ca", secured.pki.ca, "tail", "orders", "--no-follow"),
        env={"JETSTREAM_TOKEN": TOKENS["alice"]},
    )
    assert fetched.returncode == 0 and fetched.stdout.count("\n") == 2, fetched.stderr
    for result in (listed, published, tailed, fetched):
        no_token_in(result)


def test_without_credentials_the_line_names_what_is_missing(secured, files):
    untrusted = one_line(jetstream(secured, "--timeout", "2", "stream", "list"))
    assert "certificate this machine does not trust: give --tls-ca FILE" in untrusted
    anonymous = one_line(jetstream(secured, "--timeout", "2", "--tls-ca", secured.pki.ca, "stream", "list"))
    assert (
        "needs a user and token, and none were given: give --user and --token (or $JETSTREAM_TOKEN)"
        in anonymous
    )
    half = one_line(jetstream(secured, "--user", "alice", "--tls-ca", secured.pki.ca, "stream", "list"))
    assert "give user and token together" in half


def test_a_wrong_token_is_refused_and_never_printed(secured, files):
    for how in (("--token", "guessed-token"), ()):
        result = jetstream(
            secured,
            *("--timeout", "2", "--user", "alice", "--tls-ca", secured.pki.ca, *how, "stream", "list"),
            env={"JETSTREAM_TOKEN": "guessed-token"},
        )
        assert "refused user 'alice': wrong user or token" in one_line(result)
        no_token_in(result)


def test_what_a_principal_may_not_do_is_one_line_naming_it(secured, files):
    tail = jetstream(secured, "--credentials", files["mallory"], "tail", "orders", "--no-follow")
    assert one_line(tail) == "jetstream: principal 'mallory' may not read stream 'orders'"
    publish = jetstream(secured, "--timeout", "2", "--credentials", files["bob"], "publish", "orders", "x")
    assert "principal 'bob' may not write stream 'orders'" in one_line(publish)
    for result in (tail, publish):
        no_token_in(result)


def test_hash_token_reads_stdin_or_generates_one(secured):
    hashed = jetstream(secured, "acl", "hash-token", stdin="s3cret-token\n")
    assert hashed.returncode == 0, hashed.stderr
    assert bcrypt.checkpw(b"s3cret-token", hashed.stdout.strip().encode())
    assert "s3cret-token" not in hashed.stdout
    generated = jetstream(secured, "acl", "hash-token", "--generate")
    assert generated.returncode == 0, generated.stderr
    lines = dict(line.split(" = ", 1) for line in generated.stdout.splitlines())
    token, token_hash = (lines[k].split('"')[1] for k in ("token", "token_bcrypt"))
    assert len(token) >= 40 and bcrypt.checkpw(token.encode(), token_hash.encode())
    assert "no token read from stdin" in one_line(jetstream(secured, "acl", "hash-token", stdin=""))


def test_hash_token_without_bcrypt_names_the_extra():
    code = (
        "import sys; sys.modules['bcrypt'] = None; from pyspark_jetstream.cli import main; "
        "sys.exit(main(['acl', 'hash-token']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        input="t\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert "needs bcrypt, in the [broker] extra" in one_line(result)


def test_nats_config_is_generated_from_the_acl_for_the_streams_that_exist(secured: Secured, files) -> None:
    broker_file = Path(files["alice"]).with_name("broker.toml")
    broker_file.write_text(f'user = "broker"\ntoken = "{TOKENS["broker"]}"\ntls_ca = "{secured.pki.ca}"\n')
    result = jetstream(
        secured, "--credentials", str(broker_file), "acl", "nats-config", str(secured.acl_file)
    )
    assert result.returncode == 0, result.stderr
    body = result.stdout.split("authorization: ", 1)[1]
    users = {u["user"]: u for u in json.loads(body)["users"]}
    assert users["broker"]["permissions"]["subscribe"]["allow"] == [">"]
    assert "orders" in users["alice"]["permissions"]["publish"]["allow"]
    assert "orders" not in users["bob"]["permissions"]["publish"]["allow"]
    assert users["bob"]["permissions"]["subscribe"]["allow"] == ["_INBOX_bob.>", "_PJS.tail.*.orders"]
    assert users["mallory"]["permissions"]["publish"]["allow"] == ["_PJS.discover"]
    no_token_in(result)
