"""The harvester on a real PostgreSQL: concurrent writers, kill -9 failover, database and broker faults."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import tempfile
import threading

import psycopg
import pytest

from broker_node.nats_server import NatsServer
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.local import LocalBroker
from pyspark_jetstream.local_postgres import LocalPostgres
from pyspark_jetstream.outbox import init_outbox, open_store

from ..broker.harness import wait_until
from .conftest import Running, config_for, harvest_while_writing, wait_for_empty
from .test_harvester import check_exactly_once_in_order, fail_over_after_kill_9

_databases = itertools.count()


@pytest.fixture(scope="module")
def postgres():
    with LocalPostgres() as server:
        yield server


@pytest.fixture
def database(postgres):
    dsn = postgres.create_database(f"app{next(_databases)}")
    init_outbox(dsn)
    return dsn


def write_rows(dsn: str, stream: str, writer: int, transactions: int, committed: list, seed: int) -> None:
    """Application transactions of 1 to 3 rows, one in five rolled back (leaving gaps in the ids)."""
    rng = random.Random(seed)
    with psycopg.connect(dsn) as db:
        for t in range(transactions):
            rows = []
            rolled_back = rng.random() < 0.2
            with db.transaction():
                for i in range(rng.randint(1, 3)):
                    key, value = f"k{rng.randrange(8)}", f"w{writer}-t{t}-{i}"
                    row_id = db.execute(
                        "INSERT INTO outbox (stream, key, value) VALUES (%s, %s, %s) RETURNING id",
                        (stream, key.encode(), value.encode()),
                    ).fetchone()[0]
                    rows.append((row_id, key, value))
                if rolled_back:
                    raise psycopg.Rollback()
            if not rolled_back:
                committed.extend(rows)


def test_concurrent_writers_every_committed_row_once_in_id_order_per_key(deployment, client, name, database):
    client.create_stream(name, name, partitions=3)
    config = config_for(deployment, database, batch_size=50, max_in_flight=40)
    committed: list = []
    writers = [
        threading.Thread(target=write_rows, args=(database, name, w, 60, committed, w)) for w in range(4)
    ]
    harvest_while_writing(config, writers)
    ids = sorted(row_id for row_id, _, _ in committed)
    assert len(ids) > 200 and ids[-1] > len(ids), "rolled-back transactions leave gaps in the ids"
    check_exactly_once_in_order(client, name, committed)


def _insert(db: psycopg.Connection, key: str, value: str) -> int:
    row = db.execute(
        "INSERT INTO outbox (stream, key, value) VALUES ('s', %s, %s) RETURNING id",
        (key.encode(), value.encode()),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_no_row_is_marked_while_a_lower_id_may_still_commit(database):
    """Transactions commit out of id order: a row committed above an id still being written
    waits for it, so the rows of a key are marked (and published) in id order."""
    store = open_store(database)
    with psycopg.connect(database) as slow, psycopg.connect(database, autocommit=True) as fast:
        lower = _insert(slow, "k0", "first")  # its transaction stays open
        higher = _insert(fast, "k0", "second")
        assert higher > lower
        assert store.mark("term-1", 10) == [], "row 'second' marked while 'first' may still commit"
        slow.commit()
        assert [r.id for r in store.mark("term-1", 10)] == [lower, higher]
    store.close()


def test_rows_below_an_open_transaction_are_marked_and_a_rolled_back_one_frees_those_above(database):
    store = open_store(database)
    with psycopg.connect(database) as slow, psycopg.connect(database, autocommit=True) as fast:
        before = _insert(fast, "k0", "before")
        assert [r.id for r in store.mark("term-1", 10)] == [before]
        _insert(slow, "k0", "rolled back")
        after = _insert(fast, "k0", "after")
        assert [r.id for r in store.mark("term-2", 10)] == [before], "only the rows below the open one"
        slow.rollback()
        assert [r.id for r in store.mark("term-3", 10)] == [before, after]
    store.close()


def test_kill_9_of_the_leader_fails_over_to_the_standby_exactly_once(
    deployment, client, name, database, tmp_path
):
    fail_over_after_kill_9(deployment, client, name, database, tmp_path)


def test_the_database_going_down_mid_run_loses_nothing(deployment, client, name, tmp_path):
    """SIGKILL of PostgreSQL while the harvester runs: it steps down, waits, leads again, finishes."""
    client.create_stream(name, name, partitions=2)
    data = _shared_dir()
    with LocalPostgres(data_dir=data) as own:
        dsn = own.dsn
        init_outbox(dsn)
        store = open_store(dsn)
        store.insert(
            {"stream": name, "key": f"k{i % 5}".encode(), "value": f"v{i}".encode()} for i in range(3000)
        )
        store.close()
        committed = [(i + 1, f"k{i % 5}", f"v{i}") for i in range(3000)]
        config = config_for(deployment, dsn, batch_size=100, max_in_flight=100)
        running = Running(config)
        try:
            running.wait_published(300)
            own.kill()
            own.start()
            wait_for_empty(config, running=running, timeout=90)
        finally:
            running.stop()
        assert running.harvester.status.terms >= 2, "the lock's connection died with the server: a new term"
    shutil.rmtree(os.path.dirname(data), ignore_errors=True)
    check_exactly_once_in_order(client, name, committed)


def test_a_broker_that_stops_answering_is_retried_and_each_row_stored_once(name, database, tmp_path):
    """A broker paused (SIGSTOP) past the ack timeout: the publishes fail, the rows are reset and
    marked again, and those the broker stored meanwhile are dropped as duplicates when resent."""
    with (
        NatsServer() as nats_server,
        LocalBroker(tmp_path / "broker", nats_url=nats_server.url) as broker,
        SyncClient(nats_urls=nats_server.url, broker=broker.flight) as client,
    ):
        client.create_stream(name, name, partitions=2)
        store = open_store(database)
        store.insert(
            {"stream": name, "key": f"k{i % 5}".encode(), "value": f"v{i}".encode()} for i in range(2000)
        )
        committed = [(i + 1, f"k{i % 5}", f"v{i}") for i in range(2000)]
        config = config_for(broker, database, batch_size=100, max_in_flight=100, ack_timeout=1.0)
        running = Running(config)
        try:
            running.wait_published(200)
            broker.pause()
            # Until the ack timeouts have failed publishes that were in flight (they are then resent).
            wait_until(lambda: running.harvester.status.failures > 0, 30, message="a publish to time out")
            broker.resume()
            wait_for_empty(config, running=running, timeout=90)
        finally:
            running.stop()
        status = running.harvester.status
        assert status.failures > 0 and status.dead_lettered == 0
        check_exactly_once_in_order(client, name, committed)
        store.close()


def _shared_dir() -> str:
    """A data directory the postgres user can enter (pytest's own are private to root)."""
    path = tempfile.mkdtemp(prefix="outbox-pg-", dir="/tmp")
    os.chmod(path, 0o755)
    return os.path.join(path, "data")
