"""Arrow arrays of one repeated value, built from buffers (no Python list of n items)."""

from __future__ import annotations

from array import array

import pyarrow as pa


def constant_strings(value: str, n: int) -> pa.Array:
    """``n`` copies of ``value`` as a ``string`` array."""
    raw = value.encode()
    offsets = array("i", range(0, (n + 1) * len(raw), len(raw))) if raw else array("i", [0]) * (n + 1)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def constant_ints(value: int, n: int, arrow_type: pa.DataType) -> pa.Array:
    """``n`` copies of ``value`` as an array of a 32- or 64-bit integer-like type (int, timestamp)."""
    code = {32: "i", 64: "q"}[arrow_type.bit_width]
    return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(array(code, [value]) * n)])
