"""Small batches joined before a read sends them or Spark gets them: rows and order kept."""

from __future__ import annotations

from itertools import pairwise

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from pyspark_jetstream.protocol.joined_batches import joined

SMALL, MOST = 4, 10


def batches(sizes: list[int]) -> list[pa.RecordBatch]:
    out, first = [], 0
    for rows in sizes:
        out.append(pa.record_batch({"offset": pa.array(range(first, first + rows), pa.int64())}))
        first += rows
    return out


@given(st.lists(st.integers(min_value=0, max_value=14), max_size=30))
def test_rows_keep_their_order_small_runs_are_joined_within_the_limit(sizes):
    stored = batches(sizes)
    out = joined(stored, small_rows=SMALL, most_rows=MOST)
    assert [o for b in out for o in b.column(0).to_pylist()] == list(range(sum(sizes)))
    assert all(b.num_rows for b in out)
    large = [b for b in stored if b.num_rows >= SMALL]
    assert [b for b in out if any(b is s for s in large)] == large  # passed on, not copied
    made = [b for b in out if not any(b is s for s in stored)]
    assert all(b.num_rows <= MOST for b in made)
    # Two small neighbours are apart only because together they would pass the limit.
    for before, after in pairwise(out):
        if before.num_rows < SMALL and after.num_rows < SMALL:
            assert before.num_rows + after.num_rows > MOST
