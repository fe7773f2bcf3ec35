"""One contract, run against every coordinator: the single-broker file and ZooKeeper."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from broker_node.coordination.base import FEATURES, BrokerInfo, Coordinator, PartitionState
from broker_node.coordination.errors import ConflictError
from broker_node.coordination.local import LocalCoordinator
from broker_node.coordination.zookeeper import ZooKeeperCoordinator
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    NotEnoughReplicasError,
    StreamExistsError,
    UnknownStreamError,
)
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import SchemaDocument, StreamSchema

from ..broker.harness import wait_until

ME = BrokerInfo("b1", "grpc://127.0.0.1:1", ("nats://127.0.0.1:2",))


@pytest.fixture(params=["local", "zookeeper"])
def make(request, tmp_path):
    """A factory of started coordinators of one kind, sharing their metadata store."""
    made: list[Coordinator] = []

    def factory(broker: BrokerInfo = ME) -> Coordinator:
        if request.param == "local":
            coordinator: Coordinator = LocalCoordinator(tmp_path / "data")
        else:
            coordinator = ZooKeeperCoordinator(request.getfixturevalue("zk_settings"))
        coordinator.start(broker)
        made.append(coordinator)
        wait_until(lambda: coordinator.controller() == broker.broker_id, message="a controller")
        return coordinator

    factory.kind = request.param
    yield factory
    for coordinator in reversed(made):
        coordinator.close()


def test_a_started_coordinator_knows_itself(make):
    coordinator = make()
    assert coordinator.brokers() == [ME]
    assert coordinator.controller() == "b1"
    assert coordinator.list_streams() == []
    assert coordinator.describe()


def test_streams_are_created_once_and_listed(make):
    coordinator = make()
    config = StreamConfig(name="orders", subject="orders", partitions=3)
    created = coordinator.create_stream(config)
    assert created.config == config and len(created.partitions) == 3
    assert all(p.leader == "b1" and p.replicas == ("b1",) and p.isr == ("b1",) for p in created.partitions)
    assert coordinator.create_stream(config) == created  # idempotent
    wait_until(lambda: coordinator.list_streams() == [created], message="the stream to be listed")
    assert coordinator.get_stream("orders") == created
    with pytest.raises(StreamExistsError, match=r"partitions: 5 != 3"):
        coordinator.create_stream(StreamConfig(name="orders", subject="orders", partitions=5))
    with pytest.raises(UnknownStreamError, match="no stream named 'nope'"):
        coordinator.get_stream("nope")


def test_a_replication_factor_above_the_live_brokers_is_refused(make):
    coordinator = make()
    with pytest.raises(NotEnoughReplicasError, match="replication factor 2 needs"):
        coordinator.create_stream(StreamConfig(name="r2", subject="r2", replication_factor=2))
    assert coordinator.list_streams() == []


def test_partition_state_changes_by_compare_and_set_only(make):
    coordinator = make()
    created = coordinator.create_stream(StreamConfig(name="cas", subject="cas"))
    state = created.partitions[0]
    changed = PartitionState(state.leader, state.replicas, state.isr, state.leader_epoch + 1)
    stored = coordinator.update_partition("cas", 0, state.version, changed)
    assert stored.version == state.version + 1 and stored.leader_epoch == state.leader_epoch + 1
    with pytest.raises(ConflictError):
        coordinator.update_partition("cas", 0, state.version, changed)  # stale
    with pytest.raises(UnknownStreamError):
        coordinator.update_partition("cas", 7, 0, changed)
    wait_until(lambda: coordinator.get_stream("cas").partitions[0] == stored, message="the new state")


def test_deleting_leaves_a_tombstone_of_that_incarnation(make):
    coordinator = make()
    first = coordinator.create_stream(StreamConfig(name="gone", subject="gone"))
    coordinator.delete_stream("gone")
    wait_until(lambda: first.stream_id in coordinator.deleted_stream_ids(), message="the tombstone")
    with pytest.raises(UnknownStreamError):
        coordinator.get_stream("gone")
    with pytest.raises(UnknownStreamError):
        coordinator.delete_stream("gone")
    second = coordinator.create_stream(StreamConfig(name="gone", subject="gone"))
    assert second.stream_id != first.stream_id
    assert second.stream_id not in coordinator.deleted_stream_ids()


def test_listeners_hear_every_kind_of_change(make):
    coordinator = make()
    heard = threading.Semaphore(0)
    coordinator.add_listener(heard.release)
    created = coordinator.create_stream(StreamConfig(name="l", subject="l"))
    assert heard.acquire(timeout=10)
    state = created.partitions[0]
    coordinator.update_partition("l", 0, state.version, state)
    assert heard.acquire(timeout=10)
    coordinator.delete_stream("l")
    assert heard.acquire(timeout=10)


def test_metadata_outlives_the_coordinator(make):
    first = make()
    created = first.create_stream(StreamConfig(name="kept", subject="kept", partitions=2))
    first.close()
    second = make()
    wait_until(lambda: second.list_streams() == [created], message="the stream after a restart")


def test_a_stream_grows_in_one_write_and_never_shrinks(make):
    coordinator = make()
    heard = threading.Semaphore(0)
    coordinator.add_listener(heard.release)
    created = coordinator.create_stream(StreamConfig(name="grow", subject="grow", partitions=2))
    assert heard.acquire(timeout=10)
    grown = coordinator.add_partitions("grow", 5)
    assert heard.acquire(timeout=10)
    assert grown.config == StreamConfig(name="grow", subject="grow", partitions=5)
    assert grown.stream_id == created.stream_id and grown.partitions[:2] == created.partitions
    assert [(p.leader, p.replicas, p.isr) for p in grown.partitions[2:]] == [("b1", ("b1",), ("b1",))] * 3
    wait_until(lambda: coordinator.get_stream("grow") == grown, message="the grown stream")
    assert coordinator.add_partitions("grow", 5) == grown  # the same count: nothing changes
    shrink = r"^stream 'grow' has 5 partitions and cannot go down to 3: partitions can only be added"
    with pytest.raises(InvalidArgumentError, match=shrink):
        coordinator.add_partitions("grow", 3)
    for bad, shown in ((0, "0"), (-2, "-2"), (1025, "1025"), ("7", "'7'"), (2.5, "2.5"), (True, "True")):
        with pytest.raises(InvalidArgumentError, match=rf"partitions must be .* up to 1024, got {shown}$"):
            coordinator.add_partitions("grow", bad)
    with pytest.raises(UnknownStreamError, match="no stream named 'nope'"):
        coordinator.add_partitions("nope", 2)
    coordinator.create_stream(StreamConfig(name="all", subject="all.>"))
    with pytest.raises(InvalidArgumentError, match="already matches every partition subject"):
        coordinator.add_partitions("all", 2)
    assert coordinator.get_stream("grow") == grown and len(coordinator.get_stream("all").partitions) == 1
    assert coordinator.create_stream(grown.config) == grown  # the grown config is the stream's config
    coordinator.close()
    again = make()
    wait_until(lambda: grown in again.list_streams(), message="the grown stream after a restart")


def test_a_deleted_dead_letter_stream_does_not_block_schema_changes_but_a_new_one_is_checked(make):
    coordinator = make(dataclasses.replace(ME, features=FEATURES))
    fields = [{"name": "n", "type": "int32"}]
    policy = {"on_invalid": "dead-letter", "dead_letter": "bad"}
    coordinator.create_stream(StreamConfig(name="bad", subject="bad"))
    document = SchemaDocument.from_json({"fields": fields, **policy})
    coordinator.create_stream(
        StreamConfig(name="typed", subject="typed", schema=StreamSchema.first(document))
    )
    coordinator.delete_stream("bad")
    wait_until(lambda: "bad" not in [s.config.name for s in coordinator.list_streams()], message="bad gone")
    # Its invalid messages are refused at ingest now; its schema still takes a new field.
    grown = [*fields, {"name": "c", "type": "string"}]
    updated = coordinator.update_schema("typed", SchemaDocument.from_json({"fields": grown}))
    assert updated.config.schema is not None and updated.config.schema.version == 2
    assert updated.config.schema.dead_letter == "bad"
    # Naming another dead-letter stream is checked as at creation.
    with pytest.raises(InvalidArgumentError, match="its dead-letter stream 'worse' does not exist"):
        coordinator.update_schema(
            "typed",
            SchemaDocument.from_json({"fields": grown, "on_invalid": "dead-letter", "dead_letter": "worse"}),
        )


def test_a_typed_stream_keeps_every_schema_version_and_refuses_incompatible_ones(make):
    coordinator = make(dataclasses.replace(ME, features=FEATURES))
    heard = threading.Semaphore(0)
    coordinator.add_listener(heard.release)
    first = SchemaDocument.from_json({"fields": [{"name": "n", "type": "int32"}]})
    config = StreamConfig(name="typed", subject="typed", schema=StreamSchema.first(first))
    created = coordinator.create_stream(config)
    assert heard.acquire(timeout=10)
    second = SchemaDocument.from_json(
        {"fields": [{"name": "n", "type": "int64"}, {"name": "c", "type": "string"}]}
    )
    updated = coordinator.update_schema("typed", second)
    assert heard.acquire(timeout=10)
    assert updated.config.schema == StreamSchema("json", (first.schema, second.schema))
    assert updated.partitions == created.partitions and updated.stream_id == created.stream_id
    wait_until(lambda: coordinator.get_stream("typed") == updated, message="the new schema version")
    assert coordinator.update_schema("typed", second) == updated  # the same schema: nothing changes
    with pytest.raises(
        InvalidArgumentError, match="^incompatible schema change to version 3: field 'c' was removed"
    ):
        coordinator.update_schema(
            "typed", SchemaDocument.from_json({"fields": [{"name": "n", "type": "int64"}]})
        )
    with pytest.raises(UnknownStreamError, match="no stream named 'nope'"):
        coordinator.update_schema("nope", second)
    coordinator.create_stream(StreamConfig(name="plain", subject="plain"))
    with pytest.raises(InvalidArgumentError, match="stream 'plain' has no schema"):
        coordinator.update_schema("plain", second)
    assert coordinator.get_stream("typed") == updated
    coordinator.close()
    again = make()
    wait_until(lambda: updated in again.list_streams(), message="the schema versions after a restart")
