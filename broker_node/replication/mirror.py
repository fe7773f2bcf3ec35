"""A mirror partition's copier: its leader appends what the source partition holds, at its offsets.

A mirror's partition is led like any other (its leader has followers in its
own cluster, an ISR and a high watermark); what differs is where its appends
come from.  Ingest is refused (:meth:`Partition.append` names the source);
instead one :class:`MirrorCopier` per mirrored partition led here reads the
source partition (:class:`~.source_cluster.SourceCluster`: consumer reads of
committed rows, from the mirror's log end offset) and appends each row at
the source's offset (:meth:`Partition.append_mirrored`, the log's replicated
append), with the source's timestamp, key, value, headers, subject and
producer fields.  Only the ``leader_epoch`` column is restamped with the
mirror leader's own epoch: the mirror cluster's followers truncate by it,
and a promoted mirror goes on appending in it.  A typed stream's values are
parsed under the mirror's schema (the source's: versions the source added
are brought over before rows read after them are stored), so its batches
carry typed columns as the source's do.

Why it never leaves a gap or a duplicate: every read starts at the mirror's
own log end offset, and the log refuses a batch that overlaps what it holds.
A gap appears only where the source has one (its compaction).  A source
whose log starts after the mirror's end (retention deleted the rest) starts
the mirror over at the source's log start, as a follower does.  The copier
does not trust a source blindly: when it starts it compares the mirror's last
message with the source's message at that offset, and a source whose log
ends before the mirror's end, or whose message there differs, stops the
copier with one line naming the offsets (an unclean election on the source
rewrote what was copied; the operator decides).

Errors: a source leader that moved is looked up again at once; a source
out of reach is retried with a backoff growing to :data:`BACKOFF` 's
longest; a source refusing the credentials is reported and retried after
:data:`REFUSED_PAUSE` (never in a tight loop).  The copier ends when this
broker stops leading the partition in the epoch it started in (the mirror
set starts the next one) or when the mirror is promoted.

Consumer cursors (:mod:`.mirror_cursors`) ride along: every few seconds the
copier copies the source's cursors of its partition.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pyarrow as pa

from broker_node.log import InvalidRecordsError, LogError
from broker_node.log.logging_labels import Labels
from broker_node.log.typed_frames import encode_typed_frame
from pyspark_jetstream.protocol.errors import (
    JetStreamError,
    NotLeaderError,
    OffsetOutOfRangeError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from pyspark_jetstream.protocol.mirror import MirrorSource, MirrorStatus
from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.typed_values import parse_json

from .mirror_cursors import CursorCopier, WriteCursor
from .partition import Partition
from .source_cluster import Connect, SourceCluster

logger = logging.getLogger(__name__)

BACKOFF = (0.1, 5.0)
"""First and longest pause (seconds) between attempts on a source out of reach."""
REFUSED_PAUSE = 30.0
"""Pause (seconds) after the source refused the credentials or the right to read: an operator
must change something, so asking again sooner only fills the source's logs."""
FollowSchema = Callable[[str, StreamConfig], None]
"""Gives the mirror (by name) the schema versions of the source's config (``StreamConfig``) it lacks."""
CURSOR_EVERY = 2.0
"""Seconds between copies of the source's cursors."""


class MirrorMismatchError(Exception):
    """The source's log does not continue the mirror's (one line naming the offsets)."""


class MirrorCopier:
    """Copies one source partition into the mirror partition led here (see the module docstring)."""

    def __init__(
        self,
        partition: Partition,
        connect: Connect,
        write_cursor: WriteCursor,
        *,
        follow_schema: FollowSchema | None = None,
        max_bytes: int = 8 * 1024 * 1024,
        max_wait: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        mirror = partition.config.mirror
        assert mirror is not None
        self.partition = partition
        self.mirror: MirrorSource = mirror
        self.leader_epoch = partition.leader_epoch
        self._source = SourceCluster(mirror.servers, connect)
        self._cursors = CursorCopier(self._source, mirror.stream, partition, write_cursor)
        self._follow_schema = follow_schema
        self._max_bytes = max_bytes
        self._max_wait = max_wait
        self._clock = clock
        self._stopped = threading.Event()
        self._labels = Labels(partition.stream, partition.number)
        self._log = self._labels.bind(logger)
        self._thread = threading.Thread(
            target=self._run, name=f"mirror-{partition.stream}-{partition.number}", daemon=True
        )
        self.source_leader: str | None = None
        self.state = "copying"
        self.last_error: str | None = None
        self.source_end = -1
        self._caught_up_at: float | None = None
        self._failures = 0
        self._checked = False
        """Whether the mirror's last message was compared with the source's since this copier began."""

    def start(self) -> None:
        """Begin copying on its own thread."""
        self._thread.start()

    def stop(self, wait: bool = False) -> None:
        """Stop after the read under way (at most ``max_wait`` plus a round trip)."""
        self._stopped.set()
        if wait and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(self._max_wait + 15)

    @property
    def running(self) -> bool:
        """Whether the copier's thread is still copying."""
        return self._thread.is_alive()

    def status(self) -> MirrorStatus:
        """Where the copy stands (see :class:`MirrorStatus`)."""
        end = self.partition.log.log_end_offset
        lag = max(self.source_end - end, 0) if self.source_end >= 0 else -1
        if lag == 0:
            seconds = 0.0
        elif lag > 0 and self._caught_up_at is not None:
            seconds = max(self._clock() - self._caught_up_at, 0.0)
        else:
            seconds = -1.0
        return MirrorStatus(
            stream=self.partition.stream,
            partition=self.partition.number,
            source=self.mirror.where(),
            source_leader=self.source_leader,
            state=self.state,
            mirror_end=end,
            source_end=self.source_end,
            lag_messages=lag,
            lag_seconds=round(seconds, 3),
            last_error=self.last_error or self._cursors.last_error,
        )

    # ---- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        self._log.info("mirroring %s from offset %d", self.mirror.where(), self.partition.log.log_end_offset)
        next_cursors = 0.0
        try:
            while not self._stopped.is_set():
                try:
                    self._step()
                    if time.monotonic() >= next_cursors:
                        self._cursors.copy()
                        next_cursors = time.monotonic() + CURSOR_EVERY
                    self._failures = 0
                    self.last_error = None
                    self.state = "copying"
                except MirrorMismatchError as exc:
                    self.state, self.last_error = "stopped", str(exc)
                    self._log.error("mirror stopped: %s", exc, extra=self._labels.fields)
                    return
                except (NotLeaderError, LogError) as exc:
                    if self._ours(exc):
                        self._log.info("no longer leading here in epoch %d: %s", self.leader_epoch, exc)
                        return
                    self._failed(exc, pause=0.05)  # the source's leader moved: look it up again
                except (UnauthenticatedError, PermissionDeniedError) as exc:
                    self._failed(exc, pause=REFUSED_PAUSE)
                except JetStreamError as exc:
                    self._failed(exc, pause=min(BACKOFF[0] * 2**self._failures, BACKOFF[1]))
                except Exception as exc:  # noqa: BLE001 - logged with its traceback, then retried
                    self._log.exception("mirror copy failed", extra=self._labels.fields)
                    self._failed(exc, pause=BACKOFF[1])
        finally:
            self._source.close()

    def _ours(self, exc: Exception) -> bool:
        """Whether ``exc`` came of this broker no longer leading the mirror partition in the copier's
        epoch (else it is the source's: its leader moved)."""
        partition = self.partition
        return partition.closed or not partition.is_leader or partition.leader_epoch != self.leader_epoch

    def _failed(self, exc: Exception, *, pause: float) -> None:
        self.state = "waiting"
        self.last_error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, JetStreamError) else str(exc)
        if self._failures == 0 or pause >= REFUSED_PAUSE:
            self._log.warning(
                "mirror of %s: %s", self.mirror.where(), self.last_error, extra=self._labels.fields
            )
        self._failures += 1
        self.source_leader = None
        self._checked = False
        self._stopped.wait(pause)

    def _step(self) -> None:
        """One read of the source and its append (or the check that begins a copier's work)."""
        partition = self.partition
        if not partition.is_leader or partition.leader_epoch != self.leader_epoch:
            raise NotLeaderError(
                f"{partition.stream}/{partition.number} is not led here in epoch {self.leader_epoch}"
            )
        if self.source_leader is None:
            self.source_leader = self._source.leader_address(self.mirror.stream, partition.number)
        end = partition.log.log_end_offset
        if not self._checked:
            self._check_last(end)
            self._checked = True
        try:
            read = self._source.read(
                self.source_leader,
                self.mirror.stream,
                partition.number,
                end,
                max_bytes=self._max_bytes,
                max_wait=self._max_wait,
            )
        except OffsetOutOfRangeError as exc:
            self._out_of_range(exc, end)
            return
        except NotLeaderError:
            self.source_leader = None
            raise
        self.source_end = read.high_watermark
        if read.batches:
            self._append(read.batches, end)
        if partition.log.log_end_offset >= read.high_watermark:
            self._caught_up_at = self._clock()

    def _append(self, batches: list[pa.RecordBatch], end: int) -> None:
        partition = self.partition
        first = batches[0].column(0)[0].as_py()
        if first < end:
            raise MirrorMismatchError(
                f"the source sent offset {first} for a read from {end}: its log does not continue the "
                "mirror's"
            )
        restamped = [_restamped(b, self.leader_epoch) for b in batches]
        self._follow_source_schema()
        frames: list[pa.Buffer | pa.RecordBatch] = list(restamped)
        if partition.config.schema is not None:
            frames = [self._typed_frame(batch) for batch in restamped]
        try:
            partition.append_mirrored(frames, restamped, self.leader_epoch)
        except InvalidRecordsError as exc:
            raise MirrorMismatchError(
                f"the source's batch from offset {first} does not follow the mirror's end {end}: {exc}"
            ) from None

    def _follow_source_schema(self) -> None:
        """Bring the source's newer schema versions over before its rows read just now are stored:
        they were written under a version the source had by then, so asking after the read is
        enough (a typed stream's copy costs this one call per read)."""
        schema = self.partition.config.schema
        if schema is None or self._follow_schema is None or self.source_leader is None:
            return
        source = self._source.config(self.source_leader, self.mirror.stream)
        if source.schema is not None and source.schema.version > schema.version:
            self._follow_schema(self.partition.stream, source)

    def _typed_frame(self, batch: pa.RecordBatch) -> pa.Buffer:
        """``batch`` stored with its values parsed under the mirror's schema (stored untyped if they
        do not match it, as the source stored them then)."""
        partition = self.partition
        schema = partition.config.schema
        assert schema is not None
        parsed = parse_json(batch.column("value").to_pylist(), schema)
        typed = None if parsed.refused else parsed.typed
        return encode_typed_frame(batch, typed, partition.log.config.compression)

    def _out_of_range(self, exc: OffsetOutOfRangeError, end: int) -> None:
        """The source has no offset ``end``: retention deleted it (start over at the source's log
        start), or the source's log ends before the mirror's (a mismatch)."""
        start = exc.fields.get("log_start_offset")
        if isinstance(start, int) and end < start:
            self.partition.reset_mirror(start, self.leader_epoch)
            return
        raise MirrorMismatchError(
            f"the mirror holds offsets up to {end - 1} but the source {self.mirror.where()} partition "
            f"{self.partition.number} does not reach offset {end} ({exc}); the source lost messages the "
            "mirror copied (an unclean leader election?)"
        )

    def _check_last(self, end: int) -> None:
        """Compare the mirror's message at ``end - 1`` with the source's (see the module docstring)."""
        log = self.partition.log
        if end <= log.log_start_offset:
            return
        assert self.source_leader is not None
        ours = log.read(end - 1, max_records=1, upper_bound=end)
        if not ours:
            return
        try:
            theirs = self._source.read(
                self.source_leader,
                self.mirror.stream,
                self.partition.number,
                end - 1,
                max_bytes=1 << 20,
                max_wait=0.0,
                max_records=1,
            ).batches
        except OffsetOutOfRangeError as exc:
            self._out_of_range(exc, end)
            return
        if not theirs or theirs[0].column(0)[0].as_py() != end - 1:
            return  # not committed there yet (its high watermark lags), or compacted away: read on
        mine, found = _identity(ours[-1].slice(ours[-1].num_rows - 1)), _identity(theirs[0].slice(0, 1))
        if found != mine:
            raise MirrorMismatchError(
                f"offset {end - 1} differs between the mirror and the source {self.mirror.where()} "
                f"partition {self.partition.number} (timestamps {mine[1]} and {found[1]} µs): the source's "
                "log was rewritten after it was copied"
            )


def _restamped(batch: pa.RecordBatch, epoch: int) -> pa.RecordBatch:
    """``batch`` in the log schema with every row's leader epoch ``epoch``."""
    columns = list(batch.columns)
    columns[2] = pa.array([epoch] * batch.num_rows, pa.int32())
    return pa.RecordBatch.from_arrays(columns, schema=LOG_SCHEMA)


def _identity(batch: pa.RecordBatch) -> tuple[object, ...]:
    """What tells one message from another at the same offset: offset, timestamp, key, value."""
    row = batch.select(["offset", "timestamp", "key", "value"]).to_pylist()[0]
    stamp = row["timestamp"]
    micros = int(stamp.timestamp() * 1_000_000) if stamp is not None else None
    return row["offset"], micros, row["key"], row["value"]
