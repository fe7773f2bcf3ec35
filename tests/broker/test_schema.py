"""Typed streams on a real broker: create with a schema, describe, list, evolve it, refusals."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pytest

from pyspark_jetstream.client.connection import BrokerConnection
from pyspark_jetstream.protocol.errors import InvalidArgumentError, StreamExistsError
from pyspark_jetstream.protocol.flight import ActionType
from pyspark_jetstream.protocol.streams import StreamConfig

from ..protocol.test_value_schema import ORDERS as EVERY_TYPE
from .test_add_partitions import jetstream, one_line

ORDERS = {"format": "json", "fields": EVERY_TYPE["fields"][:3]}
"""Three of the fields the schema's own tests use: order_id (int32, not null), country, amount."""


def write(path, document) -> str:
    path.write_text(json.dumps(document))
    return str(path)


def test_create_describe_list_and_evolve_a_schema_with_the_command(broker, client, tmp_path):
    schema_file = write(tmp_path / "orders.schema.json", ORDERS)
    created = jetstream(broker, "stream", "create", "orders", "--subject", "orders", "--schema", schema_file)
    assert created.returncode == 0, created.stderr
    assert "stream orders on orders with 1 partition(s), schema version 1 (json)" in created.stdout
    described = jetstream(broker, "stream", "describe", "orders").stdout
    assert re.search(r"^schema +version 1 of 1, payload format json$", described, re.M)
    assert "  order_id: int32 not null\n  country: string\n  amount: decimal128(12, 2)\n" in described
    listed = jetstream(broker, "stream", "list").stdout
    assert re.search(r"^orders +orders +1 +0 +v1 json: order_id, country, amount *$", listed, re.M), listed

    # A compatible change: order_id widens, a nullable field is added.
    evolved = {
        "fields": [
            {"name": "order_id", "type": "int64", "nullable": False},
            *ORDERS["fields"][1:],
            {"name": "coupon", "type": "string"},
        ]
    }
    updated = jetstream(
        broker, "stream", "update", "orders", "--schema", write(tmp_path / "v2.json", evolved)
    )
    assert updated.returncode == 0, updated.stderr
    assert updated.stdout.strip() == "stream orders now has schema version 2"
    again = jetstream(broker, "stream", "update", "orders", "--schema", write(tmp_path / "v2.json", evolved))
    assert again.stdout.strip() == "stream orders already has this schema (version 2): nothing changed"
    schema = StreamConfig.from_json(client.describe_stream("orders").config).schema
    assert schema is not None and schema.version == 2
    assert schema.versions[0].field("order_id").type == pa.int32()
    assert schema.current.field("order_id").type == pa.int64() and "coupon" in schema.current.names
    described = jetstream(broker, "stream", "describe", "orders").stdout
    assert "version 2 of 2" in described and "  order_id: int64 not null\n" in described

    # Incompatible changes: refused in one line naming the field, nothing changes.
    dropped = {"fields": [evolved["fields"][0], *evolved["fields"][2:]]}
    refused = jetstream(
        broker, "stream", "update", "orders", "--schema", write(tmp_path / "bad.json", dropped)
    )
    assert refused.returncode == 1
    assert one_line(refused).startswith(
        "jetstream: incompatible schema change to version 3: field 'country' was removed; data written "
        "before still has it"
    )
    narrowed = {"fields": [{"name": "order_id", "type": "int32", "nullable": False}, *evolved["fields"][1:]]}
    refused = jetstream(
        broker, "stream", "update", "orders", "--schema", write(tmp_path / "bad.json", narrowed)
    )
    assert refused.returncode == 1
    assert one_line(refused) == (
        "jetstream: incompatible schema change to version 3: field 'order_id' changed type from int64 to "
        "int32; only int32 -> int64 and float32 -> float64 widen compatibly"
    )
    schema = StreamConfig.from_json(client.describe_stream("orders").config).schema
    assert schema is not None and schema.version == 2


def test_bad_schema_files_are_refused_in_one_line_naming_the_file_and_field(broker, tmp_path):
    bad = write(tmp_path / "bad.json", {"fields": [{"name": "when", "type": "datetime"}]})
    result = jetstream(broker, "stream", "create", "s", "--subject", "s", "--schema", bad)
    assert result.returncode == 1
    assert one_line(result).startswith(f"jetstream: {bad}: schema field 'when': unknown type 'datetime'; use")
    missing = str(tmp_path / "missing.json")
    result = jetstream(broker, "stream", "create", "s", "--subject", "s", "--schema", missing)
    assert result.returncode == 1
    assert one_line(result) == f"jetstream: cannot read the schema file {missing}: No such file or directory"
    plain = jetstream(broker, "stream", "create", "plain", "--subject", "plain")
    assert plain.returncode == 0, plain.stderr
    result = jetstream(broker, "stream", "update", "plain", "--schema", write(tmp_path / "s.json", ORDERS))
    assert result.returncode == 1
    assert one_line(result).startswith("jetstream: stream 'plain' has no schema: a schema is given when")
    result = jetstream(broker, "stream", "update", "plain")
    assert result.returncode == 1
    assert one_line(result) == "jetstream: stream update needs --partitions or --schema (or both)"
    assert re.search(r"^plain +plain +1 +0 +- *$", jetstream(broker, "stream", "list").stdout, re.M)


def test_the_client_and_the_flight_action_take_schemas_too(broker, client, tmp_path):
    arrow = pa.schema([pa.field("n", pa.int32(), nullable=False), ("name", pa.string())])
    info = client.create_stream("typed", "typed", schema=arrow)
    assert StreamConfig.from_json(info.config).schema.current == arrow  # type: ignore[union-attr]
    assert client.create_stream("typed", "typed", schema=arrow) == info  # the same schema: idempotent
    with pytest.raises(StreamExistsError, match="schema: <json schema version 1: n: int64 not null"):
        client.create_stream("typed", "typed", schema=pa.schema([pa.field("n", pa.int64(), nullable=False)]))
    grown = client.update_schema("typed", arrow.append(pa.field("extra", pa.float64())))
    assert StreamConfig.from_json(grown.config).schema.version == 2  # type: ignore[union-attr]
    # An Arrow IPC schema file works on the command line.
    ipc = tmp_path / "v3.arrows"
    ipc.write_bytes(
        arrow.append(pa.field("extra", pa.float64())).append(pa.field("d", pa.date32())).serialize()
    )
    result = jetstream(broker, "stream", "update", "typed", "--schema", str(ipc))
    assert result.returncode == 0 and "schema version 3" in result.stdout, result.stderr
    connection = BrokerConnection(broker.flight)
    try:
        body = {"name": "typed", "schema": {"fields": [{"name": "n", "type": "bool"}]}}
        with pytest.raises(InvalidArgumentError, match="^incompatible schema change to version 4: field 'n'"):
            connection.action(ActionType.UPDATE_SCHEMA, body)
        with pytest.raises(InvalidArgumentError, match="^schema field 'n': unknown type 'boolean'"):
            connection.action(
                ActionType.UPDATE_SCHEMA,
                {"name": "typed", "schema": {"fields": [{"name": "n", "type": "boolean"}]}},
            )
    finally:
        connection.close()
    assert StreamConfig.from_json(client.describe_stream("typed").config).schema.version == 3  # type: ignore[union-attr]
