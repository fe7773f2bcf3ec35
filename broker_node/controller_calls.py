"""Admin actions only the controller may do, run here or forwarded to whichever broker is controller.

Stream creation and deletion, growing a stream, a schema's next version,
preferred-leader elections, partition moves and a mirror's promotion change the
cluster's metadata, which only the controller writes.  :meth:`ControllerCalls.run`
runs such an action on this broker's coordinator; when it answers
``NotControllerError`` the action is sent to the controller it names
(``CONTROLLER_CALL`` over Flight), and asked again until one answers or
:data:`CONTROLLER_DEADLINE` passes, so a client never needs to know who the
controller is.  :meth:`ControllerCalls.here` is what a broker runs when another
forwards an action to it: a table of handlers, one per action, each checking its body.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from pyarrow import flight

from broker_node.coordination import reassignment
from broker_node.coordination.base import Coordinator
from broker_node.coordination.errors import NotControllerError
from broker_node.replication.manager import ReplicaManager
from pyspark_jetstream.protocol.errors import InvalidArgumentError, UnavailableError
from pyspark_jetstream.protocol.flight import ActionType, encode_json, error_from_message
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import SchemaDocument

CONTROLLER_DEADLINE = 30.0
"""Seconds an admin request keeps trying to reach the controller (it may be changing)."""
PEER_CALL_TIMEOUT = 30.0
"""Seconds an admin action sent to another broker may take."""

Handler = Callable[[Coordinator, dict[str, Any]], object]


class ControllerCalls:
    """Runs the controller's actions here or on the controller (Flight threads, any number at once)."""

    def __init__(self, broker_id: str, manager: ReplicaManager, coordinator: Coordinator) -> None:
        self._broker_id = broker_id
        self._manager = manager
        self._coordinator = coordinator

    def run(self, action: str, body: dict[str, Any]) -> object:
        """Run ``action`` here if this broker is controller, else on the controller."""
        deadline = time.monotonic() + CONTROLLER_DEADLINE
        while True:
            try:
                return self.here(action, body)
            except NotControllerError as exc:
                controller = exc.fields.get("controller") or self._coordinator.controller()
                address = self._manager.peer_address_of(str(controller)) if controller else None
                if address is not None and controller != self._broker_id:
                    try:
                        return self.on_peer(
                            address, ActionType.CONTROLLER_CALL, {"action": action, "body": body}
                        )
                    except NotControllerError:
                        pass  # it stopped being controller: ask again
                if time.monotonic() > deadline:
                    raise UnavailableError(
                        f"no controller answered within {CONTROLLER_DEADLINE:g}s ({exc}); retry later",
                    ) from None
                time.sleep(0.1)

    def here(self, action: str, body: dict[str, Any]) -> object:
        """Run an admin action as the controller (``NotControllerError`` if this broker is not)."""
        handler = HANDLERS.get(action)
        if handler is None:
            raise InvalidArgumentError(f"unknown controller action {action!r}")
        return handler(self._coordinator, body)

    def on_peer(self, address: str, action: ActionType, body: dict[str, Any]) -> object:
        """An admin action on the broker at ``address``; its errors as ``JetStreamError``."""
        client = self._manager.connect_peer(address)
        try:
            results = list(
                client.do_action(
                    flight.Action(action.value, encode_json(body)),
                    flight.FlightCallOptions(timeout=PEER_CALL_TIMEOUT),
                )
            )
        except flight.FlightError as exc:
            known = error_from_message(str(exc), getattr(exc, "extra_info", None))
            if known is not None and known.fields.get("not_controller"):
                controller = known.fields.get("controller")
                raise NotControllerError(
                    str(known), controller if isinstance(controller, str) else None
                ) from None
            raise known or UnavailableError(f"broker at {address} failed: {exc}") from None
        finally:
            client.close()
        return json.loads(results[0].body.to_pybytes()) if results else None


def _named(action: str, body: dict[str, Any]) -> str:
    """The body's ``name``; ``InvalidArgumentError`` naming the action when it has none."""
    name = body.get("name")
    if not isinstance(name, str):
        raise InvalidArgumentError(f"{action} needs a 'name', got {body!r}")
    return name


def _create_stream(coordinator: Coordinator, body: dict[str, Any]) -> object:
    created = coordinator.create_stream(StreamConfig.from_json(body))
    return {"name": created.config.name}


def _delete_stream(coordinator: Coordinator, body: dict[str, Any]) -> object:
    coordinator.delete_stream(_named("delete_stream", body))
    return {}


def _add_partitions(coordinator: Coordinator, body: dict[str, Any]) -> object:
    name = _named("add_partitions", body)
    grown = coordinator.add_partitions(name, body.get("partitions"))  # type: ignore[arg-type] # checked there
    return {"name": name, "partitions": len(grown.partitions)}


def _update_schema(coordinator: Coordinator, body: dict[str, Any]) -> object:
    name = _named("update_schema", body)
    updated = coordinator.update_schema(name, SchemaDocument.from_json(body.get("schema")))
    return {"name": name, "schema": updated.config.schema and updated.config.schema.version}


def _elect_preferred_leaders(coordinator: Coordinator, body: dict[str, Any]) -> object:
    return coordinator.elect_preferred_leaders()


def _promote_mirror(coordinator: Coordinator, body: dict[str, Any]) -> object:
    name = _named("promote_mirror", body)
    coordinator.promote_mirror(name)
    return {"name": name}


def _reassign_partitions(coordinator: Coordinator, body: dict[str, Any]) -> object:
    throttle = reassignment.check_throttle(body.get("throttle", 0))
    op = body.get("op")
    if op == "start":
        return coordinator.reassign(reassignment.parse_plan(body.get("plan")), throttle)
    if op == "drain":
        broker = body.get("broker")
        if not isinstance(broker, str) or not broker:
            raise InvalidArgumentError(f"drain needs the 'broker' to drain, got {broker!r}")
        infos = coordinator.brokers()
        racks = {b.broker_id: b.rack for b in infos if b.rack}
        live = [b.broker_id for b in infos]
        moves = reassignment.drain_plan(broker, coordinator.list_streams(), live, racks)
        return {**coordinator.reassign(moves, throttle), "plan": [m.to_json() for m in moves]}
    partitions = body.get("partitions")
    if partitions is None:
        return coordinator.cancel_reassignments(None)
    if not isinstance(partitions, list) or not all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], int)
        for p in partitions
    ):
        raise InvalidArgumentError(f"cancel takes 'partitions' as [stream, number] pairs, got {partitions!r}")
    return coordinator.cancel_reassignments([(p[0], p[1]) for p in partitions])


HANDLERS: dict[str, Handler] = {
    "create_stream": _create_stream,
    "delete_stream": _delete_stream,
    "add_partitions": _add_partitions,
    "update_schema": _update_schema,
    "elect_preferred_leaders": _elect_preferred_leaders,
    "promote_mirror": _promote_mirror,
    "reassign_partitions": _reassign_partitions,
}
"""The controller's actions, by the name a forwarded ``CONTROLLER_CALL`` gives."""
