"""Arrow arrays of one repeated value, built in Arrow (no Python list of n items)."""

from __future__ import annotations

from array import array

import pyarrow as pa


def constant_strings(value: str, n: int) -> pa.Array:
    """``n`` copies of ``value`` as a ``string`` array."""
    return pa.repeat(pa.scalar(value, pa.string()), n)


def constant_ints(value: int, n: int, arrow_type: pa.DataType) -> pa.Array:
    """``n`` copies of ``value`` as an array of a 32- or 64-bit integer-like type (int, timestamp)."""
    code = {32: "i", 64: "q"}[arrow_type.bit_width]
    return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(array(code, [value]) * n)])
