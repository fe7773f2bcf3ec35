"""A typed stream's schema on three real brokers: each version, asked of any broker, goes through the
controller into ZooKeeper and reaches every broker."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pyspark_jetstream.client.connection import BrokerConnection
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.flight import ActionType, StreamInfo
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import SchemaDocument

from ..broker.harness import wait_until

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
