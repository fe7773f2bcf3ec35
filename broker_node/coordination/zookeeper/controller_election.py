"""The controller's election: which broker runs the :class:`..controller.Controller`, and its epoch.

Every broker campaigns by creating the ephemeral ``/controller`` znode; the
one that succeeds bumps ``/controller_epoch`` (a compare-and-set), starts its
controller, and only then writes its id and epoch into ``/controller``, so
nobody who reads "the controller is <me>" finds this broker not ready yet.
The others watch the znode and campaign again when it goes.  The epoch
znode's version this broker set fences the controller's writes
(:meth:`ControllerElection.fence`, see :mod:`.stored_metadata`).  Campaigns
run on the ``zk-work`` thread; a failed one is tried again shortly.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.exceptions import KazooException, NodeExistsError

from pyspark_jetstream.protocol.streams import StreamConfig

from .. import wire
from ..controller import Controller, ControllerStore
from ..errors import CommitStateUnknownError, NotControllerError
from .znodes import CONTROLLER, CONTROLLER_EPOCH, why
from .zookeeper_session import ZooKeeperSession

T = TypeVar("T")

logger = logging.getLogger(__name__)

CONTROLLER_CALL_TIMEOUT = 30.0
"""Seconds a request waits for the controller's answer before its outcome is unknown."""


class ControllerElection:
    """Campaigns for this broker, and holds its controller while it is elected."""

    def __init__(
        self,
        session: ZooKeeperSession,
        store: ControllerStore,
        *,
        internal_streams: Callable[[int], list[StreamConfig]],
        gone: Callable[[], None],
        named: Callable[[], str | None],
    ) -> None:
        """``store``: what the controller reads and writes; ``internal_streams(live)``: the internal
        streams it creates with ``live`` brokers up; ``gone()``: called when the controller znode
        goes (the metadata changed); ``named()``: the controller the metadata names."""
        self._session = session
        self._store = store
        self._internal = internal_streams
        self._gone = gone
        self._named = named
        self._lock = threading.Lock()
        self.broker_id: str | None = None
        """This broker's id, once it started (it campaigns from then on)."""
        self.controller: Controller | None = None
        """This broker's controller while it is elected."""
        self._epoch_version = -1

    def fence(self) -> int:
        """The version of the controller epoch znode when this broker's controller took it: its
        writes are valid while the znode still has it."""
        return self._epoch_version

    def campaign(self) -> None:
        """Try to become controller; otherwise watch the controller znode and try again when it goes."""
        session = self._session
        if session.closed.is_set() or session.client is None or self.broker_id is None:
            return
        client = session.client
        me = self.broker_id
        try:
            client.create(CONTROLLER, wire.controller_to_bytes(me, -1), ephemeral=True)
        except NodeExistsError:
            try:
                stat = client.exists(CONTROLLER, watch=self._on_controller_gone)
                if stat is None:
                    session.submit(self.campaign)  # gone between the two calls
                elif stat.ephemeralOwner == client.client_id[0] and self.controller is None:
                    # Ours, from a create whose answer was lost: nobody acts on it. Start over.
                    client.delete(CONTROLLER)
            except KazooException as exc:
                logger.warning("campaigning for controller failed (%s); trying again shortly", why(exc))
                session.retry_later(self.campaign)
            return
        except KazooException as exc:
            logger.warning("campaigning for controller failed (%s); trying again shortly", why(exc))
            session.retry_later(self.campaign)
            return
        controller = None
        try:
            raw, stat = client.get(CONTROLLER_EPOCH)
            epoch = wire.epoch_from_bytes(raw) + 1
            stat = client.set(CONTROLLER_EPOCH, wire.epoch_to_bytes(epoch), version=stat.version)
            # The role is ours from here: take it up before the znode names us with its epoch,
            # so nobody who reads "the controller is <me>" finds this broker not ready yet.
            controller = Controller(self._store, me, epoch, internal_streams=self._internal)
            with self._lock:
                self._epoch_version = stat.version
                self.controller = controller
            controller.start()
            client.set(CONTROLLER, wire.controller_to_bytes(me, epoch))
        except KazooException as exc:
            logger.warning("taking up the controller role failed (%s); resigning", why(exc))
            if controller is not None:
                with self._lock:
                    if self.controller is controller:
                        self.controller = None
                controller.stop()
            with contextlib.suppress(KazooException):
                client.delete(CONTROLLER)
            session.retry_later(self.campaign)
            return
        client.exists(CONTROLLER, watch=self._on_controller_gone)

    def _on_controller_gone(self, event: Any) -> None:
        self._gone()
        self._session.submit(self.campaign)

    def resign(self) -> None:
        """Stop this broker's controller, if it runs (closing, or the session expired)."""
        with self._lock:
            if self.controller is not None:
                self.controller.stop()
                self.controller = None

    def reconcile(self, changed: bool) -> None:
        """After a reload: let this broker's controller reconcile if the metadata ``changed`` or
        its last reconciliation failed."""
        controller = self.controller
        if controller is not None and controller.running and (changed or controller.dirty):
            controller.submit(controller.reconcile)

    def active(self) -> Controller:
        """This broker's running controller; ``NotControllerError`` naming the controller otherwise."""
        with self._lock:
            controller = self.controller
        if controller is None or not controller.running:
            current = self._named()
            raise NotControllerError(
                f"broker {self.broker_id if self.broker_id is not None else '?'} is not the controller "
                f"({'the controller is ' + current if current else 'no controller is elected yet'})",
                controller=current,
            )
        return controller

    @staticmethod
    def ask(controller: Controller, work: Callable[[], T]) -> T:
        """``work``'s result, run on ``controller``'s thread; ``CommitStateUnknownError`` when it does
        not answer within :data:`CONTROLLER_CALL_TIMEOUT`."""
        future: concurrent.futures.Future[T] = controller.submit(work)
        try:
            return future.result(CONTROLLER_CALL_TIMEOUT)
        except concurrent.futures.TimeoutError:
            raise CommitStateUnknownError(
                f"the controller did not answer within {CONTROLLER_CALL_TIMEOUT:g}s"
            ) from None
