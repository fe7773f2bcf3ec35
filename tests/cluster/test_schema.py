"""A typed stream's schema on three real brokers: each version, asked of any broker, goes through the
controller into ZooKeeper and reaches every broker; the typed columns the leader parses reach every
replica byte for byte, with the schema version each batch was parsed under."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from broker_node.log import typed_of
from pyspark_jetstream.client import AckPolicy
from pyspark_jetstream.client.connection import BrokerConnection
from pyspark_jetstream.protocol.errors import InvalidArgumentError, JetStreamError
from pyspark_jetstream.protocol.flight import ActionType, StreamInfo
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import SchemaDocument

from ..broker.harness import wait_until
from .helpers import caught_up, leader_of, publish_all, status, stored_frames

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)


def schema_version(address: str, stream: str) -> int:
    """The current schema version of ``stream`` as the broker at ``address`` knows it."""
    connection = BrokerConnection(address)
    try:
        info = StreamInfo.from_json(connection.action(ActionType.DESCRIBE_STREAM, {"name": stream}))
    finally:
        connection.close()
    schema = StreamConfig.from_json(info.config).schema
    return schema.version if schema is not None else 0


def test_schema_versions_asked_of_any_broker_reach_every_broker(cluster, client):
    schema = pa.schema([pa.field("order_id", pa.int32(), nullable=False)])
    client.create_stream("typed", "typed", partitions=2, replication_factor=2, schema=schema)
    for number, address in enumerate(cluster.flights):
        schema = schema.append(pa.field(f"extra_{number}", pa.string()))
        connection = BrokerConnection(address)
        try:
            body = {"name": "typed", "schema": SchemaDocument(schema).to_json()}
            answer = StreamInfo.from_json(connection.action(ActionType.UPDATE_SCHEMA, body))
            # The broker asked answers with what the controller stored, whichever broker that is.
            assert StreamConfig.from_json(answer.config).schema.version == number + 2  # type: ignore[union-attr]
            narrowed = {
                "name": "typed",
                "schema": SchemaDocument(pa.schema([("order_id", pa.int64())])).to_json(),
            }
            with pytest.raises(
                InvalidArgumentError, match="^incompatible schema change to version .: field 'extra_0'"
            ):
                connection.action(ActionType.UPDATE_SCHEMA, narrowed)
        finally:
            connection.close()
    for address in cluster.flights:
        wait_until(
            lambda address=address: schema_version(address, "typed") == 4, message=f"version 4 on {address}"
        )
    stored = StreamConfig.from_json(client.describe_stream("typed").config).schema
    assert stored is not None and [len(v) for v in stored.versions] == [1, 2, 3, 4]


def test_every_replica_holds_the_leaders_typed_columns_and_schema_versions(cluster, client):
    schema = pa.schema([pa.field("order_id", pa.int32(), nullable=False)])
    client.create_stream("typed", "typed", replication_factor=3, schema=schema)
    for i in range(20):
        client.publish("typed", b'{"order_id": %d}' % i, ack_policy=AckPolicy.ALL)
    # The next version, asked of the partition's leader: its open partition parses with it at once.
    leader = client.describe_stream("typed").partitions[0].leader
    address = next(b.flight for b in cluster.brokers if b.broker_id == leader)
    connection = BrokerConnection(address)
    try:
        evolved = schema.append(pa.field("coupon", pa.string()))
        body = {"name": "typed", "schema": SchemaDocument(evolved).to_json()}
        connection.action(ActionType.UPDATE_SCHEMA, body)
    finally:
        connection.close()
    rows = pa.table({"value": [b'{"order_id": %d, "coupon": "c"}' % i for i in range(20, 40)]})
    client.publish_batch("typed", rows, ack_policy=AckPolicy.ALL)
    wait_until(lambda: caught_up(cluster, "typed"), message="every replica caught up")
    cluster.stop()
    frames = [stored_frames(b, "typed") for b in cluster.brokers]
    assert len(frames[0]) == 21 and frames[0] == frames[1] == frames[2]
    typed = [typed_of(pa.py_buffer(f)) for f in frames[0]]
    assert [t.version for t in typed] == [1] * 20 + [2]  # type: ignore[union-attr]
    assert typed[-1].batch.column("coupon").to_pylist() == ["c"] * 20  # type: ignore[union-attr]


def _update_schema(client, stream: str, schema: pa.Schema, deadline: float = 60) -> None:
    """``update_schema``, asked again while the cluster fails over (the same version again is no
    change, so a retry after a lost answer is harmless)."""
    stop = time.monotonic() + deadline
    while True:
        try:
            client.update_schema(stream, schema)
            return
        except JetStreamError as exc:
            if not exc.retriable or time.monotonic() > stop:
                raise


def test_schema_changes_through_kill_9_of_the_leader_and_the_controller_leave_every_replica_alike(
    cluster, client
):
    schema = pa.schema([pa.field("order_id", pa.int32(), nullable=False)])
    client.create_stream("tk", "tk", replication_factor=3, min_insync_replicas=2, schema=schema)
    values = [b'{"order_id": %d}' % n for n in range(400)]  # valid under every version below
    acks: list = []
    failure: list[BaseException] = []

    def publish() -> None:
        try:
            acks.extend(publish_all(client, "tk", values, "p", deadline=120))
        except BaseException as exc:
            failure.append(exc)

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        wait_until(lambda: len(acks) >= 50 or failure, message="the first acks")
        leader = leader_of(client, "tk")
        cluster.broker(leader).kill()  # SIGKILL, while the next version is asked for
        schema = schema.append(pa.field("coupon", pa.string()))
        _update_schema(client, "tk", schema)
        cluster.broker(leader).start()
        wait_until(lambda: len(acks) >= 200 or failure, timeout=60, message="acks after the first kill")
        controller = status(cluster.flight)["controller"]
        cluster.broker(controller).kill()
        schema = schema.append(pa.field("note", pa.string()))
        _update_schema(client, "tk", schema)
        cluster.broker(controller).start()
    finally:
        publisher.join(timeout=180)
    assert not failure, failure
    assert len(acks) == len(values) and all(a.ok for a in acks)
    wait_until(lambda: caught_up(cluster, "tk"), timeout=60, message="every replica caught up")
    cluster.stop()
    frames = [stored_frames(b, "tk") for b in cluster.brokers]
    assert frames[0] == frames[1] == frames[2]
    typed = [typed_of(pa.py_buffer(f)) for f in frames[0]]
    versions = [t.version for t in typed]  # type: ignore[union-attr]
    assert versions == sorted(versions) and versions[0] == 1
    orders = [n for t in typed for n in t.batch.column("order_id").to_pylist()]  # type: ignore[union-attr]
    assert orders == list(range(len(values)))  # each once, in order, typed under its version


def test_typed_batches_replicate_as_stored_and_survive_a_leader_change(cluster, client):
    """Rows sent as typed columns (no JSON parsed anywhere) reach every replica byte for byte, and a
    new leader goes on storing them after the old one is killed."""
    schema = pa.schema([pa.field("order_id", pa.int32(), nullable=False), pa.field("note", pa.string())])
    client.create_stream("tb", "tb", replication_factor=3, min_insync_replicas=2, schema=schema)

    def send(first: int, sequence: int) -> None:
        rows = pa.table({"order_id": pa.array(range(first, first + 10), pa.int64()), "note": ["n"] * 10})
        ack = client.publish_batch("tb", rows, ack_policy=AckPolicy.ALL, producer_id="p", sequence=sequence)
        assert (ack.first_offset, ack.last_offset) == (first, first + 9)

    send(0, 0)
    leader = leader_of(client, "tb")
    cluster.broker(leader).kill()
    wait_until(lambda: leader_of(client, "tb") != leader, timeout=60, message="a new leader")
    send(10, 1)
    cluster.broker(leader).start()
    wait_until(lambda: caught_up(cluster, "tb"), timeout=60, message="every replica caught up")
    cluster.stop()
    frames = [stored_frames(b, "tb") for b in cluster.brokers]
    assert len(frames[0]) == 2 and frames[0] == frames[1] == frames[2]
    typed = [typed_of(pa.py_buffer(f)) for f in frames[0]]
    assert [t.version for t in typed] == [1, 1]  # type: ignore[union-attr]
    orders = [n for t in typed for n in t.batch.column("order_id").to_pylist()]  # type: ignore[union-attr]
    assert orders == list(range(20))
