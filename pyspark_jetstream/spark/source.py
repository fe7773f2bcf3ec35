"""``format("jetstream")``: the Python Data Source for Spark Structured Streaming and batch reads.

Readers plan on the driver (offsets come from the broker over Flight) and
read on executors; both keep no connection in their state, because Spark
pickles them.  ``commit`` stores the query's position as cursors in the log,
so ``jetstream status`` shows its lag and ``startingOffsets=cursor`` resumes
from it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NoReturn

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    Filter,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pyspark_jetstream.client.cluster import ClusterConnection
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.flight import ActionType
from pyspark_jetstream.protocol.read_shape import ColumnFilter

from . import unpickle
from .connections import shared_connection
from .consumers import new_consumer, split_consumer, with_consumer
from .cursors import CursorWriter
from .driver_reader import DriverReadWrapper, DriverStreamReader
from .options import (
    Offsets,
    check_option_names,
    parse_sink_options,
    parse_source_options,
)
from .planning import SinkPlan, SourcePlan, plan_sink, plan_source
from .range_reads import (
    PartitionState,
    RangeSpec,
    ReadSettings,
    describe,
    describe_configs,
    limit_rows,
    plan_ranges,
    resolve,
)
from .tasks import group_ranges, read_ranges
from .typed_source import check_schema, pushable, spark_struct, unreadable, value_fields

logger = logging.getLogger(__name__)

# Executors load the source's objects through this module, sent with them: see its docstring.
cloudpickle.register_pickle_by_value(unpickle)


def connection(plan: SourcePlan) -> ClusterConnection:
    """The process's connection for ``plan`` (readers themselves must stay picklable): queries of
    different principals or brokers never share one (see :mod:`.connections`)."""
    return shared_connection(
        plan.broker,
        plan.options.credentials,
        plan.options.timeout,
        plan.options.addresses.connect_timeout,
    )


class JetStreamDataSource(unpickle.ByName, DataSource):
    """Streams of a pyspark-jetstream deployment as a Spark source and sink."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        # Spark makes the data source when the query is planned (load(), save()): a mistyped
        # option name fails there, before a reader or writer exists.
        check_option_names(self.options)

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.readStream.format("jetstream")``."""
        return "jetstream"

    def schema(self) -> StructType:
        """Rows like Spark's Kafka source, with ``stream`` for ``topic``; a typed stream's fields in
        place of ``value`` (see :mod:`.typed_source`), described now."""
        # Spark does not say whether a batch or a streaming read asks: options of batch reads
        # only say it is one; otherwise the streaming rules (the laxer about startingOffsets).
        streaming = not any(name.lower().startswith(("ending", "pushfilters")) for name in self.options)
        options = parse_source_options(self.options, streaming=streaming)
        plan = plan_source(options)
        return spark_struct(options.include_headers, value_fields(connection(plan), options))

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader (``spark.read.format("jetstream")``)."""
        plan = plan_source(parse_source_options(self.options, streaming=False))
        fields = _checked_fields(plan, schema)
        if plan.options.push_filters:
            return JetStreamFilteringBatchReader(plan, schema, fields)
        return JetStreamBatchReader(plan, schema, fields)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A streaming reader (``spark.readStream.format("jetstream")``): with ``readMode=driver``,
        :meth:`simpleStreamReader`'s in PySpark's wrapper (which keeps the rows it reads in the
        driver and hands them to the JVM: see :mod:`.driver_reader`).

        Never raises: PySpark 4.2's stream-reader runner calls ``stop()`` on
        the reader it failed to make, so an error here would end the query
        with its ``UnboundLocalError`` instead of ours.  Options that cannot be
        used give a reader that raises their error at Spark's first call.
        """
        try:
            options = parse_source_options(self.options, streaming=True)
            if options.read_mode == "driver":
                return DriverReadWrapper(self.simpleStreamReader(schema))
            plan = plan_source(options)
            return JetStreamStreamReader(plan, schema, _checked_fields(plan, schema))
        except Exception as exc:  # noqa: BLE001 -- raised again by the reader's first method
            return RefusedStreamReader(exc)

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        """The streaming reader of ``readMode=driver`` (PySpark asks :meth:`streamReader` first,
        which hands this one over in that mode)."""
        plan = plan_source(parse_source_options(self.options, streaming=True))
        return DriverStreamReader(JetStreamStreamReader(plan, schema, _checked_fields(plan, schema)))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch writer (``df.write.format("jetstream")``); ``mode("append")`` only."""
        from .sink import JetStreamBatchWriter

        if overwrite:
            raise InvalidArgumentError(
                "a stream is an append-only log: mode('overwrite') cannot replace what it holds; "
                "use mode('append')"
            )
        return JetStreamBatchWriter(self._sink_plan(schema), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """A streaming writer (``df.writeStream.format("jetstream")``), exactly once into the log."""
        from .sink import JetStreamStreamWriter

        return JetStreamStreamWriter(self._sink_plan(schema), schema)

    def _sink_plan(self, schema: StructType) -> SinkPlan:
        """The writer's options parsed and its input columns checked, then its plan (the first network
        call: the stream's configuration), and the input checked against that too."""
        from .sink import check_input_schema

        options = parse_sink_options(self.options)
        check_input_schema(schema, options, known=False)  # what needs no stream's configuration
        plan = plan_sink(options)
        check_input_schema(schema, options, plan.stream_config)  # typed rows: against its schema
        return plan


def _checked_fields(plan: SourcePlan, schema: StructType) -> pa.Schema | None:
    """The typed fields the reader reads (see :func:`.typed_source.value_fields`), once
    ``schema`` (Spark's, perhaps the user's) is checked to be the source's."""
    fields = value_fields(connection(plan), plan.options)
    check_schema(schema, spark_struct(plan.options.include_headers, fields))
    return fields


class _Reading(unpickle.ByName):
    """What batch and stream readers share: the options, the schema and the executor read."""

    def __init__(self, plan: SourcePlan, schema: StructType, fields: pa.Schema | None = None) -> None:
        self.plan = plan
        self.options = plan.options
        self.schema = schema
        self.fields = fields
        """A typed stream's fields read as columns (``None``: ``value`` as bytes)."""
        self.filters: tuple[ColumnFilter, ...] = ()
        """Filters the broker applies (pushed by Spark to a :class:`JetStreamFilteringBatchReader`)."""
        self._layout: dict[str, dict[str, PartitionState]] = {}
        """The partitions' offsets as last described on the driver: the ranges planned carry them."""
        self._judged: dict[str, str | None] = {}
        """Streams matching ``streamPattern`` seen so far, and why one cannot be read (``None``: it can)."""

    def _describe(self, conn: ClusterConnection) -> dict[str, dict[str, PartitionState]]:
        layout = describe(conn, self.options)
        if self.fields is not None and self.options.stream_pattern is not None:
            layout = self._readable(conn, layout)
        self._layout = layout
        return self._layout

    def _readable(
        self, conn: ClusterConnection, layout: dict[str, dict[str, PartitionState]]
    ) -> dict[str, dict[str, PartitionState]]:
        """``layout`` without the streams matching ``streamPattern`` whose rows cannot be read as
        the query's typed fields (see :func:`.typed_source.unreadable`), each judged once."""
        if set(layout) - set(self._judged):
            reasons = unreadable(describe_configs(conn, self.options), self.fields)
            for stream in set(layout) - set(self._judged):
                self._judged[stream] = reasons.get(stream)
                if reasons.get(stream):
                    logger.warning(
                        "stream %s matches streamPattern %r but %s: left out of this query (read it with "
                        "valueFormat=binary, or in a query of its own)",
                        stream,
                        self.options.stream_pattern,
                        reasons[stream],
                    )
        return {stream: parts for stream, parts in layout.items() if self._judged.get(stream) is None}

    def _ranges(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        ranges = plan_ranges(self.plan.broker, self.options, start, end, self._layout)
        return [InputPartition(task) for task in group_ranges(ranges, self.options)]

    def _cursors(self, layout: Mapping[str, Mapping[str, object]]) -> dict[str, dict[str, int | None]]:
        conn = connection(self.plan)
        return {
            stream: {
                p: conn.action(
                    ActionType.FETCH_CURSOR,
                    {"consumer": self.options.consumer_id, "stream": stream, "partition": int(p)},
                )["offset"]
                for p in partitions
            }
            for stream, partitions in layout.items()
        }

    def _start(self, conn: ClusterConnection, layout: dict[str, dict[str, PartitionState]]) -> Offsets:
        cursors = self._cursors(layout) if self.options.starting == "cursor" else None
        return resolve(
            conn,
            self.options.starting,
            self.options.starting_timestamp,
            layout,
            cursors,
            by_timestamp=self.options.starting_by_timestamp,
            no_match=self.options.by_timestamp_strategy,
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """On an executor: the range's batches, in exactly Spark's Arrow schema."""
        specs: tuple[RangeSpec, ...] | None = partition.value
        if not specs:  # Spark runs one empty task when the plan has no range
            return
        target = to_arrow_schema(self.schema, timezone="UTC")
        settings = ReadSettings(
            fail_on_data_loss=self.options.fail_on_data_loss,
            timeout=self.options.timeout,
            from_replicas=self.options.read_from_replicas,
            credentials=self.options.credentials,
            filters=self.filters,
        )
        yield from read_ranges(specs, target, settings)


class JetStreamBatchReader(_Reading, DataSourceReader):
    """Reads ``[startingOffsets, endingOffsets)`` of every partition once."""

    def partitions(self) -> Sequence[InputPartition]:
        """One task per partition range (long ranges split so every core works)."""
        conn = connection(self.plan)
        layout = self._describe(conn)
        start = self._start(conn, layout)
        end = resolve(
            conn,
            self.options.ending,
            self.options.ending_timestamp,
            layout,
            by_timestamp=self.options.ending_by_timestamp,
            option="endingOffsets",
        )
        return self._ranges(start, end)


class JetStreamFilteringBatchReader(JetStreamBatchReader):
    """A batch reader that hands Spark's filters on typed fields to the broker (option
    ``pushFilters``; Spark calls :meth:`pushFilters` only with its own
    ``spark.sql.python.filterPushdown.enabled``, and refuses this reader without it)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Keep the filters the broker can apply (see :mod:`.typed_source`); return the others."""
        pushed, kept = pushable(filters, self.fields)
        self.filters = tuple(pushed)
        return kept


class JetStreamStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of committed messages, with admission control and cursors in the log."""

    _transient = ("_cursor_writer",)

    def __init__(self, plan: SourcePlan, schema: StructType, fields: pa.Schema | None = None) -> None:
        super().__init__(plan, schema, fields)
        self._target: Offsets | None = None
        self._last_batch: float | None = None
        """``time.monotonic()`` when the last micro-batch was planned (the first is never delayed)."""
        self._reported: Offsets | None = None
        """The committed ends as last described (by ``latestOffset``), for ``reportLatestOffset``."""
        self._cursor_writer: CursorWriter | None = None
        """Stores cursors in the driver's process (made there on first use; never pickled)."""
        self._consumer: str | None = None
        """The query's own consumer name, carried in its offsets (``consumerId`` not given)."""

    def initialOffset(self) -> Offsets:
        """Where a new query starts (``startingOffsets`` / ``startingTimestamp``), carrying the
        query's own consumer name unless ``consumerId`` is given (see :mod:`.consumers`)."""
        conn = connection(self.plan)
        if not self.options.consumer_given:
            self._consumer = new_consumer()
        return with_consumer(self._start(conn, self._describe(conn)), self._consumer)

    def _own(self, offsets: Offsets) -> Offsets:
        """``offsets`` from Spark without the consumer name they carry, which is taken as this
        query's; offsets of an older checkpoint carry none, and keep the options' name."""
        found, plain = split_consumer(offsets)
        if not self.options.consumer_given:
            self._consumer = found
        return plain

    @property
    def consumer(self) -> str:
        """The name the query's cursors are stored under."""
        return self._consumer or self.options.consumer_id

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxRecordsPerTrigger`` as a read limit, if set."""
        limit = self.options.max_records_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of a ``Trigger.AvailableNow`` run at what is committed now."""
        self._target = self._latest()

    def reportLatestOffset(self) -> Offsets:
        """The committed end of every partition, for the query's progress: as ``latestOffset``
        found it just before (Spark asks right after it), so no call of its own."""
        return self._reported if self._reported is not None else self._latest()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        """The end of the next micro-batch (see :meth:`_next_end`), carrying the query's consumer name."""
        self._check_cursors()
        return with_consumer(self._next_end(self._own(start), limit), self._consumer)

    def _next_end(self, start: Offsets, limit: ReadLimit) -> Offsets:
        """The end of the next micro-batch: the committed end, within ``limit``.

        Partitions that appeared since ``start`` (new partitions, or new
        streams matching ``streamPattern``) are read from their beginning.

        Spark calls this once the micro-batch ending at ``start`` has
        completed, so ``start`` is stored as the query's cursors here, in
        the background while there is more to read; with nothing new (the
        query caught up, or the last batch of ``Trigger.AvailableNow`` done)
        it waits for the store, so the cursors of a query that caught up are
        at its end.  With ``minOffsetsPerTrigger``,
        fewer new messages than that plan no batch until ``maxTriggerDelay``
        has passed since the last one (as in Spark's Kafka source).
        """
        self._store(start)
        latest = self._latest()
        if self._target is not None:
            latest = {
                stream: {
                    p: min(end, self._target.get(stream, {}).get(p, start.get(stream, {}).get(p, 0)))
                    for p, end in parts.items()
                }
                for stream, parts in latest.items()
            }
        latest = {
            stream: {p: max(end, start.get(stream, {}).get(p, 0)) for p, end in parts.items()}
            for stream, parts in latest.items()
        }
        if isinstance(limit, ReadMaxRows):
            latest = limit_rows(start, latest, limit.max_rows)
        for stream, parts in start.items():  # a deleted stream keeps its last position
            latest.setdefault(stream, dict(parts))
        if self._delayed(start, latest):
            latest = start
        if latest != start:
            self._last_batch = time.monotonic()
        else:  # nothing to read now: no micro-batch waits for the cursors
            self._flush_cursors()
        return latest

    def _delayed(self, start: Offsets, latest: Offsets) -> bool:
        wanted = self.options.min_records_per_trigger
        if wanted is None or self._target is not None:  # AvailableNow reads what there is
            return False
        if self._last_batch is None or time.monotonic() - self._last_batch >= self.options.max_trigger_delay:
            return False
        available = sum(
            end - start.get(stream, {}).get(p, 0)
            for stream, parts in latest.items()
            for p, end in parts.items()
        )
        return available < wanted

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        """The micro-batch's tasks."""
        return self._ranges(self._own(start), self._own(end))

    def read_offsets(self, start: Offsets, end: Offsets) -> Iterator[pa.RecordBatch]:
        """The rows of ``[start, end)`` read here, as one task would (``readMode=driver``)."""
        ranges = plan_ranges(self.plan.broker, self.options, self._own(start), self._own(end), self._layout)
        return self.read(InputPartition(tuple(ranges)))

    def commit(self, end: Offsets) -> None:
        """Store the query's position as cursors in the log (named by ``consumerId``)."""
        self._store(self._own(end))

    def stop(self) -> None:
        """The query stops: its last position is stored as cursors (waiting up to ``timeout``; Spark
        may end the process sooner)."""
        writer = getattr(self, "_cursor_writer", None)
        if writer is not None:
            writer.close(self.options.timeout)

    def _flush_cursors(self) -> None:
        writer = getattr(self, "_cursor_writer", None)
        if writer is not None and not writer.flush(self.options.timeout):
            logger.warning("cursors of %s: still not stored after %g s", self.consumer, self.options.timeout)

    def _check_cursors(self) -> None:
        """Raise what made the cursor writer stop (another query storing this ``consumerId``)."""
        writer = getattr(self, "_cursor_writer", None)
        if writer is not None and writer.failure is not None:
            raise writer.failure

    def _store(self, position: Offsets) -> None:
        """Have cursors stored at ``position``, in the background (see :mod:`.cursors`).  They are a
        report for people and for ``startingOffsets=cursor``; Spark's checkpoint is what the query
        resumes from, so a broker that cannot take them is logged, not fatal.  With ``consumerId``
        given, cursors found moved by another query fail the query (at its next call)."""
        self._check_cursors()
        writer = getattr(self, "_cursor_writer", None)
        if writer is None:
            writer = self._cursor_writer = CursorWriter(
                lambda: connection(self.plan), self.consumer, sole_writer=self.options.consumer_given
            )
        writer.store(position)

    def _latest(self) -> Offsets:
        layout = self._describe(connection(self.plan))
        self._reported = {
            stream: {p: s.high_watermark for p, s in parts.items()} for stream, parts in layout.items()
        }
        return self._reported


class RefusedStreamReader(unpickle.ByName, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming reader that could not be made: every call Spark makes raises why."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def _refuse(self) -> NoReturn:
        raise self.error

    def initialOffset(self) -> Offsets:
        """Raises the reader's error."""
        self._refuse()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        """Raises the reader's error."""
        self._refuse()

    def getDefaultReadLimit(self) -> ReadLimit:
        """Raises the reader's error."""
        self._refuse()

    def prepareForTriggerAvailableNow(self) -> None:
        """Raises the reader's error."""
        self._refuse()

    def reportLatestOffset(self) -> Offsets:
        """Raises the reader's error."""
        self._refuse()

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        """Raises the reader's error."""
        self._refuse()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Raises the reader's error."""
        self._refuse()

    def commit(self, end: Offsets) -> None:
        """Raises the reader's error."""
        self._refuse()
