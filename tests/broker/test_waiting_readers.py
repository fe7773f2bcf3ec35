"""Readers that wait for data hold a broker thread each: a broker-wide limit bounds them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from pyarrow import flight

from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.protocol.flight import ReadRequest, StartPosition

from .harness import BrokerProcess, wait_until

LIMIT = 4


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def follow(address: str, **options) -> flight.FlightStreamReader:
    request = ReadRequest("w", 0, StartPosition("earliest"), follow=60.0, **options)
    reader = flight.connect(address).do_get(flight.Ticket(request.to_ticket()))
    reader.read_chunk()  # the stored message: the read is open and now waits for more
    return reader


@pytest.fixture
def limited(tmp_path):
    # The extra configuration continues the [flight] table.
    broker = BrokerProcess(tmp_path / "b", extra_config=f"max_waiting_readers = {LIMIT}\n").start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        client.create_stream("w", "w")
        client.publish("w", b"stored")
    yield broker
    broker.stop()


def test_waiting_readers_are_limited_for_everyone_without_an_acl(limited):
    open_reads = [follow(limited.flight) for _ in range(LIMIT)]
    held = threads(limited.process.pid)

    def attempt(_: int) -> str:
        try:
            follow(limited.flight)
        except flight.FlightError as exc:
            return str(exc)
        return "accepted"

    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(attempt, range(100)))
    assert all("limit_exceeded" in a and "([flight] max_waiting_readers) is 4" in a for a in answers), {
        a[:200] for a in answers
    }
    assert "Client.tail" in answers[0]  # the way that holds no thread
    # 100 refused readers left no thread each behind them (before: one thread per reader).
    assert threads(limited.process.pid) < held + 40

    waiting = ReadRequest("w", 0, StartPosition("latest"), max_wait=5.0)  # a long poll waits too
    with pytest.raises(flight.FlightError, match="max_waiting_readers"):
        flight.connect(limited.flight).do_get(flight.Ticket(waiting.to_ticket())).read_all()
    now = ReadRequest("w", 0, StartPosition("earliest"))  # a read that does not wait is served
    assert flight.connect(limited.flight).do_get(flight.Ticket(now.to_ticket())).read_all().num_rows == 1

    open_reads.pop().cancel()  # a reader that leaves frees its place
    wait_until(lambda: attempt(0) == "accepted", message="a place for a new follow read")


def test_a_long_poll_gives_its_place_back_when_its_wait_ends(limited):
    ticket = flight.Ticket(ReadRequest("w", 0, StartPosition("latest"), max_wait=0.2).to_ticket())
    for _ in range(3 * LIMIT):  # each waits out its 0.2 s and leaves
        assert flight.connect(limited.flight).do_get(ticket).read_all().num_rows == 0
    open_reads = [follow(limited.flight) for _ in range(LIMIT)]
    assert len(open_reads) == LIMIT
