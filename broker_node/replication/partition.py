"""One partition as this broker holds it: its log, its role, and what commits a message.

A partition is either the *leader* (it appends, tracks its followers and moves
the high watermark: what the followers ask of it is :mod:`.leader_followers`'s)
or a *follower* (it appends what it fetched from the leader and takes the
leader's high watermark: :mod:`.replica_writes`).  ``become_leader`` and
``become_follower`` switch roles; the replica manager calls them when the
coordinator's state for the partition changes.

High watermark (leader): the lowest log end offset among the in-sync
replicas, the leader's own included.  A follower's log end offset is what its
last fetch asked for (a fetch offset acknowledges everything before it); one
not yet heard from since this broker became leader holds the high watermark
back.  Messages below the high watermark are committed: consumers see only
them, and ``when_committed`` callbacks fire as it passes their offsets.

In-sync replicas: which followers count towards the high watermark, and how
the leader proposes changes to them, is :mod:`.in_sync`'s.

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

import enum
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

import pyarrow as pa

from broker_node.coordination.base import PartitionState
from broker_node.log import FsyncPolicy, LogStore, ReplicaFrame
from broker_node.log.append_input import Records
from broker_node.log.logging_labels import Labels
from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.errors import (
    ErrorCode,
    InvalidArgumentError,
    JetStreamError,
    NotEnoughReplicasError,
    NotLeaderError,
)
from pyspark_jetstream.protocol.mirror import publish_refusal
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.typed_rows import typed_input

from .commit_waiters import Committed, CommitWaiters
from .cursors import CursorTable
from .in_sync import InSyncReplicas
from .leader_followers import LeaderFollowers
from .listeners import Listeners
from .message_ids import MessageIdTable
from .partition_tables import PartitionTables
from .producers import ProducerTable, Verdict
from .replica_writes import ReplicaWrites

logger = logging.getLogger(__name__)

SCRUB_BYTES = 32 * 1024 * 1024
"""Bytes of not yet checked batches each maintenance pass checks against their checksums."""

MessageIds = Sequence[tuple[str, int]]
"""Message ids of records to append: ``(id, index of the record)``, in record order."""


class Role(enum.Enum):
    """What this broker does for a partition."""

    OPENED = "opened"
    """Opened, no role given yet."""
    LEADER = "leader"
    FOLLOWER = "follower"
    CLOSED = "closed"


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
        self._in_sync = InSyncReplicas(broker_id, state)
        """The followers and the ISR the high watermark waits for (see :mod:`.in_sync`)."""
        self.messages_in = 0
        """Messages appended here as leader (counted under the role lock, so exactly)."""
        self.producer_not_stored: Counter[Verdict] = Counter()
        """Idempotent producers' appends that stored nothing, by verdict (repeats and refusals):
        on a healthy cluster an in-order producer sends no duplicate and nothing out of order."""
        self.role = Role.OPENED
        self.tables = PartitionTables(config, log, self._log, wall_clock)
        """The producer, message-id and cursor tables and the producer snapshot (see
        :mod:`.partition_tables`)."""
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
        self.followers = LeaderFollowers(
            self.stream,
            number,
            log,
            self._in_sync,
            lock=self._lock,
            leading=lambda: self.role is Role.LEADER,
            not_leader=self._not_leader,
            advance=self._advance_high_watermark,
            clock=clock,
            log=self._log,
        )
        """What the followers ask of this partition as their leader (see :mod:`.leader_followers`)."""
        self.replica = ReplicaWrites(
            log,
            self.tables,
            role_lock=self._role_lock,
            lock=self._lock,
            advanced=self._advanced,
            check_following=self._check_following,
            config=lambda: self.config,
            log=self._log,
        )
        """What its fetcher writes to this partition as a follower (see :mod:`.replica_writes`)."""
        self._waiters = CommitWaiters()
        self._committed = Listeners()
        self._grew = Listeners()
        self.tables.rebuild(config, from_snapshot=True)

    @property
    def state(self) -> PartitionState:
        """The partition state this broker holds (leader, replicas, ISR, epoch)."""
        return self._in_sync.state

    @state.setter
    def state(self, state: PartitionState) -> None:
        self._in_sync.state = state

    @property
    def producers(self) -> ProducerTable:
        """Idempotent producers' sequences (see :mod:`.producers`)."""
        return self.tables.producers

    @property
    def message_ids(self) -> MessageIdTable:
        """Message ids stored within the duplicate window (see :mod:`.message_ids`)."""
        return self.tables.message_ids

    @property
    def cursors(self) -> CursorTable | None:
        """The cursor stream's latest positions (``None`` for any other stream)."""
        return self.tables.cursors

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
        return self._in_sync.isr

    def become_leader(self, state: PartitionState) -> None:
        """Lead from now on, in ``state.leader_epoch``: stamp appends with it and track followers."""
        with self._role_lock, self._lock:
            self._check_not_closed()
            self.log.assign_leader_epoch(state.leader_epoch)
            self.role = Role.LEADER
            self._in_sync.lead(state, self._clock())
            self._advance_high_watermark()
        self._log.info("leader in epoch %d, ISR %s", state.leader_epoch, state.isr)

    def become_follower(self, state: PartitionState) -> None:
        """Follow ``state.leader``: stop acknowledging; waiting writes fail with ``NotLeaderError``."""
        with self._role_lock, self._lock:
            self._check_not_closed()
            self.role = Role.FOLLOWER
            self._in_sync.follow(state)
            self._waiters.fail(self._not_leader())
        self._log.info("follower of %s", state.leader or "(nobody yet)")

    def update_state(self, state: PartitionState) -> None:
        """Take a newer version of the same leadership (the ISR or, in a reassignment, the replicas
        changed in the coordinator); an older version than the one held (a snapshot read before our
        own write) is ignored."""
        with self._lock:
            if state.version < self.state.version:
                return
            if self.role is Role.LEADER:
                # A reassignment adds replicas to follow this leader, and drops others.
                self._in_sync.update(state, self._clock())
                self._advance_high_watermark()
            else:
                self._in_sync.follow(state)

    def fence(self, fenced: bool) -> None:
        """Stop (or resume) acknowledging as leader: the coordinator session is in doubt."""
        with self._lock:
            self._fenced = fenced
            if fenced:
                self._waiters.fail(
                    NotLeaderError(
                        f"{self.stream}/{self.number}: this broker lost touch with the coordinator",
                        stream=self.stream,
                        partition=self.number,
                    )
                )

    # ---- leader: appends and commits ----------------------------------------------------

    def append(self, records: Records, *, message_ids: MessageIds = ()) -> range:
        """Append as leader; return the offsets.  ``NotLeaderError`` if this broker may not lead.

        ``message_ids``: the ids the records carry,
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
        offsets = self._append(records, message_ids, wait=True)
        assert offsets is not None  # a waiting append stores or raises
        return offsets

    def try_append(self, records: Records, *, message_ids: MessageIds = ()) -> range | None:
        """:meth:`append`, or ``None`` (nothing appended) at once if the log is busy (see
        :meth:`Log.try_append`)."""
        return self._append(records, message_ids, wait=False)

    def _append(self, records: Records, message_ids: MessageIds, *, wait: bool) -> range | None:
        self._refuse_if_mirror()
        records, typed = typed_input(records, self.config.schema, stream=self.stream, partition=self.number)
        if not self._role_lock.acquire(blocking=wait):
            return None
        try:
            with self._lock:
                self._check_leader()
            append = self.log.append if wait else self.log.try_append
            offsets = append(records, typed=typed)
            if offsets is not None:
                self.messages_in += len(offsets)
                if message_ids:
                    self.message_ids.remember([(i, offsets[k]) for i, k in message_ids])
        finally:
            self._role_lock.release()
        if offsets is not None:
            self._grew.notify()
            with self._lock:
                self._advance_high_watermark()
        return offsets

    def append_idempotent(
        self,
        records: Records,
        producer_id: str,
        epoch: int,
        sequence: int,
        *,
        target: bool = True,
        message_ids: MessageIds = (),
        wait: bool = True,
    ) -> Ack | None:
        """Append one producer's message(s) unless the sequence says not to (see ``producers``).

        ``target`` is whether this partition is the one the producer named;
        ``message_ids`` as for :meth:`append` (remembered, not checked).
        Returns the ack: ``ok`` with the offsets, ``duplicate`` with the
        original ones, or a refusal (out of order, fenced) that stored nothing.
        With ``wait=False``, ``None`` when another append (or the log) is busy:
        nothing was checked or stored, and the producer's state is unchanged.
        """
        self._refuse_if_mirror()
        if not self._append_lock.acquire(blocking=wait):
            return None
        try:
            check = self.producers.check(producer_id, epoch, sequence, target=target)
            if check.verdict is Verdict.STORE:
                offsets = self._append(records, message_ids, wait=wait)
                if offsets is None:
                    return None
                self.producers.record(producer_id, epoch, sequence, offsets.start, offsets[-1])
                return self._ack(offsets.start, offsets[-1])
            self.producer_not_stored[check.verdict] += 1
            if check.verdict is Verdict.DUPLICATE:
                return self._ack(check.first, check.last, ErrorCode.DUPLICATE)
            if check.verdict is Verdict.OUT_OF_ORDER:
                return self._ack(-1, -1, ErrorCode.OUT_OF_ORDER_SEQUENCE, check.reason)
            return self._ack(-1, -1, ErrorCode.PRODUCER_FENCED, check.reason)
        finally:
            self._append_lock.release()

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
                self._waiters.add(last_offset, callback)
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
                self._check_leader(leader_epoch)
            offsets = self.log.append_replicated(frames)
            with self._lock:
                self.tables.learn_batches(batches)
                self.messages_in += len(offsets)
        self._grew.notify()
        with self._lock:
            self._advance_high_watermark()
        return offsets

    def reset_mirror(self, offset: int, leader_epoch: int) -> None:
        """Start this mirror's log over empty at ``offset`` (the source deleted everything before
        it), as its leader in ``leader_epoch``; ``NotLeaderError`` as for :meth:`append_mirrored`."""
        with self._role_lock, self._lock:
            self._check_leader(leader_epoch)
            self._log.warning("mirror starting over at offset %d (the source's log start)", offset)
            self.tables.forget_snapshot()
            self.log.reset_to(offset)
            self.log.assign_leader_epoch(leader_epoch)
            self.tables.rebuild(self.config)
            self._advanced.notify_all()

    # ---- readers -------------------------------------------------------------------------------

    def wait_for_data(self, offset: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until an offset >= ``offset`` is committed."""
        with self._advanced:
            return self._advanced.wait_for(
                lambda: self.role is Role.CLOSED or self.log.high_watermark > offset, timeout
            ) and (self.role is not Role.CLOSED)

    def on_commit(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` each time the high watermark advances (on the thread that advanced
        it, holding the partition's lock); return what stops it.  See :class:`.listeners.Listeners`."""
        return self._committed.add(listener)

    def on_append(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` after each append as leader (on the appending thread, the event loop's
        or a worker's, holding no lock: the replication connections send what was appended from
        it); return what stops it."""
        return self._grew.add(listener)

    def committed_frames(self, offset: int, max_bytes: int) -> list[ReplicaFrame]:
        """Stored batches from ``offset`` to the high watermark, byte for byte (``Log.read_frames``)."""
        return self.log.read_frames(offset, max_bytes=max_bytes, upper_bound=self.high_watermark)

    def try_committed_frames(self, offset: int, max_bytes: int) -> list[ReplicaFrame] | None:
        """:meth:`committed_frames`, or ``None`` at once if the log is busy."""
        return self.log.try_read_frames(offset, max_bytes=max_bytes, upper_bound=self.high_watermark)

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
        if self.log.log_end_offset != self.tables.snapshot_end:
            self.snapshot_producers()

    def snapshot_producers(self) -> None:
        """Write the producer table with the log offset it covers (see :mod:`.partition_tables`), so
        that the next open reads only the log after that offset instead of all of it (what the
        snapshot holds: ``PartitionTables.snapshot_data``).

        Written atomically; a failure (a full disk) is logged and costs only
        the next open a longer read.  Internal streams (the cursor table is
        rebuilt from its whole compacted log) write none, nor does a partition
        whose log has no files (nothing would read it back).
        """
        if not self.tables.snapshots:
            return
        with self._snapshot_lock:
            with self._append_lock, self._role_lock, self._lock:
                if self.role is Role.CLOSED:
                    return
                data = self.tables.snapshot_data()
            try:
                self.tables.write_snapshot(data)
            except OSError as exc:
                # Closed while writing (its stream deleted, its directory removed): nothing to keep.
                if self.role is not Role.CLOSED:
                    self._log.warning("cannot write the producer snapshot: %s", exc)

    def wake_readers(self) -> None:
        """Release every long-polling reader now and from now on (shutdown is coming)."""
        with self._lock:
            self.role = Role.CLOSED
            self._advanced.notify_all()
            self._waiters.fail(NotLeaderError(f"{self.stream}/{self.number} is closing on this broker"))

    def close(self) -> None:
        """Write the producer table out, wake every waiting reader and close the log."""
        try:
            self.snapshot_producers()
        except Exception:  # noqa: BLE001 - logged with its traceback
            self._log.exception("no producer snapshot at close")
        self.wake_readers()
        self.log.close()

    # ---- internals ---------------------------------------------------------------------------

    def _check_leader(self, leader_epoch: int | None = None) -> None:
        """``NotLeaderError`` unless this broker leads (in ``leader_epoch``, if given)."""
        if self.role is not Role.LEADER or leader_epoch not in (None, self.state.leader_epoch):
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

    def _advance_high_watermark(self) -> None:
        """Move the high watermark to the lowest log end offset in the ISR (leader only)."""
        if self.role is not Role.LEADER:
            return
        hw = self._in_sync.high_watermark(self.log.log_end_offset)
        if hw is None or hw <= self.log.high_watermark:
            return  # an in-sync follower not heard from since this broker became leader
        self.log.high_watermark = hw
        self._advanced.notify_all()
        self._committed.notify()
        if self._waiters.due(hw):
            self._waiters.settle(hw, self._commit_error())
