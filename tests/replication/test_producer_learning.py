"""Learning stored batches many at once gives the producer table that learning them one by one gives."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_node.replication.producers import SMALL_ROWS, ProducerTable
from pyspark_jetstream.protocol.envelope import producer_position

from ..log.helpers import stored_batch

# A row: its producer (or none) and its (epoch, sequence) (or none); few values, so positions
# repeat within and across batches (as after a producer's state was lost and it started over).
ROW = st.tuples(
    st.sampled_from(["p", "q", None]),
    st.one_of(st.none(), st.tuples(st.integers(0, 1), st.integers(0, 4))),
)
BATCHES = st.lists(st.lists(ROW, min_size=1, max_size=SMALL_ROWS + 20), min_size=1, max_size=12)


def _stored(batches: list[list[tuple]]) -> list[pa.RecordBatch]:
    stored, offset = [], 0
    for rows in batches:
        producers = [producer for producer, _ in rows]
        positions = [None if at is None else producer_position(*at) for _, at in rows]
        stored.append(stored_batch(len(rows), offset, producer_id=producers, sequence=positions))
        offset += len(rows)
    return stored


@settings(max_examples=150, deadline=None)
@given(BATCHES)
def test_many_at_once_is_one_by_one(batches):
    stored = _stored(batches)
    one_by_one = ProducerTable()
    for batch in stored:
        one_by_one.learn(batch)
    at_once = ProducerTable()
    at_once.learn_many(stored)
    assert at_once.snapshot() == one_by_one.snapshot()


def test_a_position_stored_in_two_batches_stays_two_entries_as_one_by_one():
    twice = _stored([[("p", (0, 3))], [("q", (0, 0))], [("p", (0, 3)), ("p", (0, 3))]])
    table = ProducerTable()
    table.learn_many(twice)
    assert table.snapshot()["p"] == [[3, 0, 0], [3, 2, 3]]
