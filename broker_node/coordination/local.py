"""Single-broker coordinator: metadata in one JSON file beside the data.

Layout of ``<data_dir>/metadata.json`` (written atomically: temp file, fsync,
rename), format version 2::

    {"version": 2,
     "streams": {"<name>": {"id": "<stream id>",
                            "config": {...StreamConfig...},
                            "partitions": [{...PartitionState...}, ...]}},
     "deleted": ["<stream id>", ...]}

``deleted`` lists the ids of deleted streams (tombstones): a partition
directory whose ``partition.json`` names one of them may be removed, and
nothing else ever is.  A version 1 file (no ids, no tombstones) is read and
upgraded: its streams get ids at the next write.

The cluster's ACL text (:meth:`LocalCoordinator.store_acl`) is kept as it is
given in ``<data_dir>/acl.toml``, written the same atomic way; watchers hear
of what :meth:`LocalCoordinator.store_acl` stores, not of edits by hand (a
broker re-reads the file when it starts).

A missing file is a first start; an empty or unreadable one is an error that
names the file, because starting empty would treat every stream on disk as
unknown.  :func:`.rebuild.rebuild_metadata` writes the file again from the partitions'
own ``partition.json`` records.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_node.durable import atomic_write
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    NotEnoughReplicasError,
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

from .assignment import assign_replicas, grown_config, new_partitions
from .base import (
    AclWatcher,
    BrokerInfo,
    ConflictError,
    Coordinator,
    Listener,
    PartitionState,
    StreamMetadata,
    confirm_existing,
    new_stream_id,
)
from .errors import MetadataError

logger = logging.getLogger(__name__)

METADATA_FILE = "metadata.json"
ACL_FILE = "acl.toml"
METADATA_VERSION = 2
_READABLE_VERSIONS = (1, 2)
RECOVERY_HINT = (
    "Nothing was deleted. Restore the file from a backup, or rebuild it from the partitions' own "
    "records with: python -m broker_node --config <your config> --rebuild-metadata"
)


class LocalCoordinator(Coordinator):
    """Metadata of a one-broker deployment, kept on disk."""

    def __init__(self, data_dir: str | Path) -> None:
        self._path = Path(data_dir) / METADATA_FILE
        self._acl_path = Path(data_dir) / ACL_FILE
        self._acl_watchers: list[AclWatcher] = []
        self._lock = threading.RLock()
        self._streams: dict[str, StreamMetadata] = {}
        self._deleted: set[str] = set()
        self._broker: BrokerInfo | None = None
        self._listeners: list[Listener] = []

    def start(self, broker: BrokerInfo) -> None:
        """Load the metadata file (if any) and register ``broker``.

        Raises ``MetadataError`` naming the file if it is empty or unreadable.
        """
        self._broker = broker
        self._path.parent.mkdir(parents=True, exist_ok=True)
        if self._path.exists():
            self._streams, self._deleted = load_metadata(self._path)

    def close(self) -> None:
        """Nothing to release: every change is already on disk."""

    def describe(self) -> str:
        """See :meth:`Coordinator.describe`."""
        return str(self._path)

    def brokers(self) -> list[BrokerInfo]:
        """Just this broker."""
        return [self._broker] if self._broker else []

    def controller(self) -> str | None:
        """This broker: it alone decides."""
        return self._broker.broker_id if self._broker else None

    def create_stream(self, config: StreamConfig) -> StreamMetadata:
        """See :meth:`Coordinator.create_stream`."""
        with self._lock:
            existing = self._streams.get(config.name)
            if existing is not None:
                return confirm_existing(existing, config)
            check_new_typed(config, lambda name: _config_of(self._streams.get(name)))
            brokers = self.brokers()
            if config.replication_factor > len(brokers):
                raise NotEnoughReplicasError(
                    f"replication factor {config.replication_factor} needs as many brokers, "
                    f"but {len(brokers)} broker(s) exist"
                )
            me = brokers[0].broker_id
            metadata = StreamMetadata(
                config,
                tuple(PartitionState(me, (me,), (me,)) for _ in range(config.partitions)),
                new_stream_id(),
            )
            self._streams[config.name] = metadata
            self._save()
        logger.info(
            "created stream %s: %d partition(s)",
            config.name,
            config.partitions,
            extra={"stream": config.name},
        )
        self._notify()
        return metadata

    def delete_stream(self, name: str) -> None:
        """See :meth:`Coordinator.delete_stream`."""
        with self._lock:
            gone = self._streams.pop(name, None)
            if gone is None:
                raise UnknownStreamError(f"no stream named {name!r}")
            self._deleted.add(gone.stream_id)
            self._save()
        logger.info("deleted stream %s (%d partition(s))", name, len(gone.partitions), extra={"stream": name})
        self._notify()

    def add_partitions(self, name: str, partitions: int) -> StreamMetadata:
        """See :meth:`Coordinator.add_partitions`: every new partition is this broker's."""

        def grown(metadata: StreamMetadata) -> StreamMetadata | None:
            config = grown_config(metadata.config, partitions)
            if config is None:
                return None
            brokers = [b.broker_id for b in self.brokers()]
            count = config.partitions - len(metadata.partitions)
            added = new_partitions(assign_replicas(brokers, count, config.replication_factor))
            return StreamMetadata(config, metadata.partitions + added, metadata.stream_id)

        def said(before: StreamMetadata, after: StreamMetadata) -> None:
            logger.info(
                "stream %s grew from %d to %d partition(s)",
                name,
                len(before.partitions),
                after.config.partitions,
                extra={"stream": name},
            )

        return self._change(name, grown, said)

    def update_schema(self, name: str, document: SchemaDocument) -> StreamMetadata:
        """See :meth:`Coordinator.update_schema`."""

        def updated(metadata: StreamMetadata) -> StreamMetadata | None:
            config = schema_updated(metadata.config, document)
            if config is None:
                return None
            check_dead_letter(
                config, lambda other: _config_of(self._streams.get(other)), before=metadata.config
            )
            return StreamMetadata(config, metadata.partitions, metadata.stream_id)

        def said(before: StreamMetadata, after: StreamMetadata) -> None:
            logger.info("stream %s: schema now %r", name, after.config.schema, extra={"stream": name})

        return self._change(name, updated, said)

    def promote_mirror(self, name: str) -> StreamMetadata:
        """See :meth:`Coordinator.promote_mirror`."""

        def promotion(metadata: StreamMetadata) -> StreamMetadata | None:
            config = promoted(metadata.config)
            return None if config is None else StreamMetadata(config, metadata.partitions, metadata.stream_id)

        def said(before: StreamMetadata, after: StreamMetadata) -> None:
            logger.info("stream %s: mirror promoted", name, extra={"stream": name})

        return self._change(name, promotion, said)

    def _change(
        self,
        name: str,
        change: Callable[[StreamMetadata], StreamMetadata | None],
        said: Callable[[StreamMetadata, StreamMetadata], None],
    ) -> StreamMetadata:
        """Stream ``name``'s metadata after ``change`` (``None``: nothing to change), stored and saved
        under the lock; then ``said(before, after)`` logs it and the listeners hear of it."""
        with self._lock:
            before = self.get_stream(name)
            after = change(before)
            if after is None:
                return before
            self._streams[name] = after
            self._save()
        said(before, after)
        self._notify()
        return after

    def deleted_stream_ids(self) -> frozenset[str]:
        """See :meth:`Coordinator.deleted_stream_ids`."""
        with self._lock:
            return frozenset(self._deleted)

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
            stored = dataclasses.replace(state, version=current.version + 1)
            partitions = list(metadata.partitions)
            partitions[partition] = stored
            self._streams[stream] = StreamMetadata(metadata.config, tuple(partitions), metadata.stream_id)
            self._save()
        self._notify()
        return stored

    def add_listener(self, listener: Listener) -> None:
        """See :meth:`Coordinator.add_listener`: called on the thread that made the change."""
        self._listeners.append(listener)

    def store_acl(self, text: str) -> None:
        """See :meth:`Coordinator.store_acl`: into ``<data_dir>/acl.toml``; watchers are called here."""
        with self._lock:  # held while calling back: watchers hear the changes in order
            self._acl_path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self._acl_path, text.encode("utf-8"))
            for watcher in self._acl_watchers:
                _call_acl_watcher(watcher, text)

    def watch_acl(self, callback: AclWatcher) -> None:
        """See :meth:`Coordinator.watch_acl`: the file's text now, then what :meth:`store_acl` stores.

        Raises ``MetadataError`` naming the file if it cannot be read.
        """
        with self._lock:
            try:
                text: str | None = self._acl_path.read_text(encoding="utf-8")
            except FileNotFoundError:
                text = None
            except OSError as exc:
                raise MetadataError(f"cannot read the ACL file {self._acl_path}: {exc.strerror}") from None
            except UnicodeDecodeError:
                raise MetadataError(f"the ACL file {self._acl_path} is not UTF-8 text") from None
            self._acl_watchers.append(callback)
            _call_acl_watcher(callback, text)

    def _save(self) -> None:
        write_metadata(self._path, self._streams, self._deleted)

    def _notify(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                logger.exception("metadata listener failed")


def _call_acl_watcher(watcher: AclWatcher, text: str | None) -> None:
    try:
        watcher(text)
    except Exception:
        logger.exception("ACL watcher failed")


def write_metadata(path: Path, streams: dict[str, StreamMetadata], deleted: set[str]) -> None:
    """Write the metadata file (atomically): ``streams`` by name and the ids of ``deleted`` ones."""
    document = {
        "version": METADATA_VERSION,
        "streams": {
            name: {
                "id": m.stream_id,
                "config": m.config.to_json(),
                "partitions": [p.to_json() for p in m.partitions],
            }
            for name, m in sorted(streams.items())
        },
        "deleted": sorted(deleted),
    }
    atomic_write(path, json.dumps(document, indent=1).encode())


def load_metadata(path: Path) -> tuple[dict[str, StreamMetadata], set[str]]:
    """The metadata file's streams by name and deleted stream ids; ``MetadataError`` naming the
    file and how to recover when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MetadataError(f"cannot read the metadata file {path}: {exc}. {RECOVERY_HINT}") from None
    if not text.strip():
        raise MetadataError(f"the metadata file {path} is empty. {RECOVERY_HINT}")
    try:
        document = json.loads(text)
        if not isinstance(document, dict):
            raise ValueError(f"a JSON {type(document).__name__}, not an object")
        version = document.get("version")
        if version not in _READABLE_VERSIONS:
            raise ValueError(f"unknown format version {version!r} (this broker reads {_READABLE_VERSIONS})")
        streams = {
            name: _stream(name, entry) for name, entry in _mapping(document.get("streams", {})).items()
        }
        deleted = {str(i) for i in document.get("deleted", [])}
    except (ValueError, TypeError, KeyError, InvalidArgumentError, RecursionError) as exc:
        raise MetadataError(f"the metadata file {path} is not valid: {exc}. {RECOVERY_HINT}") from None
    return streams, deleted


def _stream(name: str, entry: Any) -> StreamMetadata:
    entry = _mapping(entry)
    config = StreamConfig.from_json(entry["config"])
    if config.name != name:
        raise ValueError(f"stream {name!r} holds the config of {config.name!r}")
    return StreamMetadata(
        config,
        tuple(PartitionState.from_json(p) for p in entry["partitions"]),
        str(entry.get("id") or new_stream_id()),  # version 1 had no ids
    )


def _mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"expected an object, got {type(value).__name__}")
    return value


def _config_of(metadata: StreamMetadata | None) -> StreamConfig | None:
    return metadata.config if metadata is not None else None
