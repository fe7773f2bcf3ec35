"""A read of messages stored one per batch arrives as one batch per run of small ones.

Each batch sent is an IPC message the reader decodes on its own; a partition
written message by message is stored a message or a few per batch.
"""

from __future__ import annotations

import pyarrow as pa

from broker_node.api.typed_reads import JOINED_ROWS, SMALL_ROWS, joined
from pyspark_jetstream.protocol.read_shape import ColumnFilter


def rows(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"offset": pa.array(range(start, start + n), pa.int64())})


def test_a_read_of_messages_stored_one_by_one_comes_in_one_batch(client):
    client.create_stream("one-by-one", "one-by-one")
    for i in range(200):
        client.publish("one-by-one", b"%d" % i)  # awaited: one stored batch each
    result = client.fetch("one-by-one", start=0, max_records=1_000)
    assert len(result.batches) == 1
    assert result.batches[0].column("offset").to_pylist() == list(range(200))
    assert [v.as_py() for v in result.batches[0].column("value")] == [b"%d" % i for i in range(200)]
    some = client.fetch("one-by-one", start=0, max_records=1_000, columns=["offset"])
    assert len(some.batches) == 1 and some.batches[0].schema.names == ["offset"]
    odd = client.fetch("one-by-one", start=0, max_records=1_000, filters=[ColumnFilter("ge", "offset", 150)])
    assert [b.num_rows for b in odd.batches] == [50] and odd.next_offset == 200


def test_small_runs_are_joined_and_large_batches_kept_as_they_are():
    large = rows(10, SMALL_ROWS)
    out = joined([rows(0, 3), rows(3, 7), large, rows(10 + SMALL_ROWS, 1)])
    assert [b.num_rows for b in out] == [10, SMALL_ROWS, 1]
    assert out[1] is large
    assert pa.Table.from_batches(out).column("offset").to_pylist() == list(range(11 + SMALL_ROWS))


def test_a_joined_batch_holds_at_most_its_limit_of_rows():
    small = SMALL_ROWS - 1
    n = JOINED_ROWS // small + 2
    out = joined([rows(i * small, small) for i in range(n)])
    assert all(b.num_rows <= JOINED_ROWS for b in out) and len(out) == 2
    assert sum(b.num_rows for b in out) == n * small
