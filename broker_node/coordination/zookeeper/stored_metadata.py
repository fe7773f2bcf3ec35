"""The metadata stored in ZooKeeper's znodes: streams, partition states and the ACL text, and every
write to them (see :mod:`.znodes` for the layout).

Two kinds of writes.  A leader's change of its partition's state is a
compare-and-set on the partition znode's version
(:meth:`StoredMetadata.update_partition`).  The controller's writes (a new
stream, a grown or changed one, a deletion, leadership) are each one
ZooKeeper transaction that first checks the ``/controller_epoch`` znode's
version the controller set when it took the role up: a replaced
controller's writes fail as ``NotControllerError`` (fencing).  A write that
lost a race raises ``ConflictError`` (read again), one whose outcome is
unknown ``CommitStateUnknownError`` (do not blindly retry).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError, RolledBackError
from kazoo.recipe.watchers import DataWatch

from pyspark_jetstream.protocol.errors import UnknownStreamError

from .. import wire
from ..base import AclWatcher, PartitionState, StreamMetadata
from ..controller import PartitionChange
from ..errors import CommitStateUnknownError, ConflictError, CoordinationError, NotControllerError
from .znodes import ACL_TEXT, CONTROLLER_EPOCH, DELETED, OUTCOME_UNKNOWN, STREAMS, read_streams
from .zookeeper_session import ZooKeeperSession

logger = logging.getLogger(__name__)


class StoredMetadata:
    """Reads and writes the streams' znodes and the ACL's; the controller's writes are fenced by
    ``fence()``, the controller epoch znode's version this broker's controller set."""

    def __init__(self, session: ZooKeeperSession, fence: Callable[[], int]) -> None:
        self._session = session
        self._fence = fence
        self._acl_watches: list[DataWatch] = []

    def read_streams(self) -> list[StreamMetadata]:
        """Fresh read of every stream, by name; ``CoordinationError`` when ZooKeeper cannot answer."""
        streams = self._session.read(lambda: read_streams(self._session.connected_client(), None))
        return sorted(streams.values(), key=lambda m: m.config.name)

    def update_partition(
        self, stream: str, partition: int, expected_version: int, state: PartitionState
    ) -> PartitionState:
        """See :meth:`Coordinator.update_partition`."""
        client = self._session.connected_client()
        try:
            stat = client.set(
                f"{STREAMS}/{stream}/{partition}", wire.partition_to_bytes(state), version=expected_version
            )
        except BadVersionError:
            raise ConflictError(f"{stream}/{partition} changed since version {expected_version}") from None
        except NoNodeError:
            raise UnknownStreamError(f"no partition {stream}/{partition}") from None
        except OUTCOME_UNKNOWN as exc:
            raise CommitStateUnknownError(
                f"the write of {stream}/{partition} may or may not have happened: {type(exc).__name__}"
            ) from None
        return dataclasses.replace(state, version=stat.version)

    # ---- the ACL text -------------------------------------------------------------------------

    def store_acl(self, text: str) -> None:
        """See :meth:`Coordinator.store_acl`: into the ``/acl`` znode of the chroot."""
        client = self._session.connected_client()
        data = text.encode("utf-8")
        try:
            try:
                client.set(ACL_TEXT, data)
            except NoNodeError:
                try:
                    client.create(ACL_TEXT, data)
                except NodeExistsError:  # another broker created it meanwhile: ours is the later write
                    client.set(ACL_TEXT, data)
        except OUTCOME_UNKNOWN as exc:
            raise CommitStateUnknownError(
                f"storing the ACL text in {self._session.describe()} may or may not have happened: "
                f"{type(exc).__name__}"
            ) from None
        except KazooException as exc:
            raise CoordinationError(
                f"cannot store the ACL text in {self._session.describe()}{ACL_TEXT}: {type(exc).__name__}"
            ) from None

    def watch_acl(self, callback: AclWatcher) -> None:
        """See :meth:`Coordinator.watch_acl`: later calls on kazoo's event thread.

        The same text twice in a row (a rewrite, a new session) is passed on once.
        """
        client = self._session.connected_client()
        where = self._session.describe()
        delivered: list[str | None] = []  # the last text passed on, once there is one

        def on_change(data: bytes | None, stat: Any, event: Any = None) -> None:
            try:
                text = None if data is None else data.decode("utf-8")
            except UnicodeDecodeError:
                logger.error("the ACL text in %s%s is not UTF-8: ignored", where, ACL_TEXT)
                return
            if delivered and delivered[0] == text:
                return
            delivered[:] = [text]
            try:
                callback(text)
            except Exception:
                logger.exception("ACL watcher failed")

        try:
            self._acl_watches.append(DataWatch(client, ACL_TEXT, on_change))
        except KazooException as exc:
            raise CoordinationError(
                f"cannot watch the ACL text in {where}{ACL_TEXT}: {type(exc).__name__}"
            ) from None

    # ---- the controller's writes (on the controller thread), fenced by its epoch ---------------

    def write_partitions(self, changes: list[PartitionChange]) -> None:
        """Compare-and-set partition states in one transaction fenced by the controller epoch."""
        self._fenced_commit(
            lambda t: [
                t.set_data(
                    f"{STREAMS}/{c.stream}/{c.partition}",
                    wire.partition_to_bytes(c.state),
                    version=c.expected_version,
                )
                for c in changes
            ]
        )

    def write_new_stream(self, metadata: StreamMetadata) -> None:
        """Create a stream's znodes in one fenced transaction."""
        name = metadata.config.name

        def ops(t: Any) -> None:
            t.create(f"{STREAMS}/{name}", wire.stream_to_bytes(metadata.config, metadata.stream_id))
            for number, state in enumerate(metadata.partitions):
                t.create(f"{STREAMS}/{name}/{number}", wire.partition_to_bytes(state))

        self._fenced_commit(ops)

    def write_stream_change(self, before: StreamMetadata, grown: StreamMetadata) -> None:
        """Store a stream's new config and create its new partitions' znodes (if it grew), in one
        fenced transaction; ``ConflictError`` if the stream is not ``before`` any more."""
        name = before.config.name
        path = f"{STREAMS}/{name}"

        def read() -> tuple[bytes, Any] | None:
            try:
                return self._session.connected_client().get(path)
            except NoNodeError:
                return None

        found = self._session.read(read)
        if found is None:
            raise ConflictError(f"stream {name!r} was deleted meanwhile")
        raw, stat = found
        stored = wire.stream_from_bytes(raw, f"stream znode {name}")
        if stored != wire.StoredStream(before.config, before.stream_id):
            raise ConflictError(f"stream {name!r} changed since it was read")

        def ops(t: Any) -> None:
            for number in range(len(before.partitions), len(grown.partitions)):
                t.create(f"{path}/{number}", wire.partition_to_bytes(grown.partitions[number]))
            t.set_data(path, wire.stream_to_bytes(grown.config, grown.stream_id), version=stat.version)

        self._fenced_commit(ops)

    def write_deletion(self, metadata: StreamMetadata) -> None:
        """Remove a stream's znodes and write its tombstone, in one fenced transaction."""
        name = metadata.config.name

        def ops(t: Any) -> None:
            for number in range(len(metadata.partitions)):
                t.delete(f"{STREAMS}/{name}/{number}")
            t.delete(f"{STREAMS}/{name}")
            t.create(f"{DELETED}/{metadata.stream_id}", wire.dumps({"name": name}))

        self._fenced_commit(ops)

    def _fenced_commit(self, build: Callable[[Any], Any]) -> None:
        client = self._session.connected_client()
        transaction = client.transaction()
        transaction.check(CONTROLLER_EPOCH, self._fence())
        build(transaction)
        try:
            results = transaction.commit()
        except OUTCOME_UNKNOWN as exc:
            raise CommitStateUnknownError(
                f"a controller write may or may not have happened: {exc!r}"
            ) from None
        if isinstance(results[0], BadVersionError):
            raise NotControllerError("a newer controller epoch exists: this controller is fenced")
        failures = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if failures:
            raise ConflictError(f"a controller write lost a race: {failures[0]!r}")
