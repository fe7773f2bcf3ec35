"""The harvester's marks: each taken as soon as the one before it is done, above its rows, with the
rows below salvaged; and a mark whose answer is lost marked again."""

from __future__ import annotations

import asyncio
import threading

from pyspark_jetstream.outbox import HarvesterConfig, init_outbox, open_store
from pyspark_jetstream.outbox import marks as marks_module
from pyspark_jetstream.outbox.marks import Marks
from pyspark_jetstream.outbox.outbox_table import SQLiteStore, UnavailableDatabaseError
from pyspark_jetstream.outbox.store_thread import StoreThread

from .conftest import Running, config_for, read_all, wait_for_empty
from .test_postgres import database, postgres  # noqa: F401 - the fixtures


def rows(address: str, count: int) -> None:
    store = open_store(address)
    try:
        store.insert({"stream": "s", "key": b"k%d" % i, "value": b"v%d" % i} for i in range(count))
    finally:
        store.close()


def mark_by_another(address: str, row_id: int) -> None:
    """What another harvester's mark leaves on a row: its own leader id."""
    store = open_store(address)
    try:
        store._db.execute("UPDATE outbox SET leader_id = 'another' WHERE id = " + str(row_id))
    finally:
        store.close()


def sqlite_database(tmp_path) -> str:
    address = f"sqlite:///{tmp_path / 'app.db'}"
    init_outbox(address)
    return address


def marks_above(address: str) -> None:
    rows(address, 6)
    store = open_store(address)
    try:
        assert [r.id for r in store.mark("a", 10, 3)] == [4, 5, 6]
        assert [r.id for r in store.mark("a", 10, 0)] == [1, 2, 3]
        assert store.mark("a", 10, 6) == []
    finally:
        store.close()


def test_a_sqlite_mark_takes_only_the_rows_above_the_given_id(tmp_path):
    marks_above(sqlite_database(tmp_path))


def test_a_postgres_mark_takes_only_the_rows_above_the_given_id(database):  # noqa: F811
    marks_above(database)


def test_marks_go_on_above_the_last_full_one_and_rows_left_below_are_salvaged(tmp_path, monkeypatch):
    address = sqlite_database(tmp_path)
    rows(address, 30)
    config = HarvesterConfig(database=address, nats="nats://unused:4222")

    async def scenario() -> list[list[int]]:
        connection = StoreThread(config, "mark")
        marks = Marks(connection, 10)
        try:
            seen = [[r.id for r in await marks.next("a")]]  # 1-10
            mark_by_another(address, 5)  # below the bound from now on
            for _ in range(4):  # 11-20, 21-30, none above 30, then from the first row: 5
                seen.append([r.id for r in await marks.next("a")])
            mark_by_another(address, 5)
            seen.append([r.id for r in await marks.next("b")])  # a new leader id: from the first row
            return seen
        finally:
            await marks.drop()
            await connection.close()

    seen = asyncio.run(scenario())
    assert seen == [list(range(1, 11)), list(range(11, 21)), list(range(21, 31)), [], [5], list(range(1, 11))]


def test_every_rescan_every_marks_one_starts_from_the_first_row(tmp_path, monkeypatch):
    address = sqlite_database(tmp_path)
    rows(address, 50)
    monkeypatch.setattr(marks_module, "RESCAN_EVERY", 2)
    afters: list[int] = []
    original = SQLiteStore.mark

    def noted(self, leader_id: str, limit: int, after: int = 0):
        afters.append(after)
        return original(self, leader_id, limit, after)

    monkeypatch.setattr(SQLiteStore, "mark", noted)
    config = HarvesterConfig(database=address, nats="nats://unused:4222")

    async def scenario() -> list[list[int]]:
        connection = StoreThread(config, "mark")
        marks = Marks(connection, 10)
        try:
            return [[r.id for r in await marks.next("a")] for _ in range(5)]
        finally:
            await marks.drop()
            await connection.close()

    seen = asyncio.run(scenario())
    assert seen == [list(range(n, n + 10)) for n in range(1, 51, 10)]
    assert afters[:5] == [0, 10, 0, 30, 0], "the second and the fourth mark are each followed by a rescan"


def test_the_next_mark_is_taken_before_the_loop_asks_for_it(tmp_path, monkeypatch):
    """Once a full mark is handed over, the connection's thread goes on to the next without waiting
    for the event loop (which publishes the rows meanwhile without yielding)."""
    address = sqlite_database(tmp_path)
    rows(address, 30)
    calls: list[int] = []
    second = threading.Event()
    original = SQLiteStore.mark

    def counted(self, leader_id: str, limit: int, after: int = 0):
        calls.append(after)
        if len(calls) == 2:
            second.set()
        return original(self, leader_id, limit, after)

    monkeypatch.setattr(SQLiteStore, "mark", counted)
    config = HarvesterConfig(database=address, nats="nats://unused:4222")

    async def scenario() -> bool:
        connection = StoreThread(config, "mark")
        marks = Marks(connection, 10)
        try:
            await marks.next("a")
            return second.wait(10)  # blocks the loop, as publishing a mark's rows does
        finally:
            await marks.drop()
            await connection.close()

    assert asyncio.run(scenario()), "the second mark waited for the event loop"
    assert calls[:2] == [0, 10]


def test_rows_of_a_mark_whose_answer_is_lost_are_marked_again(deployment, client, tmp_path, monkeypatch):
    """The mark's UPDATE committed but the connection failed before its rows came back: they are
    marked by the leader id, so only a new one marks them again."""
    client.create_stream("lost-mark", "lost-mark")
    address = sqlite_database(tmp_path)
    store = open_store(address)
    store.insert({"stream": "lost-mark", "key": b"k", "value": b"v%d" % i} for i in range(20))
    store.close()
    original = SQLiteStore.mark
    lost: list[list[int]] = []

    def answer_lost(self, leader_id: str, limit: int, after: int = 0):
        records = original(self, leader_id, limit, after)
        if records and not lost:
            lost.append([r.id for r in records])
            raise UnavailableDatabaseError("the connection was lost after the mark committed")
        return records

    monkeypatch.setattr(SQLiteStore, "mark", answer_lost)
    config = config_for(deployment, address, batch_size=5)
    running = Running(config)
    try:
        wait_for_empty(config, timeout=20, running=running)
    finally:
        running.stop()
    assert lost == [[1, 2, 3, 4, 5]]
    stored = [bytes(r["value"]) for r in read_all(client, "lost-mark")]
    assert stored == [b"v%d" % i for i in range(20)], "every row once, in id order"


def test_marks_queued_under_an_older_leader_id_are_dropped_and_its_rows_marked_again(tmp_path, monkeypatch):
    """Two marks queued under leader id a; the loop asks for b: a's marks are skipped if they have
    not started, awaited if they have, and b's mark takes every row from the first, a's too."""
    address = sqlite_database(tmp_path)
    rows(address, 30)
    started, gate = threading.Event(), threading.Event()
    original = SQLiteStore.mark
    leaders: list[str] = []

    def gated(self, leader_id: str, limit: int, after: int = 0):
        if len(leaders) == 1:
            started.set()
            gate.wait(10)  # a's second mark holds the thread: the third, queued, has not started
        leaders.append(leader_id)
        return original(self, leader_id, limit, after)

    monkeypatch.setattr(SQLiteStore, "mark", gated)
    config = HarvesterConfig(database=address, nats="nats://unused:4222")

    async def scenario() -> tuple[list[int], list[int]]:
        connection = StoreThread(config, "mark")
        marks = Marks(connection, 10)
        try:
            first = [r.id for r in await marks.next("a")]  # 1-10; the next two queued
            assert started.wait(10), "a's second mark did not start"
            asyncio.get_running_loop().call_later(0.2, gate.set)
            again = [r.id for r in await marks.next("b")]
            return first, again
        finally:
            await marks.drop()
            await connection.close()

    first, again = asyncio.run(scenario())
    assert first == list(range(1, 11))
    assert again == list(range(1, 11)), "b marks from the first row, a's rows too"
    assert leaders[:3] == ["a", "a", "b"], "a's third mark was skipped, not run"
