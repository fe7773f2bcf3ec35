"""Arrays built from their buffers."""

from __future__ import annotations

import sys

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from pyspark_jetstream.protocol.array_builders import constant_ints, constant_strings, large_binary_of


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_large_binary_of_holds_each_buffer_in_order(values):
    array = large_binary_of([pa.py_buffer(v) for v in values])
    assert array.type == pa.large_binary()
    assert array.null_count == 0
    assert array.to_pylist() == values


def test_large_binary_of_keeps_no_reference_to_its_buffers():
    # Conversions that hold on to their input kept every replicated frame alive.
    buffers = [pa.py_buffer(b"x" * 1000) for _ in range(3)]
    before = [sys.getrefcount(b) for b in buffers]
    array = large_binary_of(buffers)
    assert [sys.getrefcount(b) for b in buffers] == before
    assert array.to_pylist() == [b"x" * 1000] * 3


def test_constant_arrays():
    assert constant_ints(7, 3, pa.int32()).to_pylist() == [7, 7, 7]
    assert constant_strings("a", 2).to_pylist() == ["a", "a"]
