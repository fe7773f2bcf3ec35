"""``streamPattern`` over typed streams: streams that match once the query runs are read when they
have the query's fields, and otherwise left out -- never a failure mid-query."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException

from pyspark_jetstream.spark.typed_source import unreadable

from .frames import into_memory, read, read_stream

N = {"fields": [{"name": "n", "type": "int32", "nullable": False}]}


def test_streams_matching_later_are_read_by_their_common_fields_or_left_out(
    spark, deployment, client, name, tmp_path
):
    client.create_stream(f"{name}-a", f"{name}-a", schema=N)
    client.publish(f"{name}-a", b'{"n": 1}')
    table = f"typed_pattern_{name}"
    frame = read_stream(spark, deployment, streamPattern=f"{name}-.*", startingOffsets="earliest")
    query = into_memory(frame, table, tmp_path / "ck")
    try:
        query.processAllAvailable()
        # Matching now: one with more fields (read: its n), one with others, one with none.
        more = {"fields": [*N["fields"], {"name": "extra", "type": "string"}]}
        client.create_stream(f"{name}-more", f"{name}-more", schema=more)
        client.create_stream(
            f"{name}-other", f"{name}-other", schema={"fields": [{"name": "label", "type": "string"}]}
        )
        client.create_stream(f"{name}-plain", f"{name}-plain")
        client.publish(f"{name}-more", b'{"n": 2, "extra": "x"}')
        client.publish(f"{name}-other", b'{"label": "y"}')
        client.publish(f"{name}-plain", b"z")
        client.publish(f"{name}-a", b'{"n": 3}')
        query.processAllAvailable()
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    rows = sorted((r.stream, r.n) for r in spark.table(table).select("stream", "n").collect())
    assert rows == [(f"{name}-a", 1), (f"{name}-a", 3), (f"{name}-more", 2)]


def test_streams_with_different_fields_at_planning_are_refused_naming_them(spark, deployment, client, name):
    client.create_stream(f"{name}-a", f"{name}-a", schema=N)
    client.create_stream(f"{name}-b", f"{name}-b", schema={"fields": [{"name": "label", "type": "string"}]})
    with pytest.raises(PySparkException, match=rf"streams {name}-a and {name}-b have different fields"):
        read(spark, deployment, streamPattern=f"{name}-.*").collect()


def test_why_a_stream_cannot_be_read_as_the_querys_fields():
    fields = pa.schema([pa.field("n", pa.int32()), pa.field("s", pa.string())])

    def config(*typed: dict) -> dict:
        return {"schema": {"format": "json", "versions": [{"version": 1, "fields": list(typed)}]}}

    configs = {
        "same": config({"name": "n", "type": "int32"}, {"name": "s", "type": "string"}),
        "more": config(
            {"name": "n", "type": "int32"}, {"name": "s", "type": "string"}, {"name": "x", "type": "bool"}
        ),
        "less": config({"name": "n", "type": "int32"}),
        "wider": config({"name": "n", "type": "int64"}, {"name": "s", "type": "string"}),
        "plain": {},
    }
    assert unreadable(configs, fields) == {
        "less": "lacks the field(s) s",
        "wider": "has field 'n' of type int64, not int32",
        "plain": "has no schema",
    }
