"""A read's shape on both log implementations: typed columns beside the log's as the stream's current
version (nulls for frames stored without, and for fields added since), columns and filters applied
at the broker, and the untyped fast path returning the log's batches as read."""

from __future__ import annotations

import pyarrow as pa
import pytest

from broker_node.api.typed_reads import ReadShape
from broker_node.log import Record
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.flight import ReadRequest
from pyspark_jetstream.protocol.read_shape import ColumnFilter
from pyspark_jetstream.protocol.schema import LOG_SCHEMA

from . import test_typed
from .test_typed import V1, V2, messages

new_log = test_typed.new_log  # the fixture: each test runs on both log kinds


def shaped(log, schema, **request):
    shape = ReadShape(ReadRequest("s", **request), schema)
    read = shape.read(log, 0, max_records=None, max_bytes=None, upper_bound=log.log_end_offset)
    return shape, read, pa.Table.from_batches(read.batches, schema=shape.schema)


def test_a_typed_read_has_the_current_versions_fields_with_nulls_where_a_frame_has_none(new_log):
    log = new_log()
    log.append([Record(b"before the schema")])  # as a repair or an older broker may have stored it
    append(log, range(1, 3))
    append(log, range(3, 5), V2)
    shape, read, table = shaped(log, V2)
    assert shape.schema.names == [*LOG_SCHEMA.names, "id", "name", "extra"]
    assert all(
        shape.schema.field(n).nullable for n in ("id", "name", "extra")
    )  # a frame without typed columns reads as nulls
    assert table.select(["offset", "id", "name", "extra"]).to_pylist() == [
        {"offset": 0, "id": None, "name": None, "extra": None},
        {"offset": 1, "id": 1, "name": "n1", "extra": None},  # version 1: widened, the new field null
        {"offset": 2, "id": 2, "name": "n2", "extra": None},
        {"offset": 3, "id": 3, "name": "n3", "extra": None},
        {"offset": 4, "id": 4, "name": "n4", "extra": None},
    ]
    assert table.schema.field("id").type == pa.int64() and read.last_offset == 4
    # A read starting inside a stored batch gets the same rows of its typed columns.
    middle = ReadShape(ReadRequest("s", columns=("id",)), V2).read(
        log, 2, max_records=2, max_bytes=None, upper_bound=log.log_end_offset
    )
    assert pa.Table.from_batches(middle.batches).to_pylist() == [
        {"offset": 2, "id": 2},
        {"offset": 3, "id": 3},
    ]
    assert table.column("value").to_pylist()[1] == b'{"id": 1, "name": "n1"}'


def test_columns_and_filters_are_applied_and_a_read_moves_past_filtered_rows(new_log):
    log = new_log()
    append(log, range(0, 6))
    log.append([Record(b"untyped")])
    shape, read, table = shaped(
        log,
        V1,
        columns=("name", "key"),
        filters=(ColumnFilter("ge", "id", 4), ColumnFilter("is_not_null", "id")),
    )
    assert shape.schema.names == ["offset", "key", "name"]
    assert table.to_pylist() == [
        {"offset": 4, "key": None, "name": "n4"},
        {"offset": 5, "key": None, "name": "n5"},
    ]
    assert read.last_offset == 6  # the untyped row was read, and filtered out
    _, read, table = shaped(log, V1, filters=(ColumnFilter("in", "name", ("n1", "none")),))
    assert table.column("offset").to_pylist() == [1] and read.last_offset == 6
    _, _, table = shaped(log, V1, filters=(ColumnFilter("is_null", "id"),))
    assert table.column("value").to_pylist() == [b"untyped"]


def test_log_columns_only_give_the_logs_batches_as_read(new_log):
    log = new_log()
    append(log, range(0, 3))
    _, read, _ = shaped(log, V1, columns=("value",))
    assert len(read.batches) == 1 and read.batches[0].schema.names == ["offset", "value"]
    # The untyped path selects from the very buffers the log returned (no copy, no re-encoding).
    stored = log.read(0)[0]
    assert read.batches[0].column(1).buffers()[2].address == stored.column("value").buffers()[2].address
    _, untyped_read, table = shaped(log, None)
    assert table.schema.equals(LOG_SCHEMA) and untyped_read.batches[0].column(0).buffers()[1].address == (
        stored.column(0).buffers()[1].address
    )


def test_unknown_columns_and_bad_filters_are_refused_naming_them(new_log):
    for request, message in [
        ({"columns": ("id", "colour")}, "unknown column 'colour'.*its fields: id, name"),
        ({"filters": (ColumnFilter("eq", "colour", 1),)}, "filter on unknown column 'colour'"),
        (
            {"filters": (ColumnFilter("eq", "id", "one"),)},
            "filter on 'id': 'one' is not a value of its type int32",
        ),
        (
            {"filters": (ColumnFilter("eq", "headers", 1),)},
            "filter on 'headers': its type .* cannot be filtered",
        ),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            ReadShape(ReadRequest("s", **request), V1)
    with pytest.raises(
        InvalidArgumentError, match=r"unknown column 'id': a read returns the log's columns \(offset"
    ):
        ReadShape(ReadRequest("s", columns=("id",)), None)


def append(log, ids, schema=V1):
    records, typed = messages(ids, schema)
    log.append(records, typed=typed)
