"""The coordinator interface and the metadata it holds.

Partition state changes only through :meth:`Coordinator.update_partition`, a
compare-and-set on the state's ``version``: a writer that lost a race gets
:class:`ConflictError` and must re-read, never overwrite.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark_jetstream.protocol.streams import StreamConfig

from .errors import ConflictError

__all__ = ["BrokerInfo", "ConflictError", "Coordinator", "PartitionState", "StreamMetadata"]


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A live broker and where it serves Flight."""

    broker_id: str
    flight_address: str


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Leadership of one partition, versioned for compare-and-set."""

    leader: str
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    leader_epoch: int = 0
    version: int = 0

    def to_json(self) -> dict[str, Any]:
        """Stored form."""
        return {
            "leader": self.leader,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "leader_epoch": self.leader_epoch,
            "version": self.version,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartitionState:
        """Parse the stored form."""
        return cls(
            leader=data["leader"],
            replicas=tuple(data["replicas"]),
            isr=tuple(data["isr"]),
            leader_epoch=int(data["leader_epoch"]),
            version=int(data["version"]),
        )


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


Listener = Callable[[], None]


class Coordinator(abc.ABC):
    """Where brokers agree on streams and partition leadership."""

    @abc.abstractmethod
    def start(self, broker: BrokerInfo) -> None:
        """Join as ``broker``; metadata is readable afterwards."""

    @abc.abstractmethod
    def close(self) -> None:
        """Leave; the broker's registration ends."""

    @abc.abstractmethod
    def brokers(self) -> list[BrokerInfo]:
        """Live brokers."""

    @abc.abstractmethod
    def create_stream(self, config: StreamConfig) -> StreamMetadata:
        """Create a stream, or return it if one with the same config exists.

        Raises ``StreamExistsError`` listing the differences if the name is
        taken by another config, ``NotEnoughReplicasError`` if the
        replication factor exceeds the live brokers.
        """

    @abc.abstractmethod
    def delete_stream(self, name: str) -> None:
        """Delete a stream; ``UnknownStreamError`` if there is none.

        The stream's id joins :meth:`deleted_stream_ids` in the same write
        that removes the stream, so its data may go from then on.
        """

    @abc.abstractmethod
    def deleted_stream_ids(self) -> frozenset[str]:
        """Ids of deleted streams: data on disk under one of these may be removed, nothing else."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the metadata lives, for messages (a file path, ZooKeeper hosts and chroot)."""

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
        otherwise.
        """

    @abc.abstractmethod
    def add_listener(self, listener: Listener) -> None:
        """Call ``listener`` (with no arguments) whenever streams or partitions change."""
