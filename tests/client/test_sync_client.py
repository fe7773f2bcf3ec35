"""SyncClient's Flight calls run in the caller's thread, not through the client's event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import threading

import pytest

from pyspark_jetstream.client.connection import BrokerConnection

WAIT = 15.0
"""Seconds a call given to another thread may take before the test fails instead of hanging."""


def blocked_loop(client) -> threading.Event:
    """Block the client's event loop until the returned event is set."""
    gate = threading.Event()
    running = threading.Event()

    def hold() -> None:
        running.set()
        gate.wait()

    client._loop.call_soon_threadsafe(hold)
    assert running.wait(WAIT)
    return gate


def in_a_thread(call):
    """``call()``'s result, run in a thread of its own: a hung call fails the test."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(call).result(timeout=WAIT)
    finally:
        pool.shutdown(wait=False)


def test_flight_calls_need_no_event_loop(client):
    client.create_stream("direct", "direct.in", partitions=2)
    assert client.publish("direct", b"a").first_offset == 0
    gate = blocked_loop(client)
    try:

        def admin_and_reads():
            client.create_stream("other", "other.in")
            client.set_cursor("c", "direct", 0, 1)
            return (
                client.describe_stream("direct").partitions[0].high_watermark,
                [s.config["name"] for s in client.list_streams()],
                client.fetch_cursor("c", "direct", 0),
                client.fetch("direct", 0).num_rows,
                client.status() is not None,
                len(client.metadata()["brokers"]),
                client.health()["ok"],
            )

        high, names, cursor, rows, status, brokers, healthy = in_a_thread(admin_and_reads)
    finally:
        gate.set()
    assert (high, cursor, rows, status, brokers, healthy) == (1, 1, 1, True, 1, True)
    assert {"direct", "other"} <= set(names)
    # The stream created while the loop was held is handed to the publisher on its loop, in turn.
    client._run(asyncio.sleep(0))
    assert "other" in client._client._streams
    assert client.publish("other", b"b").first_offset == 0


def test_an_interrupted_flight_call_leaves_the_client_usable(client, monkeypatch):
    client.create_stream("kept", "kept.in")
    action = BrokerConnection.action
    interrupted = []

    def once(self, *args, **kwargs):
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return action(self, *args, **kwargs)

    monkeypatch.setattr(BrokerConnection, "action", once)

    def interrupted_then_more():
        with pytest.raises(KeyboardInterrupt):
            client.status()
        return client.status(), client.publish("kept", b"x").first_offset, client.describe_stream("kept")

    status, offset, info = in_a_thread(interrupted_then_more)
    assert interrupted and status is not None and offset == 0
    assert info.partitions[0].high_watermark == 1
    in_a_thread(client.close)


def test_ctrl_c_during_a_long_poll_leaves_the_client_usable(client):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGINT reaches only the main thread")
    client.create_stream("poll", "poll.in")

    def interrupt_then_publish():
        os.kill(os.getpid(), signal.SIGINT)
        client.publish("poll", b"wake")  # ends the long poll, so the pending interrupt is raised

    with pytest.raises(KeyboardInterrupt):
        helper = threading.Thread(target=interrupt_then_publish)
        helper.start()
        client.fetch("poll", 0, max_wait=60.0)
    helper.join(WAIT)
    assert client.fetch("poll", 0).num_rows == 1
    client.close()
    assert client._loop.is_closed()
