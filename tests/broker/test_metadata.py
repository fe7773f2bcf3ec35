"""Damaged or lost metadata never deletes data: the broker refuses clearly, and can rebuild it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.streams import StreamConfig

from .harness import BrokerProcess, rebuild_metadata


def _broker_with_data(tmp_path, nats_server):
    broker = BrokerProcess(tmp_path / "b", nats_url=nats_server.url).start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        client.create_stream("orders", "orders", partitions=2, compression="lz4")
        client.create_stream("audit", "audit.>")
        for i in range(10):
            client.publish("orders", b"%d" % i, partition=i % 2)
        client.publish("audit", b"a", subject="audit.x")
        client.set_cursor("app", "orders", 1, 3)
    assert broker.stop() == 0
    return broker


def _segments(broker) -> list[str]:
    return sorted(str(p.relative_to(broker.data_dir)) for p in broker.data_dir.glob("streams/*/*/*.arrows"))


@pytest.mark.parametrize(
    ("damage", "complaint"),
    [
        ("missing", "has no streams, but"),
        ("empty", "is empty"),
        ("garbage", "is not valid: Expecting property name"),
        ("wrong type", "is not valid: a JSON list"),
        ("future version", "unknown format version 99"),
    ],
)
def test_damaged_metadata_refuses_to_start_and_deletes_nothing(tmp_path, nats_server, damage, complaint):
    broker = _broker_with_data(tmp_path, nats_server)
    before = _segments(broker)
    path = broker.data_dir / "metadata.json"
    {
        "missing": path.unlink,
        "empty": lambda: path.write_text(""),
        "garbage": lambda: path.write_text("{ not json"),
        "wrong type": lambda: path.write_text("[]"),
        "future version": lambda: path.write_text('{"version": 99}'),
    }[damage]()
    with pytest.raises(Exception, match="exited with code 1") as info:
        broker.start()
    message = str(info.value)
    assert complaint in message and "metadata" in message
    assert "Nothing was deleted" in message and "--rebuild-metadata" in message
    assert "Traceback" not in broker.log_tail()
    assert _segments(broker) == before


def test_lost_metadata_is_rebuilt_from_the_partitions_own_records(tmp_path, nats_server):
    broker = _broker_with_data(tmp_path, nats_server)
    (broker.data_dir / "metadata.json").write_text("{ damaged")
    rebuilt = rebuild_metadata(broker)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "stream 'orders' on 'orders': 2 partition(s)" in rebuilt.stdout
    assert (broker.data_dir / "metadata.json.unreadable").read_text() == "{ damaged"
    broker.start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        assert client.describe_stream("orders").config["compression"] == "lz4"
        assert client.fetch("orders", 0).num_rows + client.fetch("orders", 1).num_rows == 10
        assert client.fetch("audit").num_rows == 1
        assert client.fetch_cursor("app", "orders", 1) == 3
        assert client.publish("orders", b"new", partition=0).first_offset == 5
    assert broker.stop() == 0
    again = rebuild_metadata(broker)
    assert again.returncode == 1 and "is readable; it is not rebuilt" in again.stderr


def test_a_directory_the_metadata_does_not_know_is_kept_and_reported(tmp_path, nats_server):
    broker = _broker_with_data(tmp_path, nats_server)
    # The metadata loses one stream (no tombstone): its data must stay.
    path = broker.data_dir / "metadata.json"
    metadata = json.loads(path.read_text())
    del metadata["streams"]["audit"]
    path.write_text(json.dumps(metadata))
    broker.start()
    try:
        assert (broker.data_dir / "streams" / "audit" / "0" / "partition.json").exists()
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
            problems = client.health()["problems"]
            assert any("streams/audit/0: not in the metadata; kept untouched" in p for p in problems)
            # Its name cannot be reused while the old data is there.
            with pytest.raises(InvalidArgumentError, match="holds partition 0 of another stream"):
                client.create_stream("audit", "audit.>")
            assert "audit" not in [s.config["name"] for s in client.list_streams()]
            assert client.fetch("orders", 0).num_rows == 5
    finally:
        assert broker.stop() == 0
    assert (broker.data_dir / "streams" / "audit" / "0").exists()


def test_deleting_and_recreating_a_stream_starts_it_empty(tmp_path, nats_server):
    broker = _broker_with_data(tmp_path, nats_server)
    broker.start()
    try:
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
            client.delete_stream("audit")
            assert not (broker.data_dir / "streams" / "audit").exists()
            client.create_stream("audit", "audit.>")
            assert client.fetch("audit").num_rows == 0
            assert client.health()["ok"]
    finally:
        assert broker.stop() == 0


V1 = {"fields": [{"name": "order_id", "type": "int64", "nullable": False}]}
V2 = {"fields": [*V1["fields"], {"name": "coupon", "type": "string"}]}
V3 = {"fields": [*V2["fields"], {"name": "channel", "type": "string"}]}


def _typed_stream_at_v3(tmp_path, nats_server, *, batch_per_version: bool = True):
    """A stopped broker whose typed stream ``orders`` went through two schema changes."""
    broker = BrokerProcess(tmp_path / "b", nats_url=nats_server.url).start()
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        client.create_stream("orders", "orders", schema=V1)
        client.publish("orders", b'{"order_id": 1}')
        client.update_schema("orders", V2)
        if batch_per_version:
            client.publish("orders", b'{"order_id": 2, "coupon": "FREE"}')
        client.update_schema("orders", V3)
        client.publish("orders", b'{"order_id": 3, "coupon": "X", "channel": "web"}')
    assert broker.stop() == 0
    (broker.data_dir / "metadata.json").unlink()
    return broker


def _accepts_every_version(broker) -> None:
    with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
        schema = StreamConfig.from_json(client.describe_stream("orders").config).schema
        assert schema is not None and schema.version == 3
        assert schema.current.names == ["order_id", "coupon", "channel"]
        assert schema.versions[1].names == ["order_id", "coupon"]
        client.publish("orders", b'{"order_id": 4, "coupon": "AGAIN"}')
        client.publish("orders", b'{"order_id": 5, "channel": "app"}')
        table = client.fetch("orders", 0).to_table()
        assert table.column("order_id").to_pylist() == [1, 2, 3, 4, 5][-table.num_rows :]
        assert table.column("channel").to_pylist()[-1] == "app"


def _record_with_version_1_only(broker) -> None:
    """Cut the partition record's schema back to version 1, as records written before they
    followed schema changes are."""
    path = broker.data_dir / "streams" / "orders" / "0" / "partition.json"
    record = json.loads(path.read_text())
    record["config"]["schema"]["versions"] = record["config"]["schema"]["versions"][:1]
    path.write_text(json.dumps(record))


def _rebuilt_then(broker, said: str, check: Callable[[Any], None] = _accepts_every_version) -> None:
    """Rebuild the stopped ``broker``'s metadata (its output says ``said``), start it, ``check`` it
    and stop it."""
    rebuilt = rebuild_metadata(broker)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert said in rebuilt.stdout
    broker.start()
    try:
        check(broker)
    finally:
        assert broker.stop() == 0


def test_a_rebuild_keeps_every_schema_version_of_a_typed_stream(tmp_path, nats_server):
    broker = _typed_stream_at_v3(tmp_path, nats_server)
    _rebuilt_then(broker, "stream 'orders' on 'orders': 1 partition(s), schema version 3")


def test_a_rebuild_recovers_schema_versions_from_the_logs_batches(tmp_path, nats_server):
    """A partition record written before records followed schema changes holds version 1 only:
    the versions its batches were parsed with are read back from the batches."""
    broker = _typed_stream_at_v3(tmp_path, nats_server)
    _record_with_version_1_only(broker)
    _rebuilt_then(broker, "schema version 3 (versions 2-3 read back from the log's batches)")


def test_a_version_with_no_batches_and_no_record_is_rebuilt_as_the_next_and_said(tmp_path, nats_server):
    broker = _typed_stream_at_v3(tmp_path, nats_server, batch_per_version=False)
    _record_with_version_1_only(broker)

    def version_2_is_3s_fields(broker) -> None:
        with SyncClient(nats_urls=broker.nats_url, broker=broker.flight) as client:
            schema = StreamConfig.from_json(client.describe_stream("orders").config).schema
            assert schema is not None and schema.version == 3
            assert schema.versions[1].names == schema.current.names == ["order_id", "coupon", "channel"]
            client.publish("orders", b'{"order_id": 4, "channel": "app"}')

    said = "schema version 2 is in no record and no batch: rebuilt with version 3's fields"
    _rebuilt_then(broker, said, version_2_is_3s_fields)
