"""The attacks of a hostile client on the same network, each against a secured broker: each fails.

The broker serves Flight over TLS and the embedded nats-server over TLS, with
the ACL of ``conftest.acl_text``: alice owns ``orders*``, bob may read
``orders``, mallory holds a valid token and no grant.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats
import pytest
from nats.errors import Error as NatsError

from pyspark_jetstream.client import ClusterConnection, Credentials, SyncClient
from pyspark_jetstream.client.nats_connection import drop_transport
from pyspark_jetstream.protocol.errors import (
    LimitExceededError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
)
from pyspark_jetstream.protocol.flight import ActionType, ReadRequest

from ..broker.harness import wait_until
from .conftest import TOKENS, Secured, acl_text


@pytest.fixture(scope="module")
def orders(secured: Secured):
    """Stream ``orders`` with a message, created by alice."""
    with secured.client("alice") as alice:
        alice.create_stream("orders", "orders")
        alice.publish("orders", b"first", key=b"k")
    return "orders"


def flight(secured: Secured, credentials: Credentials | None) -> ClusterConnection:
    return ClusterConnection(secured.broker.flight, timeout=5, credentials=credentials)


def read(connection: ClusterConnection, stream: str) -> list[bytes]:
    """Every value of partition 0 of ``stream``, read through ``connection``."""
    return connection.read(ReadRequest(stream, 0)).to_table().column("value").to_pylist()


# ---- Flight: who may do what -----------------------------------------------------------------


def test_no_credentials_are_refused(secured: Secured, orders: str) -> None:
    connection = flight(secured, Credentials(tls_ca=secured.pki.ca))
    with pytest.raises(UnauthenticatedError, match="needs credentials"):
        read(connection, orders)
    with pytest.raises(UnauthenticatedError):
        connection.action(ActionType.LIST_STREAMS, {})


def test_a_wrong_token_is_refused(secured: Secured, orders: str) -> None:
    connection = flight(secured, Credentials(user="alice", token="guessed", tls_ca=secured.pki.ca))
    with pytest.raises(UnauthenticatedError, match="wrong user or token") as caught:
        read(connection, orders)
    assert "guessed" not in str(caught.value)


def test_reading_without_permission_is_denied(secured: Secured, orders: str) -> None:
    connection = flight(secured, secured.credentials("mallory"))
    with pytest.raises(PermissionDeniedError) as caught:
        read(connection, orders)
    assert str(caught.value) == "principal 'mallory' may not read stream 'orders'"
    # The stream is not even listed to mallory; bob, who may read it, sees it and its message.
    listed = connection.action(ActionType.LIST_STREAMS, {})
    assert [s["config"]["name"] for s in listed] == []
    bob = flight(secured, secured.credentials("bob"))
    assert read(bob, orders)


def test_deleting_and_creating_need_admin(secured: Secured, orders: str) -> None:
    for user in ("mallory", "bob"):
        connection = flight(secured, secured.credentials(user))
        with pytest.raises(PermissionDeniedError, match=f"'{user}' may not admin stream 'orders'"):
            connection.action(ActionType.DELETE_STREAM, {"name": orders})
        with pytest.raises(PermissionDeniedError, match=f"'{user}' may not admin stream 'orders2'"):
            connection.action(ActionType.CREATE_STREAM, {"name": "orders2", "subject": "orders2"})
    with secured.client("alice") as alice:
        assert alice.describe_stream(orders).config["name"] == orders


def test_another_consumers_cursor_cannot_be_overwritten(secured: Secured, orders: str) -> None:
    with secured.client("alice") as alice:
        alice.set_cursor("alice-app", orders, 0, 1)
    bob = flight(secured, secured.credentials("bob"))
    body = {"consumer": "alice-app", "stream": orders, "partition": 0}
    with pytest.raises(PermissionDeniedError, match="'bob' may not cursor consumer 'alice-app'"):
        bob.action(ActionType.SET_CURSOR, {**body, "offset": 0})
    with pytest.raises(PermissionDeniedError):
        bob.action(ActionType.DELETE_CURSOR, body)
    with pytest.raises(PermissionDeniedError):
        bob.action(ActionType.FETCH_CURSOR, body)
    bob.action(ActionType.SET_CURSOR, {**body, "consumer": "bob-app", "offset": 1})  # its own: allowed
    with secured.client("alice") as alice:
        assert alice.fetch_cursor("alice-app", orders, 0) == 1


def test_replication_and_controller_calls_are_for_brokers_only(secured: Secured, orders: str) -> None:
    alice = flight(secured, secured.credentials("alice"))
    with pytest.raises(PermissionDeniedError, match="only brokers may"):
        alice.action(ActionType.CONTROLLER_CALL, {"action": "create_stream", "body": {}})
    with pytest.raises(PermissionDeniedError, match="only brokers may"):
        alice.action(ActionType.OFFSETS_FOR_LEADER_EPOCH, {"stream": orders, "partition": 0, "epoch": 0})
    with pytest.raises(PermissionDeniedError, match="'alice' may not admin stream '\\*'"):
        alice.action(ActionType.STATUS, {})


def test_denials_are_logged_with_no_credential(secured: Secured, orders: str) -> None:
    with pytest.raises(PermissionDeniedError):
        read(flight(secured, secured.credentials("mallory")), orders)
    log = secured.broker.log_path.read_text()
    assert "denied: principal 'mallory' may not read stream 'orders'" in log
    for token in TOKENS.values():
        assert token not in log


def test_follow_readers_are_limited_per_principal(secured: Secured, orders: str) -> None:
    async def main() -> None:
        from pyspark_jetstream.client import Client

        async with await Client.connect(
            nats_urls=secured.broker.nats_url,
            broker=secured.broker.flight,
            credentials=secured.credentials("bob"),
        ) as bob:
            tails = [bob.tail(orders, 0, start="earliest", live=False) for _ in range(3)]
            first = [await anext(aiter(t)) for t in tails[:2]]  # bob's limit is 2 follow reads
            assert all(batch.column("value")[0].as_py() == b"first" for batch in first)
            with pytest.raises(LimitExceededError, match="'bob' has 2 follow reads open"):
                await anext(aiter(tails[2]))
            for tail in tails:
                await tail.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_the_stream_cap_stops_creation(secured: Secured, orders: str) -> None:
    with secured.client("alice") as alice:
        made = []
        with pytest.raises(LimitExceededError, match="its limit \\(\\[security\\] max_streams\\) is 6"):
            for n in range(10):
                alice.create_stream(f"orders-cap-{n}", f"orders.cap.{n}")
                made.append(n)
        assert 0 < len(made) < 10
        for n in made:
            alice.delete_stream(f"orders-cap-{n}")


# ---- NATS: acks, inboxes, discovery ---------------------------------------------------------


async def _nats(secured: Secured, user: str | None, errors: list[str]) -> nats.NATS:
    async def collect(error: Exception) -> None:
        errors.append(str(error).removeprefix("nats: "))  # nats-py gives them in lower case

    return await nats.connect(
        secured.broker.nats_url,
        error_cb=collect,
        max_reconnect_attempts=0,
        **secured.credentials(user).nats_arguments(),
    )


async def _violations_within(errors: list[str], count: int, seconds: float = 5.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while len(errors) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return errors


def test_acks_cannot_be_sniffed_or_forged(secured: Secured, orders: str) -> None:
    async def main() -> None:
        errors: list[str] = []
        mallory = await _nats(secured, "mallory", errors)
        sniffed: list[bytes] = []

        async def sniff(msg: nats.aio.msg.Msg) -> None:
            sniffed.append(msg.data)

        await mallory.subscribe("_INBOX.>", cb=sniff)
        await mallory.subscribe("_INBOX_alice.>", cb=sniff)
        await mallory.subscribe(">", cb=sniff)
        await mallory.publish("_INBOX_alice.forged", b'{"offset": 999}')  # a forged ack
        await mallory.flush()
        await _violations_within(errors, 4)
        assert sum('permissions violation for subscription to "' in e for e in errors) == 3, errors
        assert sum('permissions violation for publish to "_inbox_alice.forged"' in e for e in errors) == 1
        with secured.client("alice") as alice:  # acks still reach alice, and only alice
            acks = [alice.publish(orders, f"m{i}".encode()) for i in range(20)]
        assert all(a.error.value == "ok" for a in acks)
        assert len({a.first_offset for a in acks}) == 20
        assert sniffed == []
        await mallory.close()

    asyncio.run(main())


def test_discovery_cannot_be_answered_by_a_client(secured: Secured, orders: str) -> None:
    async def main() -> None:
        errors: list[str] = []
        mallory = await _nats(secured, "mallory", errors)

        async def answer(msg: nats.aio.msg.Msg) -> None:
            await msg.respond(b'{"flight": "grpc+tls://evil.example:1"}')

        await mallory.subscribe("_PJS.discover", cb=answer)
        await mallory.flush()
        await _violations_within(errors, 1)
        assert 'permissions violation for subscription to "_pjs.discover"' in errors, errors
        await mallory.close()

    asyncio.run(main())
    for _ in range(10):
        with SyncClient(nats_urls=secured.broker.nats_url, credentials=secured.credentials("bob")) as bob:
            assert bob.broker == secured.broker.flight


def test_publishing_needs_write_permission(secured: Secured, orders: str) -> None:
    async def main() -> None:
        errors: list[str] = []
        bob = await _nats(secured, "bob", errors)  # bob may read orders, not write it
        await bob.publish(orders, b"not bob's to write")
        await bob.flush()
        await _violations_within(errors, 1)
        assert f'permissions violation for publish to "{orders}"' in errors, errors
        await bob.close()

    asyncio.run(main())
    with secured.client("alice") as alice:
        values = alice.fetch(orders, 0).to_table().column("value").to_pylist()
    assert b"not bob's to write" not in values


def test_a_publish_without_any_grant_is_refused_as_a_write(secured: Secured, orders: str) -> None:
    with secured.client("mallory") as mallory, pytest.raises(PermissionDeniedError) as caught:
        mallory.publish(orders, b"not mallory's to write")  # no grant on orders at all
    assert (
        str(caught.value)
        == f"principal 'mallory' may not write stream '{orders}' (nor read or administer it)"
    )
    refused = f"principal 'bob' may not write stream '{orders}'"
    with secured.client("bob") as bob, pytest.raises(PermissionDeniedError, match=refused):
        bob.publish(orders, b"not bob's to write")  # bob may read orders: NATS refuses it


def _nats_refuses(url: str, **arguments: Any) -> None:
    """Connecting to NATS at ``url`` with ``arguments`` fails (refused, dropped or timed out)."""

    async def main() -> None:
        client = nats.NATS()
        try:
            with pytest.raises((NatsError, OSError, TimeoutError)):
                await asyncio.wait_for(
                    client.connect(url, allow_reconnect=False, connect_timeout=3, **arguments), 10
                )
        finally:
            # nats-py leaves the socket of a connect that failed open; closed here, while the loop
            # runs, it is not found by the garbage collector during some later test.
            await drop_transport(client)

    asyncio.run(main())


def test_nats_needs_credentials(secured: Secured) -> None:
    _nats_refuses(secured.broker.nats_url, tls=Credentials(tls_ca=secured.pki.ca).nats_arguments()["tls"])


# ---- TLS -----------------------------------------------------------------------------------


def test_plain_connections_to_tls_listeners_fail(secured: Secured) -> None:
    plain = secured.broker.flight.replace("grpc+tls://", "grpc://")
    with pytest.raises(UnavailableError):
        ClusterConnection(plain, timeout=3).action(ActionType.METADATA, {})
    _nats_refuses(secured.broker.nats_url, user="alice", password=TOKENS["alice"])


def test_a_server_certificate_from_another_ca_is_refused(secured: Secured, tmp_path) -> None:
    from .pki import Pki

    other = Pki(tmp_path / "other", "other-ca")
    connection = flight(secured, Credentials(user="alice", token=TOKENS["alice"], tls_ca=other.ca))
    with pytest.raises(UnavailableError):
        connection.action(ActionType.METADATA, {})
    with pytest.raises(UnavailableError):
        SyncClient(
            nats_urls=secured.broker.nats_url,
            credentials=Credentials(user="alice", token=TOKENS["alice"], tls_ca=other.ca),
            timeout=1,
        )


def test_the_acl_reloads_without_a_restart(secured: Secured, orders: str) -> None:
    mallory = flight(secured, secured.credentials("mallory"))
    with pytest.raises(PermissionDeniedError):
        read(mallory, orders)
    secured.acl_file.write_text(
        acl_text('\n[[grants]]\nprincipal = "mallory"\nstreams = ["orders"]\nactions = ["read"]\n')
    )

    def reads() -> bool:
        try:
            return bool(read(mallory, orders))
        except PermissionDeniedError:
            return False

    try:
        wait_until(reads, 10, 0.1, "the new grant to be applied")
        secured.acl_file.write_text("this is [not valid TOML")  # a broken edit keeps the last good ACL

        def kept() -> bool:  # the file is checked at a request, at most once a second
            assert read(mallory, orders)
            return "keeping the ACL in force" in secured.broker.log_path.read_text()

        wait_until(kept, 10, 0.1, "the broken ACL file to be seen")
    finally:
        secured.acl_file.write_text(acl_text())
        wait_until(lambda: not reads(), 10, 0.1, "the grant to be taken back")
