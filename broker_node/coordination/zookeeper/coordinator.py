"""The ZooKeeper coordinator: a cluster's metadata in ZooKeeper, through kazoo.

:class:`ZooKeeperCoordinator` is the :class:`..base.Coordinator` a clustered
broker uses, and the :class:`..controller.ControllerStore` of the controller
it runs when elected.  It is made of rooms, each one job, and says how they
meet (start, the session's changes, close):

- :mod:`.zookeeper_session`: the kazoo client (made in :mod:`.kazoo_client`,
  with its TLS and digest identity), connecting while ZooKeeper is down, the
  ``zk-work`` thread, session states and the lease;
- :mod:`.broker_registration`: this broker's ephemeral registration, the
  brokers' fresh view of each other, controlled-shutdown requests;
- :mod:`.metadata_view`: the snapshot every read comes from, its reloads and
  the metadata listeners;
- :mod:`.stored_metadata`: the writes -- a partition's compare-and-set, the
  ACL text, the controller's fenced transactions;
- :mod:`.controller_election`: campaigning for the controller role, and
  handing requests to the controller while elected;
- :mod:`.znodes`: the znode layout and how each znode is read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.exceptions import KazooException
from kazoo.protocol.states import KazooState

from pyspark_jetstream.protocol.errors import UnknownStreamError
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import SchemaDocument

from ..base import (
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
from ..controller import Controller, PartitionChange
from ..zookeeper_config import ZooKeeperConfig
from .broker_registration import BrokerRegistration, refuse_older
from .controller_election import ControllerElection
from .metadata_view import MetadataView
from .stored_metadata import StoredMetadata
from .znodes import why
from .zookeeper_session import ZooKeeperSession

T = TypeVar("T")

logger = logging.getLogger(__name__)


class ZooKeeperCoordinator(Coordinator):
    """Cluster metadata in ZooKeeper; see :mod:`.znodes` for the layout."""

    def __init__(
        self,
        settings: ZooKeeperConfig,
        *,
        internal_streams: Callable[[int], list[StreamConfig]] = lambda live: [],
    ) -> None:
        """``internal_streams(live)``: internal streams the controller creates with ``live`` brokers up."""
        self.settings = settings
        self._broker: BrokerInfo | None = None
        self._session = ZooKeeperSession(settings)
        self._registration = BrokerRegistration(self._session)
        self._view = MetadataView(self._session, reloaded=self._reloaded)
        self._election = ControllerElection(
            self._session,
            self,
            internal_streams=internal_streams,
            gone=self._view.wake,
            named=self.controller,
        )
        self._stored = StoredMetadata(self._session, fence=self._election.fence)

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self, broker: BrokerInfo) -> None:
        """Connect (retrying until connected or closed), register, load metadata, campaign for controller."""
        self._broker = broker
        self._election.broker_id = broker.broker_id
        self._session.open(then=lambda: self._registration.register(broker))
        self._session.connected_client().add_listener(self._on_state)
        self._view.start()
        self._session.start_work()
        self._session.submit(self._election.campaign)

    def close(self) -> None:
        """Resign as controller, leave (the broker's registration ends), stop the threads."""
        self._session.stop_work()
        self._view.wake()
        self._election.resign()
        self._session.close()

    def describe(self) -> str:
        """See :meth:`Coordinator.describe`."""
        return self._session.describe()

    @property
    def waiting(self) -> str | None:
        """While start-up waits for ZooKeeper: one line saying so (for the health check)."""
        return self._session.waiting

    def session(self) -> tuple[int, bytes] | None:
        """The ZooKeeper session id and password (whoever holds them can expire the session)."""
        return self._session.session()

    def lease_valid(self) -> bool:
        """Whether this broker's session is surely alive now (see :mod:`.zookeeper_session`)."""
        return self._session.lease_valid()

    def add_session_listener(self, listener: SessionListener) -> None:
        """See :meth:`Coordinator.add_session_listener`: called on the ``zk-work`` thread."""
        self._session.add_listener(listener)

    def _on_state(self, state: str) -> None:
        """kazoo's connection thread: hand everything to the work thread."""
        if state == KazooState.SUSPENDED:
            self._session.end_lease()
            self._session.submit(lambda: self._session.tell(SessionState.SUSPENDED))
        elif state == KazooState.LOST:
            self._session.end_lease()
            self._session.submit(self._on_lost)
        elif state == KazooState.CONNECTED:
            self._session.submit(self._on_connected)

    def _on_lost(self) -> None:
        logger.error("ZooKeeper session expired: leadership may have moved; registering again when possible")
        self._election.resign()
        self._session.tell(SessionState.LOST)

    def _on_connected(self) -> None:
        session = self._session
        if session.client is None or session.closed.is_set() or self._broker is None:
            return
        try:
            if session.is_new():  # a new session: our ephemerals are gone
                self._registration.register(self._broker)
                session.submit(self._election.campaign)
            else:
                session.renew_lease()
        except KazooException as exc:
            logger.warning(
                "registering again after a new ZooKeeper session failed (%s); trying again shortly", why(exc)
            )
            session.retry_later(self._on_connected)
            return
        self._view.wake()
        session.tell(SessionState.CONNECTED)

    def _reloaded(self, changed: bool) -> None:
        self._election.reconcile(changed)

    # ---- reads -----------------------------------------------------------------------------

    def brokers(self) -> list[BrokerInfo]:
        """See :meth:`Coordinator.brokers`."""
        brokers = self._view.snapshot.brokers
        return [brokers[b] for b in sorted(brokers)]

    def controller(self) -> str | None:
        """See :meth:`Coordinator.controller`."""
        return self._view.snapshot.controller

    def get_stream(self, name: str) -> StreamMetadata:
        """See :meth:`Coordinator.get_stream`."""
        try:
            return self._view.snapshot.streams[name]
        except KeyError:
            raise UnknownStreamError(f"no stream named {name!r}") from None

    def list_streams(self) -> list[StreamMetadata]:
        """See :meth:`Coordinator.list_streams`."""
        streams = self._view.snapshot.streams
        return [streams[name] for name in sorted(streams)]

    def deleted_stream_ids(self) -> frozenset[str]:
        """See :meth:`Coordinator.deleted_stream_ids`."""
        return self._view.snapshot.deleted

    def refresh(self) -> None:
        """See :meth:`.metadata_view.MetadataView.refresh`."""
        self._view.refresh()

    def add_listener(self, listener: Listener) -> None:
        """See :meth:`Coordinator.add_listener`: called on the ``zk-metadata`` thread."""
        self._view.add_listener(listener)

    # ---- writes --------------------------------------------------------------------------

    def update_partition(
        self, stream: str, partition: int, expected_version: int, state: PartitionState
    ) -> PartitionState:
        """See :meth:`Coordinator.update_partition`."""
        return self._stored.update_partition(stream, partition, expected_version, state)

    def store_acl(self, text: str) -> None:
        """See :meth:`Coordinator.store_acl`: into the ``/acl`` znode of the chroot."""
        self._stored.store_acl(text)

    def watch_acl(self, callback: AclWatcher) -> None:
        """See :meth:`Coordinator.watch_acl`: later calls on kazoo's event thread."""
        self._stored.watch_acl(callback)

    def request_controlled_shutdown(self, broker_id: str) -> None:
        """See :meth:`Coordinator.request_controlled_shutdown`."""
        self._registration.request_controlled_shutdown(broker_id)

    # ---- requests for the controller (only on the controller) ------------------------------

    def create_stream(self, config: StreamConfig) -> StreamMetadata:
        """See :meth:`Coordinator.create_stream`: only on the controller."""
        if config.schema is not None:
            self._check_features("schema", "keep a stream schema")
        if config.mirror is not None:
            self._check_features("mirror", "keep a mirror")
        controller = self._election.active()
        return self._ask(controller, lambda: controller.create_stream(config, new_stream_id()))

    def delete_stream(self, name: str) -> None:
        """See :meth:`Coordinator.delete_stream`: only on the controller."""
        controller = self._election.active()
        self._ask(controller, lambda: controller.delete_stream(name))

    def add_partitions(self, name: str, partitions: int) -> StreamMetadata:
        """See :meth:`Coordinator.add_partitions`: only on the controller."""
        controller = self._election.active()
        return self._ask(controller, lambda: controller.add_partitions(name, partitions))

    def update_schema(self, name: str, document: SchemaDocument) -> StreamMetadata:
        """See :meth:`Coordinator.update_schema`: only on the controller."""
        self._check_features("schema", "keep a stream schema")
        controller = self._election.active()
        return self._ask(controller, lambda: controller.update_schema(name, document))

    def promote_mirror(self, name: str) -> StreamMetadata:
        """See :meth:`Coordinator.promote_mirror`: only on the controller."""
        controller = self._election.active()
        return self._ask(controller, lambda: controller.promote_mirror(name))

    def elect_preferred_leaders(self) -> dict[str, Any]:
        """See :meth:`Coordinator.elect_preferred_leaders`: only on the controller."""
        controller = self._election.active()
        return self._ask(controller, controller.elect_preferred_leaders)

    def reassign(self, moves: list[Move], throttle: int) -> dict[str, Any]:
        """See :meth:`Coordinator.reassign`: only on the controller, and only when every live
        broker can keep a move (an older one's writes would drop it)."""
        controller = self._election.active()
        self._check_features("reassign", "move partitions")
        return self._ask(controller, lambda: controller.reassign(moves, throttle))

    def cancel_reassignments(self, partitions: list[tuple[str, int]] | None) -> dict[str, Any]:
        """See :meth:`Coordinator.cancel_reassignments`: only on the controller."""
        controller = self._election.active()
        return self._ask(controller, lambda: controller.cancel_reassignments(partitions))

    def _ask(self, controller: Controller, work: Callable[[], T]) -> T:
        """``work``'s result on ``controller``'s thread, then the metadata reloaded."""
        result = self._election.ask(controller, work)
        self.refresh()
        return result

    def _check_features(self, feature: str, what: str) -> None:
        refuse_older(self.brokers(), feature, what)

    # ---- the controller's store (used on the controller thread) -------------------------

    def live_brokers(self) -> list[str]:
        """See :meth:`.broker_registration.BrokerRegistration.live_brokers`."""
        return self._registration.live_brokers()

    def registrations(self) -> dict[str, int]:
        """See :meth:`.broker_registration.BrokerRegistration.registrations`."""
        return self._registration.registrations()

    def shutting_down(self) -> set[str]:
        """See :meth:`.broker_registration.BrokerRegistration.shutting_down`."""
        return self._registration.shutting_down()

    def read_streams(self) -> list[StreamMetadata]:
        """See :meth:`.stored_metadata.StoredMetadata.read_streams`."""
        return self._stored.read_streams()

    def write_partitions(self, changes: list[PartitionChange]) -> None:
        """See :meth:`.stored_metadata.StoredMetadata.write_partitions`."""
        self._stored.write_partitions(changes)

    def write_new_stream(self, metadata: StreamMetadata) -> None:
        """See :meth:`.stored_metadata.StoredMetadata.write_new_stream`."""
        self._stored.write_new_stream(metadata)

    def write_stream_change(self, before: StreamMetadata, grown: StreamMetadata) -> None:
        """See :meth:`.stored_metadata.StoredMetadata.write_stream_change`."""
        self._stored.write_stream_change(before, grown)

    def write_deletion(self, metadata: StreamMetadata) -> None:
        """See :meth:`.stored_metadata.StoredMetadata.write_deletion`."""
        self._stored.write_deletion(metadata)
