"""The fault matrix's checker finds each kind of violation it claims to (it can fail)."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa

from broker_node.log.typed_frames import encode_typed_frame
from pyspark_jetstream.protocol.typed_values import parse_json
from pyspark_jetstream.protocol.value_schema import SchemaDocument, StreamSchema

from ..log.helpers import stored_batch
from .matrix import TYPED_FIELDS, History, Replica, _typed_mismatches, judge

P0, P1 = ("chaos", 0), ("chaos", 1)


def history(acked: dict[bytes, tuple[tuple[str, int], int]], served=(), ack_times=(1.0, 2.0)) -> History:
    h = History()
    h.acked.update(acked)
    h.served += list(served)
    h.ack_times += list(ack_times)
    h.operations = len(acked)
    return h


def replica(*values: bytes, start: int = 0, typed_mismatches: int = 0) -> Replica:
    stored = {start + n: v for n, v in enumerate(values)}
    return Replica(stored, [b"frame:" + v for v in values], typed_mismatches)


def test_a_healthy_history_is_clean():
    report = judge(
        history({b"a": (P0, 0), b"b": (P0, 1)}, served=[(P0, 0, b"a"), (P0, 1, b"b")]),
        {P0: [replica(b"a", b"b"), replica(b"a", b"b")]},
        Counter({"kill-leader": 1}),
        heals=[1.5],
    )
    assert (report.lost, report.duplicates, report.stale_reads, report.gaps, report.divergent_replicas) == (
        0,
        0,
        0,
        0,
        0,
    )
    assert report.typed_mismatches == 0
    assert report.longest_unavailability == 0.5
    assert "kill-leader x1" in report.table()


def test_an_acknowledged_value_missing_from_its_partition_is_lost():
    report = judge(
        history({b"a": (P0, 0), b"b": (P0, 1), b"c": (P1, 0)}),
        {P0: [replica(b"a")], P1: [replica(b"b")]},  # b in the wrong partition, c nowhere
        Counter(),
        heals=[],
    )
    assert report.lost == 2


def test_a_value_stored_twice_is_a_duplicate():
    report = judge(history({b"a": (P0, 0)}), {P0: [replica(b"a", b"a")], P1: [replica(b"a")]}, Counter(), [])
    assert report.duplicates == 2


def test_a_served_value_that_the_final_log_does_not_hold_there_is_a_stale_read():
    served = [(P0, 0, b"a"), (P0, 1, b"truncated"), (P0, 5, b"beyond the end")]
    report = judge(history({b"a": (P0, 0)}, served), {P0: [replica(b"a", b"b")]}, Counter(), [])
    assert report.stale_reads == 2


def test_missing_offsets_are_a_gap_but_a_start_after_zero_is_not():
    gap = {P0: [Replica({0: b"a", 2: b"c"}, [b"x"], 0)]}
    assert judge(history({}), gap, Counter(), []).gaps == 1
    assert judge(history({}), {P0: [replica(b"a", start=7)]}, Counter(), []).gaps == 0


def test_replicas_that_differ_in_any_byte_diverge():
    report = judge(
        history({}),
        {
            P0: [
                replica(b"a", b"b"),
                replica(b"a", b"b"),
                Replica({0: b"a", 1: b"b"}, [b"frame:a", b"frame:B"], 0),
            ]
        },
        Counter(),
        [],
    )
    assert report.divergent_replicas == 1


def test_no_ack_after_a_heal_is_unbounded_unavailability():
    report = judge(history({}, ack_times=[1.0]), {}, Counter(), heals=[0.5, 3.0])
    assert report.longest_unavailability == float("inf")


def _frame(values: list[bytes], typed_from: list[bytes] | None) -> pa.Buffer:
    """A typed stream's frame of ``values``, its typed columns parsed from ``typed_from``."""
    batch = stored_batch(len(values), value=values)
    if typed_from is None:
        return encode_typed_frame(batch, None)
    schema = StreamSchema.first(SchemaDocument.from_json({"fields": TYPED_FIELDS}))
    return encode_typed_frame(batch, parse_json(typed_from, schema).typed)


def test_typed_rows_missing_or_disagreeing_with_their_value_are_counted():
    rows = [json.dumps({"writer": "typed-0", "round": 0, "count": n}).encode() for n in range(3)]
    assert _typed_mismatches(_frame(rows, rows)) == 0
    assert _typed_mismatches(_frame(rows, None)) == 3  # stored without its typed columns
    other = [*rows[:2], json.dumps({"writer": "typed-0", "round": 0, "count": 9}).encode()]
    assert _typed_mismatches(_frame(rows, other)) == 1
    report = judge(history({}), {("chaos-typed", 0): [replica(b"a", typed_mismatches=2)]}, Counter(), [])
    assert report.typed_mismatches == 2
