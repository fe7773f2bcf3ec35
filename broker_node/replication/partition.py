"""One partition as this broker holds it: its log, its role, and what commits a message.

A partition is either the *leader* (it appends, tracks its followers and moves
the high watermark) or a *follower* (it appends what it fetched from the
leader and takes the leader's high watermark).  ``become_leader`` and
``become_follower`` switch roles; the replica manager calls them when the
coordinator's state for the partition changes.

High watermark (leader): the lowest log end offset among the in-sync
replicas, the leader's own included.  A follower's log end offset is what its
last fetch asked for (a fetch offset acknowledges everything before it); one
not yet heard from since this broker became leader holds the high watermark
back.  Messages below the high watermark are committed: consumers see only
them, and ``when_committed`` callbacks fire as it passes their offsets.

In-sync replicas: a follower whose fetch offset reached the leader's log end
offset within the last ``replica_max_lag`` seconds is caught up (Kafka's
rule: caught up to the log end as of its previous fetch counts too).  The
leader proposes ISR changes; the replica manager writes them through the
coordinator and applies the result.  While a removal is being written the
follower still counts (a larger ISR only holds the high watermark back);
an addition counts once it is written.

Fencing: a partition whose broker lost touch with the coordinator (or whose
lease lapsed) refuses appends and holds back acknowledgements, because
another broker may be leader already.

Producer, message-id and cursor tables follow the log: built when the
partition opens, kept up to date by every append (a follower's replicated
appends included) and rebuilt after a truncation, so a new leader
de-duplicates retries of what its predecessor stored.  The message ids are
read back from the log's last ``duplicate_window`` only (see
:mod:`.message_ids`).
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import itertools
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, overload

import pyarrow as pa
import pyarrow.compute as pc

from broker_node.coordination.base import PartitionState
from broker_node.durable import atomic_write
from broker_node.log import CorruptSegmentError, FsyncPolicy, LogStore, Record, ReplicaFrame
from broker_node.log.append_input import Records
from broker_node.log.frames import decode
from broker_node.log.logging_labels import Labels
from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.envelope import TYPED_COLUMN, typed_version
from pyspark_jetstream.protocol.errors import (
    ErrorCode,
    InvalidArgumentError,
    JetStreamError,
    NotEnoughReplicasError,
    NotLeaderError,
    OffsetOutOfRangeError,
    UnavailableError,
)
from pyspark_jetstream.protocol.mirror import publish_refusal
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.typed_rows import exactly, problem, render_json
from pyspark_jetstream.protocol.typed_values import InvalidValuesError, TypedValues, parse_json

from .cursors import CURSOR_STREAM, CursorTable
from .message_ids import MessageIdTable
from .producers import ProducerTable, Verdict

logger = logging.getLogger(__name__)

LEARN_ROWS = 65_536
"""Rows of stored batches the producer, message-id and cursor tables take in at once when they
are rebuilt from the log."""
SCRUB_BYTES = 32 * 1024 * 1024
"""Bytes of not yet checked batches each maintenance pass checks against their checksums."""

MessageIds = Sequence[tuple[str, int]]
"""Message ids of records to append: ``(id, index of the record)``, in record order."""
Committed = Callable[[JetStreamError | None], None]
"""Called once with ``None`` when an offset is committed, or with the error that ended the wait."""


PRODUCER_SNAPSHOT = "producer-snapshot.json"
"""The producer table as of an offset, in the partition's directory (see ``snapshot_producers``)."""
SNAPSHOT_VERSION = 1


class Role(enum.Enum):
    """What this broker does for a partition."""

    OPENED = "opened"
    """Opened, no role given yet."""
    LEADER = "leader"
    FOLLOWER = "follower"
    CLOSED = "closed"


@dataclass
class FollowerProgress:
    """What the leader knows of one follower."""

    log_end_offset: int = -1
    """Its last fetch offset; -1 until it fetched from this leader."""
    last_caught_up: float = 0.0
    """When it last was caught up (monotonic seconds)."""
    previous_fetch_leader_end: int = -1
    previous_fetch_time: float = 0.0


class Partition:
    """A partition's log plus the replication bookkeeping around it."""

    def __init__(
        self,
        config: StreamConfig,
        number: int,
        log: LogStore,
        broker_id: str,
        state: PartitionState,
        *,
        clock: Callable[[], float] = time.monotonic,
        lease: Callable[[], bool] = lambda: True,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``log`` is the partition's log, a file :class:`~broker_node.log.Log` or a
        :class:`~broker_node.log.MemoryLog` (which keeps no producer snapshot);
        ``lease()`` says whether this broker's coordinator session is surely alive;
        ``wall_clock`` gives seconds since the epoch, as the log's timestamps count them."""
        self.config = config
        self.stream = config.name
        self.number = number
        self.log = log
        self._log = Labels(self.stream, number).bind(logger)
        """Logs with ``stream/partition:`` first, and both as fields."""
        self.broker_id = broker_id
        self.state = state
        self.messages_in = 0
        """Messages appended here as leader (counted under the role lock, so exactly)."""
        self.producer_not_stored: Counter[Verdict] = Counter()
        """Idempotent producers' appends that stored nothing, by verdict (repeats and refusals):
        on a healthy cluster an in-order producer sends no duplicate and nothing out of order."""
        self.role = Role.OPENED
        self.producers = ProducerTable()
        self._wall_clock = wall_clock
        self.message_ids = self._new_message_ids()
        self.cursors: CursorTable | None = CursorTable() if config.name == CURSOR_STREAM else None
        self._clock = clock
        self._lease = lease
        self._fenced = False
        self._lock = threading.RLock()
        self._append_lock = threading.Lock()
        """Orders a producer check with its append (appends themselves are the log's to order)."""
        self._snapshot_lock = threading.Lock()
        """One producer snapshot written at a time (the maintenance thread's and the one at close):
        they share the file's temporary name, and an older table must not replace a newer one."""
        self._role_lock = threading.Lock()
        """Held from a write's role check to the end of the write, and by role changes: a write
        checked under one role never lands under the next (taken before ``_lock``)."""
        self._advanced = threading.Condition(self._lock)
        self._followers: dict[str, FollowerProgress] = {}
        self._isr: tuple[str, ...] = state.isr
        self._pending_isr: tuple[str, ...] | None = None
        self._joining: set[str] = set()
        """Followers that caught up while out of the ISR, until the ISR naming them is stored: the
        high watermark waits for them already (Kafka's "maximal ISR"), so one that keeps up with a
        busy partition is not overtaken between catching up and being written in."""
        self._waiters: list[tuple[int, int, Committed]] = []
        self._ids = itertools.count()
        self._listeners: list[Callable[[], None]] = []
        self._append_listeners: list[Callable[[], None]] = []
        self._snapshot_path = None if log.directory is None else log.directory / PRODUCER_SNAPSHOT
        """Where the producer snapshot goes: beside the log's files (a log without files has none)."""
        self._snapshot_end = -1
        self._rebuild_tables(from_snapshot=True)

    # ---- roles ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether the partition is shutting down (readers should stop waiting)."""
        return self.role is Role.CLOSED

    @property
    def is_leader(self) -> bool:
        """Whether this broker leads the partition and may acknowledge writes now."""
        return self.role is Role.LEADER and not self._fenced

    @property
    def leader_epoch(self) -> int:
        """The leader epoch of the partition state this broker holds."""
        return self.state.leader_epoch

    @property
    def isr(self) -> tuple[str, ...]:
        """The in-sync replicas the high watermark waits for (the leader included)."""
        return self._isr

    def become_leader(self, state: PartitionState) -> None:
        """Lead from now on, in ``state.leader_epoch``: stamp appends with it and track followers."""
        with self._role_lock, self._lock:
            self._check_not_closed()
            self.log.assign_leader_epoch(state.leader_epoch)
            self.state = state
            self.role = Role.LEADER
            self._isr = state.isr
            self._pending_isr = None
            self._joining = set()
            now = self._clock()
            self._followers = {
                r: FollowerProgress(last_caught_up=now) for r in state.replicas if r != self.broker_id
            }
            self._advance_high_watermark()
        self._log.info("leader in epoch %d, ISR %s", state.leader_epoch, state.isr)

    def become_follower(self, state: PartitionState) -> None:
        """Follow ``state.leader``: stop acknowledging; waiting writes fail with ``NotLeaderError``."""
        with self._role_lock, self._lock:
            self._check_not_closed()
            self.state = state
            self.role = Role.FOLLOWER
            self._followers = {}
            self._isr = state.isr
            self._pending_isr = None
            self._joining = set()
            self._fail_waiters(self._not_leader())
        self._log.info("follower of %s", state.leader or "(nobody yet)")

    def update_state(self, state: PartitionState) -> None:
        """Take a newer version of the same leadership (the ISR or, in a reassignment, the replicas
        changed in the coordinator); an older version than the one held (a snapshot read before our
        own write) is ignored."""
        with self._lock:
            if state.version < self.state.version:
                return
            self.state = state
            if self.role is Role.LEADER:
                # A reassignment adds replicas to follow this leader, and drops others.
                now = self._clock()
                self._followers = {
                    r: self._followers.get(r) or FollowerProgress(last_caught_up=now)
                    for r in state.replicas
                    if r != self.broker_id
                }
                self._joining = {r for r in self._joining if r in state.replicas and r not in state.isr}
                if self._pending_isr is not None and state.isr == self._pending_isr:
                    self._pending_isr = None
                self._isr = self._merged()
                self._advance_high_watermark()
            else:
                self._isr = state.isr

    def fence(self, fenced: bool) -> None:
        """Stop (or resume) acknowledging as leader: the coordinator session is in doubt."""
        with self._lock:
            self._fenced = fenced
            if fenced:
                self._fail_waiters(
                    NotLeaderError(
                        f"{self.stream}/{self.number}: this broker lost touch with the coordinator",
                        stream=self.stream,
                        partition=self.number,
                    )
                )

    # ---- leader: appends and commits ----------------------------------------------------

    @overload
    def append(
        self, records: Records, *, wait: Literal[True] = True, message_ids: MessageIds = ()
    ) -> range: ...
    @overload
    def append(self, records: Records, *, wait: bool, message_ids: MessageIds = ()) -> range | None: ...

    def append(self, records: Records, *, wait: bool = True, message_ids: MessageIds = ()) -> range | None:
        """Append as leader; return the offsets.  ``NotLeaderError`` if this broker may not lead.

        With ``wait=False``, ``None`` (nothing appended) if the log is busy
        (see :meth:`Log.append`).  ``message_ids``: the ids the records carry,
        ``(id, index of the record)`` in record order, remembered with the
        append (see :mod:`.message_ids`).

        A typed stream's values are parsed here, under the schema version
        current now (see :mod:`pyspark_jetstream.protocol.typed_values`), and
        stored with the batch: ``InvalidValuesError`` names each message that
        does not match, and nothing is stored.  A typed batch (an Arrow input
        with a ``typed`` column, see :mod:`pyspark_jetstream.protocol.typed_rows`)
        is checked instead of parsed, and its values are the JSON text of its
        rows; ``InvalidArgumentError`` names the field that does not match.
        """
        self._refuse_if_mirror()
        typed = None
        if isinstance(records, pa.Table | pa.RecordBatch) and TYPED_COLUMN in records.schema.names:
            records, typed = self._checked(records)
        elif self.config.schema is not None:
            records, typed = self._parsed(records)
        if not self._role_lock.acquire(blocking=wait):
            return None
        try:
            with self._lock:
                self._check_leader()
            offsets = self.log.append(records, wait=wait, typed=typed)
            if offsets is not None:
                self.messages_in += len(offsets)
                if message_ids:
                    self.message_ids.remember([(i, offsets[k]) for i, k in message_ids])
        finally:
            self._role_lock.release()
        if offsets is not None:
            self._appended()
            with self._lock:
                self._advance_high_watermark()
        return offsets

    def _parsed(self, records: Records) -> tuple[Records, TypedValues | None]:
        """``records`` (an iterable made a list) and their values parsed under the stream's current
        schema; ``InvalidValuesError`` if any does not match."""
        schema = self.config.schema
        assert schema is not None
        if isinstance(records, pa.Table | pa.RecordBatch):
            names = records.schema.names
            values = records.column("value").to_pylist() if "value" in names else [None] * records.num_rows
        else:
            records = list(records)
            values = [r.value if isinstance(r, Record) else None for r in records]
        if not values:
            return records, None  # the log refuses an empty append, with its own message
        parsed = parse_json(values, schema)
        if parsed.refused:
            raise InvalidValuesError(parsed.refused, stream=self.stream, partition=self.number)
        return records, parsed.typed

    def _checked(self, records: pa.Table | pa.RecordBatch) -> tuple[pa.Table, TypedValues]:
        """A typed batch's typed columns checked against the schema version they say they hold (the
        client is not trusted), and its records with each row's value rendered from them."""
        where = f"stream {self.stream!r} partition {self.number}"
        schema = self.config.schema
        if schema is None:
            raise InvalidArgumentError(
                f"{where} is not typed: typed rows go to a typed stream (send JSON values here)",
                stream=self.stream,
                partition=self.number,
            )
        version = typed_version(records)
        if version is None or version > schema.version:
            raise InvalidArgumentError(
                f"{where}: the typed rows are of schema version {version}, but the stream has versions "
                f"1 to {schema.version}",
                stream=self.stream,
                partition=self.number,
            )
        table = records if isinstance(records, pa.Table) else pa.Table.from_batches([records])
        column = table.column(TYPED_COLUMN).combine_chunks()
        fields = schema.versions[version - 1]
        found = "a row is null" if column.null_count else None
        columns = pa.RecordBatch.from_struct_array(column) if found is None else None
        if columns is not None:
            found = problem(columns, fields)
        if found is not None or columns is None:
            raise InvalidArgumentError(
                f"{where}: the typed rows do not match schema version {version}: {found}",
                stream=self.stream,
                partition=self.number,
            )
        checked = exactly(columns, fields)
        index = table.schema.get_field_index(TYPED_COLUMN)
        rows = table.set_column(index, "value", render_json(checked))
        return rows, TypedValues(version, checked)

    def append_idempotent(
        self,
        records: Records,
        producer_id: str,
        epoch: int,
        sequence: int,
        *,
        target: bool = True,
        message_ids: MessageIds = (),
    ) -> Ack:
        """Append one producer's message(s) unless the sequence says not to (see ``producers``).

        ``target`` is whether this partition is the one the producer named;
        ``message_ids`` as for :meth:`append` (remembered, not checked).
        Returns the ack: ``ok`` with the offsets, ``duplicate`` with the
        original ones, or a refusal (out of order, fenced) that stored nothing.
        """
        self._refuse_if_mirror()
        with self._append_lock:
            check = self.producers.check(producer_id, epoch, sequence, target=target)
            if check.verdict is not Verdict.STORE:
                self.producer_not_stored[check.verdict] += 1
            if check.verdict is Verdict.DUPLICATE:
                return self._ack(check.first, check.last, ErrorCode.DUPLICATE)
            if check.verdict is Verdict.OUT_OF_ORDER:
                return self._ack(-1, -1, ErrorCode.OUT_OF_ORDER_SEQUENCE, check.reason)
            if check.verdict is Verdict.FENCED:
                return self._ack(-1, -1, ErrorCode.PRODUCER_FENCED, check.reason)
            offsets = self.append(records, message_ids=message_ids)
            self.producers.record(producer_id, epoch, sequence, offsets.start, offsets[-1])
            return self._ack(offsets.start, offsets[-1])

    def message_id_offset(self, message_id: str) -> int | None:
        """The offset of the message stored with ``message_id`` within the stream's
        ``duplicate_window``, or ``None`` (see :mod:`.message_ids`)."""
        return self.message_ids.offset_of(message_id)

    def _ack(self, first: int, last: int, error: ErrorCode = ErrorCode.OK, message: str = "") -> Ack:
        return Ack(self.stream, self.number, first, last, "", error, message)

    def check_min_insync(self) -> None:
        """Raise ``NotEnoughReplicasError`` if fewer replicas are in sync than the stream requires."""
        required = self.config.min_insync_replicas
        if len(self.state.isr) < required:
            raise NotEnoughReplicasError(
                f"{self.stream}/{self.number} has {len(self.state.isr)} in-sync replica(s) "
                f"({', '.join(self.state.isr)}), fewer than min_insync_replicas={required}",
                stream=self.stream,
                partition=self.number,
            )

    def when_committed(self, last_offset: int, callback: Committed) -> None:
        """Call ``callback(None)`` once offsets up to ``last_offset`` are committed (on some thread).

        It gets ``NotEnoughReplicasError`` instead if the ISR shrank below
        ``min_insync_replicas`` by then, or ``NotLeaderError`` if leadership
        was lost first.  Called at once when already committed.  A
        ``last_offset`` below 0 (a duplicate whose offsets are no longer known)
        waits for everything stored so far, which holds the original.
        """
        with self._lock:
            if last_offset < 0:
                last_offset = self.log.log_end_offset - 1
            if self.role is not Role.LEADER or self._fenced:
                error: JetStreamError | None = self._not_leader()
            elif self.log.high_watermark > last_offset:
                error = self._commit_error()
            else:
                heapq.heappush(self._waiters, (last_offset, next(self._ids), callback))
                return
        callback(error)

    @property
    def high_watermark(self) -> int:
        """Offsets below this are committed and visible to consumers."""
        return self.log.high_watermark

    @property
    def appends_sync(self) -> bool:
        """Whether every append is forced to disk (then appends are slow: keep them off event loops)."""
        return self.log.config.fsync is FsyncPolicy.ALWAYS

    @property
    def max_batch_bytes(self) -> int:
        """The largest batch the log takes, as stored."""
        return self.log.config.max_batch_bytes

    # ---- leader: followers -----------------------------------------------------------------

    def frames_for_leader_repair(
        self, leader: str, leader_epoch: int, start: int, max_bytes: int
    ) -> list[ReplicaFrame]:
        """This in-sync follower's stored frames from ``start`` on, below its high watermark, byte
        for byte (a typed batch's typed columns with them), for its leader ``leader`` to repair
        a damaged range of its own log (see ``leader_repair``); nothing is recorded.

        ``NotLeaderError`` if the asker does not lead this partition in ``leader_epoch`` as
        this replica knows it, ``UnavailableError`` if this replica is not in sync,
        ``OffsetOutOfRangeError`` if ``start`` is not below its high watermark."""
        state = self.state
        if self.role is not Role.FOLLOWER or leader != state.leader or leader_epoch != state.leader_epoch:
            raise NotLeaderError(
                f"{leader} asks for a repair copy of {self.stream}/{self.number} in leader epoch "
                f"{leader_epoch}, but broker {self.broker_id} is {self.role.value} there with "
                f"{state.leader} leading in epoch {state.leader_epoch}",
                stream=self.stream,
                partition=self.number,
            )
        if self.broker_id not in state.isr:
            raise UnavailableError(
                f"broker {self.broker_id} is not in sync for {self.stream}/{self.number}: it gives no "
                "repair copy",
                stream=self.stream,
                partition=self.number,
            )
        log, high_watermark = self.log, self.high_watermark
        if not log.log_start_offset <= start < high_watermark:
            raise OffsetOutOfRangeError(
                f"a repair copy of {self.stream}/{self.number} from {start}, but broker {self.broker_id} "
                f"holds committed offsets {log.log_start_offset} to {high_watermark - 1}",
                stream=self.stream,
                partition=self.number,
                offset=start,
                log_start_offset=log.log_start_offset,
                log_end_offset=high_watermark,
            )
        return log.read_frames(start, max_bytes=max_bytes, upper_bound=high_watermark)

    def record_fetch(self, replica: str, fetch_offset: int) -> bool:
        """A follower fetched from ``fetch_offset`` (so it holds everything before it).

        Returns whether it caught up while out of the ISR (see :meth:`expansion`).
        ``NotLeaderError`` if this broker does not lead, ``InvalidArgument``
        semantics are the caller's.
        """
        with self._lock:
            if self.role is not Role.LEADER:
                raise self._not_leader()
            progress = self._followers.get(replica)
            if progress is None:
                raise NotLeaderError(
                    f"{replica} is not a replica of {self.stream}/{self.number} in epoch "
                    f"{self.state.leader_epoch}",
                    stream=self.stream,
                    partition=self.number,
                )
            now = self._clock()
            leader_end = self.log.log_end_offset
            if fetch_offset >= leader_end:
                progress.last_caught_up = now
            elif fetch_offset >= progress.previous_fetch_leader_end >= 0:
                progress.last_caught_up = max(progress.last_caught_up, progress.previous_fetch_time)
            progress.previous_fetch_leader_end = leader_end
            progress.previous_fetch_time = now
            progress.log_end_offset = fetch_offset
            if fetch_offset < self.log.high_watermark and replica in self._isr:
                # An in-sync replica holds everything below the high watermark: one that fetches
                # from below it lost committed data (a crash that cut its unsynced tail, and a
                # restart quick enough to stay in the ISR). It leaves the ISR at the next pass,
                # so it is never elected with less than was acknowledged.
                self._joining.discard(replica)
                self._isr = self._merged()
                progress.last_caught_up = float("-inf")
                self._log.warning(
                    "%s fetched from %d, below the high watermark %d: it lost committed data and "
                    "leaves the ISR",
                    replica,
                    fetch_offset,
                    self.log.high_watermark,
                )
            self._advance_high_watermark()
            return self.expansion(replica) is not None

    def expansion(self, replica: str) -> tuple[str, ...] | None:
        """The ISR with ``replica`` added, if it is out of the ISR and caught up (it had the high
        watermark and this leader's whole epoch, and the high watermark has waited for it since);
        else ``None``.  Asked again when the change is about to be written, so a queued request
        never revives a stale view (a replica dropped meanwhile, another leadership)."""
        with self._lock:
            if self.role is not Role.LEADER:
                return None
            progress = self._followers.get(replica)
            wanted = self._pending_isr or self.state.isr
            if progress is None or replica in wanted:
                return None
            if replica not in self._joining:
                epoch_start = self.log.end_offset_for_epoch(self.state.leader_epoch - 1).end_offset
                if progress.log_end_offset < max(self.log.high_watermark, epoch_start, 0):
                    return None
                self._joining.add(replica)  # the high watermark waits for it from now on
                self._isr = self._merged()
            return tuple(r for r in self.state.replicas if r in wanted or r == replica)

    def lagging_replicas(self, max_lag: float) -> tuple[str, ...] | None:
        """A proposed ISR without the followers not caught up for ``max_lag`` seconds, or ``None``."""
        with self._lock:
            if self.role is not Role.LEADER:
                return None
            now = self._clock()
            stale = {
                r
                for r in self._joining
                if (progress := self._followers.get(r)) is None or now - progress.last_caught_up > max_lag
            }
            if stale:  # caught up once, and fell behind again before being written in
                self._joining -= stale
                self._isr = self._merged()
                self._advance_high_watermark()
            current = self._pending_isr or self.state.isr
            lagging = {
                r
                for r in current
                if r != self.broker_id
                and (progress := self._followers.get(r)) is not None
                and now - progress.last_caught_up > max_lag
            }
            if not lagging:
                return None
            return tuple(r for r in current if r not in lagging)

    def propose_isr(self, isr: tuple[str, ...]) -> PartitionState | None:
        """Mark ``isr`` as being written; the state to write, or ``None`` if not leader any more."""
        with self._lock:
            if self.role is not Role.LEADER:
                return None
            self._pending_isr = isr
            self._isr = self._merged()
            return dataclasses.replace(self.state, isr=isr)

    def isr_written(self, state: PartitionState | None) -> None:
        """The coordinator stored ``state`` (or refused the proposal: ``None``)."""
        with self._lock:
            self._pending_isr = None
            # A newer state may have arrived first (the controller completing a move that this
            # very write let finish): the stored answer to our write must not roll it back.
            if state is not None and self.role is Role.LEADER and state.version > self.state.version:
                if state.isr != self.state.isr:
                    self._log.info("ISR %s -> %s", self.state.isr, state.isr)
                self.state = state
            self._joining -= set(self.state.isr)
            self._isr = self._merged()
            self._advance_high_watermark()

    def follower_log_ends(self) -> dict[str, int]:
        """Each follower's last fetch offset as this leader knows it (-1: not heard from)."""
        with self._lock:
            return {r: p.log_end_offset for r, p in self._followers.items()}

    # ---- follower ----------------------------------------------------------------------------

    def append_replicated(
        self, frames: Iterable[pa.Buffer], leader_high_watermark: int, leader_epoch: int | None = None
    ) -> range:
        """Append frames fetched from the leader and take its high watermark (up to our log end).

        ``leader_epoch`` is the leadership the frames come from: ``NotLeaderError``
        if this replica follows another one by now (a fetcher that outlived its leader).
        """
        frames = list(frames)
        with self._role_lock:
            self._check_following(leader_epoch)
            offsets = self.log.append_replicated(frames)
            with self._lock:
                self._learn_from(frames)
                hw = min(leader_high_watermark, self.log.log_end_offset)
                if hw > self.log.high_watermark:
                    self.log.high_watermark = hw
                    self._advanced.notify_all()
        return offsets

    def truncate_to(self, offset: int, leader_epoch: int | None = None) -> None:
        """Drop everything from ``offset`` on (a diverged tail); the tables are rebuilt.
        ``leader_epoch`` as for :meth:`append_replicated`."""
        with self._role_lock, self._lock:
            self._check_following(leader_epoch)
            if offset < self.log.log_end_offset:
                self._log.warning("truncating from %d to %d", self.log.log_end_offset, offset)
                self._forget_snapshot()
                self.log.truncate_to(offset)
                self._rebuild_tables()
            else:
                self.log.truncate_to(offset)  # forgets epochs begun at the end without data

    def reset_to(self, offset: int, leader_epoch: int | None = None) -> None:
        """Start over empty at ``offset`` (the leader no longer has what lies before).
        ``leader_epoch`` as for :meth:`append_replicated`."""
        with self._role_lock, self._lock:
            self._check_following(leader_epoch)
            self._log.warning("starting over at offset %d", offset)
            self._forget_snapshot()
            self.log.reset_to(offset)
            self._rebuild_tables()

    # ---- mirror leader (see .mirror): appends that come from another cluster's stream ------------

    def _refuse_if_mirror(self) -> None:
        """``InvalidArgumentError`` if the stream is a mirror still copying: it takes no publishes."""
        mirror = self.config.mirror
        if mirror is not None and mirror.active:
            raise InvalidArgumentError(
                publish_refusal(self.stream, mirror), stream=self.stream, partition=self.number
            )

    def append_mirrored(
        self,
        frames: Sequence[pa.Buffer | pa.RecordBatch],
        batches: Sequence[pa.RecordBatch],
        leader_epoch: int,
    ) -> range:
        """Append a source's batches as this mirror's leader in ``leader_epoch``, at their offsets
        (``frames``: what the log stores, see ``Log.append_replicated``; ``batches``: the same rows
        decoded, which the producer, message-id and cursor tables learn).  ``NotLeaderError`` if
        this broker does not lead in that epoch any more."""
        with self._role_lock:
            with self._lock:
                self._check_leader()
                if self.state.leader_epoch != leader_epoch:
                    raise self._not_leader()
            offsets = self.log.append_replicated(frames)
            with self._lock:
                for batch in batches:
                    self.producers.learn(batch)
                    self.message_ids.learn(batch)
                self.messages_in += len(offsets)
        self._appended()
        with self._lock:
            self._advance_high_watermark()
        return offsets

    def reset_mirror(self, offset: int, leader_epoch: int) -> None:
        """Start this mirror's log over empty at ``offset`` (the source deleted everything before
        it), as its leader in ``leader_epoch``; ``NotLeaderError`` as for :meth:`append_mirrored`."""
        with self._role_lock, self._lock:
            self._check_leader()
            if self.state.leader_epoch != leader_epoch:
                raise self._not_leader()
            self._log.warning("mirror starting over at offset %d (the source's log start)", offset)
            self._forget_snapshot()
            self.log.reset_to(offset)
            self.log.assign_leader_epoch(leader_epoch)
            self._rebuild_tables()
            self._advanced.notify_all()

    # ---- readers -------------------------------------------------------------------------------

    def wait_for_data(self, offset: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until an offset >= ``offset`` is committed."""
        with self._advanced:
            return self._advanced.wait_for(
                lambda: self.role is Role.CLOSED or self.log.high_watermark > offset, timeout
            ) and (self.role is not Role.CLOSED)

    def on_commit(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` each time the high watermark advances; return what stops it.

        It is called on the thread that advanced it, holding the partition's
        lock, so it must only hand the news on (wake a task), never block.
        """
        with self._lock:
            self._listeners.append(listener)

        def stop() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return stop

    def on_append(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` after each append as leader; return what stops it.

        It is called on the appending thread (the event loop's, or a worker's
        for a large batch), holding no lock, so it must only hand the news on
        (schedule a send), never block: the replication connections send what
        was appended from it.
        """
        self._append_listeners = [*self._append_listeners, listener]

        def stop() -> None:
            self._append_listeners = [a for a in self._append_listeners if a is not listener]

        return stop

    def _appended(self) -> None:
        """Tell the append listeners (the replication connections) that the log grew as leader."""
        for appended in self._append_listeners:
            appended()

    @overload
    def committed_frames(
        self, offset: int, max_bytes: int, *, wait: Literal[True] = True
    ) -> list[ReplicaFrame]: ...
    @overload
    def committed_frames(self, offset: int, max_bytes: int, *, wait: bool) -> list[ReplicaFrame] | None: ...

    def committed_frames(
        self, offset: int, max_bytes: int, *, wait: bool = True
    ) -> list[ReplicaFrame] | None:
        """Stored batches from ``offset`` up to the high watermark, byte for byte (see
        ``Log.read_frames``); with ``wait=False``, ``None`` if the log is busy."""
        return self.log.read_frames(offset, max_bytes=max_bytes, upper_bound=self.high_watermark, wait=wait)

    def maintain(self) -> None:
        """Apply retention, key compaction if the stream has it, check some unread data, and
        write the producer table out if the log moved.

        The check (``SCRUB_BYTES`` per pass) finds damage in data nobody has
        read, so a follower can repair it from its leader before it is needed.
        """
        self.log.enforce_retention()
        if self.log.config.compaction:
            self.log.compact()
        self.log.verify(SCRUB_BYTES)
        if self.log.log_end_offset != self._snapshot_end:
            self.snapshot_producers()

    def snapshot_producers(self) -> None:
        """Write the producer table with the log offset it covers (:data:`PRODUCER_SNAPSHOT`), so
        that the next open reads only the log after that offset instead of all of it.

        Beside it, ``message_ids_from``: the offset of the oldest message id
        remembered (the end offset when there is none), so that an open reads
        message ids back from there at the earliest: a stream that stores no
        ids reads nothing more than the producers need.

        Written atomically; a failure (a full disk) is logged and costs only
        the next open a longer read.  Internal streams (the cursor table is
        rebuilt from its whole compacted log) write none, nor does a partition
        whose log has no files (nothing would read it back).
        """
        if self.cursors is not None or self._snapshot_path is None:
            return
        with self._snapshot_lock:
            with self._append_lock, self._role_lock, self._lock:
                if self.role is Role.CLOSED:
                    return
                end = self.log.log_end_offset
                data = {
                    "version": SNAPSHOT_VERSION,
                    "end_offset": end,
                    "epoch": self._epoch_below(end),
                    "producers": self.producers.snapshot(),
                    "message_ids_from": self.message_ids.oldest_offset(end),
                }
            try:
                atomic_write(self._snapshot_path, json.dumps(data, separators=(",", ":")).encode())
            except OSError as exc:
                # Closed while writing (its stream deleted, its directory removed): nothing to keep.
                if self.role is not Role.CLOSED:
                    self._log.warning("cannot write %s: %s", self._snapshot_path, exc)
                return
            self._snapshot_end = end

    def wake_readers(self) -> None:
        """Release every long-polling reader now and from now on (shutdown is coming)."""
        with self._lock:
            self.role = Role.CLOSED
            self._advanced.notify_all()
            self._fail_waiters(NotLeaderError(f"{self.stream}/{self.number} is closing on this broker"))

    def close(self) -> None:
        """Write the producer table out, wake every waiting reader and close the log."""
        try:
            self.snapshot_producers()
        except Exception:  # noqa: BLE001 - logged with its traceback
            self._log.exception("no producer snapshot at close")
        self.wake_readers()
        self.log.close()

    # ---- internals ---------------------------------------------------------------------------

    def _check_leader(self) -> None:
        if self.role is not Role.LEADER:
            raise self._not_leader()
        if self._fenced or not self._lease():
            raise NotLeaderError(
                f"{self.stream}/{self.number}: this broker lost touch with the coordinator and "
                "must not lead until it is back",
                stream=self.stream,
                partition=self.number,
            )

    def _check_following(self, leader_epoch: int | None) -> None:
        if self.role is not Role.FOLLOWER or (
            leader_epoch is not None and leader_epoch != self.state.leader_epoch
        ):
            raise NotLeaderError(
                f"{self.stream}/{self.number} on broker {self.broker_id} no longer follows that "
                f"leadership (epoch {leader_epoch}; now {self.role.name.lower()} in epoch "
                f"{self.state.leader_epoch})",
                stream=self.stream,
                partition=self.number,
            )

    def _check_not_closed(self) -> None:
        if self.role is Role.CLOSED:
            raise NotLeaderError(f"{self.stream}/{self.number} is closed on this broker")

    def _not_leader(self) -> NotLeaderError:
        leader = self.state.leader
        where = f"the leader is {leader}" if leader and leader != self.broker_id else "it has no leader now"
        return NotLeaderError(
            f"broker {self.broker_id} does not lead {self.stream}/{self.number}: {where}",
            stream=self.stream,
            partition=self.number,
            leader=leader if leader != self.broker_id else None,
        )

    def _commit_error(self) -> JetStreamError | None:
        try:
            self.check_min_insync()
        except NotEnoughReplicasError as exc:
            return exc
        return None

    def _merged(self) -> tuple[str, ...]:
        """The ISR the high watermark waits for: the stored one, a pending proposal and the
        replicas joining, together (a replica being added counts as soon as it caught up, one
        being removed until the removal is stored), so whoever the coordinator may name in sync
        has everything acknowledged."""
        stored, pending, joining = self.state.isr, self._pending_isr or (), self._joining
        return tuple(r for r in self.state.replicas if r in stored or r in pending or r in joining)

    def _advance_high_watermark(self) -> None:
        """Move the high watermark to the lowest log end offset in the ISR (leader only)."""
        if self.role is not Role.LEADER:
            return
        ends = [self.log.log_end_offset]
        for replica in self._isr:
            if replica == self.broker_id:
                continue
            progress = self._followers.get(replica)
            if progress is None or progress.log_end_offset < 0:
                return  # not heard from since this broker became leader
            ends.append(progress.log_end_offset)
        hw = min(ends)
        if hw <= self.log.high_watermark:
            return
        self.log.high_watermark = hw
        self._advanced.notify_all()
        for listener in self._listeners:
            listener()
        if self._waiters and self._waiters[0][0] < hw:
            error = self._commit_error()
            while self._waiters and self._waiters[0][0] < hw:
                _, _, callback = heapq.heappop(self._waiters)
                _call(callback, error)

    def _fail_waiters(self, error: JetStreamError) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, callback in waiters:
            _call(callback, error)

    def _learn_from(self, frames: list[pa.Buffer]) -> None:
        """Keep the producer and cursor tables in step with what a follower appended."""
        for frame in frames:
            batch = decode(frame)
            self.producers.learn(batch)
            self.message_ids.learn(batch)
            if self.cursors is not None:
                self.cursors.learn(batch)

    def _rebuild_tables(self, *, from_snapshot: bool = False) -> None:
        """Read the producer, message-id (and cursor) tables from the log; ``from_snapshot``:
        start the producers from their snapshot when it still fits the log, and read only
        what follows it.  Message ids are read from the start of the window on."""

        def skipped(error: CorruptSegmentError) -> None:
            self._log.error(
                "%s; rebuilding without it (duplicates of what it held may be stored again)", error
            )

        self.producers = ProducerTable()
        producers_from = 0
        ids_from: int | None = 0
        loaded = self._load_snapshot() if from_snapshot and self.cursors is None else None
        if loaded is not None:
            self.producers, producers_from, ids_from = loaded
            self._snapshot_end = producers_from
        message_ids = self._new_message_ids()
        # Ids stored before the window are forgotten; the snapshot says where its ids began.
        ids_from = max(self._window_start(message_ids), ids_from or 0) if message_ids.enabled else None
        start = producers_from if ids_from is None else min(producers_from, ids_from)
        cursors = CursorTable() if self.cursors is not None else None

        def learn(batches: list[pa.RecordBatch]) -> None:
            self.producers.learn_many(
                [
                    _from_offset(b, producers_from)
                    for b in batches
                    if b.column(0)[-1].as_py() >= producers_from
                ]
            )
            if ids_from is None and cursors is None:
                return  # the producers alone: their learn_many joins the batches itself
            batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
            if ids_from is not None:
                message_ids.learn(batch)  # ids older than the window are left out by timestamp
            if cursors is not None:
                cursors.learn(batch)

        # The tables learn many stored batches at once: a log of single-message batches (one
        # publish each) took ~1 ms a batch to learn one by one (a grouping each), which kept a
        # restarted broker's partition from serving for 10 s and more.
        pending: list[pa.RecordBatch] = []
        rows = 0
        for batch in self.log.scan(max_bytes=64 * 1024 * 1024, on_damaged=skipped, start_offset=start):
            pending.append(batch)
            rows += batch.num_rows
            if rows >= LEARN_ROWS:
                learn(pending)
                pending, rows = [], 0
        if pending:
            learn(pending)
        self.message_ids = message_ids
        self.cursors = cursors

    def _new_message_ids(self) -> MessageIdTable:
        return MessageIdTable(self.config.duplicate_window, self.config.duplicate_max_ids, self._wall_clock)

    def _window_start(self, message_ids: MessageIdTable) -> int:
        """The first offset stored within the duplicate window, found through the time index."""
        try:
            return self.log.offset_for_timestamp(message_ids.horizon() / 1_000_000)
        except CorruptSegmentError as exc:
            return exc.first_offset  # the scan skips the damaged batch and goes on after it

    def _epoch_below(self, end: int) -> list[int] | None:
        """``[epoch, start offset]`` of the leader epoch that holds offset ``end - 1`` (if any)."""
        entries = [entry for entry in self.log.leader_epochs if entry[1] < end]
        return list(entries[-1]) if entries else None

    def _load_snapshot(self) -> tuple[ProducerTable, int, int | None] | None:
        """The producer snapshot, the offset it covers and its ``message_ids_from`` (``None`` if
        it has none), if it is readable and fits the log: the log still reaches that offset,
        in the same leader epoch as when it was written."""
        path = self._snapshot_path
        if path is None:
            return None
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._log.warning("cannot read %s (%s); reading the whole log", path, exc)
            return None
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("version") != SNAPSHOT_VERSION:
                raise ValueError(f"not a version {SNAPSHOT_VERSION} producer snapshot")
            end, epoch = data["end_offset"], data["epoch"]
            if isinstance(end, bool) or not isinstance(end, int) or end < 0:
                raise ValueError(f"bad end_offset {end!r}")
            table = ProducerTable.from_snapshot(data["producers"])
            ids_from = data.get("message_ids_from")
            if ids_from is not None and (
                isinstance(ids_from, bool) or not isinstance(ids_from, int) or not 0 <= ids_from <= end
            ):
                raise ValueError(f"bad message_ids_from {ids_from!r}")
        except (ValueError, KeyError, RecursionError) as exc:
            self._log.warning("ignoring %s (%s); reading the whole log", path, exc)
            return None
        if end > self.log.log_end_offset or epoch != self._epoch_below(end):
            self._log.info(
                "the producer snapshot at offset %d no longer fits the log; reading the whole log", end
            )
            return None
        return table, end, ids_from

    def _forget_snapshot(self) -> None:
        """Remove the producer snapshot before the log below its offset changes."""
        self._snapshot_end = -1
        if self._snapshot_path is None:
            return
        try:
            self._snapshot_path.unlink(missing_ok=True)
        except OSError as exc:
            self._log.warning("cannot remove %s: %s", self._snapshot_path, exc)


def _from_offset(batch: pa.RecordBatch, offset: int) -> pa.RecordBatch:
    """The rows of ``batch`` at and after ``offset`` (offsets ascend, with gaps after compaction)."""
    if batch.column(0)[0].as_py() >= offset:
        return batch
    return batch.slice(pc.sum(pc.less(batch.column(0), offset)).as_py() or 0)


def _call(callback: Committed, error: JetStreamError | None) -> None:
    try:
        callback(error)
    except Exception:
        logger.exception("a commit callback failed")
