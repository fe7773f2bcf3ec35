"""The broker's registration in ZooKeeper, and the brokers' view of each other.

A broker is live while its ephemeral ``/brokers/<id>`` znode exists; it asks to
be relieved of leadership with an ephemeral ``/admin/shutdown/<id>``.  The
controller reads both fresh (:meth:`BrokerRegistration.live_brokers`,
:meth:`~BrokerRegistration.registrations`,
:meth:`~BrokerRegistration.shutting_down`); everyone else reads the brokers
from the coordinator's snapshot, and :func:`refuse_older` turns away a change
that a live broker of an older version would drop.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from pyspark_jetstream.protocol.errors import InvalidArgumentError

from .. import wire
from ..base import BrokerInfo
from ..errors import CoordinationError
from .znodes import BROKERS, SHUTDOWN, why
from .zookeeper_session import ZooKeeperSession


class BrokerRegistration:
    """Registers this broker (again after each new session) and reads who else is registered."""

    def __init__(self, session: ZooKeeperSession) -> None:
        self._session = session

    def register(self, broker: BrokerInfo) -> None:
        """Create this broker's ephemeral znode, waiting out a previous session that still holds it."""
        session = self._session
        client = session.connected_client()
        path = f"{BROKERS}/{broker.broker_id}"
        deadline = time.monotonic() + 2 * session.settings.session_timeout + 1
        while True:
            try:
                client.create(path, wire.broker_to_bytes(broker), ephemeral=True)
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
                        f"broker id {broker.broker_id!r} is already registered in {session.describe()} by "
                        f"a live session (0x{stat.ephemeralOwner:x}): another broker with this id is running"
                    ) from None
                time.sleep(0.2)  # a previous run's session that has not expired yet
        session.registered(path)

    def request_controlled_shutdown(self, broker_id: str) -> None:
        """See :meth:`Coordinator.request_controlled_shutdown`."""
        try:
            self._session.connected_client().create(f"{SHUTDOWN}/{broker_id}", b"", ephemeral=True)
        except NodeExistsError:
            pass
        except KazooException as exc:
            raise CoordinationError(f"cannot reach {self._session.describe()}: {why(exc)}") from None

    # Fresh reads, for the controller: ``CoordinationError`` when ZooKeeper cannot answer now (the
    # controller's next event reads again).

    def live_brokers(self) -> list[str]:
        """Fresh read of the registered brokers."""
        return sorted(self._session.read(lambda: self._session.connected_client().get_children(BROKERS)))

    def registrations(self) -> dict[str, int]:
        """Fresh read of each registered broker's znode creation id (czxid): a restart changes it."""

        def read() -> dict[str, int]:
            client = self._session.connected_client()
            found = {}
            for broker_id in client.get_children(BROKERS):
                stat = client.exists(f"{BROKERS}/{broker_id}")
                if stat is not None:
                    found[broker_id] = stat.czxid
            return found

        return self._session.read(read)

    def shutting_down(self) -> set[str]:
        """Fresh read of the brokers that asked to be relieved of leadership."""
        return set(self._session.read(lambda: self._session.connected_client().get_children(SHUTDOWN)))


def refuse_older(brokers: Iterable[BrokerInfo], feature: str, what: str) -> None:
    """Refuse a change that a live broker of an older version (without ``feature``) would drop on its
    next write: ``InvalidArgumentError`` naming those brokers."""
    older = [b.broker_id for b in brokers if feature not in b.features]
    if older:
        raise InvalidArgumentError(
            f"broker(s) {', '.join(older)} run a version that cannot {what}: upgrade every broker first"
        )
