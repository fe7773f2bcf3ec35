"""The harvester on SQLite (the embedded default) against a real broker and nats-server."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import defaultdict

import pytest

from pyspark_jetstream.outbox import HarvesterConfig, init_outbox, open_store
from pyspark_jetstream.protocol.errors import InvalidArgumentError

from ..broker.harness import wait_until
from .conftest import Running, config_for, harvest_while_writing, read_all, wait_for_empty


def write_rows(path: str, writer: int, transactions: int, keys: int, committed: list, seed: int) -> None:
    """Application transactions: 1 to 3 rows each, one in five rolled back."""
    rng = random.Random(seed)
    db = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        for t in range(transactions):
            db.execute("BEGIN IMMEDIATE")
            rows = []
            for i in range(rng.randint(1, 3)):
                key = f"k{rng.randrange(keys)}"
                value = f"w{writer}-t{t}-{i}"
                cursor = db.execute(
                    "INSERT INTO outbox (stream, key, value) VALUES (?, ?, ?)",
                    (committed[0], key.encode(), value.encode()),
                )
                rows.append((cursor.lastrowid, key, value))
            if rng.random() < 0.2:
                db.execute("ROLLBACK")
            else:
                db.execute("COMMIT")
                committed[1].extend(rows)
    finally:
        db.close()


def check_exactly_once_in_order(client, stream: str, committed: list[tuple[int, str, str]]) -> None:
    stored = read_all(client, stream)
    values = [bytes(r["value"]).decode() for r in stored]
    assert sorted(values) == sorted(v for _, _, v in committed), "each committed row exactly once"
    id_of = {value: row_id for row_id, _, value in committed}
    by_key: dict[str, list[int]] = defaultdict(list)
    for row in stored:  # partition by partition, in offset order
        by_key[bytes(row["key"]).decode()].append(id_of[bytes(row["value"]).decode()])
    for key, ids in by_key.items():
        assert ids == sorted(ids), f"key {key} out of id order: {ids}"


def test_concurrent_writers_every_committed_row_once_in_id_order_per_key(deployment, client, name, tmp_path):
    client.create_stream(name, name, partitions=3)
    path = str(tmp_path / "app.db")
    init_outbox(f"sqlite:///{path}")
    config = config_for(deployment, f"sqlite:///{path}", batch_size=50, max_in_flight=40)
    committed: list = [name, []]
    writers = [threading.Thread(target=write_rows, args=(path, w, 60, 8, committed, w)) for w in range(4)]
    running = harvest_while_writing(config, writers)
    assert len(committed[1]) > 200
    check_exactly_once_in_order(client, name, committed[1])
    status = running.harvester.status
    assert status.published >= len(committed[1]) and status.dead_lettered == 0


def test_a_refused_row_is_retried_then_dead_lettered_and_its_key_moves_on(deployment, client, name, tmp_path):
    client.create_stream(name, name)
    client.create_stream(f"{name}-small", f"{name}-small", max_message_bytes=1024)
    database = f"sqlite:///{tmp_path / 'app.db'}"
    init_outbox(database)
    store = open_store(database)
    store.insert(
        [
            {"stream": f"{name}-missing", "key": b"k1", "value": b"poison"},
            {"stream": name, "key": b"k1", "value": b"after the poison"},
            {"stream": name, "key": b"k2", "value": b"another key"},
            {"stream": name, "key": b"k3", "value": b"x" * 1_100_000},  # over NATS's 1 MiB max_payload
            {"stream": f"{name}-small", "key": b"k4", "value": b"x" * 4096},  # refused by the broker
            {"stream": f"{name}-small", "key": b"k4", "value": b"after the refusal"},
        ]
    )
    config = config_for(deployment, database, max_attempts=3)
    running = Running(config)
    try:
        wait_for_empty(config, running=running)
    finally:
        running.stop()
    assert sorted(bytes(r["value"]) for r in read_all(client, name)) == [b"after the poison", b"another key"]
    letter, oversize, refused = store.dead_letters()
    assert (letter.original_id, letter.attempts, letter.value) == (1, 3, b"poison")
    assert f"{name}-missing" in letter.error
    assert (oversize.original_id, oversize.attempts) == (4, 3) and "max_payload" in oversize.error
    assert (refused.original_id, refused.attempts) == (5, 3), refused  # a negative ack from the broker
    assert [bytes(r["value"]) for r in read_all(client, f"{name}-small")] == [b"after the refusal"]
    # The row after the poison, of the same key, waited until the poison was dead-lettered.
    (after,) = [r for r in read_all(client, name) if bytes(r["value"]) == b"after the poison"]
    assert after["timestamp"].timestamp() >= letter.failed_at - 0.005
    assert running.harvester.status.dead_lettered == 3

    # Requeued once the stream exists, the dead letter is published (as a new row).
    client.create_stream(f"{name}-missing", f"{name}-missing")
    cli = [sys.executable, "-m", "pyspark_jetstream.cli", "--nats", deployment.nats_url, "outbox"]
    listed = subprocess.run(
        [*cli, "dead-letters", "--database", database, "--json"], capture_output=True, text=True, check=False
    )
    assert listed.returncode == 0, listed.stderr
    assert [d["row"] for d in json.loads(listed.stdout)] == [1, 4, 5]
    requeued = subprocess.run(
        [*cli, "dead-letters", "--database", database, "--requeue", str(letter.id)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert requeued.returncode == 0 and "requeued 1 of 1" in requeued.stdout
    running = Running(config)
    try:
        wait_for_empty(config, running=running)
    finally:
        running.stop()
    assert [bytes(r["value"]) for r in read_all(client, f"{name}-missing")] == [b"poison"]
    assert [d.original_id for d in store.dead_letters()] == [4, 5]
    store.close()


def test_a_missing_table_and_bad_settings_are_named(deployment, tmp_path):
    database = f"sqlite:///{tmp_path / 'empty.db'}"
    running = Running(config_for(deployment, database))
    wait_until(lambda: running.error is not None, 30, message="the harvester to fail")
    with pytest.raises(InvalidArgumentError, match=r"no such table: outbox.*jetstream outbox init"):
        running.stop()

    cli = [sys.executable, "-m", "pyspark_jetstream.cli", "outbox"]
    status = subprocess.run(
        [*cli, "status", "--database", database], capture_output=True, text=True, check=False
    )
    assert status.returncode == 1 and "jetstream outbox init" in status.stderr, status.stderr
    for options, message in [
        ({"table": "outbox; drop table x"}, "must be letters, digits"),
        ({"max_in_flight": 0}, "max_in_flight must be an integer from 1"),
        ({"nats": ""}, "'nats' is required"),
        ({"ack_policy": "none"}, "ack_policy must be leader or all"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            HarvesterConfig(**{"database": database, "nats": "nats://127.0.0.1:4222", **options})
    with pytest.raises(InvalidArgumentError, match="use sqlite:///"):
        open_store("mysql://db/app")
    conf = tmp_path / "outbox.toml"
    conf.write_text('[outbox]\ndatabase = "sqlite:///x.db"\nnats = "nats://127.0.0.1:1"\nbatch = 5\n')
    with pytest.raises(InvalidArgumentError, match=r"unknown key\(s\) batch"):
        HarvesterConfig.from_file(conf)


def test_a_stopped_leader_leaves_nothing_behind_for_the_next(deployment, client, name, tmp_path):
    client.create_stream(name, name, partitions=2)
    database = f"sqlite:///{tmp_path / 'app.db'}"
    init_outbox(database)
    store = open_store(database)
    committed = []
    store.insert(
        {"stream": name, "key": f"k{i % 5}".encode(), "value": f"v{i}".encode()} for i in range(3000)
    )
    committed = [(i + 1, f"k{i % 5}", f"v{i}") for i in range(3000)]
    config = config_for(deployment, database, batch_size=100, max_in_flight=200)
    first = Running(config, identifier="first")
    first.wait_published(300)
    first.stop()
    assert 0 < store.backlog() < 3000
    second = Running(config, identifier="second")
    try:
        wait_for_empty(config, running=second)
    finally:
        second.stop()
    store.close()
    check_exactly_once_in_order(client, name, committed)


def fail_over_after_kill_9(deployment, client, name: str, database: str, tmp_path) -> None:
    """Two `jetstream outbox run` processes on ``database``: SIGKILL the leader mid-run; the standby
    (idle until then) finishes, and every row is in the stream once, in id order per key."""
    client.create_stream(name, name, partitions=2)
    conf = tmp_path / "outbox.toml"
    conf.write_text(
        f'[outbox]\ndatabase = "{database}"\nnats = "{deployment.nats_url}"\n'
        "deadline = 0.5\nbatch_size = 100\nmax_in_flight = 200\nreport_every = 0.2\n"
    )
    store = open_store(database)
    store.insert(
        {"stream": name, "key": f"k{i % 7}".encode(), "value": f"v{i}".encode()} for i in range(4000)
    )
    committed = [(i + 1, f"k{i % 7}", f"v{i}") for i in range(4000)]
    command = [sys.executable, "-m", "pyspark_jetstream.cli", "outbox", "run", "--config", str(conf)]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    with logs[0].open("w") as out:
        leader = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def leads() -> bool:
        assert leader.poll() is None, logs[0].read_text()
        return "leads" in logs[0].read_text()

    wait_until(leads, 60, message="the first harvester to lead")
    with logs[1].open("w") as out:
        standby = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: store.backlog() <= 3000, 60, 0.005, "the leader to be mid-run")  # then kill it
        assert "leads" not in logs[1].read_text()  # one leader at a time
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait(30)
        assert store.backlog() > 0
        wait_for_empty(HarvesterConfig(database=database, nats=deployment.nats_url), timeout=90)
        assert "leads" in logs[1].read_text()
    finally:
        for process in (leader, standby):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(30)
    assert standby.returncode == 0, logs[1].read_text()[-2000:]
    store.close()
    check_exactly_once_in_order(client, name, committed)


def test_kill_9_of_the_leading_process_fails_over_exactly_once(deployment, client, name, tmp_path):
    database = f"sqlite:///{tmp_path / 'app.db'}"
    init_outbox(database)
    fail_over_after_kill_9(deployment, client, name, database, tmp_path)


def test_the_sample_config_lists_every_setting_with_its_default():
    from dataclasses import fields
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "conf" / "outbox.toml"
    config = HarvesterConfig.from_file(path)
    listed = set(__import__("tomllib").loads(path.read_text())["outbox"])
    assert listed == {f.name for f in fields(HarvesterConfig)}
    for f in fields(HarvesterConfig):
        if f.name not in ("database", "nats"):
            assert getattr(config, f.name) == f.default, f.name
