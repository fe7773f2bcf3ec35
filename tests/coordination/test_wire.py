"""Stored metadata: strict in tests, tolerant of a newer writer in production."""

from __future__ import annotations

import json

import pytest

from broker_node.coordination import wire
from broker_node.coordination.base import BrokerInfo, PartitionState
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import SchemaDocument, StreamSchema


def test_round_trips():
    broker = BrokerInfo("b1", "grpc://h:1", ("nats://h:2",))
    assert wire.broker_from_bytes(wire.broker_to_bytes(broker)) == broker
    state = PartitionState("b1", ("b1", "b2"), ("b1",), 7, 0)
    assert wire.partition_from_bytes(wire.partition_to_bytes(state), 3) == PartitionState(
        "b1", ("b1", "b2"), ("b1",), 7, 3
    )
    config = StreamConfig(name="s", subject="s", partitions=2)
    assert wire.stream_from_bytes(wire.stream_to_bytes(config, "id1")) == (config, "id1")
    assert wire.controller_from_bytes(wire.controller_to_bytes("b2", 9)) == ("b2", 9)
    assert wire.epoch_from_bytes(wire.epoch_to_bytes(4)) == 4


def newer(raw: bytes, **extra) -> bytes:
    data = json.loads(raw)
    data.update(extra)
    return json.dumps(data).encode()


def test_unknown_fields_are_errors_when_strict_and_ignored_otherwise(monkeypatch):
    raw = newer(wire.partition_to_bytes(PartitionState("b1", ("b1",), ("b1",))), version=2, fence=5)
    monkeypatch.setenv(wire.STRICT_ENV, "1")
    with pytest.raises(wire.WireError, match=r"version 2 and unknown field\(s\) \['fence'\]"):
        wire.partition_from_bytes(raw, 0)
    monkeypatch.setenv(wire.STRICT_ENV, "0")
    assert wire.partition_from_bytes(raw, 0).leader == "b1"
    config = newer(wire.stream_to_bytes(StreamConfig(name="s", subject="s"), "i"))
    data = json.loads(config)
    data["config"]["tiered_storage"] = True
    assert wire.stream_from_bytes(json.dumps(data).encode())[0].name == "s"
    monkeypatch.setenv(wire.STRICT_ENV, "1")
    with pytest.raises(wire.WireError, match="unknown stream option"):
        wire.stream_from_bytes(json.dumps(data).encode())


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"not json", "is not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"leader": "b1"}', "no valid version"),
        (b'{"version": 1, "leader": "b1"}', "lacks field"),
        (b'{"version": 1, "leader": 5, "replicas": [], "isr": [], "leader_epoch": 0}', "wrong type"),
        (
            b'{"version": 1, "leader": "b", "replicas": [1], "isr": [], "leader_epoch": 0}',
            "list of broker ids",
        ),
        (b'{"version": 1, "leader": "b", "replicas": [], "isr": [], "leader_epoch": true}', "wrong type"),
    ],
)
def test_malformed_objects_are_named_errors_in_any_mode(raw, message):
    with pytest.raises(wire.WireError, match=message):
        wire.partition_from_bytes(raw, 0, "partition s/0")


OLD_STREAM = (
    b'{"config":{"ack_reply":true,"compaction":false,"compression":"none","duplicate_max_ids":1000000,'
    b'"duplicate_window":120.0,"group":null,"max_message_bytes":1048576,"min_insync_replicas":1,'
    b'"name":"s","partitions":2,"replication_factor":1,"retention_age":null,"retention_bytes":null,'
    b'"retention_messages":null,"segment_bytes":67108864,"subject":"s","unclean_leader_election":false},'
    b'"id":"id1","version":1}'
)
"""A stream as brokers stored it before streams had schemas."""


def test_a_stream_stored_before_schemas_reads_untyped_and_is_stored_the_same(monkeypatch):
    monkeypatch.setenv(wire.STRICT_ENV, "1")
    config, stream_id = wire.stream_from_bytes(OLD_STREAM)
    assert config.schema is None and stream_id == "id1"
    assert wire.stream_to_bytes(config, stream_id) == OLD_STREAM


def test_a_typed_stream_round_trips_with_every_schema_version(monkeypatch):
    monkeypatch.setenv(wire.STRICT_ENV, "1")
    first = SchemaDocument.from_json({"fields": [{"name": "n", "type": "int32", "nullable": False}]})
    second = SchemaDocument.from_json(
        {"fields": [{"name": "n", "type": "int64", "nullable": False}, {"name": "c", "type": "string"}]}
    )
    schema = StreamSchema.first(first).evolved(second)
    config = StreamConfig(name="s", subject="s", schema=schema)
    raw = wire.stream_to_bytes(config, "id1")
    assert json.loads(raw)["config"]["schema"]["versions"][0] == {
        "version": 1,
        "fields": [{"name": "n", "type": "int32", "nullable": False}],
    }
    read, _ = wire.stream_from_bytes(raw)
    assert read == config and read.schema is not None
    assert read.schema.version == 2 and read.schema.versions == (first.schema, second.schema)
    data = json.loads(raw)
    data["config"]["schema"]["versions"][1]["fields"][0]["type"] = "string"
    with pytest.raises(
        wire.WireError, match="stream znode s: incompatible schema change to version 2: field 'n'"
    ):
        wire.stream_from_bytes(json.dumps(data).encode(), "stream znode s")
