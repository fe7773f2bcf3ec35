"""The controller: one broker, elected through the coordinator, that changes leadership.

It assigns replicas when a stream is created or grows, deletes streams, elects a new
leader from the in-sync replicas when a leader's broker goes away, moves
leadership off a broker that is shutting down (controlled shutdown), and back
to preferred replicas on request.  It never touches data; it only writes
partition states, each write a compare-and-set fenced by the controller epoch,
so a controller that was replaced cannot change anything any more
(``NotControllerError``).

Every decision is taken from a fresh read of the store, on the controller's
own thread, one event at a time (Kafka's controller event queue), and
reconciles the whole cluster: a new controller that takes over half-done work
finishes it by the same pass.  The store (:class:`ControllerStore`) is the
ZooKeeper coordinator's; the logic here is independent of it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    NotEnoughReplicasError,
    StreamExistsError,
    UnknownStreamError,
)
from pyspark_jetstream.protocol.mirror import promoted
from pyspark_jetstream.protocol.streams import (
    StreamConfig,
    check_dead_letter,
    check_new_typed,
    schema_updated,
)
from pyspark_jetstream.protocol.value_schema import SchemaDocument

from . import reassignment
from .assignment import assign_replicas, elect_leader, grown_config, new_partitions, preferred_leader
from .base import PartitionState, StreamMetadata, confirm_existing, new_stream_id
from .errors import ConflictError, CoordinationError, NotControllerError

logger = logging.getLogger(__name__)
T = TypeVar("T")

_REFUSALS = (StreamExistsError, UnknownStreamError, NotEnoughReplicasError, InvalidArgumentError)
"""Answers to a request that was wrong, not failures of the controller: logged without a traceback."""

CONFLICT_RETRIES = 20
"""Times one event is retried after losing a race to a leader's ISR write."""


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """A compare-and-set of one partition's state."""

    stream: str
    partition: int
    expected_version: int
    state: PartitionState


class ControllerStore(Protocol):
    """What the controller reads and writes; every write is fenced by the controller epoch."""

    def live_brokers(self) -> list[str]: ...
    def registrations(self) -> dict[str, int]: ...
    def read_streams(self) -> list[StreamMetadata]: ...
    def shutting_down(self) -> set[str]: ...
    def write_partitions(self, changes: list[PartitionChange]) -> None: ...
    def write_new_stream(self, metadata: StreamMetadata) -> None: ...
    def write_deletion(self, metadata: StreamMetadata) -> None: ...
    def write_stream_change(self, before: StreamMetadata, grown: StreamMetadata) -> None: ...


class Controller:
    """Runs the controller's event loop on its own thread while this broker is controller."""

    def __init__(
        self,
        store: ControllerStore,
        broker_id: str,
        epoch: int,
        *,
        internal_streams: Callable[[int], list[StreamConfig]] = lambda live: [],
    ) -> None:
        """``internal_streams(live)`` lists the internal streams to create once ``live`` brokers are up."""
        self.store = store
        self.broker_id = broker_id
        self.epoch = epoch
        self._internal = internal_streams
        self._events: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None] = (
            queue.Queue()
        )
        self._thread = threading.Thread(target=self._run, name=f"controller-{epoch}", daemon=True)
        self._stopped = False
        self._registered: dict[str, int] = {}
        """Each live broker's registration as the last successful reconciliation saw it."""
        self.dirty = False
        """The last reconciliation failed (ZooKeeper unreachable, say): run it again even if
        the metadata did not change meanwhile."""

    def start(self) -> None:
        """Begin: reconcile the whole cluster first."""
        logger.info("broker %s is controller (epoch %d)", self.broker_id, self.epoch)
        self._thread.start()
        self.submit(self.reconcile)

    def stop(self) -> None:
        """Stop taking events (another broker is or will be controller)."""
        self._stopped = True
        self._events.put(None)

    @property
    def running(self) -> bool:
        """Whether this controller still takes events."""
        return not self._stopped

    def submit(self, work: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``work`` on the controller thread, after earlier events; its result or error."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        if self._stopped:
            future.set_exception(NotControllerError(f"broker {self.broker_id} is no longer controller"))
        else:
            self._events.put((work, future))
        return future

    def _run(self) -> None:
        while (item := self._events.get()) is not None:
            work, future = item
            try:
                future.set_result(self._with_retries(work))
                if work == self.reconcile:
                    self.dirty = False
            except NotControllerError as exc:
                logger.warning("controller epoch %d fenced: %s", self.epoch, exc)
                future.set_exception(exc)
                self._stopped = True
            except Exception as exc:
                if isinstance(exc, CoordinationError) and not isinstance(exc, ConflictError):
                    logger.warning("controller event failed: %s", exc)  # ZooKeeper out of reach
                elif not isinstance(exc, _REFUSALS):
                    logger.exception("controller event failed")
                if work == self.reconcile:
                    self.dirty = True
                future.set_exception(exc)
        while not self._events.empty():  # fail whatever is left
            left = self._events.get_nowait()
            if left is not None:
                left[1].set_exception(NotControllerError(f"broker {self.broker_id} is no longer controller"))

    @staticmethod
    def _with_retries(work: Callable[[], T]) -> T:
        for attempt in range(CONFLICT_RETRIES):
            try:
                return work()
            except ConflictError:
                if attempt == CONFLICT_RETRIES - 1:
                    raise
                logger.debug("controller event lost a race; reading again")
        raise AssertionError("unreachable")

    # ---- events ----------------------------------------------------------------------

    def reconcile(self) -> list[str]:
        """Make every partition's leadership fit the live brokers; return what changed.

        A partition whose leader is gone (dead, or shutting down and another
        in-sync replica can take over) gets a new leader from its ISR; dead
        brokers leave every ISR (a leader would drop them after
        ``replica_max_lag`` anyway); a partition without a leader gets one as
        soon as an in-sync replica is back.  Internal streams are created
        once enough brokers are live.

        A broker that registered again since the last reconciliation
        restarted, perhaps quicker than anyone saw it gone, and perhaps with
        less than it had acknowledged (a crash loses what was not yet
        synced): it is handled as dead once, so it leaves every ISR and
        leadership, and rejoins an ISR only by catching up again.
        """
        registrations = self.store.registrations()
        bounced = {b for b, r in registrations.items() if self._registered.get(b, r) != r}
        if bounced:
            logger.warning(
                "broker(s) %s registered again (restarted): they leave every ISR until they catch up",
                ", ".join(sorted(bounced)),
            )
        live = set(registrations) - bounced
        leaving = self.store.shutting_down() & live
        staying = live - leaving
        changes = []
        moved = []
        streams = self.store.read_streams()
        for metadata in streams:
            unclean = bool(getattr(metadata.config, "unclean_leader_election", False))
            for number, state in enumerate(metadata.partitions):
                new = self._reconciled(state, staying, leaving, unclean)
                done = reassignment.completed(new or state, staying)
                if done is not None:
                    logger.info(
                        "%s/%d moved to %s (controller epoch %d)",
                        metadata.config.name,
                        number,
                        ", ".join(done.replicas),
                        self.epoch,
                        extra={"stream": metadata.config.name, "partition": number},
                    )
                    new = done
                if new is not None and new != state:
                    changes.append(PartitionChange(metadata.config.name, number, state.version, new))
                    if new.leader != state.leader:
                        name = f"{metadata.config.name}/{number}"
                        moved.append(f"{name}: {state.leader or '-'} -> {new.leader or '-'}")
        if changes:
            self.store.write_partitions(changes)
            for line in moved:
                logger.info("leadership %s (controller epoch %d)", line, self.epoch)
        self._registered = registrations
        existing = {m.config.name for m in streams}
        for config in self._internal(len(registrations)):
            if config.name not in existing:
                self._create(config, streams)
        return moved

    def _reconciled(
        self, state: PartitionState, staying: set[str], leaving: set[str], unclean: bool
    ) -> PartitionState | None:
        live = staying | leaving
        if state.leader and state.leader in staying:
            # Dead brokers leave the ISR, and so do followers shutting down, so the
            # leader's acks do not wait for them.
            kept = tuple(b for b in state.isr if b in staying)
            return replace(state, isr=kept) if kept != state.isr else None
        isr = tuple(b for b in state.isr if b in live)
        # The leader is gone, absent, or shutting down: elect from the ISR.
        choice = elect_leader(state, live, exclude=leaving, unclean=unclean)
        if choice is None:
            if state.leader and state.leader in leaving:
                return None  # nobody else can take over: it leads until it stops
            if state.leader == "" and isr == state.isr:
                return None  # still nobody to lead; keep the ISR as it was for a clean election
            # Keep the last ISR (without dead brokers, unless that empties it): whoever
            # of it returns first can lead without losing committed data.
            return replace(state, leader="", isr=isr or state.isr)
        leader, new_isr = choice
        if leader == state.leader:
            return replace(state, isr=new_isr) if new_isr != state.isr else None
        return replace(state, leader=leader, isr=new_isr, leader_epoch=state.leader_epoch + 1)

    def create_stream(self, config: StreamConfig, stream_id: str) -> StreamMetadata:
        """Create a stream (or return the same one): replicas spread over the live brokers."""
        return self._create(config, self.store.read_streams(), stream_id)

    def _create(
        self, config: StreamConfig, streams: list[StreamMetadata], stream_id: str | None = None
    ) -> StreamMetadata:
        for metadata in streams:
            if metadata.config.name == config.name:
                return confirm_existing(metadata, config)
        by_name = {m.config.name: m.config for m in streams}
        check_new_typed(config, by_name.get)
        leaders = [p.leader for m in streams for p in m.partitions]
        assignment = assign_replicas(
            self.store.live_brokers(), config.partitions, config.replication_factor, leaders
        )
        created = StreamMetadata(
            config,
            tuple(PartitionState(r[0], r, r, leader_epoch=0) for r in assignment),
            stream_id or new_stream_id(),
        )
        self.store.write_new_stream(created)
        logger.info(
            "created stream %s: %d partition(s), replicas %s",
            config.name,
            config.partitions,
            assignment,
            extra={"stream": config.name},
        )
        return created

    def _stream(self, name: str, streams: list[StreamMetadata] | None = None) -> StreamMetadata:
        """The stream ``name`` among ``streams`` (by default a fresh read); ``UnknownStreamError`` if
        there is none."""
        found = self.store.read_streams() if streams is None else streams
        metadata = next((m for m in found if m.config.name == name), None)
        if metadata is None:
            raise UnknownStreamError(f"no stream named {name!r}")
        return metadata

    def delete_stream(self, name: str) -> None:
        """Delete a stream: its metadata goes and its id becomes a tombstone, in one write."""
        metadata = self._stream(name)
        self.store.write_deletion(metadata)
        logger.info(
            "deleted stream %s (%d partition(s))", name, len(metadata.partitions), extra={"stream": name}
        )

    def add_partitions(self, name: str, partitions: int) -> StreamMetadata:
        """Grow a stream: new partitions assigned as a new stream's; config and states in one write."""
        streams = self.store.read_streams()
        metadata = self._stream(name, streams)
        config = grown_config(metadata.config, partitions)
        if config is None:
            return metadata
        leaders = [p.leader for m in streams for p in m.partitions]
        assignment = assign_replicas(
            self.store.live_brokers(),
            config.partitions - len(metadata.partitions),
            config.replication_factor,
            leaders,
        )
        grown = StreamMetadata(config, metadata.partitions + new_partitions(assignment), metadata.stream_id)
        self.store.write_stream_change(metadata, grown)
        logger.info(
            "stream %s grew from %d to %d partition(s), new replicas %s",
            name,
            len(metadata.partitions),
            config.partitions,
            assignment,
            extra={"stream": name},
        )
        return grown

    def update_schema(self, name: str, document: SchemaDocument) -> StreamMetadata:
        """A stream's schema gets its next version (if compatible): its config in one versioned write."""
        metadata = self._stream(name)
        config = schema_updated(metadata.config, document)
        if config is None:
            return metadata
        streams = {m.config.name: m.config for m in self.store.read_streams()}
        check_dead_letter(config, streams.get, before=metadata.config)
        updated = StreamMetadata(config, metadata.partitions, metadata.stream_id)
        self.store.write_stream_change(metadata, updated)
        logger.info("stream %s: schema now %r", name, config.schema, extra={"stream": name})
        return updated

    def promote_mirror(self, name: str) -> StreamMetadata:
        """A mirror stops copying and takes publishes: its config in one versioned write."""
        metadata = self._stream(name)
        config = promoted(metadata.config)
        if config is None:
            return metadata
        updated = StreamMetadata(config, metadata.partitions, metadata.stream_id)
        self.store.write_stream_change(metadata, updated)
        logger.info("stream %s: mirror promoted", name, extra={"stream": name})
        return updated

    def elect_preferred_leaders(self) -> dict[str, Any]:
        """Move leadership to each partition's first replica where it is live and in sync."""
        live = set(self.store.live_brokers()) - self.store.shutting_down()
        changes = []
        for metadata in self.store.read_streams():
            for number, state in enumerate(metadata.partitions):
                preferred = preferred_leader(state, live)
                if preferred is not None:
                    new = replace(state, leader=preferred, leader_epoch=state.leader_epoch + 1)
                    changes.append(PartitionChange(metadata.config.name, number, state.version, new))
        if changes:
            self.store.write_partitions(changes)
        return {"moved": [f"{c.stream}/{c.partition} -> {c.state.leader}" for c in changes]}

    def reassign(self, moves: list[reassignment.Move], throttle: int) -> dict[str, Any]:
        """Begin moving partitions (see :mod:`.reassignment`): every move checked first, then one write."""
        live = self.store.live_brokers()
        checked = reassignment.checked_plan(moves, self.store.read_streams(), live)
        changes = []
        under_way = []
        for metadata, move in checked:
            state = metadata.partitions[move.partition]
            new = reassignment.started(state, move.replicas, throttle)
            if new is not None:
                changes.append(PartitionChange(move.stream, move.partition, state.version, new))
            elif state.reassigning:
                under_way.append(f"{move.stream}/{move.partition}")
        if changes:
            self.store.write_partitions(changes)
            for change in changes:
                logger.info(
                    "moving %s/%d to %s (throttle %s)",
                    change.stream,
                    change.partition,
                    ", ".join(change.state.target),
                    f"{throttle} B/s" if throttle else "none",
                    extra={"stream": change.stream, "partition": change.partition},
                )
        return {"started": [f"{c.stream}/{c.partition}" for c in changes], "under_way": under_way}

    def cancel_reassignments(self, partitions: list[tuple[str, int]] | None) -> dict[str, Any]:
        """Put partitions being moved (``None``: all of them) back on their original replicas."""
        live = set(self.store.live_brokers()) - self.store.shutting_down()
        wanted = None if partitions is None else set(partitions)
        changes = []
        for metadata in self.store.read_streams():
            for number, state in enumerate(metadata.partitions):
                key = (metadata.config.name, number)
                if not state.reassigning or (wanted is not None and key not in wanted):
                    continue
                try:
                    new = reassignment.cancelled(state, live)
                except InvalidArgumentError as exc:
                    raise InvalidArgumentError(f"{key[0]}/{key[1]}: {exc}") from None
                changes.append(PartitionChange(key[0], number, state.version, new))
        if changes:
            self.store.write_partitions(changes)
            for change in changes:
                logger.info("cancelled moving %s/%d", change.stream, change.partition)
        return {"cancelled": [f"{c.stream}/{c.partition}" for c in changes]}
