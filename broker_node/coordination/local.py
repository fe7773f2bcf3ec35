"""Single-broker coordinator: metadata in one JSON file beside the data.

Layout of ``<data_dir>/metadata.json`` (written atomically)::

    {"version": 1,
     "streams": {"<name>": {"config": {...StreamConfig...},
                            "partitions": [{...PartitionState...}, ...]}}}
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from broker_node.log.checkpoint import atomic_write
from pyspark_jetstream.protocol.errors import (
    NotEnoughReplicasError,
    StreamExistsError,
    UnknownStreamError,
)
from pyspark_jetstream.protocol.streams import StreamConfig

from .base import BrokerInfo, ConflictError, Coordinator, Listener, PartitionState, StreamMetadata

logger = logging.getLogger(__name__)

METADATA_FILE = "metadata.json"
METADATA_VERSION = 1


class LocalCoordinator(Coordinator):
    """Metadata of a one-broker deployment, kept on disk."""

    def __init__(self, data_dir: str | Path) -> None:
        self._path = Path(data_dir) / METADATA_FILE
        self._lock = threading.RLock()
        self._streams: dict[str, StreamMetadata] = {}
        self._broker: BrokerInfo | None = None
        self._listeners: list[Listener] = []

    def start(self, broker: BrokerInfo) -> None:
        """Load the metadata file (if any) and register ``broker``."""
        self._broker = broker
        self._path.parent.mkdir(parents=True, exist_ok=True)
        if self._path.exists():
            document = json.loads(self._path.read_text(encoding="utf-8"))
            if document.get("version") != METADATA_VERSION:
                raise ValueError(f"{self._path} has unknown metadata version {document.get('version')!r}")
            self._streams = {
                name: StreamMetadata(
                    StreamConfig.from_json(entry["config"]),
                    tuple(PartitionState.from_json(p) for p in entry["partitions"]),
                )
                for name, entry in document["streams"].items()
            }

    def close(self) -> None:
        """Nothing to release: every change is already on disk."""

    def brokers(self) -> list[BrokerInfo]:
        """Just this broker."""
        return [self._broker] if self._broker else []

    def create_stream(self, config: StreamConfig) -> StreamMetadata:
        """See :meth:`Coordinator.create_stream`."""
        with self._lock:
            existing = self._streams.get(config.name)
            if existing is not None:
                if existing.config == config:
                    return existing
                raise StreamExistsError(
                    f"stream {config.name!r} exists with a different configuration: "
                    + "; ".join(config.differences(existing.config))
                    + " (requested != existing)"
                )
            brokers = self.brokers()
            if config.replication_factor > len(brokers):
                raise NotEnoughReplicasError(
                    f"replication factor {config.replication_factor} needs as many brokers, "
                    f"but {len(brokers)} broker(s) exist"
                )
            me = brokers[0].broker_id
            metadata = StreamMetadata(
                config, tuple(PartitionState(me, (me,), (me,)) for _ in range(config.partitions))
            )
            self._streams[config.name] = metadata
            self._save()
        self._notify()
        return metadata

    def delete_stream(self, name: str) -> None:
        """See :meth:`Coordinator.delete_stream`."""
        with self._lock:
            if self._streams.pop(name, None) is None:
                raise UnknownStreamError(f"no stream named {name!r}")
            self._save()
        self._notify()

    def get_stream(self, name: str) -> StreamMetadata:
        """See :meth:`Coordinator.get_stream`."""
        with self._lock:
            try:
                return self._streams[name]
            except KeyError:
                raise UnknownStreamError(f"no stream named {name!r}") from None

    def list_streams(self) -> list[StreamMetadata]:
        """See :meth:`Coordinator.list_streams`."""
        with self._lock:
            return [self._streams[name] for name in sorted(self._streams)]

    def update_partition(
        self, stream: str, partition: int, expected_version: int, state: PartitionState
    ) -> PartitionState:
        """See :meth:`Coordinator.update_partition`."""
        with self._lock:
            metadata = self.get_stream(stream)
            if not 0 <= partition < len(metadata.partitions):
                raise UnknownStreamError(
                    f"stream {stream!r} has partitions 0 to {len(metadata.partitions) - 1}, not {partition}"
                )
            current = metadata.partitions[partition]
            if current.version != expected_version:
                raise ConflictError(
                    f"{stream}/{partition} is at version {current.version}, not {expected_version}"
                )
            stored = PartitionState(
                state.leader, state.replicas, state.isr, state.leader_epoch, current.version + 1
            )
            partitions = list(metadata.partitions)
            partitions[partition] = stored
            self._streams[stream] = StreamMetadata(metadata.config, tuple(partitions))
            self._save()
        self._notify()
        return stored

    def add_listener(self, listener: Listener) -> None:
        """See :meth:`Coordinator.add_listener`."""
        self._listeners.append(listener)

    def _save(self) -> None:
        document = {
            "version": METADATA_VERSION,
            "streams": {
                name: {"config": m.config.to_json(), "partitions": [p.to_json() for p in m.partitions]}
                for name, m in sorted(self._streams.items())
            },
        }
        atomic_write(self._path, json.dumps(document, indent=1).encode())

    def _notify(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                logger.exception("metadata listener failed")
