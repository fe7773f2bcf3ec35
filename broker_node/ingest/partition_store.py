"""Storing: appends to one partition, one at a time in arrival order, each message's outcome.

Appends run in a worker thread, one at a time per partition, so the event
loop goes on receiving (for this partition and every other) while a write or
a compaction holds the log; a small batch whose log is free is written on the
loop (see :meth:`PartitionStore._append`).  ``ALL`` messages are refused with
``not_enough_replicas`` before anything is stored while fewer replicas than
the stream's ``min_insync_replicas`` are in sync; the others go ahead.  A
failed append becomes each message's refusal (the ack error the log's error
maps to, see :class:`~.port.LogTerms`).  An envelope batch carrying message
ids is stored without its rows that repeat an id already stored (or carried
by an earlier row); an idempotent producer's batch is stored whole (its
sequence de-duplicates it), its ids remembered, not checked.

A typed stream's partition parses the values of each batch it is given (see
:mod:`pyspark_jetstream.protocol.typed_values`) and stores nothing of a batch
in which some do not match (``InvalidValuesError``).  For a coalesced batch
the messages that do not match become :class:`Invalid` outcomes (the stream's
``on_invalid`` decides what the caller does with them) and the others are
appended again, without them.  An envelope batch is one publish with one ack:
it is refused whole, naming its first bad row, whatever ``on_invalid`` says.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.errors import ErrorCode, JetStreamError
from pyspark_jetstream.protocol.typed_values import InvalidValuesError

from .batcher import Batch
from .decoding import Whole
from .port import IngestPartition, LogTerms, MessageIds, Refusal

logger = logging.getLogger(__name__)

INLINE_BYTES = 256 * 1024
"""Batches up to this size are appended on the event loop when the log is free (see ``_append``)."""


class NewRows(NamedTuple):
    """What storing an envelope batch's rows with new message ids came to."""

    outcome: range | Refusal
    """The offsets of the rows stored, or why none was."""
    kept: list[int]
    """The rows stored, in order."""
    repeats: dict[int, int | str]
    """Rows repeating an id: ``{row: the offset stored with it, or the id an earlier row carries}``."""
    first_rows: dict[str, int]
    """The first row of each new id."""

    def offsets(self) -> dict[int, int]:
        """Each row's offset: the stored one, or the one it repeats (``outcome`` is a range)."""
        assert isinstance(self.outcome, range)
        offset_of = {row: self.outcome.start + n for n, row in enumerate(self.kept)}
        for row, original in self.repeats.items():
            offset_of[row] = original if isinstance(original, int) else offset_of[self.first_rows[original]]
        return offset_of


class Invalid(NamedTuple):
    """A message of a typed stream whose value does not match the stream's schema: nothing of it
    was stored."""

    reason: str
    """Naming the field and why (``field 'amount': ...``)."""


Outcome = int | Refusal | Invalid
"""What became of one message of a coalesced batch: its offset, or why it was not stored."""


class PartitionStore:
    """Appends to one partition, one at a time."""

    def __init__(
        self, partition: IngestPartition, terms: LogTerms, name: str, fields: dict[str, object]
    ) -> None:
        self.partition = partition
        self.terms = terms
        self._name = name
        self._fields = fields
        self._errors = terms.append_errors
        self._writing = asyncio.Lock()
        """One append at a time, in arrival order."""

    async def batch(self, batch: Batch) -> list[Outcome]:
        """Append a coalesced batch; for each message, its offset or why it was not stored (a typed
        stream's messages whose values do not match: :class:`Invalid`, the others stored)."""
        records, targets = batch.records, batch.targets
        outcomes: list[Outcome] = [(ErrorCode.STORAGE, "not stored")] * len(records)
        kept = list(range(len(records)))
        ids = list(batch.ids.items())
        if any(t is not None and t.committed for t in targets):
            try:
                self.partition.check_min_insync()
            except JetStreamError as exc:
                # Refused before storing (Kafka does the same): the others go ahead.
                kept = [i for i, t in enumerate(targets) if t is None or not t.committed]
                for i, target in enumerate(targets):
                    if target is not None and target.committed:
                        outcomes[i] = (exc.code, str(exc))
                if not kept:
                    return outcomes
                records = [records[i] for i in kept]
                ids = kept_ids(ids, kept)
        try:
            async with self._writing:
                try:
                    offsets = await self._append(records, self._bytes_of(records), ids)
                except InvalidValuesError as exc:
                    for row, reason in exc.refused.items():
                        outcomes[kept[row]] = Invalid(reason)
                    rows = [row for row in range(len(records)) if row not in exc.refused]
                    if not rows:
                        return outcomes
                    records, ids, kept = (
                        [records[r] for r in rows],
                        kept_ids(ids, rows),
                        [kept[r] for r in rows],
                    )
                    offsets = await self._append(records, self._bytes_of(records), ids)
        except self._errors as exc:
            code = self._refusal(exc, "failed to append %d messages to %s", len(records))
            for i in kept:
                outcomes[i] = (code, str(exc))
            return outcomes
        for i, offset in zip(kept, offsets, strict=True):
            outcomes[i] = offset
        return outcomes

    async def _append(self, records: list[Any], size: int, message_ids: MessageIds) -> range:
        """Append coalesced messages; a batch stored larger than the log's ``max_batch_bytes``
        goes in two appends, in order, each split again while it is too large.

        The batcher coalesces up to the ingest's own ``max_batch_bytes`` of raw messages; what
        is stored is larger when a typed stream's parsed columns go beside the values, and
        refusing every coalesced message for it would refuse messages that each fit.
        """
        try:
            return await self._append_once(records, size, message_ids)
        except self._errors as exc:
            too_large = self.terms.refusal(exc) is ErrorCode.TOO_LARGE
            if (
                not too_large
                or len(records) < 2
                or getattr(exc, "limit", None) != self.partition.max_batch_bytes
            ):
                raise
        half = len(records) // 2
        head, tail = records[:half], records[half:]
        stored = await self._append(head, self._bytes_of(head), kept_ids(message_ids, range(half)))
        after = kept_ids(message_ids, range(half, len(records)))
        rest = await self._append(tail, self._bytes_of(tail), after)
        return range(stored.start, rest.stop)

    async def _append_once(self, records: list[Any], size: int, message_ids: MessageIds) -> range:
        """Append in a worker thread -- or right here when that costs less than the hop to a thread.

        A small batch (``INLINE_BYTES``) whose log is free and does not fsync
        every append is written on the loop: the write is a few microseconds,
        the hop to a thread and back tens of them.  A busy log (a compaction
        holds it) is never waited for on the loop.
        """
        if size <= INLINE_BYTES and not self.partition.appends_sync:
            offsets = self.partition.try_append(records, message_ids=message_ids)
            if offsets is not None:
                return offsets
        return await asyncio.to_thread(self.partition.append, records, message_ids=message_ids)

    def _bytes_of(self, records: list[Any]) -> int:
        size = self.terms.size
        return sum(size(r) for r in records)

    async def whole(self, whole: Whole) -> Ack | Refusal:
        """Append an envelope batch whole: an idempotent producer's (its sequence says whether to),
        or one without message ids; its ack (correlation id not set) or why it was not stored."""
        envelope, table, ids = whole.envelope, whole.table, whole.message_ids
        producer, sequence, epoch = envelope.producer_id, envelope.sequence, envelope.producer_epoch
        partition = self.partition
        try:
            async with self._writing:
                if producer is not None and sequence is not None:
                    append = functools.partial(
                        partition.append_idempotent,
                        table,
                        producer,
                        epoch,
                        sequence,
                        target=whole.targeted,
                        message_ids=ids,
                    )
                    # One producer's message at a time: a small one on the loop when the log is
                    # free, as ``_append_once`` writes plain messages (an idempotent producer's
                    # pipeline paid a thread hop per message, and ran at 1/40 of a plain one's).
                    inline = table.get_total_buffer_size() <= INLINE_BYTES and not partition.appends_sync
                    ack = append(wait=False) if inline else None
                    if ack is None:
                        ack = await asyncio.to_thread(append)
                    assert ack is not None  # an append that may wait always answers
                    return ack
                offsets = await asyncio.to_thread(partition.append, table, message_ids=ids)
                return Ack(partition.config.name, partition.number, offsets.start, offsets[-1])
        except self._errors as exc:
            return self._refusal(exc, "failed to append a batch to %s"), str(exc)

    async def new_rows(self, table: pa.Table, ids: MessageIds) -> NewRows:
        """Append the rows of ``table`` whose message ids (``ids``) are new, one batch in row order."""
        try:
            async with self._writing:
                # Every earlier append is done: the partition knows the ids they stored.
                repeats, first_rows = find_repeats(ids, self.partition.message_id_offset)
                kept = [row for row in range(table.num_rows) if row not in repeats]
                outcome = range(0)
                if kept:
                    rows = table if len(kept) == table.num_rows else table.take(kept)
                    outcome = await asyncio.to_thread(
                        self.partition.append, rows, message_ids=kept_ids(ids, kept)
                    )
        except self._errors as exc:
            return NewRows((self._refusal(exc, "failed to append a batch to %s"), str(exc)), [], {}, {})
        return NewRows(outcome, kept, repeats, first_rows)

    def _refusal(self, exc: Exception, failure: str, *args: object) -> ErrorCode:
        """The ack error for a failed append; a storage failure is logged with its traceback."""
        code = self.terms.refusal(exc)
        if code is ErrorCode.STORAGE:
            logger.error(failure, *args, self._name, exc_info=exc, extra=self._fields)
        return code


def kept_ids(ids: MessageIds, kept: Sequence[int]) -> list[tuple[str, int]]:
    """The message ids of the rows ``kept`` (row numbers, ascending), numbered as those rows are
    once the others are left out."""
    position = {row: n for n, row in enumerate(kept)}
    return [(message_id, position[row]) for message_id, row in ids if row in position]


def find_repeats(
    ids: MessageIds, stored: Callable[[str], int | None]
) -> tuple[dict[int, int | str], dict[str, int]]:
    """Which rows of a batch repeat a message id: ``{row: the offset stored with the id, or the
    id itself when an earlier row of the batch carries it}``, and the first row of each new id."""
    repeats: dict[int, int | str] = {}
    first_rows: dict[str, int] = {}
    for message_id, row in ids:
        original = stored(message_id)
        if original is not None:
            repeats[row] = original
        elif message_id in first_rows:
            repeats[row] = message_id
        else:
            first_rows[message_id] = row
    return repeats, first_rows
