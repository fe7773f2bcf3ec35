"""The ZooKeeper coordinator: a cluster's metadata in ZooKeeper, through kazoo.

This module is the only importer of kazoo.

Znode layout (under the cluster's chroot, e.g. ``/pyspark-jetstream``;
values are JSON with a ``version`` field, see :mod:`.wire`)::

    /brokers/<broker id>      ephemeral   {"broker_id", "flight", "nats": [...]}
    /controller               ephemeral   {"broker_id", "epoch"}: the elected controller
    /controller_epoch         persistent  {"epoch"}: bumped by every new controller; every
                                          controller write checks this znode's version, so a
                                          replaced controller's writes fail (fencing)
    /streams/<name>           persistent  {"id", "config": {...StreamConfig...}}
    /streams/<name>/<n>       persistent  {"leader", "replicas", "isr", "leader_epoch"}; the
                                          znode version is the state's version, and every
                                          change is a compare-and-set on it
    /deleted_streams/<id>     persistent  {"name"}: tombstones of deleted streams
    /admin/shutdown/<id>      ephemeral   a broker asking to be relieved of leadership
    /acl                      persistent  the cluster's ACL text (TOML, UTF-8, opaque here)

A stream and its partition znodes are created, and deleted with its
tombstone, in one ZooKeeper transaction.  A stream grows in one transaction
too: its new partition znodes are created and its config (with the new
count) written, the latter a compare-and-set on the stream znode's version;
a reader reads the stream znode before its partitions, so it never finds a
count without every partition of it.

Reads come from a snapshot of the whole tree, reloaded (on a thread of its
own) whenever a watch fires, and at least every ``RELOAD_EVERY`` seconds.
Listeners are called on that thread after each reload that changed anything.

Security (see :class:`.settings.ZooKeeperConfig`): with ``tls_ca`` or
``tls_cert`` the connection is TLS (the server's certificate checked against
``tls_ca``, and its host name unless ``tls_check_hostname`` is off; this
broker's certificate presented).  With ``digest_user`` the session
authenticates as that digest identity and every znode the coordinator
creates, the chroot included, carries one ACL entry: all permissions for that
identity, none for anyone else.  Znodes that existed before keep their ACL (a
warning says so for the chroot).  Without either: plain TCP, open znodes.

Sessions: ``SUSPENDED`` (the connection is lost; the session may live on) and
``LOST`` (it expired) are passed to session listeners on a worker thread, so a
leader stops leading before anyone else can be elected (others wait for the
session to expire).  A broker also keeps a *lease*: the time until which its
session is surely alive, renewed by a round trip every quarter of the session
timeout; :meth:`ZooKeeperCoordinator.lease_valid` is false once two thirds of
the session timeout have passed without one (after a process pause, say).
After ``LOST`` kazoo opens a new session; the broker registers again and
reloads.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import queue
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.protocol.serialization import Auth
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import DataWatch
from kazoo.retry import KazooRetry
from kazoo.security import make_digest_acl

from pyspark_jetstream.protocol.errors import InvalidArgumentError, UnknownStreamError
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import SchemaDocument

from . import wire
from .base import (
    AclWatcher,
    BrokerInfo,
    Coordinator,
    Listener,
    Move,
    PartitionState,
    SessionListener,
    SessionState,
    StreamMetadata,
    new_stream_id,
)
from .controller import Controller, PartitionChange
from .errors import CommitStateUnknownError, ConflictError, CoordinationError, NotControllerError
from .zookeeper_config import ZooKeeperConfig

T = TypeVar("T")

logger = logging.getLogger(__name__)

BROKERS = "/brokers"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
STREAMS = "/streams"
DELETED = "/deleted_streams"
SHUTDOWN = "/admin/shutdown"
ACL_TEXT = "/acl"
RELOAD_EVERY = 10.0
"""Seconds between reloads when no watch fires (a safety net, not the mechanism)."""
RETRY_AFTER = 1.0
"""Seconds before campaigning or registering again after ZooKeeper failed us."""
CONTROLLER_CALL_TIMEOUT = 30.0


class _RedactCredentials(logging.Filter):
    """Hides the credentials of the ``Auth`` requests kazoo logs whole (at DEBUG) when it sends them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, Auth) for a in record.args):
            record.args = tuple(
                a._replace(auth="<redacted>") if isinstance(a, Auth) else a for a in record.args
            )
        return True


_REDACT_CREDENTIALS = _RedactCredentials()


def _kazoo_logger() -> logging.Logger:
    """The logger the coordinator's kazoo clients log to, with credentials redacted."""
    kazoo_logger = logging.getLogger("kazoo.client")
    if _REDACT_CREDENTIALS not in kazoo_logger.filters:
        kazoo_logger.addFilter(_REDACT_CREDENTIALS)
    return kazoo_logger


class _TlsHandler(SequentialThreadingHandler):
    """kazoo's threading handler, with connections made over TLS by our own context.

    kazoo's own TLS trusts the system's CAs besides the given one, and leaves
    the socket of a failed handshake open; this trusts exactly ``tls_ca``
    (the system's CAs only without one) and closes what fails.
    """

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        self._context = context

    def create_connection(
        self,
        address: tuple[str, int],
        hostname: str | None = None,
        timeout: float | None = None,
        **ignored: Any,
    ) -> ssl.SSLSocket:
        """A connected TLS socket; kazoo's TLS arguments are ignored (the context has them)."""
        sock = socket.create_connection(address, timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return self._context.wrap_socket(sock, server_hostname=hostname)
        except BaseException:
            sock.close()  # a failed handshake closes the TLS socket itself; this is the plain one
            raise


@dataclass(frozen=True)
class _Snapshot:
    brokers: dict[str, BrokerInfo] = field(default_factory=dict)
    controller: str | None = None
    streams: dict[str, StreamMetadata] = field(default_factory=dict)
    deleted: frozenset[str] = frozenset()
    shutting_down: frozenset[str] = frozenset()
    registrations: dict[str, int] = field(default_factory=dict)
    """Each broker znode's creation id: a broker that restarted differs here alone."""


class ZooKeeperCoordinator(Coordinator):
    """Cluster metadata in ZooKeeper; see the module docstring for the layout."""

    def __init__(
        self,
        settings: ZooKeeperConfig,
        *,
        internal_streams: Callable[[int], list[StreamConfig]] = lambda live: [],
    ) -> None:
        """``internal_streams(live)``: internal streams the controller creates with ``live`` brokers up."""
        self.settings = settings
        self._internal = internal_streams
        self._client: KazooClient | None = None
        self._broker: BrokerInfo | None = None
        self._snapshot = _Snapshot()
        self._listeners: list[Listener] = []
        self._session_listeners: list[SessionListener] = []
        self._controller: Controller | None = None
        self._controller_epoch_version = -1
        self._reload = threading.Event()
        self._work: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self._lease_until = 0.0
        self._session_id: int | None = None
        self._lock = threading.RLock()
        self._acl_watches: list[DataWatch] = []
        self.waiting: str | None = None
        """While start-up waits for ZooKeeper: one line saying so (see :meth:`_connect`)."""

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self, broker: BrokerInfo) -> None:
        """Connect (retrying until connected or closed), register, load metadata, campaign for controller."""
        self._broker = broker
        settings = self.settings
        client = KazooClient(
            hosts=settings.hosts,
            timeout=settings.session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.2, max_delay=2.0),
            logger=_kazoo_logger(),
            **self._security_arguments(),
        )
        self._connect(client)
        try:
            client.ensure_path(settings.chroot)
            if settings.digest:
                self._warn_if_open(client, settings.chroot)
            client.chroot = settings.chroot  # every path from here on is under the cluster's chroot
            self._client = client
            for path in (BROKERS, STREAMS, DELETED, SHUTDOWN):
                client.ensure_path(path)
            with contextlib.suppress(NodeExistsError):
                client.create(CONTROLLER_EPOCH, wire.epoch_to_bytes(0))
            self._register()
        except BaseException as exc:
            self._client = None
            client.stop()
            client.close()
            if isinstance(exc, NoAuthError):
                raise CoordinationError(
                    f"ZooKeeper refused access to {self.describe()}: its znodes have an ACL that "
                    + (f"digest_user {settings.digest_user!r}" if settings.digest else "an anonymous client")
                    + " does not match (is [zookeeper] digest_user or its password file wrong?)"
                ) from None
            raise
        client.add_listener(self._on_state)
        for target, name in (
            (self._run_reloads, "zk-metadata"),
            (self._run_work, "zk-work"),
            (self._run_lease, "zk-lease"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self._snapshot = self._read_snapshot(watch=True)
        self._work.put(self._campaign)

    def _connect(self, client: KazooClient) -> None:
        """Connect ``client``, however long ZooKeeper takes to come up: kazoo retries with backoff,
        and every ``connect_timeout`` without a connection logs one line (and :attr:`waiting`
        says so, for the health check), so a whole site restarted in the wrong order heals
        itself.  ``CoordinationError`` if :meth:`close` is called meanwhile."""
        settings = self.settings
        connected = client.start_async()
        started = time.monotonic()
        next_line = started + settings.connect_timeout
        while not connected.wait(min(0.2, settings.connect_timeout)) or not client.connected:
            if self._closed.is_set():
                client.stop()
                client.close()
                self.waiting = None
                raise CoordinationError(f"stopped while waiting for ZooKeeper at {settings.hosts}")
            if time.monotonic() >= next_line:
                next_line += settings.connect_timeout
                self.waiting = (
                    f"waiting for ZooKeeper at {settings.hosts} for {time.monotonic() - started:.0f}s "
                    f"(retrying with backoff): is it running, and is [zookeeper] hosts right?"
                    f"{_tls_hint(settings.tls)}"
                )
                logger.warning("%s", self.waiting)
        self.waiting = None

    def close(self) -> None:
        """Resign as controller, leave (the broker's registration ends), stop the threads."""
        self._closed.set()
        self._reload.set()
        self._work.put(None)
        with self._lock:
            if self._controller is not None:
                self._controller.stop()
                self._controller = None
        if self._client is not None:
            try:
                self._client.stop()
                self._client.close()
            except KazooException:
                logger.exception("closing the ZooKeeper connection failed")
        for thread in self._threads:
            thread.join(5)

    def describe(self) -> str:
        """See :meth:`Coordinator.describe`."""
        return f"ZooKeeper at {self.settings.hosts}{self.settings.chroot}"

    def session(self) -> tuple[int, bytes] | None:
        """The ZooKeeper session id and password (whoever holds them can expire the session)."""
        return self._client.client_id if self._client is not None else None

    def lease_valid(self) -> bool:
        """Whether this broker's session is surely alive now (see the module docstring)."""
        return time.monotonic() < self._lease_until

    # ---- reads -----------------------------------------------------------------------------

    def brokers(self) -> list[BrokerInfo]:
        """See :meth:`Coordinator.brokers`."""
        snapshot = self._snapshot
        return [snapshot.brokers[b] for b in sorted(snapshot.brokers)]

    def controller(self) -> str | None:
        """See :meth:`Coordinator.controller`."""
        return self._snapshot.controller

    def get_stream(self, name: str) -> StreamMetadata:
        """See :meth:`Coordinator.get_stream`."""
        try:
            return self._snapshot.streams[name]
        except KeyError:
            raise UnknownStreamError(f"no stream named {name!r}") from None

    def list_streams(self) -> list[StreamMetadata]:
        """See :meth:`Coordinator.list_streams`."""
        streams = self._snapshot.streams
        return [streams[name] for name in sorted(streams)]

    def deleted_stream_ids(self) -> frozenset[str]:
        """See :meth:`Coordinator.deleted_stream_ids`."""
        return self._snapshot.deleted

    def refresh(self) -> None:
        """Reload the snapshot now (after losing a compare-and-set, say) and notify listeners.

        ``CoordinationError`` when ZooKeeper cannot be read now (the watches
        reload it once it can).
        """
        try:
            snapshot = self._read_snapshot(watch=False)
        except KazooException as exc:
            raise CoordinationError(f"cannot read the metadata from {self.describe()}: {_why(exc)}") from None
        self._apply(snapshot)

    # ---- writes --------------------------------------------------------------------------

    def create_stream(self, config: StreamConfig) -> StreamMetadata:
        """See :meth:`Coordinator.create_stream`: only on the controller."""
        if config.schema is not None:
            self._check_features("schema", "keep a stream schema")
        if config.mirror is not None:
            self._check_features("mirror", "keep a mirror")
        controller = self._active_controller()
        created = controller.submit(lambda: controller.create_stream(config, new_stream_id()))
        result = self._await(created)
        self.refresh()
        return result

    def delete_stream(self, name: str) -> None:
        """See :meth:`Coordinator.delete_stream`: only on the controller."""
        controller = self._active_controller()
        self._await(controller.submit(lambda: controller.delete_stream(name)))
        self.refresh()

    def add_partitions(self, name: str, partitions: int) -> StreamMetadata:
        """See :meth:`Coordinator.add_partitions`: only on the controller."""
        controller = self._active_controller()
        result = self._await(controller.submit(lambda: controller.add_partitions(name, partitions)))
        self.refresh()
        return result

    def update_schema(self, name: str, document: SchemaDocument) -> StreamMetadata:
        """See :meth:`Coordinator.update_schema`: only on the controller."""
        self._check_features("schema", "keep a stream schema")
        controller = self._active_controller()
        result = self._await(controller.submit(lambda: controller.update_schema(name, document)))
        self.refresh()
        return result

    def promote_mirror(self, name: str) -> StreamMetadata:
        """See :meth:`Coordinator.promote_mirror`: only on the controller."""
        controller = self._active_controller()
        result = self._await(controller.submit(lambda: controller.promote_mirror(name)))
        self.refresh()
        return result

    def elect_preferred_leaders(self) -> dict[str, Any]:
        """See :meth:`Coordinator.elect_preferred_leaders`: only on the controller."""
        controller = self._active_controller()
        result = self._await(controller.submit(controller.elect_preferred_leaders))
        self.refresh()
        return result

    def reassign(self, moves: list[Move], throttle: int) -> dict[str, Any]:
        """See :meth:`Coordinator.reassign`: only on the controller, and only when every live
        broker can keep a move (an older one's writes would drop it)."""
        controller = self._active_controller()
        self._check_features("reassign", "move partitions")
        result = self._await(controller.submit(lambda: controller.reassign(moves, throttle)))
        self.refresh()
        return result

    def cancel_reassignments(self, partitions: list[tuple[str, int]] | None) -> dict[str, Any]:
        """See :meth:`Coordinator.cancel_reassignments`: only on the controller."""
        controller = self._active_controller()
        result = self._await(controller.submit(lambda: controller.cancel_reassignments(partitions)))
        self.refresh()
        return result

    def update_partition(
        self, stream: str, partition: int, expected_version: int, state: PartitionState
    ) -> PartitionState:
        """See :meth:`Coordinator.update_partition`."""
        client = self._connected_client()
        try:
            stat = client.set(
                f"{STREAMS}/{stream}/{partition}", wire.partition_to_bytes(state), version=expected_version
            )
        except BadVersionError:
            raise ConflictError(f"{stream}/{partition} changed since version {expected_version}") from None
        except NoNodeError:
            raise UnknownStreamError(f"no partition {stream}/{partition}") from None
        except (ConnectionLoss, OperationTimeoutError, SessionExpiredError) as exc:
            raise CommitStateUnknownError(
                f"the write of {stream}/{partition} may or may not have happened: {type(exc).__name__}"
            ) from None
        return dataclasses.replace(state, version=stat.version)

    def store_acl(self, text: str) -> None:
        """See :meth:`Coordinator.store_acl`: into the ``/acl`` znode of the chroot."""
        client = self._connected_client()
        data = text.encode("utf-8")
        try:
            try:
                client.set(ACL_TEXT, data)
            except NoNodeError:
                try:
                    client.create(ACL_TEXT, data)
                except NodeExistsError:  # another broker created it meanwhile: ours is the later write
                    client.set(ACL_TEXT, data)
        except (ConnectionLoss, OperationTimeoutError, SessionExpiredError) as exc:
            raise CommitStateUnknownError(
                f"storing the ACL text in {self.describe()} may or may not have happened: "
                f"{type(exc).__name__}"
            ) from None
        except KazooException as exc:
            raise CoordinationError(
                f"cannot store the ACL text in {self.describe()}{ACL_TEXT}: {type(exc).__name__}"
            ) from None

    def watch_acl(self, callback: AclWatcher) -> None:
        """See :meth:`Coordinator.watch_acl`: later calls on kazoo's event thread.

        The same text twice in a row (a rewrite, a new session) is passed on once.
        """
        client = self._connected_client()
        delivered: list[str | None] = []  # the last text passed on, once there is one

        def on_change(data: bytes | None, stat: Any, event: Any = None) -> None:
            try:
                text = None if data is None else data.decode("utf-8")
            except UnicodeDecodeError:
                logger.error("the ACL text in %s%s is not UTF-8: ignored", self.describe(), ACL_TEXT)
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
                f"cannot watch the ACL text in {self.describe()}{ACL_TEXT}: {type(exc).__name__}"
            ) from None

    def request_controlled_shutdown(self, broker_id: str) -> None:
        """See :meth:`Coordinator.request_controlled_shutdown`."""
        try:
            self._connected_client().create(f"{SHUTDOWN}/{broker_id}", b"", ephemeral=True)
        except NodeExistsError:
            pass
        except KazooException as exc:
            raise CoordinationError(f"cannot reach {self.describe()}: {_why(exc)}") from None

    def add_listener(self, listener: Listener) -> None:
        """See :meth:`Coordinator.add_listener`: called on the ``zk-metadata`` thread."""
        self._listeners.append(listener)

    def add_session_listener(self, listener: SessionListener) -> None:
        """See :meth:`Coordinator.add_session_listener`: called on the ``zk-work`` thread."""
        self._session_listeners.append(listener)

    # ---- the controller's store (used on the controller thread) -------------------------

    # Reads raise ``CoordinationError`` when ZooKeeper cannot answer now; the controller's
    # next event reads again.

    def live_brokers(self) -> list[str]:
        """Fresh read of the registered brokers."""
        return sorted(self._reading(lambda: self._connected_client().get_children(BROKERS)))

    def registrations(self) -> dict[str, int]:
        """Fresh read of each registered broker's znode creation id (czxid): a restart changes it."""

        def read() -> dict[str, int]:
            client = self._connected_client()
            found = {}
            for broker_id in client.get_children(BROKERS):
                stat = client.exists(f"{BROKERS}/{broker_id}")
                if stat is not None:
                    found[broker_id] = stat.czxid
            return found

        return self._reading(read)

    def shutting_down(self) -> set[str]:
        """Fresh read of the brokers that asked to be relieved of leadership."""
        return set(self._reading(lambda: self._connected_client().get_children(SHUTDOWN)))

    def read_streams(self) -> list[StreamMetadata]:
        """Fresh read of every stream."""
        streams = self._reading(lambda: self._read_streams(watch=None))
        return sorted(streams.values(), key=lambda m: m.config.name)

    def _reading(self, read: Callable[[], T]) -> T:
        try:
            return read()
        except KazooException as exc:
            raise CoordinationError(f"cannot read {self.describe()}: {_why(exc)}") from None

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
                return self._connected_client().get(path)
            except NoNodeError:
                return None

        found = self._reading(read)
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

    # ---- internals ---------------------------------------------------------------------------

    def _check_features(self, feature: str, what: str) -> None:
        """Refuse a change that a live broker of an older version would drop on its next write."""
        older = [b.broker_id for b in self.brokers() if feature not in b.features]
        if older:
            raise InvalidArgumentError(
                f"broker(s) {', '.join(older)} run a version that cannot {what}: upgrade every broker first"
            )

    def _security_arguments(self) -> dict[str, Any]:
        """KazooClient's TLS and digest arguments from the settings (none by default)."""
        settings = self.settings
        arguments: dict[str, Any] = {}
        if settings.tls:
            try:
                context = ssl.create_default_context(cafile=settings.tls_ca or None)
                context.check_hostname = settings.tls_check_hostname
                if settings.tls_cert:
                    context.load_cert_chain(settings.tls_cert, settings.tls_key)
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                raise CoordinationError(
                    f"cannot use the [zookeeper] TLS files (tls_ca {settings.tls_ca!r}, tls_cert "
                    f"{settings.tls_cert!r}, tls_key {settings.tls_key!r}): {exc}"
                ) from None
            arguments.update(handler=_TlsHandler(context), use_ssl=True)
        if settings.digest:
            try:
                password = settings.read_digest_password()
            except ValueError as exc:
                raise CoordinationError(str(exc)) from None
            with contextlib.suppress(OSError):
                if Path(settings.digest_password_file).stat().st_mode & 0o077:
                    logger.warning(
                        "the ZooKeeper digest password file %s is readable by others than its owner "
                        "(chmod 600 it)",
                        settings.digest_password_file,
                    )
            user = settings.digest_user
            arguments["auth_data"] = [("digest", f"{user}:{password}")]
            arguments["default_acl"] = [make_digest_acl(user, password, all=True)]
        return arguments

    def _warn_if_open(self, client: KazooClient, path: str) -> None:
        """Warn when ``path`` (made before digest authentication was on) is open to anyone."""
        try:
            acls, _ = client.get_acls(path)
        except KazooException:
            return
        if any(acl.id.scheme != "digest" for acl in acls):
            logger.warning(
                "%s in ZooKeeper was created before digest_user was set and is not protected by it "
                "(nor are the znodes made then): move the cluster to a new chroot, or set their ACLs",
                path,
            )

    def _connected_client(self) -> KazooClient:
        if self._client is None:
            raise CoordinationError("the ZooKeeper coordinator is not started")
        return self._client

    def _active_controller(self) -> Controller:
        with self._lock:
            controller = self._controller
        if controller is None or not controller.running:
            current = self.controller()
            raise NotControllerError(
                f"broker {self._broker.broker_id if self._broker else '?'} is not the controller "
                f"({'the controller is ' + current if current else 'no controller is elected yet'})",
                controller=current,
            )
        return controller

    @staticmethod
    def _await(future: concurrent.futures.Future[Any]) -> Any:
        try:
            return future.result(CONTROLLER_CALL_TIMEOUT)
        except concurrent.futures.TimeoutError:
            raise CommitStateUnknownError(
                f"the controller did not answer within {CONTROLLER_CALL_TIMEOUT:g}s"
            ) from None

    def _fenced_commit(self, build: Callable[[Any], Any]) -> None:
        client = self._connected_client()
        transaction = client.transaction()
        transaction.check(CONTROLLER_EPOCH, self._controller_epoch_version)
        build(transaction)
        try:
            results = transaction.commit()
        except (ConnectionLoss, OperationTimeoutError, SessionExpiredError) as exc:
            raise CommitStateUnknownError(
                f"a controller write may or may not have happened: {exc!r}"
            ) from None
        if isinstance(results[0], BadVersionError):
            raise NotControllerError("a newer controller epoch exists: this controller is fenced")
        failures = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if failures:
            raise ConflictError(f"a controller write lost a race: {failures[0]!r}")

    def _register(self) -> None:
        """Create this broker's ephemeral znode, waiting out a previous session that still holds it."""
        client = self._connected_client()
        assert self._broker is not None
        path = f"{BROKERS}/{self._broker.broker_id}"
        deadline = time.monotonic() + 2 * self.settings.session_timeout + 1
        while True:
            try:
                client.create(path, wire.broker_to_bytes(self._broker), ephemeral=True)
                break
            except NodeExistsError:
                try:
                    _, stat = client.get(path)
                except NoNodeError:
                    continue
                if stat.ephemeralOwner == client.client_id[0]:
                    break
                if time.monotonic() > deadline:
                    raise CoordinationError(
                        f"broker id {self._broker.broker_id!r} is already registered in {self.describe()} by "
                        f"a live session (0x{stat.ephemeralOwner:x}): another broker with this id is running"
                    ) from None
                time.sleep(0.2)  # a previous run's session that has not expired yet
        self._session_id = client.client_id[0]
        self._lease_until = time.monotonic() + self.settings.session_timeout * 2 / 3

    def _campaign(self) -> None:
        """Try to become controller; otherwise watch the controller znode and try again when it goes."""
        if self._closed.is_set() or self._client is None or self._broker is None:
            return
        client = self._client
        me = self._broker.broker_id
        try:
            client.create(CONTROLLER, wire.controller_to_bytes(me, -1), ephemeral=True)
        except NodeExistsError:
            try:
                stat = client.exists(CONTROLLER, watch=self._on_controller_gone)
                if stat is None:
                    self._work.put(self._campaign)  # gone between the two calls
                elif stat.ephemeralOwner == client.client_id[0] and self._controller is None:
                    # Ours, from a create whose answer was lost: nobody acts on it. Start over.
                    client.delete(CONTROLLER)
            except KazooException as exc:
                logger.warning("campaigning for controller failed (%s); trying again shortly", _why(exc))
                self._retry_later(self._campaign)
            return
        except KazooException as exc:
            logger.warning("campaigning for controller failed (%s); trying again shortly", _why(exc))
            self._retry_later(self._campaign)
            return
        controller = None
        try:
            raw, stat = client.get(CONTROLLER_EPOCH)
            epoch = wire.epoch_from_bytes(raw) + 1
            stat = client.set(CONTROLLER_EPOCH, wire.epoch_to_bytes(epoch), version=stat.version)
            # The role is ours from here: take it up before the znode names us with its epoch,
            # so nobody who reads "the controller is <me>" finds this broker not ready yet.
            controller = Controller(self, me, epoch, internal_streams=self._internal)
            with self._lock:
                self._controller_epoch_version = stat.version
                self._controller = controller
            controller.start()
            client.set(CONTROLLER, wire.controller_to_bytes(me, epoch))
        except KazooException as exc:
            logger.warning("taking up the controller role failed (%s); resigning", _why(exc))
            if controller is not None:
                with self._lock:
                    if self._controller is controller:
                        self._controller = None
                controller.stop()
            with contextlib.suppress(KazooException):
                client.delete(CONTROLLER)
            self._retry_later(self._campaign)
            return
        client.exists(CONTROLLER, watch=self._on_controller_gone)

    def _on_controller_gone(self, event: Any) -> None:
        self._reload.set()
        self._work.put(self._campaign)

    def _on_state(self, state: str) -> None:
        """kazoo's connection thread: hand everything to the work thread."""
        if state == KazooState.SUSPENDED:
            self._lease_until = 0.0
            self._work.put(lambda: self._tell_session(SessionState.SUSPENDED))
        elif state == KazooState.LOST:
            self._lease_until = 0.0
            self._work.put(self._on_lost)
        elif state == KazooState.CONNECTED:
            self._work.put(self._on_connected)

    def _on_lost(self) -> None:
        logger.error("ZooKeeper session expired: leadership may have moved; registering again when possible")
        with self._lock:
            if self._controller is not None:
                self._controller.stop()
                self._controller = None
        self._tell_session(SessionState.LOST)

    def _on_connected(self) -> None:
        client = self._client
        if client is None or self._closed.is_set():
            return
        try:
            if client.client_id[0] != self._session_id:  # a new session: our ephemerals are gone
                self._register()
                self._work.put(self._campaign)
            else:
                self._lease_until = time.monotonic() + self.settings.session_timeout * 2 / 3
        except KazooException as exc:
            logger.warning(
                "registering again after a new ZooKeeper session failed (%s); trying again shortly", _why(exc)
            )
            self._retry_later(self._on_connected)
            return
        self._reload.set()
        self._tell_session(SessionState.CONNECTED)

    def _retry_later(self, work: Callable[[], None]) -> None:
        """Queue ``work`` on the work thread after ``RETRY_AFTER`` seconds (unless closed by then)."""

        def queue_it() -> None:
            if not self._closed.is_set():
                self._work.put(work)

        timer = threading.Timer(RETRY_AFTER, queue_it)
        timer.daemon = True
        timer.start()

    def _tell_session(self, state: SessionState) -> None:
        for listener in self._session_listeners:
            try:
                listener(state)
            except Exception:
                logger.exception("session listener failed")

    def _run_work(self) -> None:
        while (work := self._work.get()) is not None:
            try:
                work()
            except Exception:
                logger.exception("coordinator work failed")

    def _run_lease(self) -> None:
        period = self.settings.session_timeout / 4
        while not self._closed.wait(period):
            client, broker = self._client, self._broker
            if client is None or broker is None:
                continue
            started = time.monotonic()
            try:
                stat = client.exists(f"{BROKERS}/{broker.broker_id}")
            except KazooException:
                continue
            session = client.client_id  # None once the connection is closed (a lost session)
            owner = None if stat is None else stat.ephemeralOwner
            if session is not None and owner == self._session_id == session[0]:
                self._lease_until = started + self.settings.session_timeout * 2 / 3

    def _run_reloads(self) -> None:
        while not self._closed.is_set():
            self._reload.wait(RELOAD_EVERY)
            if self._closed.is_set():
                return
            self._reload.clear()
            try:
                self._apply(self._read_snapshot(watch=True))
            except KazooException as exc:
                logger.warning("reading the metadata from ZooKeeper failed (%s); retrying", _why(exc))
                self._closed.wait(0.5)
                self._reload.set()

    def _apply(self, snapshot: _Snapshot) -> None:
        with self._lock:
            changed = snapshot != self._snapshot
            self._snapshot = snapshot
        controller = self._controller
        if controller is not None and controller.running and (changed or controller.dirty):
            controller.submit(controller.reconcile)
        if changed:
            for listener in self._listeners:
                try:
                    listener()
                except Exception:
                    logger.exception("metadata listener failed")

    def _on_watch(self, event: Any) -> None:
        self._reload.set()

    def _read_snapshot(self, *, watch: bool) -> _Snapshot:
        client = self._connected_client()
        w = self._on_watch if watch else None
        brokers = {}
        registrations = {}
        for broker_id in client.get_children(BROKERS, watch=w):
            try:
                raw, stat = client.get(f"{BROKERS}/{broker_id}")
                registrations[broker_id] = stat.czxid
                brokers[broker_id] = wire.broker_from_bytes(raw, f"broker znode {broker_id}")
            except NoNodeError:
                continue
            except wire.WireError as exc:
                logger.error("%s", exc)
        try:
            raw, _ = client.get(CONTROLLER, watch=w)
            registered = wire.controller_from_bytes(raw)
            # Epoch -1: a broker won the election but has not taken the role up yet.
            controller: str | None = registered.broker_id if registered.epoch >= 0 else None
        except NoNodeError:
            controller = None
            client.exists(CONTROLLER, watch=w)
        return _Snapshot(
            brokers=brokers,
            controller=controller,
            streams=self._read_streams(watch=w),
            deleted=frozenset(client.get_children(DELETED, watch=w)),
            shutting_down=frozenset(client.get_children(SHUTDOWN, watch=w)),
            registrations=registrations,
        )

    def _read_streams(self, watch: Callable[[Any], None] | None) -> dict[str, StreamMetadata]:
        client = self._connected_client()
        streams = {}
        for name in client.get_children(STREAMS, watch=watch):
            path = f"{STREAMS}/{name}"
            try:
                raw, _ = client.get(path, watch=watch)  # watched: a stream that grows changes it
                config, stream_id = wire.stream_from_bytes(raw, f"stream znode {name}")
                states = []
                for number in range(config.partitions):
                    raw, stat = client.get(f"{path}/{number}", watch=watch)
                    states.append(wire.partition_from_bytes(raw, stat.version, f"partition {name}/{number}"))
            except NoNodeError:
                continue  # being created or deleted: the next reload sees it whole
            except wire.WireError as exc:
                logger.error("skipping stream %s: %s", name, exc)
                continue
            streams[name] = StreamMetadata(config, tuple(states), stream_id)
        return streams


def _why(exc: KazooException) -> str:
    """What went wrong; kazoo gives some errors no message (``ConnectionLoss``, say): their name."""
    return str(exc) or type(exc).__name__


def _tls_hint(tls: bool) -> str:
    """What to check when ZooKeeper over TLS cannot be reached."""
    if not tls:
        return ""
    return (
        "; over TLS: does hosts name ZooKeeper's secureClientPort, does tls_ca sign its "
        "certificate (for that host name), does it trust tls_cert? (kazoo's log has the TLS error)"
    )
