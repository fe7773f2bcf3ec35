"""The batches a read sends: the log's columns as stored, a typed stream's fields, the rows kept.

The wire form is :mod:`pyspark_jetstream.protocol.read_shape`'s.  A read that
asks for no typed field and no filter (every read of an untyped stream, and
of a typed one with a ``columns`` list of log columns only) sends the log's
batches as read, the chosen columns selected without a copy.  Otherwise each
batch is read with the typed columns stored in its frame
(:meth:`~broker_node.log.LogStore.read_typed`), which are turned into the
stream's current schema version (nulls where a frame has none, or a field
was added since), filtered, and projected.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from broker_node.log import LogStore, TypedRead
from pyspark_jetstream.protocol.flight import ReadRequest
from pyspark_jetstream.protocol.joined_batches import joined as join_small
from pyspark_jetstream.protocol.read_shape import filter_mask, read_schema, typed_fields
from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.typed_values import as_version
from pyspark_jetstream.protocol.value_schema import StreamSchema

SMALL_ROWS = 1_024
"""A stored batch of fewer rows is sent joined with its small neighbours (see :func:`joined`)."""
JOINED_ROWS = 65_536
"""Rows of one joined batch at most."""


def joined(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """``batches`` with each run of small ones joined (see
    :mod:`pyspark_jetstream.protocol.joined_batches`): 4,000 one-message batches made a read of
    4,000 messages cost a Spark micro-batch ~300 ms, most of it in the reader."""
    return join_small(batches, small_rows=SMALL_ROWS, most_rows=JOINED_ROWS)


@dataclass(frozen=True, slots=True)
class ReadBatches:
    """What one read of the log gives a reader."""

    batches: list[pa.RecordBatch]
    """The batches to send (rows a filter drops are gone, batches left empty too)."""
    last_offset: int | None
    """The last offset read, filtered out or not (``None`` if nothing was in range)."""


class ReadShape:
    """The response's columns and rows for one read request on one stream (checked when made:
    an unknown column, or a filter the columns cannot take, raises ``InvalidArgumentError``)."""

    def __init__(self, request: ReadRequest, schema: StreamSchema | None) -> None:
        self.schema = read_schema(schema, request.columns)
        """The response's schema (without the offsets' metadata)."""
        self.filters = request.filters
        self._stream_schema = schema
        self._projected = request.columns is not None and self.schema.names != LOG_SCHEMA.names
        every = read_schema(schema)
        if self.filters:
            filter_mask(_empty(every), self.filters)  # refuses a filter the columns cannot take
        typed = set() if schema is None else set(typed_fields(schema).names)
        wanted = set(self.schema.names) | {f.column for f in self.filters}
        self._typed = [f for f in every if f.name in typed and f.name in wanted]
        """The typed fields the response or its filters need (none: the log's batches as read)."""

    def read(
        self, log: LogStore, start: int, *, max_records: int | None, max_bytes: int | None, upper_bound: int
    ) -> ReadBatches:
        """Read from ``start`` (see :meth:`~broker_node.log.LogStore.read`) and shape the batches."""
        if not self._typed:
            batches = log.read(start, max_records=max_records, max_bytes=max_bytes, upper_bound=upper_bound)
            last = batches[-1].column(0)[-1].as_py() if batches else None
            batches = joined(batches)  # first: the filter and the projection once per joined batch
            if self.filters:
                batches = [b.filter(filter_mask(b, self.filters)) for b in batches]
                batches = [b for b in batches if b.num_rows]
            if self._projected:
                batches = [b.select(self.schema.names) for b in batches]  # zero-copy
            return ReadBatches(batches, last)
        reads = log.read_typed(start, max_records=max_records, max_bytes=max_bytes, upper_bound=upper_bound)
        last = reads[-1].batch.column(0)[-1].as_py() if reads else None
        out = []
        for read in reads:
            batch = self._with_typed(read)
            if self.filters:
                batch = batch.filter(filter_mask(batch, self.filters))
                if not batch.num_rows:
                    continue
            out.append(batch.select(self.schema.names))
        return ReadBatches(joined(out), last)

    def _with_typed(self, read: TypedRead) -> pa.RecordBatch:
        """The batch's log columns and the typed fields needed, as the stream's current version."""
        assert self._stream_schema is not None
        batch = read.batch
        rows = batch.num_rows
        current = None if read.typed is None else as_version(read.typed, self._stream_schema)
        columns = list(batch.columns)
        for field in self._typed:
            index = -1 if current is None else current.schema.get_field_index(field.name)
            columns.append(
                current.column(index) if current is not None and index >= 0 else pa.nulls(rows, field.type)
            )
        return pa.RecordBatch.from_arrays(columns, schema=pa.schema(list(LOG_SCHEMA) + self._typed))


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
