"""The coordinator interface and the metadata it holds.

A coordinator is where brokers agree on streams, partition leadership and
who the controller is.  Two implementations: :class:`~.local.LocalCoordinator`
(one broker, a file) and :class:`~.zookeeper.ZooKeeperCoordinator` (a
cluster).  ``tests/coordination/test_contract.py`` runs one contract against
both.

Partition state changes only through :meth:`Coordinator.update_partition`, a
compare-and-set on the state's ``version``: a writer that lost a race gets
``ConflictError`` and must re-read, never overwrite; a write whose outcome is
unknown raises ``CommitStateUnknownError``.

Threads: listeners are called on the coordinator's own thread (the caller's
thread for the local coordinator, kazoo's event thread for ZooKeeper).  They
must return quickly and hand real work to the broker's event loop.
"""

from __future__ import annotations

import abc
import enum
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark_jetstream.protocol.errors import InvalidArgumentError, StreamExistsError
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import SchemaDocument

from .errors import ConflictError

__all__ = [
    "AclWatcher",
    "BrokerInfo",
    "ConflictError",
    "Coordinator",
    "Move",
    "PartitionState",
    "SessionState",
    "StreamMetadata",
    "new_stream_id",
]


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A live broker: where it serves Flight, and the NATS servers it uses."""

    broker_id: str
    flight_address: str
    nats_urls: tuple[str, ...] = ()
    rack: str = ""
    """Where it sits, if it says (``[broker] rack``): plans spread replicas over racks."""
    features: tuple[str, ...] = ()
    """What this broker's version can do that older ones cannot (``FEATURES``): a partition move
    is refused while a live broker lacks it (its writes would drop the move's fields)."""
    replication_address: str = ""
    """Where its followers connect to replicate (``tcp://host:port`` or ``tls://host:port``);
    empty from a broker of an earlier version, which replicated over Flight."""


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Leadership of one partition, versioned for compare-and-set.

    ``leader`` is ``""`` while no replica can lead (every in-sync replica is
    down and unclean election is off).
    """

    leader: str
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    leader_epoch: int = 0
    version: int = 0
    adding: tuple[str, ...] = ()
    """While a reassignment moves the partition: replicas it adds (they catch up, then join the ISR)."""
    removing: tuple[str, ...] = ()
    """While a reassignment moves the partition: replicas it drops once every target is in sync."""
    throttle: int = 0
    """While a reassignment moves the partition: bytes/s each adding broker may fetch (0: no limit)."""
    previous: tuple[str, ...] = ()
    """While a reassignment moves the partition: the replicas before it, in their order."""

    @property
    def reassigning(self) -> bool:
        """Whether a reassignment is moving this partition."""
        return bool(self.adding or self.removing)

    @property
    def target(self) -> tuple[str, ...]:
        """The replicas the partition has once its reassignment (if any) is done."""
        return tuple(r for r in self.replicas if r not in self.removing)

    @property
    def original(self) -> tuple[str, ...]:
        """The replicas the partition had before its reassignment (if any): what a cancel restores."""
        return self.previous or tuple(r for r in self.replicas if r not in self.adding)

    def to_json(self) -> dict[str, Any]:
        """Stored form (the local coordinator's file)."""
        stored: dict[str, Any] = {
            "leader": self.leader,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "leader_epoch": self.leader_epoch,
            "version": self.version,
        }
        if self.reassigning:
            stored.update(
                adding=list(self.adding),
                removing=list(self.removing),
                throttle=self.throttle,
                previous=list(self.previous),
            )
        return stored

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartitionState:
        """Parse the stored form."""
        return cls(
            leader=data["leader"],
            replicas=tuple(data["replicas"]),
            isr=tuple(data["isr"]),
            leader_epoch=int(data["leader_epoch"]),
            version=int(data["version"]),
            adding=tuple(data.get("adding", ())),
            removing=tuple(data.get("removing", ())),
            throttle=int(data.get("throttle", 0)),
            previous=tuple(data.get("previous", ())),
        )


@dataclass(frozen=True, slots=True)
class Move:
    """One entry of a reassignment plan: where a partition's replicas go (see :mod:`.reassignment`)."""

    stream: str
    partition: int
    replicas: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """Plan-file form."""
        return {"stream": self.stream, "partition": self.partition, "replicas": list(self.replicas)}


@dataclass(frozen=True, slots=True)
class StreamMetadata:
    """A stream's configuration and its partitions' leadership.

    ``stream_id`` is unique to this incarnation of the stream: a stream
    deleted and created again under the same name gets a new one, so data
    on disk can always be told apart from a namesake's.
    """

    config: StreamConfig
    partitions: tuple[PartitionState, ...]
    stream_id: str


FEATURES = ("reassign", "schema", "typed-batches", "puts2", "mirror")
"""The features this version registers with (``typed-batches``: it stores a typed stream's rows
sent as typed columns, see ``pyspark_jetstream/protocol/typed_rows.py``; ``puts2``: it takes a
producer's chunks over Flight in wire version 2, see ``pyspark_jetstream/protocol/put.py``, where
older brokers registered ``puts`` for version 1; clients use either only when every broker has it;
``mirror``: it reads a stream config's ``mirror`` and copies mirrors, see
``pyspark_jetstream/protocol/mirror.py``)."""


def new_stream_id() -> str:
    """A fresh, unique stream id."""
    return uuid.uuid4().hex


def confirm_existing(existing: StreamMetadata, config: StreamConfig) -> StreamMetadata:
    """``existing``, when creating a stream with ``config`` asks for it exactly (creation is
    idempotent); otherwise ``StreamExistsError`` listing the differences."""
    if existing.config == config:
        return existing
    raise StreamExistsError(
        f"stream {config.name!r} exists with a different configuration: "
        + "; ".join(config.differences(existing.config))
        + " (requested != existing)"
    )


class SessionState(enum.Enum):
    """This broker's standing with the coordinator."""

    CONNECTED = "connected"
    """Registered and in touch: leaders may lead."""
    SUSPENDED = "suspended"
    """Out of touch, but the session may still be alive: stop acting as leader
    (others cannot be elected before the session expires), keep the data."""
    LOST = "lost"
    """The session expired: everything this broker led may have moved; it
    registers again when it can."""


Listener = Callable[[], None]
SessionListener = Callable[[SessionState], None]
AclWatcher = Callable[[str | None], None]


class Coordinator(abc.ABC):
    """Where brokers agree on streams, partition leadership and the controller."""

    @abc.abstractmethod
    def start(self, broker: BrokerInfo) -> None:
        """Join as ``broker``; metadata is readable afterwards.

        Raises ``CoordinationError`` if the broker id is already registered
        by a live broker, or the coordinator cannot be reached (naming it).
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Leave; the broker's registration ends."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the metadata lives, for messages (a file path, ZooKeeper hosts and chroot)."""

    @abc.abstractmethod
    def brokers(self) -> list[BrokerInfo]:
        """Live brokers, by id."""

    @abc.abstractmethod
    def controller(self) -> str | None:
        """The id of the broker that is controller now, if any."""

    @abc.abstractmethod
    def create_stream(self, config: StreamConfig) -> StreamMetadata:
        """Create a stream, or return it if one with the same config exists.

        Only on the controller (else ``NotControllerError`` naming it).
        Raises ``StreamExistsError`` listing the differences if the name is
        taken by another config, ``NotEnoughReplicasError`` if the
        replication factor exceeds the live brokers.
        """

    @abc.abstractmethod
    def delete_stream(self, name: str) -> None:
        """Delete a stream; ``UnknownStreamError`` if there is none.  Only on the controller.

        The stream's id joins :meth:`deleted_stream_ids` in the same write
        that removes the stream, so its data may go from then on.
        """

    @abc.abstractmethod
    def add_partitions(self, name: str, partitions: int) -> StreamMetadata:
        """Grow stream ``name`` to ``partitions`` partitions; return it as stored.  Only on the controller.

        The new partitions are assigned as a new stream's would be, and the
        stream's config and their states are stored in one write: nobody
        reads the new count without every new partition.  The same count
        again changes nothing.  Raises ``UnknownStreamError``,
        ``InvalidArgumentError`` for fewer partitions or a bad count, and
        ``NotEnoughReplicasError`` when the replication factor exceeds the
        live brokers.
        """

    @abc.abstractmethod
    def update_schema(self, name: str, document: SchemaDocument) -> StreamMetadata:
        """Make ``document`` the next version of stream ``name``'s schema; return the stream as stored.

        Only on the controller.  The same schema as the current version changes nothing.  Raises
        ``UnknownStreamError``, and ``InvalidArgumentError`` (one line naming the field and why)
        for an incompatible change or a stream without a schema.
        """

    @abc.abstractmethod
    def promote_mirror(self, name: str) -> StreamMetadata:
        """Stop mirror ``name`` for good and let it take publishes (its config's mirror marked
        promoted, in one versioned write); return the stream as stored.  Only on the controller.

        A promoted mirror again changes nothing.  Raises ``UnknownStreamError``, and
        ``InvalidArgumentError`` for a stream that is no mirror.
        """

    @abc.abstractmethod
    def deleted_stream_ids(self) -> frozenset[str]:
        """Ids of deleted streams: data on disk under one of these may be removed, nothing else."""

    @abc.abstractmethod
    def get_stream(self, name: str) -> StreamMetadata:
        """One stream; ``UnknownStreamError`` if there is none."""

    @abc.abstractmethod
    def list_streams(self) -> list[StreamMetadata]:
        """Every stream, by name."""

    @abc.abstractmethod
    def update_partition(
        self, stream: str, partition: int, expected_version: int, state: PartitionState
    ) -> PartitionState:
        """Replace a partition's state if its version is still ``expected_version``.

        Returns the stored state (version incremented); raises ``ConflictError``
        otherwise, and ``CommitStateUnknownError`` if the outcome is unknown.
        """

    @abc.abstractmethod
    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` (no arguments) whenever streams, partitions, brokers or the controller change."""

    @abc.abstractmethod
    def store_acl(self, text: str) -> None:
        """Keep ``text``, the cluster's ACL (TOML, opaque here), for every broker.

        Replaces any stored text; every :meth:`watch_acl` callback hears of it.
        Raises ``CoordinationError`` if it could not be stored, and
        ``CommitStateUnknownError`` if it may or may not have been.
        """

    @abc.abstractmethod
    def watch_acl(self, callback: AclWatcher) -> None:
        """Call ``callback`` with the stored ACL text now, and again on every change.

        ``None`` when no text is stored.  Called at once on the caller's
        thread, later on the coordinator's (see the module docstring); a
        callback that raises is logged and keeps being called.
        """

    def add_session_listener(self, listener: SessionListener) -> None:  # noqa: B027 - optional hook
        """Call ``listener`` with the new :class:`SessionState` when it changes (never, by default)."""

    def request_controlled_shutdown(self, broker_id: str) -> None:  # noqa: B027 - optional hook
        """Ask the controller to move leadership away from ``broker_id`` before it stops."""

    def elect_preferred_leaders(self) -> dict[str, Any]:
        """Move leadership back to each partition's first replica where it is in sync; on the controller."""
        return {"moved": []}

    def reassign(self, moves: list[Move], throttle: int) -> dict[str, Any]:
        """Begin moving partitions to other brokers (see :mod:`.reassignment`); on the controller."""
        raise InvalidArgumentError(f"moving partitions needs a cluster; {self.describe()} holds one broker")

    def cancel_reassignments(self, partitions: list[tuple[str, int]] | None) -> dict[str, Any]:
        """Put partitions being moved (``None``: all) back on their original replicas; on the controller."""
        raise InvalidArgumentError(f"moving partitions needs a cluster; {self.describe()} holds one broker")
