"""NATS headers the broker acts on, and message ids.

JetStream publishers (``nats-py``'s ``js.publish`` and every other NATS
client's) send these headers; the broker honours the ones it can and refuses
a message whose header asks for a check it does not make, rather than
storing it unchecked:

``Nats-Msg-Id``
    The message id (:data:`MSG_ID_HEADER`): 1 to 256 bytes of UTF-8.  Within
    the stream's ``duplicate_window``, a second message with the same id in
    the same partition is not stored again and is acked as a duplicate with
    the original offset.  The id is stored as this header of the stored
    record (the client's ``message_id=`` sets it), so the log holds
    everything needed to remember ids again after a restart or on a new
    leader.
``Nats-Expected-Stream``
    The stream that must store the message: see
    ``broker_node/ingest/decoding.py``.
``Nats-Expected-Last-Sequence`` and the other optimistic-concurrency checks
    (:data:`UNSUPPORTED_EXPECTATIONS`): not supported; such a message is
    refused, nothing stored.

Header names are matched exactly, as nats-server does.  Pure functions, no I/O.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from .errors import InvalidArgumentError, shown
from .schema import HEADER_TYPE

MSG_ID_HEADER = "Nats-Msg-Id"
EXPECTED_STREAM_HEADER = "Nats-Expected-Stream"
UNSUPPORTED_EXPECTATIONS: tuple[str, ...] = (
    "Nats-Expected-Last-Sequence",
    "Nats-Expected-Last-Subject-Sequence",
    "Nats-Expected-Last-Msg-Id",
)
"""JetStream's optimistic-concurrency headers: a message carrying one is refused, not stored unchecked."""
MAX_MESSAGE_ID_BYTES = 256


def message_id_problem(message_id: object) -> str | None:
    """Why ``message_id`` is not a valid message id (naming it), or ``None`` if it is one."""
    if not isinstance(message_id, str):
        return f"message_id must be a string, got {shown(message_id)}"
    try:
        size = len(message_id.encode())
    except UnicodeEncodeError:
        return f"message_id {shown(message_id)} is not valid UTF-8 (it holds a lone surrogate)"
    if not 1 <= size <= MAX_MESSAGE_ID_BYTES:
        return (
            f"message_id must be 1 to {MAX_MESSAGE_ID_BYTES} bytes of UTF-8, got {shown(message_id)} "
            f"({size} bytes)"
        )
    return None


def validate_message_id(message_id: object) -> str:
    """Return ``message_id`` if it is a valid message id, else raise ``InvalidArgumentError`` naming it."""
    problem = message_id_problem(message_id)
    if problem is not None:
        raise InvalidArgumentError(problem)
    assert isinstance(message_id, str)
    return message_id


def message_ids_in(headers: pa.Array) -> tuple[list[int], list[str]]:
    """The rows of a log ``headers`` column whose message carries a message id, and the id
    of each (the first ``Nats-Msg-Id`` of a row; an empty one is no id, as in JetStream).

    Stored bytes that are not UTF-8 are decoded with replacement characters,
    the same way wherever ids are read, so they still match each other.
    """
    if headers.null_count == len(headers):
        return [], []
    items = pc.list_flatten(headers)
    matches = pc.equal(items.field("key"), MSG_ID_HEADER)
    if not pc.any(matches).as_py():
        return [], []
    rows = pc.filter(pc.list_parent_indices(headers), matches).to_pylist()
    values = pc.filter(items.field("value"), matches).to_pylist()
    out_rows: list[int] = []
    out_ids: list[str] = []
    for row, value in zip(rows, values, strict=True):
        if (not out_rows or out_rows[-1] != row) and value:
            out_rows.append(row)
            out_ids.append(value.decode(errors="replace"))
    return out_rows, out_ids


def decoded_id(value: bytes) -> str:
    """A ``Nats-Msg-Id`` header's bytes as the id (see :func:`message_ids_in`)."""
    return value.decode(errors="replace")


def checked_message_ids(ids: object, rows: int, what: str = "message_ids") -> pa.Array:
    """``ids`` (a sequence of strings or a string Arrow array, one per row of a batch of
    ``rows`` rows) as a string array; ``InvalidArgumentError`` naming ``what`` and the first
    bad row otherwise."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if isinstance(ids, pa.Array):
        if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
            raise InvalidArgumentError(f"{what} must be strings, got {ids.type}")
        array = ids
    elif isinstance(ids, str | bytes) or not hasattr(ids, "__len__"):
        raise InvalidArgumentError(f"{what} must be a sequence of strings, one per row, got {shown(ids)}")
    else:
        values = list(ids)  # type: ignore[call-overload]
        for row, value in enumerate(values):
            if value is not None and not isinstance(value, str):
                raise InvalidArgumentError(f"{what} must be strings, got {shown(value)} at row {row}")
        try:
            array = pa.array(values, pa.string())
        except UnicodeEncodeError:  # a lone surrogate: name its row
            _refuse_first_bad(values, what)
            raise
    if len(array) != rows:
        raise InvalidArgumentError(f"{what} has {len(array)} ids for a batch of {rows} rows")
    if array.null_count:
        row = pc.index(pc.is_null(array), True).as_py()
        raise InvalidArgumentError(f"{what} has a null at row {row}: every row needs an id")
    sizes = pc.binary_length(array)
    # Valid UTF-8 as Arrow's string arrays must be (one built from Python refuses a lone surrogate);
    # a row is looked at in Python only to name the first one at fault.
    if rows and (pc.min(sizes).as_py() < 1 or pc.max(sizes).as_py() > MAX_MESSAGE_ID_BYTES):
        _refuse_first_bad(array.to_pylist(), what)
    return array.cast(pa.string())


def _refuse_first_bad(ids: list[object], what: str) -> None:
    """Raise ``InvalidArgumentError`` naming the first id of ``ids`` that is not a message id."""
    for row, value in enumerate(ids):
        problem = None if value is None else message_id_problem(value)
        if problem is not None:
            raise InvalidArgumentError(f"{what}, row {row}: {problem}")


def with_message_ids(headers: pa.Array | None, ids: pa.Array) -> pa.Array:
    """A ``headers`` column (``None``: none) with each row's id as its ``Nats-Msg-Id`` header,
    replacing one the row had."""
    count = len(ids)
    if headers is None or headers.null_count == len(headers) or len(pc.list_flatten(headers)) == 0:
        entries = pa.StructArray.from_arrays(
            [pa.array([MSG_ID_HEADER] * count, pa.string()), ids.cast(pa.binary())], names=["key", "value"]
        )
        offsets = pa.array(range(count + 1), pa.int32())
        return pa.ListArray.from_arrays(offsets, entries, type=HEADER_TYPE)
    rows = []
    for row, message_id in zip(headers.to_pylist(), ids.to_pylist(), strict=True):
        kept = [h for h in (row or ()) if h["key"] != MSG_ID_HEADER]
        rows.append([*kept, {"key": MSG_ID_HEADER, "value": message_id.encode()}])
    return pa.array(rows, HEADER_TYPE)
