"""The replica manager: the partitions this broker holds, in the roles the coordinator gives them.

:meth:`ReplicaManager.apply` reads the coordinator's metadata and makes this
broker's partitions fit it: it opens the partitions assigned here (checking
each directory belongs to that very stream), makes them leaders or followers
(starting a :class:`~.fetcher.Fetcher` for each follower, a task on the
broker's event loop: :mod:`.follower_fetchers`), applies ISR
changes, and closes partitions no longer here, removing the directories of
deleted streams and of partitions moved to other brokers (only those: see
:mod:`.partition_record`).  It runs on whatever thread calls it, one call at a time.

A thread of its own keeps the ISRs of the partitions led here
(:mod:`.isr_keeper`): it drops followers that have not caught up for
``replica_max_lag`` seconds and adds back those that caught up (proposed by
their fetches), each change a compare-and-set through the coordinator.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from pyarrow import flight

from broker_node.coordination.base import Coordinator, PartitionState, StreamMetadata
from broker_node.coordination.errors import MetadataError
from broker_node.coordination.local import RECOVERY_HINT
from broker_node.log import Log, LogConfig, LogError
from broker_node.log.logging_labels import Labels
from pyspark_jetstream.protocol.errors import (
    JetStreamError,
    NotLeaderError,
    UnavailableError,
    UnknownStreamError,
)
from pyspark_jetstream.protocol.streams import StreamConfig

from .fetcher import Fetcher
from .follower_fetchers import FollowerFetchers
from .isr_keeper import IsrKeeper
from .leader_repair import repair_leader
from .partition import Partition, Role
from .partition_record import partition_directories, partition_record, read_record, write_record
from .replication_config import ReplicationConfig
from .throttle import Throttle

logger = logging.getLogger(__name__)

Key = tuple[str, int]
APPLY_WAIT = 30.0
"""Seconds ``close`` waits for an apply under way (one stuck on the coordinator is not waited out)."""


class ReplicaManager:
    """The partitions held by one broker (see the module docstring)."""

    def __init__(
        self,
        broker_id: str,
        data_dir: Path,
        coordinator: Coordinator,
        config: ReplicationConfig,
        log_config: Callable[[StreamConfig], LogConfig],
        *,
        lease: Callable[[], bool] = lambda: True,
    ) -> None:
        self.broker_id = broker_id
        self.data_dir = data_dir
        self.coordinator = coordinator
        self.config = config
        self._log_config = log_config
        self._lease = lease
        self._partitions: dict[Key, Partition] = {}
        self._stream_ids: dict[Key, str] = {}
        """Which incarnation of its stream each open partition belongs to."""
        self.connect_peer: Callable[[str], flight.FlightClient] = flight.connect
        """Opens a Flight client to another broker (the broker sets its TLS and credentials)."""
        self._released: dict[Key, int] = {}
        """The last partition state version each partition closed here held: a moved copy is
        deleted only on a newer state that leaves this broker out (not on a stale snapshot)."""
        self.throttle = Throttle()
        """Holds back the fetches of partitions being moved onto this broker (see ``throttle``)."""
        self.offline: dict[Key, str] = {}
        """Partitions this broker should hold but cannot, and why."""
        self.strays: dict[str, str] = {}
        """Partition directories the metadata does not know, and why they are kept."""
        self._lock = threading.RLock()
        self.fetching = FollowerFetchers(
            config,
            self._lock,
            replication_address_of=self.replication_address_of,
            peer_address_of=self.peer_address_of,
            connect=lambda address: self.connect_peer(address),  # noqa: PLW0108 - set after this
            throttle=self.throttle,
        )
        """The fetchers of the partitions followed here (see :mod:`.follower_fetchers`); the broker
        sets their ``loop`` and ``link``."""
        self._apply_lock = threading.Lock()
        self._fenced = False
        self._stopped = threading.Event()
        self._isr = IsrKeeper(coordinator, config.replica_max_lag, self.leaders, self._stopped)
        """The thread keeping the ISRs of the partitions led here (see :mod:`.isr_keeper`)."""

    def start(self) -> None:
        """Start keeping ISRs (call once the first :meth:`apply` is done)."""
        self._isr.start()

    # ---- lookups ---------------------------------------------------------------------------

    def get(self, stream: str, number: int) -> Partition | None:
        """The partition if this broker holds it."""
        with self._lock:
            return self._partitions.get((stream, number))

    def held(self) -> list[Partition]:
        """Every partition held here."""
        with self._lock:
            return list(self._partitions.values())

    def leaders(self) -> dict[Key, Partition]:
        """The partitions this broker leads now."""
        with self._lock:
            return {k: p for k, p in self._partitions.items() if p.role is Role.LEADER}

    def fetchers(self) -> dict[Key, Fetcher]:
        """The running fetchers, by partition."""
        return self.fetching.running()

    def require(self, stream: str, number: int, *, leader: bool, from_replicas: bool = False) -> Partition:
        """The partition to serve a request, or the error that names who can.

        ``leader``: only its leader may serve (writes, cursors); otherwise an
        in-sync follower may too when ``from_replicas``.  A partition held
        elsewhere raises ``NotLeaderError`` with its leader; a stream or
        partition that does not exist, ``UnknownStreamError``.
        """
        partition = self.get(stream, number)
        if partition is not None:
            if partition.role is Role.LEADER and (partition.is_leader or not leader):
                return partition
            in_sync = self.broker_id in partition.state.isr
            if not leader and from_replicas and partition.role is Role.FOLLOWER and in_sync:
                return partition
        metadata = self.coordinator.get_stream(stream)  # raises UnknownStreamError
        if not 0 <= number < len(metadata.partitions):
            raise UnknownStreamError(
                f"stream {stream!r} has partitions 0 to {len(metadata.partitions) - 1}, not {number}",
                stream=stream,
                partition=number,
            )
        state = metadata.partitions[number]
        if state.leader == self.broker_id:
            why = self.offline.get((stream, number), "it is taking up the role")
            raise UnavailableError(
                f"broker {self.broker_id} leads {stream}/{number} but cannot serve it: {why}",
                stream=stream,
                partition=number,
            )
        address = next(
            (b.flight_address for b in self.coordinator.brokers() if b.broker_id == state.leader), None
        )
        where = (
            f"ask its leader {state.leader} at {address}" if state.leader else "it has no leader right now"
        )
        raise NotLeaderError(
            f"broker {self.broker_id} does not lead {stream}/{number}: {where}",
            stream=stream,
            partition=number,
            leader=state.leader or None,
            leader_address=address,
        )

    def address_of(self, broker_id: str) -> str | None:
        """A live broker's Flight address, as it advertises it to clients."""
        return next((b.flight_address for b in self.coordinator.brokers() if b.broker_id == broker_id), None)

    def replication_address_of(self, broker_id: str) -> str:
        """Where this broker reaches a live peer's replication listener: ``[replication]
        peer_replication_addresses`` if set, else the address it registered; ``UnavailableError``
        naming why there is none."""
        info = next((b for b in self.coordinator.brokers() if b.broker_id == broker_id), None)
        if info is None:
            raise UnavailableError(f"leader {broker_id} is not registered (not running?)")
        address = self.config.peer_replication_addresses.get(broker_id) or info.replication_address
        if not address:
            raise UnavailableError(
                f"leader {broker_id} offers no replication listener: it runs an older version of the "
                "broker, which replicates over Flight; run the same version on every broker"
            )
        return address

    def led_for(self, stream: str, number: int, replica: str, leader_epoch: int) -> Partition:
        """The partition ``replica`` follows, led here in ``leader_epoch``: ``NotLeaderError``
        (or ``UnavailableError`` while taking up the role, ``UnknownStreamError``) otherwise."""
        partition = self.require(stream, number, leader=True)
        epoch = partition.state.leader_epoch
        if leader_epoch != epoch:
            raise NotLeaderError(
                f"{replica} follows {stream}/{number} in leader epoch {leader_epoch}, but this leader "
                f"is in epoch {epoch}",
                stream=stream,
                partition=number,
            )
        if replica == self.broker_id or replica not in partition.state.replicas:
            raise NotLeaderError(
                f"{replica} is not a replica of {stream}/{number} in epoch {epoch}",
                stream=stream,
                partition=number,
            )
        return partition

    def repair_leader(self, partition: Partition) -> None:
        """Repair a damaged leader's log from an in-sync follower (see ``leader_repair``)."""
        repair_leader(partition, self.peer_address_of, connect=self.connect_peer)

    def peer_address_of(self, broker_id: str) -> str | None:
        """Where this broker reaches a live peer: ``peer_addresses`` if set, else its advertised address."""
        address = self.address_of(broker_id)
        if address is None:
            return None
        return self.config.peer_addresses.get(broker_id, address)

    # ---- applying the coordinator's state -------------------------------------------------

    def apply(self) -> None:
        """Make the partitions held here fit the coordinator's metadata (see the module docstring)."""
        with self._apply_lock:
            if self._stopped.is_set():
                return  # closing: a partition opened now would race its own closing
            streams = self.coordinator.list_streams()
            wanted = {
                (m.config.name, n): (m, state)
                for m in streams
                for n, state in enumerate(m.partitions)
                if self.broker_id in state.replicas
            }
            for key, (metadata, state) in wanted.items():
                partition = self.get(*key)
                if partition is not None and self._stream_ids.get(key) != metadata.stream_id:
                    # Deleted and created again between two looks at the metadata.
                    self._close_partition(key)  # opening it again removes the old files
                    partition = None
                if partition is None:
                    partition = self._open(metadata, key[1], state)
                    if partition is None:
                        continue
                if partition.closed:
                    continue  # shutting down: it takes no role any more
                if partition.config != metadata.config:
                    # A schema's new version (or partitions added): a typed stream's next
                    # append parses with the version current then, without a restart.  The
                    # record follows, so a rebuild of lost metadata finds every version.
                    partition.config = metadata.config
                    self._write_record(metadata, key[1])
                try:
                    self._apply_role(partition, state)
                except Exception as exc:
                    # One partition (a full disk under its epoch checkpoint, say) must not keep
                    # the others from their new roles; the next change or reload tries again.
                    fields = Labels(*key).fields
                    if isinstance(exc, JetStreamError | LogError | OSError):  # its message says it all
                        logger.error("%s/%d: cannot take its new role yet: %s", *key, exc, extra=fields)
                    else:
                        logger.exception("%s/%d: cannot take its new role yet", *key, extra=fields)
                    self.offline[key] = f"cannot take its role ({_role_of(state, self.broker_id)}): {exc}"
                else:
                    self.offline.pop(key, None)
            for key in [k for k in self.offline if k not in wanted]:
                del self.offline[key]
            gone = [k for k in self.held_keys() if k not in wanted]
            for key in gone:
                self._close_partition(key)
            lingering = [k for k in self._released if k not in wanted and self.partition_dir(*k).exists()]
            if gone or lingering:
                self.clean_up(streams)

    def held_keys(self) -> list[Key]:
        """The partitions open here."""
        with self._lock:
            return list(self._partitions)

    def _close_partition(self, key: Key) -> None:
        with self._lock:
            partition = self._partitions.pop(key)
            self._stream_ids.pop(key, None)
            self._released[key] = partition.state.version
        self.fetching.stop(key)
        partition.close()
        logger.info("%s/%d: closed here", *key, extra=Labels(*key).fields)

    def _apply_role(self, partition: Partition, state: PartitionState) -> None:
        key = (partition.stream, partition.number)
        current = partition.state
        if partition.role is not Role.OPENED and state.version < current.version:
            return  # a snapshot read before a newer write this partition already took
        if state.leader == self.broker_id:
            if partition.role is not Role.LEADER or current.leader_epoch != state.leader_epoch:
                self.fetching.stop(key)
                partition.become_leader(state)
                partition.fence(self._fenced)
            elif state.version != current.version:
                partition.update_state(state)
            return
        new_leader = partition.role is not Role.FOLLOWER or current.leader_epoch != state.leader_epoch
        if new_leader or current.leader != state.leader:
            self.fetching.stop(key)
            partition.become_follower(state)
            if state.leader:
                self.fetching.start(key, partition, state)
        elif state.version != current.version:
            partition.update_state(state)

    def _open(self, metadata: StreamMetadata, number: int, state: PartitionState) -> Partition | None:
        key = (metadata.config.name, number)
        try:
            partition = self._open_partition(metadata, number, state)
        except Exception as exc:
            # One damaged partition must not keep the others from serving.
            logger.exception("%s/%d: cannot be opened; it stays offline", *key, extra=Labels(*key).fields)
            self.offline[key] = f"cannot be opened: {exc}"
            return None
        self.offline.pop(key, None)
        with self._lock:
            self._partitions[key] = partition
            self._stream_ids[key] = metadata.stream_id
        return partition

    def _open_partition(self, metadata: StreamMetadata, number: int, state: PartitionState) -> Partition:
        config = metadata.config
        labels = Labels(config.name, number)
        directory = self.partition_dir(config.name, number)
        record = read_record(directory)
        if record is not None and record["stream_id"] != metadata.stream_id:
            if record["stream_id"] not in self.coordinator.deleted_stream_ids():
                raise MetadataError(
                    f"{directory} holds partition {number} of another stream named {config.name!r} "
                    f"(id {record['stream_id']}) that the metadata does not know: move it away "
                    "to reuse the name"
                )
            labels.bind(logger).warning("removing %s: it holds a deleted stream of the same name", directory)
            shutil.rmtree(directory)
        new = not directory.exists()
        log = Log.open(directory, self._log_config(config), labels=labels)
        try:
            write_record(directory, partition_record(metadata, number))
            partition = Partition(config, number, log, self.broker_id, state, lease=self._lease)
        except BaseException:
            log.close()
            raise
        if new:
            labels.bind(logger).info("created here, replicas %s", ", ".join(state.replicas))
        return partition

    def _write_record(self, metadata: StreamMetadata, number: int) -> None:
        """Record ``metadata``'s config beside partition ``number``'s log; a failure is logged (the
        partition serves on; the next change or open writes it again)."""
        try:
            write_record(self.partition_dir(metadata.config.name, number), partition_record(metadata, number))
        except OSError as exc:
            logger.error(
                "%s/%d: cannot record its new config: %s",
                metadata.config.name,
                number,
                exc,
                extra=Labels(metadata.config.name, number).fields,
            )

    def partition_dir(self, stream: str, number: int) -> Path:
        """Where a partition's log lives."""
        return self.data_dir / "streams" / stream / str(number)

    def check_data(self) -> None:
        """Refuse to start when the metadata knows no stream but the data directory holds some.

        That is lost metadata (a missing file, a wrong ZooKeeper chroot), and
        starting would serve nothing and tempt someone to clean up.
        """
        if self.coordinator.list_streams():
            return
        deleted = self.coordinator.deleted_stream_ids()
        names = set()
        for directory in partition_directories(self.data_dir / "streams"):
            record = read_record(directory)
            if record is None:
                names.add(f"{directory.parent.name!r} (without partition.json)")
            elif record["stream_id"] not in deleted:
                names.add(repr(record["stream"]))
        if names:
            raise MetadataError(
                f"the metadata ({self.coordinator.describe()}) has no streams, but "
                f"{self.data_dir / 'streams'} holds partitions of {', '.join(sorted(names))}. {RECOVERY_HINT}"
            )

    def clean_up(self, streams: list[StreamMetadata] | None = None) -> None:
        """Remove partition directories of deleted streams and of partitions moved to other brokers;
        note any the metadata does not know.

        Only a directory whose ``partition.json`` names a deleted stream id,
        or a partition of a live stream (the very same stream id) whose
        replicas no longer include this broker, is removed: absent or
        unreadable metadata never deletes data.  ``streams`` is the metadata
        ``apply`` acted on (by default a fresh read); a partition open here is
        never removed, nor a moved one on a state no newer than the one it
        was closed under.
        """
        deleted = self.coordinator.deleted_stream_ids()
        if streams is None:
            streams = self.coordinator.list_streams()
        known = {
            (m.config.name, str(n))
            for m in streams
            for n, state in enumerate(m.partitions)
            if self.broker_id in state.replicas
        }
        known |= {(name, str(n)) for name, n in self.held_keys()}
        moved = {
            (m.stream_id, n, m.config.name)
            for m in streams
            for n, state in enumerate(m.partitions)
            if self.broker_id not in state.replicas
            and state.version > self._released.get((m.config.name, n), -1)
        }
        strays = {}
        for directory in partition_directories(self.data_dir / "streams"):
            if (directory.parent.name, directory.name) in known:
                continue
            record = read_record(directory)
            labels = Labels(str(record["stream"]), _number(record["partition"])) if record else None
            if record is not None and labels is not None and record["stream_id"] in deleted:
                labels.bind(logger).info("removing %s: its stream was deleted", directory)
                shutil.rmtree(directory)
            elif (
                record is not None
                and labels is not None
                and (record["stream_id"], record["partition"], record["stream"]) in moved
                and directory.name == str(record["partition"])
            ):
                labels.bind(logger).info("removing %s: the partition was moved to other brokers", directory)
                shutil.rmtree(directory)
            else:
                strays[str(directory)] = (
                    "not in the metadata; kept untouched (move it away, or rebuild the metadata)"
                )
        for stream_dir in self.data_dir.joinpath("streams").glob("*"):
            if stream_dir.is_dir() and not any(stream_dir.iterdir()):
                stream_dir.rmdir()
        self.strays = strays

    # ---- fencing and ISRs -----------------------------------------------------------------

    def fence(self, fenced: bool) -> None:
        """Stop (or resume) acknowledging in every partition led here."""
        self._fenced = fenced
        for partition in self.held():
            if partition.role is Role.LEADER:
                partition.fence(fenced)

    def request_isr(self, partition: Partition, replica: str) -> None:
        """Ask for ``replica`` to join ``partition``'s ISR (it caught up); checked again when written."""
        self._isr.request(partition, replica)

    def close(self) -> list[str]:
        """Stop fetchers and the ISR thread, close every partition; return what could not be closed.

        Every partition is closed even when one fails (a full disk, say).
        """
        self._isr.stop()
        # An apply under way finishes first (later ones do nothing), so none reopens a
        # partition being closed here (bounded: one stuck on the coordinator is not waited for).
        applying = self._apply_lock.acquire(timeout=APPLY_WAIT)
        try:
            with self._lock:
                fetchers = self.fetching.take_all()
                partitions, self._partitions = list(self._partitions.values()), {}
        finally:
            if applying:
                self._apply_lock.release()
        for fetcher in fetchers:
            fetcher.stop()
        for partition in partitions:
            partition.wake_readers()
        failures = []
        for partition in partitions:
            try:
                partition.close()
            except LogError as exc:
                failures.append(str(exc))
                Labels(partition.stream, partition.number).bind(logger).error("cannot close: %s", exc)
        self._isr.join(5)
        self.fetching.close_loop()
        return failures


def _number(value: object) -> int | None:
    """A partition number from a partition record (``None`` if it holds something else)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _role_of(state: PartitionState, broker_id: str) -> str:
    return f"leader in epoch {state.leader_epoch}" if state.leader == broker_id else "follower"
