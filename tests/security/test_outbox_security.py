"""The outbox harvester publishing through a secured broker, with credentials from its config."""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyspark_jetstream.outbox import HarvesterConfig, init_outbox, open_store
from pyspark_jetstream.protocol.errors import InvalidArgumentError

from .conftest import TOKENS, Secured

ROOT = Path(__file__).resolve().parents[2]


def wait_for_empty(database: str, process: subprocess.Popen[str], timeout: float = 30) -> None:
    store = open_store(database, "outbox")
    try:
        deadline = time.monotonic() + timeout
        while store.backlog():
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, f"{store.backlog()} rows still in the outbox"
            time.sleep(0.05)
    finally:
        store.close()


def test_the_harvester_publishes_as_alice_through_tls(secured: Secured, tmp_path):
    with secured.client("alice") as alice:
        alice.create_stream("orders-outbox", "orders-outbox")
    database = f"sqlite:///{tmp_path / 'app.db'}"
    init_outbox(database)
    with sqlite3.connect(tmp_path / "app.db") as db:
        db.executemany(
            "INSERT INTO outbox (stream, key, value) VALUES (?, ?, ?)",
            [("orders-outbox", b"k", f"row{i}".encode()) for i in range(5)],
        )
    credentials = tmp_path / "alice.toml"
    credentials.write_text(f'user = "alice"\ntoken = "{TOKENS["alice"]}"\n')
    config = tmp_path / "outbox.toml"
    config.write_text(
        f'[outbox]\ndatabase = "{database}"\nnats = "{secured.broker.nats_url}"\n'
        f'credentials_file = "{credentials}"\ntls_ca = "{secured.pki.ca}"\n'
        "poll = 0.02\ndeadline = 0.3\nreport_every = 1.0\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("JETSTREAM_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "pyspark_jetstream.cli", "outbox", "run", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        wait_for_empty(database, process)
    finally:
        process.send_signal(signal.SIGTERM)
        _, log = process.communicate(timeout=30)
    assert process.returncode == 0, log
    assert TOKENS["alice"] not in log
    with secured.client("alice") as alice:
        table = alice.fetch("orders-outbox").to_table()
    assert table.column("value").to_pylist() == [f"row{i}".encode() for i in range(5)]


def test_the_config_checks_its_credentials_and_hides_the_token(secured: Secured, tmp_path):
    config = HarvesterConfig(
        database=f"sqlite:///{tmp_path / 'app.db'}",
        nats=secured.broker.nats_url,
        user="alice",
        token=TOKENS["alice"],
        tls_ca=secured.pki.ca,
    )
    assert config.credentials() == secured.credentials("alice")
    assert TOKENS["alice"] not in repr(config)
    with pytest.raises(InvalidArgumentError, match="outbox: cannot read credentials file") as missing:
        HarvesterConfig(database=config.database, nats=config.nats, credentials_file=str(tmp_path / "none"))
    with pytest.raises(InvalidArgumentError, match="outbox: give user and token together") as half:
        HarvesterConfig(database=config.database, nats=config.nats, token=TOKENS["alice"])
    for caught in (missing, half):
        assert TOKENS["alice"] not in str(caught.value)


def test_the_command_lines_credentials_override_the_configs(secured: Secured, tmp_path):
    from pyspark_jetstream.outbox.cli import _config

    config = tmp_path / "outbox.toml"
    config.write_text(f'[outbox]\ndatabase = "sqlite:///{tmp_path / "app.db"}"\nnats = "nats://x:4222"\n')
    given = {"user": "bob", "token": TOKENS["bob"], "tls.ca": secured.pki.ca}
    args = argparse.Namespace(config=str(config), database=None, table=None, credentials_given=given)
    assert _config(args).credentials() == secured.credentials("bob")
    args = argparse.Namespace(config=None, database="sqlite:///x.db", table=None, nats="nats://x:4222")
    assert _config(args).credentials().empty
