"""Arrow arrays built from their buffers: one repeated value (no Python list of n items), and
binary values that are Arrow buffers already."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import accumulate

import pyarrow as pa


def constant_strings(value: str, n: int) -> pa.Array:
    """``n`` copies of ``value`` as a ``string`` array."""
    return pa.repeat(pa.scalar(value, pa.string()), n)


def constant_ints(value: int, n: int, arrow_type: pa.DataType) -> pa.Array:
    """``n`` copies of ``value`` as an array of a 32- or 64-bit integer-like type (int, timestamp)."""
    code = {32: "i", 64: "q"}[arrow_type.bit_width]
    return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(array(code, [value]) * n)])


def large_binary_of(buffers: Sequence[pa.Buffer]) -> pa.Array:
    """A ``large_binary`` array whose values are the bytes of ``buffers`` (copied once, joined).

    Built from its buffers: ``pa.array`` of memoryviews over Arrow buffers
    keeps every buffer alive for good (pyarrow 26 never releases the views it
    converts), so a leader serving frames that way grew by every byte it
    replicated.
    """
    offsets = array("q", accumulate((b.size for b in buffers), initial=0))
    data = pa.py_buffer(b"".join(buffers))
    return pa.Array.from_buffers(pa.large_binary(), len(buffers), [None, pa.py_buffer(offsets), data])
