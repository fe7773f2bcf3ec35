"""``df.writeStream.format("jetstream")`` and ``df.write.format("jetstream")``.

Each Spark task sends its rows as Arrow batches ("chunks"), as an idempotent
producer, and waits for the broker's acks: the chunks for the ``stream``
option's partitions are put straight to each partition's leader over Flight
(:mod:`pyspark_jetstream.client.putting`), those for other subjects are
published on NATS in envelopes (as is everything while a broker without puts
is in the cluster).  The producer id is the
streaming query's id (stable across restarts from the same checkpoint) plus
the Spark partition; the producer epoch is the micro-batch id and the
sequence is the chunk number (from 0, per log partition).  A task that runs
again for the same micro-batch -- a retried task, or a query restarted from
its checkpoint -- sends the same producer ids, epochs and sequences, and the
broker stores each chunk once: exactly once into the log, as long as the
query's output for a micro-batch is deterministic (the same rows in the same
Spark partitions).

A chunk refused with a retriable error (a storage error, a timeout, a leader
change) is sent again, in order with the chunks after it: the broker refuses
a sequence that skips one (out of order), so a chunk never lands after one
that failed, and a chunk whose ack was lost is acked again as a duplicate.

On a secured deployment the options' credentials go to NATS and to every
broker.  A principal without ``write`` on the stream is refused by
nats-server itself: the publish is dropped and no broker ever acks it; the
client fails that ack at once with ``PermissionDeniedError`` (naming the
principal and the stream), which is not retried, so the task fails instead of
waiting out the timeout of every attempt.

Input columns: ``value`` (binary or string, required), and optionally
``key`` (binary or string), ``headers`` (``array<struct<key:string,
value:binary>>``), ``partition`` (int), ``subject`` (string: publish there
instead of to the ``stream`` option's partition) and ``messageId`` (string:
each row's ``Nats-Msg-Id`` header, so consumers that read JetStream's
message ids see them; a null or an invalid id fails the write naming the
column and row).  Other columns are ignored.  The sink's own exactly-once
comes from its producer sequences: rows with ids are stored as the chunk
carries them, and the broker remembers their ids, so a later publish of the
same id by anyone else is a duplicate within the stream's window.

Typed rows: into a typed stream (the ``stream`` option names one with a
schema), input without a ``value`` column is written as typed rows: every
column but the sink's own (``key``, ``headers``, ``partition``, ``subject``,
``messageId``) is a field of the schema's current version, and the rows go
as Arrow columns of those fields (see
:mod:`pyspark_jetstream.protocol.typed_rows`), never as JSON; the partition
leader checks them and stores them as the frame's typed columns, and each
row's value is their JSON text.  Checked at planning, in one line naming the
column: a column that is not a field, a missing non-nullable field, a type
that cannot be cast to the field's without losing values, and a ``value``
column beside fields (a typed row's value is rendered from its fields: write
one or the other).  Values that do not fit (an integer out of a narrower
type's range, a null in a non-nullable field, NaN) fail the task's first
batch holding one, naming the column.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
import uuid
import zlib
from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from pyspark_jetstream.client.sync import SyncClient
from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.envelope import MAX_SEQUENCE, typed_batch, typed_fields_apart
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    RequestTimeoutError,
    UnavailableError,
)
from pyspark_jetstream.protocol.headers import checked_message_ids, with_message_ids
from pyspark_jetstream.protocol.put import PUTS_FEATURE
from pyspark_jetstream.protocol.schema import HEADER_TYPE
from pyspark_jetstream.protocol.streams import StreamConfig, partition_subject
from pyspark_jetstream.protocol.subjects import subject_matches
from pyspark_jetstream.protocol.typed_rows import conform

from . import unpickle
from .options import SinkOptions
from .planning import SinkPlan

logger = logging.getLogger(__name__)

IN_FLIGHT_CHUNKS = 8
"""Chunks a task publishes ahead of their acks (each up to ``maxBatchBytes``)."""
SEND_ATTEMPTS = 5
"""Times a chunk is sent before a retriable error fails the task."""
RETRY_BACKOFF = 0.2
"""Seconds before the first resend; doubled for each further attempt."""
ACK_WAIT_TIMEOUTS = 3
"""A chunk put over Flight is resent after this many of the options' ``timeout`` without an ack."""
_PAYLOAD_TYPES = {"key": pa.binary(), "value": pa.binary(), "headers": HEADER_TYPE}
"""Input columns that travel in the envelope, and their types there."""
SINK_COLUMNS = frozenset({"key", "value", "headers", "partition", "subject", "messageid"})
"""The sink's own input columns (lower-cased, as Spark compares names); in typed rows, every other
column is a field."""


def typed_input(schema: StructType, config: StreamConfig | None) -> bool:
    """Whether the input is written as typed rows: into a typed stream, without a ``value`` column."""
    return (
        config is not None
        and config.schema is not None
        and "value" not in {f.name.lower() for f in schema.fields}
    )


def check_input_schema(
    schema: StructType, options: SinkOptions, config: StreamConfig | None = None, *, known: bool = True
) -> None:
    """Fail at planning, naming the column, if the input cannot be written into the stream of
    ``config`` (typed rows are checked against its schema).  ``known=False``: the stream's
    configuration is not known yet, so input without ``value`` may still be typed rows."""
    names = {f.name.lower(): f for f in schema.fields}
    if config is not None and config.schema is not None:
        fields = [f.name for f in schema.fields if f.name.lower() not in SINK_COLUMNS]
        if "value" in names and fields:
            raise InvalidArgumentError(
                f"column {names['value'].name!r} beside the fields {', '.join(fields)} of typed stream "
                f"{config.name!r}: a typed row's value is the JSON of its fields; drop 'value' to write "
                "typed rows, or the fields to write JSON values"
            )
    if typed_input(schema, config):
        assert config is not None and config.schema is not None
        data = [f for f in schema.fields if f.name.lower() not in SINK_COLUMNS]
        arrow = to_arrow_schema(StructType(data), timezone="UTC")
        # The columns' types checked on no rows: a type that cannot be cast fails now, naming it.
        conform(_empty(arrow), config.schema.current, config.schema.version)
    elif "value" not in names and (known or options.stream is None):
        raise InvalidArgumentError(
            "writing to jetstream needs a 'value' column (binary or string); "
            f"the input has {schema.fieldNames()}"
        )
    allowed = {
        "key": {"binary", "string"},
        "value": {"binary", "string"},
        "partition": {"int", "bigint", "smallint"},
        "subject": {"string"},
        "messageid": {"string"},
    }
    for name, kinds in allowed.items():
        field = names.get(name)
        if field is not None and field.dataType.simpleString() not in kinds:
            raise InvalidArgumentError(
                f"column {field.name!r} is {field.dataType.simpleString()}; "
                f"it must be one of {', '.join(sorted(kinds))}"
            )
    if options.stream is None and "subject" not in names:
        raise InvalidArgumentError("set the option 'stream' or give a 'subject' column to say where rows go")


class _Publishing(unpickle.ByName):
    """The executor side shared by batch and streaming writers."""

    def __init__(self, plan: SinkPlan, schema: StructType) -> None:
        # Again, for a writer made without the data source.
        check_input_schema(schema, plan.options, plan.stream_config)
        self.plan = plan
        self.options = plan.options
        self.stream_config = plan.stream_config
        self.typed = typed_input(schema, plan.stream_config)

    def _publish(self, batches: Iterator[pa.RecordBatch], producer_id: str, epoch: int) -> int:
        context = TaskContext.get()
        task_partition = context.partitionId() if context else 0
        chunkers: dict[str, Chunker] = {}
        numbers: dict[str, int] = {}
        rows = 0
        with SyncClient(
            nats_urls=list(self.plan.nats),
            broker=self.plan.broker,
            timeout=self.options.timeout,
            credentials=self.options.credentials,
        ) as client:
            window = _Window(
                client,
                self.options.stream,
                producer_id,
                epoch,
                partitions=self._partitions(client),
                timeout=self.options.timeout,
                schema_version=self._schema_version(),
            )
            try:
                for batch in batches:
                    rows += batch.num_rows
                    for subject, part in self._route(batch, task_partition):
                        chunker = chunkers.setdefault(subject, Chunker(self.options.max_batch_bytes))
                        for chunk in chunker.add(part):
                            window.send(subject, numbers.setdefault(subject, 0), chunk)
                            numbers[subject] += 1
                for subject, chunker in chunkers.items():
                    for chunk in chunker.flush():
                        window.send(subject, numbers.setdefault(subject, 0), chunk)
                        numbers[subject] += 1
            except BaseException:
                window.abandon()  # no put is left open (an open put holds a broker's thread)
                raise
            window.close()
        return rows

    def _partitions(self, client: SyncClient) -> dict[str, int]:
        """The options' stream's partition subjects, and their numbers: what goes there is put
        straight to the partition's leader over Flight (while every broker takes puts)."""
        config = self.stream_config
        if config is None:
            return {}
        metadata = client.metadata()
        if not all(PUTS_FEATURE in b.get("features", ()) for b in metadata["brokers"]):
            logger.info("a broker of an older version does not take puts: the rows go through NATS")
            return {}
        ours = {partition_subject(config.subject, n): n for n in range(config.partitions)}
        for stream in metadata["streams"]:
            other = stream["config"]
            if other["name"] == config.name:
                continue
            listening = [partition_subject(other["subject"], n) for n in range(len(stream["partitions"]))]
            if any(subject_matches(p, s) or subject_matches(s, p) for p in listening for s in ours):
                # A put reaches only the partition's leader; on NATS, that stream stores a copy too.
                logger.info(
                    "stream %r listens on the subjects of %r: the rows go through NATS (it stores them too)",
                    other["name"],
                    config.name,
                )
                return {}
        return ours

    def _schema_version(self) -> int | None:
        """The schema version typed rows are written as (``None``: not typed rows)."""
        config = self.stream_config
        if not self.typed or config is None or config.schema is None:
            return None
        return config.schema.version

    def _route(self, batch: pa.RecordBatch, task_partition: int) -> Iterator[tuple[str, pa.RecordBatch]]:
        """Split ``batch`` by destination subject; rows keep their order within each."""
        names = {n.lower(): n for n in batch.schema.names}
        columns = {}
        for name, arrow_type in _PAYLOAD_TYPES.items():
            if name in names:
                columns[name] = batch.column(names[name]).cast(arrow_type)
        if "messageid" in names:  # each row's Nats-Msg-Id header, as JetStream publishers send it
            ids = checked_message_ids(
                batch.column(names["messageid"]), batch.num_rows, f"column {names['messageid']!r}"
            )
            columns["headers"] = with_message_ids(columns.get("headers"), ids)
        if self.typed:
            columns.update(self._fields(batch))
        payload = pa.record_batch(columns)
        if "subject" in names:
            subjects = batch.column(names["subject"])
            if subjects.null_count == 0 or self.stream_config is None:
                if subjects.null_count:
                    raise InvalidArgumentError("column 'subject' has nulls and no 'stream' option is set")
                for subject in pc.unique(subjects).to_pylist():
                    yield subject, payload.filter(pc.equal(subjects, subject))
                return
        assert self.stream_config is not None
        config = self.stream_config
        if "partition" in names:
            targets = batch.column(names["partition"]).cast(pa.int32())
            bad = pc.or_(
                pc.is_null(targets), pc.or_(pc.less(targets, 0), pc.greater_equal(targets, config.partitions))
            )
            if pc.any(bad).as_py():
                raise InvalidArgumentError(
                    f"column 'partition' has values outside 0..{config.partitions - 1} "
                    f"of stream {config.name!r}"
                )
        elif config.partitions == 1:
            targets = None
            fixed = 0
        elif "key" in names and payload.column("key").null_count < payload.num_rows:
            # A keyed row goes where the client sends its key; a row whose key is null goes
            # where rows without a key column go (the task's partition), as Kafka spreads them.
            spread = task_partition % config.partitions
            keys = payload.column("key").to_pylist()
            targets = pa.array(
                [spread if k is None else zlib.crc32(k) % config.partitions for k in keys], pa.int32()
            )
        else:
            targets = None
            fixed = task_partition % config.partitions
        if targets is None:
            yield partition_subject(config.subject, fixed), payload
            return
        for number in pc.unique(targets).to_pylist():
            yield partition_subject(config.subject, number), payload.filter(pc.equal(targets, number))

    def _fields(self, batch: pa.RecordBatch) -> dict[str, pa.Array]:
        """The typed columns of ``batch``: its columns but the sink's, as the schema's fields."""
        config = self.stream_config
        assert config is not None and config.schema is not None
        data = batch.select([n for n in batch.schema.names if n.lower() not in SINK_COLUMNS])
        typed = conform(data, config.schema.current, config.schema.version)
        return dict(zip(typed.schema.names, typed.columns, strict=True))


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


class _Sent(NamedTuple):
    subject: str
    sequence: int
    chunk: pa.RecordBatch
    ack: concurrent.futures.Future[Ack | None]


class _Window:
    """Chunks sent ahead of their acks, resent in order after a retriable failure.

    A chunk for one of the options' stream's partitions (``partitions``: their subjects and
    numbers) is put straight to the partition's leader over Flight; one for another subject is
    published on NATS."""

    def __init__(
        self,
        client: SyncClient,
        stream: str | None,
        producer_id: str,
        epoch: int,
        *,
        partitions: dict[str, int],
        timeout: float,
        schema_version: int | None = None,
    ) -> None:
        self.client = client
        self.stream = stream
        self.producer_id = producer_id
        self.epoch = epoch
        self.partitions = partitions
        self.ack_timeout = ACK_WAIT_TIMEOUTS * timeout
        """Seconds a put chunk's ack may take (a NATS publish's times out in the client)."""
        self.putter = client.putter(producer_id, epoch)
        self.schema_version = schema_version
        """Typed rows' (their fields' columns are put as a typed batch of it), or ``None``."""
        self._sent: deque[_Sent] = deque()

    def close(self) -> None:
        """Wait for every ack (as :meth:`drain`), then end the puts (without waiting for a broker
        that no longer answers, when the task fails)."""
        try:
            self.drain()
        except BaseException:
            self.abandon()
            raise
        self.putter.close()

    def abandon(self) -> None:
        """The task failed: end the puts without waiting for their acks."""
        self.putter.close(error=UnavailableError(f"the task of {self.producer_id} failed"))

    def send(self, subject: str, sequence: int, chunk: pa.RecordBatch) -> None:
        """Publish ``chunk``; first wait for the oldest ack if the window is full."""
        if len(self._sent) >= IN_FLIGHT_CHUNKS:
            # Flow control: a broker (and nats-server, which drops slow consumers)
            # is never sent more than a few chunks ahead of its acks.
            oldest = self._sent.popleft()
            if self._failure(oldest) is not None:
                self._recover([oldest, *self._sent])
                self._sent.clear()
        self._sent.append(_Sent(subject, sequence, chunk, self._submit(subject, sequence, chunk)))

    def drain(self) -> None:
        """Wait for every ack, resending what failed; raise what cannot be stored."""
        sent, self._sent = list(self._sent), deque()
        if any(self._failure(s) is not None for s in sent):
            self._recover(sent)

    def _submit(
        self, subject: str, sequence: int, chunk: pa.RecordBatch
    ) -> concurrent.futures.Future[Ack | None]:
        if sequence > MAX_SEQUENCE:
            raise InvalidArgumentError(f"more than {MAX_SEQUENCE + 1} chunks in one task for {subject}")
        partition = self.partitions.get(subject)
        if partition is not None and self.stream is not None:
            put = self._typed(chunk) if self.schema_version is not None else chunk
            return self.putter.send(self.stream, partition, sequence, put)  # type: ignore[return-value]
        return self.client.publish_batch_nowait(
            self.stream,
            chunk,
            subject=subject,
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            sequence=sequence,
        )

    def _typed(self, chunk: pa.RecordBatch) -> pa.RecordBatch:
        """Typed rows (the fields' columns, conformed, beside ``key`` and ``headers``) as the typed
        batch a publish would send (see :func:`~pyspark_jetstream.protocol.envelope.typed_batch`)."""
        assert self.schema_version is not None
        fields, others = typed_fields_apart(chunk)
        return typed_batch(fields, self.schema_version, others)

    def _recover(self, sent: list[_Sent]) -> None:
        """Every chunk of ``sent`` whose ack failed is sent again, one at a time, in order."""
        for item in sent:
            error = self._failure(item)
            attempt = 1
            while error is not None:
                if not error.retriable or attempt >= SEND_ATTEMPTS:
                    raise error
                logger.warning(
                    "resending chunk %d of %s to %s (attempt %d): %s",
                    item.sequence,
                    self.producer_id,
                    item.subject,
                    attempt + 1,
                    error,
                )
                time.sleep(RETRY_BACKOFF * 2 ** (attempt - 1))
                attempt += 1
                error = self._failure(
                    item._replace(ack=self._submit(item.subject, item.sequence, item.chunk))
                )

    def _failure(self, sent: _Sent) -> JetStreamError | None:
        """The error the chunk's ack carried (waiting for it), or ``None`` if it is stored.

        A publish NATS refused (no write grant) is never acked by a broker: the
        client fails its ack with ``PermissionDeniedError`` as soon as NATS
        reports the refusal.
        """
        try:
            sent.ack.result(self.ack_timeout)
        except JetStreamError as exc:
            return exc
        except concurrent.futures.TimeoutError:
            error = RequestTimeoutError(
                f"chunk {sent.sequence} of {self.producer_id} to {sent.subject} was not acked "
                f"within {self.ack_timeout:g}s"
            )
            partition = self.partitions.get(sent.subject)
            if partition is not None and self.stream is not None:
                self.putter.abandon(self.stream, partition, error)
            return error
        return None


class Chunker:
    """Cuts a stream of rows into chunks of at most ``max_bytes`` (at least one row each).

    Where a chunk ends depends only on the sequence of rows, not on how they
    arrived in batches: a task that runs again produces the same chunks, so
    their sequence numbers match and the broker drops the repeats.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0

    def add(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """Take ``batch``; yield every chunk it completes."""
        sizes = _row_sizes(batch)
        start = 0
        while start < batch.num_rows:
            room = self.max_bytes - self._pending_bytes
            fits = pc.sum(pc.less_equal(pc.cumulative_sum(sizes.slice(start)), room)).as_py() or 0
            if fits == batch.num_rows - start:  # all the rest fits: keep it for the next chunk
                self._pending.append(batch.slice(start))
                self._pending_bytes += pc.sum(sizes.slice(start)).as_py() or 0
                return
            take = max(fits, 0 if self._pending else 1)
            yield pa.concat_batches([*self._pending, batch.slice(start, take)])
            self._pending, self._pending_bytes = [], 0
            start += take

    def flush(self) -> Iterator[pa.RecordBatch]:
        """Yield what is left."""
        if self._pending:
            yield pa.concat_batches(self._pending)
            self._pending, self._pending_bytes = [], 0


def _row_sizes(batch: pa.RecordBatch) -> pa.Array:
    """Bytes per row counted toward a chunk: key, value and header values, plus 16 of overhead;
    typed rows (no value): their fields' bytes instead of the value's."""
    if "value" in batch.schema.names:
        sizes = pc.add(pc.fill_null(pc.binary_length(batch.column("value")), 0), 16)
    else:
        sizes = pa.repeat(pa.scalar(16, pa.int64()), batch.num_rows)
        for name in batch.schema.names:
            if name not in ("key", "headers"):
                sizes = pc.add(sizes, _value_sizes(batch.column(name)))
    if "key" in batch.schema.names:
        sizes = pc.add(sizes, pc.fill_null(pc.binary_length(batch.column("key")), 0))
    return sizes.cast(pa.int64())


def _value_sizes(array: pa.Array) -> pa.Array:
    """Bytes of each value of a typed column as an Arrow IPC batch holds it (at least: a value's
    bytes, and its offset and validity bit), a function of the value alone."""
    data_type = array.type
    if pa.types.is_string(data_type) or pa.types.is_binary(data_type):
        sizes = pc.add(pc.fill_null(pc.binary_length(array).cast(pa.int64()), 0), 5)
    elif pa.types.is_struct(data_type):
        sizes = pa.repeat(pa.scalar(1, pa.int64()), len(array))
        for i in range(data_type.num_fields):
            sizes = pc.add(sizes, _value_sizes(array.field(i)))
    elif pa.types.is_list(data_type):
        items = _value_sizes(array.values)
        ends = pc.cumulative_sum(pa.concat_arrays([pa.array([0], pa.int64()), items]))
        offsets = array.offsets
        spans = pc.subtract(ends.take(offsets.slice(1)), ends.take(offsets.slice(0, len(array))))
        sizes = pc.add(spans, 5)
    else:
        sizes = pa.repeat(pa.scalar(max(data_type.bit_width // 8, 1) + 1, pa.int64()), len(array))
    return sizes


class JetStreamStreamWriter(_Publishing, DataSourceStreamArrowWriter):
    """The streaming sink: exactly once into the log per micro-batch."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Publish this task's rows for the current micro-batch and wait for the acks."""
        context = TaskContext.get()
        query = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch_id = context.getLocalProperty("streaming.sql.batchId") if context else None
        if query is None or batch_id is None:
            raise InvalidArgumentError("the streaming sink runs only inside a streaming query")
        partition = context.partitionId() if context else 0
        self._publish(iterator, f"spark-{query}-{partition}", int(batch_id))
        return WriterCommitMessage()


class JetStreamBatchWriter(_Publishing, DataSourceArrowWriter):
    """The batch sink: a retried task does not store its rows twice."""

    def __init__(self, plan: SinkPlan, schema: StructType) -> None:
        super().__init__(plan, schema)
        self.job = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Publish this task's rows and wait for the acks."""
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        self._publish(iterator, f"spark-write-{self.job}-{partition}", 0)
        return WriterCommitMessage()
