"""The fault matrix's checker finds each kind of violation it claims to (it can fail)."""

from __future__ import annotations

from collections import Counter

from .matrix import History, judge


def history(acked: dict[bytes, tuple[int, int]], served=(), ack_times=(1.0, 2.0)) -> History:
    h = History()
    h.acked.update(acked)
    h.served += list(served)
    h.ack_times += list(ack_times)
    h.operations = len(acked)
    return h


def replica(*values: bytes, start: int = 0):
    stored = {start + n: v for n, v in enumerate(values)}
    return stored, [b"frame:" + v for v in values]


def test_a_healthy_history_is_clean():
    report = judge(
        history({b"a": (0, 0), b"b": (0, 1)}, served=[(0, 0, b"a"), (0, 1, b"b")]),
        {0: [replica(b"a", b"b"), replica(b"a", b"b")]},
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
    assert report.longest_unavailability == 0.5
    assert "kill-leader x1" in report.table()


def test_an_acknowledged_value_missing_from_its_partition_is_lost():
    report = judge(
        history({b"a": (0, 0), b"b": (0, 1), b"c": (1, 0)}),
        {0: [replica(b"a")], 1: [replica(b"b")]},  # b in the wrong partition, c nowhere
        Counter(),
        heals=[],
    )
    assert report.lost == 2


def test_a_value_stored_twice_is_a_duplicate():
    report = judge(history({b"a": (0, 0)}), {0: [replica(b"a", b"a")], 1: [replica(b"a")]}, Counter(), [])
    assert report.duplicates == 2


def test_a_served_value_that_the_final_log_does_not_hold_there_is_a_stale_read():
    served = [(0, 0, b"a"), (0, 1, b"truncated"), (0, 5, b"beyond the end")]
    report = judge(history({b"a": (0, 0)}, served), {0: [replica(b"a", b"b")]}, Counter(), [])
    assert report.stale_reads == 2


def test_missing_offsets_are_a_gap_but_a_start_after_zero_is_not():
    gap = {0: [({0: b"a", 2: b"c"}, [b"x"])]}
    assert judge(history({}), gap, Counter(), []).gaps == 1
    assert judge(history({}), {0: [replica(b"a", start=7)]}, Counter(), []).gaps == 0


def test_replicas_that_differ_in_any_byte_diverge():
    report = judge(
        history({}),
        {0: [replica(b"a", b"b"), replica(b"a", b"b"), ({0: b"a", 1: b"b"}, [b"frame:a", b"frame:B"])]},
        Counter(),
        [],
    )
    assert report.divergent_replicas == 1


def test_no_ack_after_a_heal_is_unbounded_unavailability():
    report = judge(history({}, ack_times=[1.0]), {}, Counter(), heals=[0.5, 3.0])
    assert report.longest_unavailability == float("inf")
