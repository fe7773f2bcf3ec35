"""The admin surface is one table (client.admin.AdminActions): every face is derived from it.

The pure tests check the derivation (every action on every face, with its signature and
docstring; the CLI's declared commands); the others run the faces against a real broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io

import pytest

from pyspark_jetstream.cli.command import build_parser
from pyspark_jetstream.client import Client, SyncClient
from pyspark_jetstream.client.admin import Admin, AdminActions, BlockingAdmin
from pyspark_jetstream.client.admin_faces import AdminAction, Argument, InCallersThread, actions_of
from pyspark_jetstream.client.cluster import ClusterConnection

FACES = (Client, SyncClient, Admin, BlockingAdmin)
ASYNC_FACES = (Client, Admin)


def test_every_action_is_declared_once_and_no_face_writes_one_of_its_own():
    actions = actions_of(AdminActions)
    assert len(actions) == 22 and len({a.name for a in actions}) == 22
    for face in FACES:
        for action in actions:
            assert action.name not in vars(face), f"{face.__name__} writes {action.name} again"
            assert getattr(face, action.name) is action


def _unused_cluster() -> ClusterConnection:
    """A connection never called (nothing listens there): the faces only bind to it."""
    return ClusterConnection("grpc://127.0.0.1:9", timeout=1.0)


class _Listener:
    def __init__(self) -> None:
        self.heard: list[tuple[str, object]] = []

    def learn(self, info, config) -> None:
        self.heard.append(("learn", config.name))

    def forget(self, stream: str) -> None:
        self.heard.append(("forget", stream))


def test_each_face_binds_an_action_with_its_signature_and_docstring():
    cluster = _unused_cluster()
    faces = [Admin(cluster, _Listener()), BlockingAdmin(cluster, _Listener())]
    for action in actions_of(AdminActions):
        declared = list(inspect.signature(action.call).parameters.values())[1:]  # without the cluster
        for face in faces:
            bound = getattr(face, action.name)
            assert bound is getattr(face, action.name), "bound once per face"
            assert list(inspect.signature(bound).parameters.values()) == declared
            assert bound.__name__ == action.name and bound.__doc__ == action.call.__doc__
            assert inspect.iscoroutinefunction(bound) == isinstance(face, Admin)


def test_a_class_that_is_no_face_cannot_bind_an_action():
    class Table(AdminActions):
        pass

    with pytest.raises(TypeError, match="Table is neither a blocking nor an asynchronous face"):
        _ = Table().status


def test_the_declared_commands_are_the_clis_and_parse_as_declared():
    declared = [(a.command.group, a.command.name) for a in actions_of(AdminActions) if a.command]
    assert declared == [
        ("stream", "promote"),
        ("stream", "delete"),
        ("cluster", "elect-leaders"),
        ("cursor", "get"),
        ("cursor", "set"),
    ]
    parser = build_parser()
    args = parser.parse_args(["cursor", "set", "etl", "orders", "7", "--partition", "2"])
    assert (args.consumer, args.stream, args.offset, args.partition) == ("etl", "orders", 7, 2)
    assert parser.parse_args(["cursor", "get", "etl", "orders"]).partition == 0
    for group, names in (("stream", ["promote", "delete"]), ("cursor", ["get", "set"])):
        usage = io.StringIO()
        with contextlib.redirect_stdout(usage), pytest.raises(SystemExit):
            parser.parse_args([group, "--help"])
        for name in names:
            line = next(line for line in usage.getvalue().splitlines() if line.strip().startswith(name + " "))
            assert len(line.split()) > 2, f"'{group} {name}' has no help"


def test_an_argument_fills_the_parameter_of_its_name():
    assert Argument("--replication-factor").keyword == "replication_factor"
    assert Argument("consumer").keyword == "consumer"


# ---- against a broker ---------------------------------------------------------------------


def test_the_blocking_admin_creates_and_the_publisher_hears_of_it(client: SyncClient):
    info = client.admin.create_stream("heard", "heard.in", partitions=3)
    assert len(info.partitions) == 3
    # The publisher hears on its loop; a publish submitted after the call finds it done.
    assert client.publish("heard", b"x", partition=2).partition == 2
    assert client._client._streams["heard"].partitions == 3
    assert len(client.admin.add_partitions("heard", 4).partitions) == 4
    assert client._run(_streams_of(client._client))["heard"].partitions == 4
    client.admin.delete_stream("heard")
    assert "heard" not in client._run(_streams_of(client._client))
    assert "heard" not in [s.config["name"] for s in client.admin.list_streams()]


async def _streams_of(client: Client) -> dict:
    return dict(client._streams)


def test_the_async_admin_is_the_clients_and_hands_each_call_on(broker):
    async def main():
        client = await Client.connect(nats_urls=broker.nats_url, broker=broker.flight, timeout=10)
        try:
            created = await client.admin.create_stream("async", "async.in", partitions=2)
            assert client._streams["async"].partitions == 2  # heard before the call returned
            described = await client.describe_stream("async")  # handed on to client.admin
            await client.admin.set_cursor("app", "async", 1, 0)
            cursor = await client.fetch_cursor("app", "async", 1)
            await client.delete_stream("async")
            return created, described, cursor, "async" in client._streams
        finally:
            await client.close()

    created, described, cursor, still_known = asyncio.run(main())
    assert created.config == described.config and len(described.partitions) == 2
    assert cursor == 0 and not still_known


def test_an_action_declared_in_a_table_appears_on_a_face_built_from_it(client: SyncClient):
    """What a new action costs: one function and one line of the table."""

    def _broker_ids(cluster: ClusterConnection) -> list[str]:
        """The ids of the brokers in the cluster's metadata."""
        return sorted(cluster.brokers())

    class Wider(AdminActions):
        broker_ids = AdminAction(_broker_ids)

    class WiderAdmin(Wider, InCallersThread):
        pass

    admin = WiderAdmin(client.admin.cluster, _Listener())
    expected = sorted(b["broker_id"] for b in client.metadata()["brokers"])
    assert admin.broker_ids() == expected and expected
    assert admin.broker_ids.__doc__ == "The ids of the brokers in the cluster's metadata."
    assert [a.name for a in actions_of(Wider)][-1] == "broker_ids"


def test_a_closed_sync_client_refuses_admin_calls_as_its_loop_would(broker):
    client = SyncClient(nats_urls=broker.nats_url, broker=broker.flight)
    client.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        client.admin.status()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        client.list_streams()


def test_a_publish_names_a_keyword_argument_it_does_not_take(client: SyncClient):
    client.create_stream("kw", "kw.in")
    with pytest.raises(TypeError, match="publish\\(\\) got an unexpected keyword argument 'colour'"):
        client.publish("kw", b"x", colour="red")  # type: ignore[call-arg]
    with pytest.raises(
        TypeError, match="publish_batch\\(\\) got an unexpected keyword argument 'partitioner'"
    ):
        client.publish_batch("kw", [{"value": b"x"}], partitioner=None)  # type: ignore[call-arg]
    assert client.publish("kw", b"y", key=b"k", headers={"h": b"1"}).first_offset == 0
