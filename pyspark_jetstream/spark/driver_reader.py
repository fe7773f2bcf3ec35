"""``readMode=driver``: micro-batches read in the driver, with no Python task per micro-batch.

With ``readMode=tasks`` (the default) a micro-batch's rows are read by Spark
tasks, each run in a Python worker: the JVM hands the task to the worker,
which unpickles the reader and sends its rows back.  That costs every
micro-batch a fixed few hundred milliseconds on top of its rows, and is the
floor of a query's latency at low rates (``docs/spark-latency.md``).

PySpark's ``SimpleDataSourceStreamReader`` takes another path: when Spark
asks for the next micro-batch's end (``latestOffset``), PySpark calls the
reader's ``read(start)`` in the driver's own Python process (the one that
lives as long as the query), keeps the rows it returns, and hands them to
the JVM as Arrow with the micro-batch's plan; the micro-batch's one task
reads them in the JVM.  :class:`DriverStreamReader` is this source on that
path: ``read`` fetches every partition's committed rows from ``start`` at
once through the process's kept connection, at most :func:`driver_cap` of
them, and returns them with their end offsets.

The offsets, the consumer name they carry, the cursors, ``startingOffsets``
and the streams matching ``streamPattern`` are the task reader's own: the
driver reader keeps a :class:`~.source.JetStreamStreamReader` for them
(:class:`Positions`) and only reads differently.  When a query restarts with
a micro-batch planned but not done, Spark has no rows kept for it and reads
it again in a task (``readBetweenOffsets``): exactly the offsets the
checkpoint holds.

What it gives up: one process reads every row, so it is for low rates (a
catch-up is read :func:`driver_cap` rows at a time); no read limit but that
cap (``minOffsetsPerTrigger`` is refused); ``minPartitions`` does not apply.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import pyarrow as pa
from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.datasource_internal import _SimpleStreamReaderWrapper
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from . import unpickle
from .options import Offsets, SourceOptions

DRIVER_MAX_ROWS = 100_000
"""Rows a micro-batch of ``readMode=driver`` reads at most when ``maxRecordsPerTrigger`` is not
set: a catch-up never loads more than this into the driver at once."""


def driver_cap(options: SourceOptions) -> int:
    """The most rows one micro-batch of ``readMode=driver`` reads."""
    return options.max_records_per_trigger or DRIVER_MAX_ROWS


class Positions(Protocol):
    """What the driver reader takes from the task reader: offsets, cursors, and a range's rows."""

    @property
    def options(self) -> SourceOptions: ...

    def initialOffset(self) -> Offsets: ...

    def prepareForTriggerAvailableNow(self) -> None: ...

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets: ...

    def read_offsets(self, start: Offsets, end: Offsets) -> Iterator[pa.RecordBatch]: ...

    def commit(self, end: Offsets) -> None: ...

    def stop(self) -> None: ...


class DriverStreamReader(unpickle.ByName, SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of committed messages read in the driver (see the module docstring)."""

    def __init__(self, positions: Positions) -> None:
        """``positions``: the query's task reader, which keeps its offsets and cursors."""
        self.positions = positions

    def initialOffset(self) -> Offsets:
        """Where a new query starts (see :meth:`.JetStreamStreamReader.initialOffset`)."""
        return self.positions.initialOffset()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of a ``Trigger.AvailableNow`` run at what is committed now."""
        self.positions.prepareForTriggerAvailableNow()

    def read(self, start: Offsets) -> tuple[Iterator[pa.RecordBatch], Offsets]:
        """The committed rows from ``start`` (at most :func:`driver_cap` of them, shared over the
        partitions as ``maxRecordsPerTrigger`` shares them), read now, and where they end."""
        end = self.positions.latestOffset(start, ReadMaxRows(driver_cap(self.positions.options)))
        return self.readBetweenOffsets(start, end), end

    def readBetweenOffsets(self, start: Offsets, end: Offsets) -> Iterator[pa.RecordBatch]:
        """Exactly the rows of ``[start, end)``, read now, in Spark's Arrow schema (every
        partition's first read asked for at once)."""
        # A list's iterator: PySpark copies it to hand the kept rows over (a generator cannot be).
        return iter(list(self.positions.read_offsets(start, end)))

    def commit(self, end: Offsets) -> None:
        """Store the query's position as cursors (see :meth:`.JetStreamStreamReader.commit`)."""
        self.positions.commit(end)

    def stop(self) -> None:
        """The query stops: its last position is stored as cursors."""
        self.positions.stop()


class DriverReadWrapper(unpickle.ByName, _SimpleStreamReaderWrapper):
    """PySpark's wrapper of a ``SimpleDataSourceStreamReader`` (what makes its runner keep the rows
    ``read`` returns and hand them to the JVM), passing ``stop()`` on: PySpark 4.2's own drops it,
    and the reader's last cursors are stored there."""

    def stop(self) -> None:
        """Stop the driver reader."""
        if isinstance(self.simple_reader, DriverStreamReader):
            self.simple_reader.stop()
