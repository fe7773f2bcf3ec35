"""The client library reports connection failures as one error, without stray tracebacks."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import pytest

from pyspark_jetstream.client import Client
from pyspark_jetstream.client.cluster import ClusterConnection
from pyspark_jetstream.protocol.errors import InvalidArgumentError, RequestTimeoutError, UnavailableError


@pytest.fixture
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_failed_connect_says_its_cause_once_and_logs_attempts_only_at_debug(caplog, free_port):
    """The raised error names the cause; nats-py's attempts are one DEBUG line each, never a
    WARNING or a traceback on the user's stderr (issue 23, item 8)."""
    caplog.set_level(logging.DEBUG)

    async def connect() -> None:
        await Client.connect(nats_urls=f"nats://127.0.0.1:{free_port}", timeout=1)

    with pytest.raises(UnavailableError) as failed:
        asyncio.run(connect())
    assert str(failed.value).startswith(f"cannot connect to NATS at nats://127.0.0.1:{free_port}: ")
    assert "Connect call failed" in str(failed.value)
    attempts = [r for r in caplog.records if r.name == "pyspark_jetstream.client.nats_connection"]
    assert attempts, "each failed attempt is still logged, at DEBUG"
    assert all(r.levelno == logging.DEBUG and "Connect call failed" in r.getMessage() for r in attempts)
    assert not [r for r in caplog.records if r.exc_info], "no traceback is logged"


@pytest.mark.parametrize("address", ["nonsense", "grpc://host:notaport", "http://host:1"])
def test_a_malformed_broker_address_leaves_no_nats_connection_behind(nats_server, address):
    async def connect() -> list[asyncio.Task]:
        with pytest.raises(InvalidArgumentError, match=f"invalid broker address {address!r}: use grpc"):
            await Client.connect(nats_urls=nats_server.url, broker=address, timeout=5)
        await asyncio.sleep(0)  # let cancelled tasks finish
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]

    assert asyncio.run(connect()) == []


@pytest.mark.parametrize("listening", [False, True], ids=["refused", "silent"])
def test_brokers_never_reached_fail_after_the_connect_timeout_not_the_whole_timeout(free_port, listening):
    """Nothing listens (a broker that is down), or something listens and never answers (a
    blackholed network): either way the lookup gives up after ``connect_timeout`` (1 s here), not
    after the connection's ``timeout`` (30 s), which is for brokers lost after a first answer."""
    with socket.socket() as silent:
        if listening:
            silent.bind(("127.0.0.1", free_port))
            silent.listen(8)  # connections complete, nothing ever answers
        connection = ClusterConnection(f"grpc://127.0.0.1:{free_port}", timeout=30, connect_timeout=1)
        started = time.monotonic()
        with pytest.raises((UnavailableError, RequestTimeoutError), match=f"127.0.0.1:{free_port}"):
            connection.describe("orders")
        took = time.monotonic() - started
        connection.close()
    assert took < 10, f"gave up after {took:.1f}s"  # 30 s before the connect timeout; ~1-2 s now


def test_the_connect_timeout_defaults_to_the_whole_timeout_and_never_exceeds_it():
    assert ClusterConnection("grpc://127.0.0.1:1", timeout=7).connect_timeout == 7
    assert ClusterConnection("grpc://127.0.0.1:1", timeout=7, connect_timeout=3).connect_timeout == 3
    assert ClusterConnection("grpc://127.0.0.1:1", timeout=2, connect_timeout=3).connect_timeout == 2
