"""What a broker answers to admin requests that change streams or move partitions.

Each request is checked here (internal streams, a mirror's configuration, the
form of a plan), then runs on the controller (:class:`~.controller_calls.ControllerCalls`),
and returns once its effect can be seen: on a single broker once the change is
applied here (a new stream NATS refuses is deleted again, nothing half-made
stays behind), in a cluster once every partition's leader serves it -- asked of
the leader itself over Flight.  Listing and generating partition moves answer
from this broker's metadata.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from broker_node.controller_calls import ControllerCalls
from broker_node.coordination import reassignment
from broker_node.coordination.base import Coordinator
from broker_node.replication.manager import ReplicaManager
from broker_node.runtime import Runtime
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    RequestTimeoutError,
    UnavailableError,
    UnknownStreamError,
)
from pyspark_jetstream.protocol.flight import ActionType, StreamInfo
from pyspark_jetstream.protocol.mirror import refuse_mirror_change
from pyspark_jetstream.protocol.streams import INTERNAL_PREFIX, StreamConfig, validate_stream_name
from pyspark_jetstream.protocol.value_schema import SchemaDocument

SERVED_DEADLINE = 30.0
"""Seconds ``create_stream`` waits for every partition's leader to serve it."""


class StreamAdmin:
    """Creates, deletes, grows and evolves streams, elects leaders and moves partitions (Flight
    threads, any number at once); see the module docstring."""

    def __init__(
        self,
        runtime: Runtime,
        manager: ReplicaManager,
        coordinator: Coordinator,
        controller: ControllerCalls,
        *,
        clustered: bool,
        wait_for_sync: Callable[[], None],
        describe: Callable[[str], StreamInfo],
        leading: Callable[[], list[str]],
    ) -> None:
        """``describe``: a stream as this broker knows it; ``leading``: the partitions it leads and
        ingests, as ``stream/number``."""
        self._runtime = runtime
        self._manager = manager
        self._coordinator = coordinator
        self._controller = controller
        self._clustered = clustered
        self._wait_for_sync = wait_for_sync
        self._describe = describe
        self._leading = leading

    def create_stream(self, config: StreamConfig) -> StreamInfo:
        """Create (or confirm) a stream and return once every partition's leader serves it.

        A new stream that cannot be served on a single broker (NATS refuses
        its subscription, or its directory holds another stream's data) is
        deleted again and the reason raised: nothing half-made stays behind.
        """
        validate_stream_name(config.name)  # internal names are the broker's own
        existed = any(m.config.name == config.name for m in self._coordinator.list_streams())
        self._controller.run("create_stream", config.to_json())
        if not self._clustered:
            self._wait_for_sync()
            refused = [why for (stream, _), why in self._problems() if stream == config.name]
            if refused and not existed:
                self._coordinator.delete_stream(config.name)
                self._wait_for_sync()
                raise InvalidArgumentError(f"stream {config.name!r} was not created: {refused[0]}")
        else:
            self._wait_until_served(config.name)
        return self._describe(config.name)

    def delete_stream(self, name: str) -> None:
        """Delete a stream and its data (the data of each replica as its broker applies the change)."""
        if name.startswith("__"):
            raise InvalidArgumentError(f"stream {name!r} is internal and cannot be deleted")
        self._controller.run("delete_stream", {"name": name})
        self._wait_for_sync()

    def add_partitions(self, name: str, partitions: int) -> StreamInfo:
        """Grow a stream to ``partitions`` partitions (never fewer) and return once each is served.

        On a single broker a new partition that cannot be served (NATS
        refuses its subscription) is reported; it stays, since partitions are
        never removed, and is served once the cause is fixed and the broker
        restarts.
        """
        if name.startswith(INTERNAL_PREFIX):
            raise InvalidArgumentError(f"stream {name!r} is internal: its partitions are the broker's own")
        self._refuse_mirror_change(name, "add partitions")
        try:
            # This broker's view may lag behind, never run ahead: if it has the count already,
            # the controller either changes nothing or refuses (the stream has more).
            unchanged = len(self._coordinator.get_stream(name).partitions) == partitions
        except UnknownStreamError:
            unchanged = False  # not known here yet: the controller answers
        self._controller.run("add_partitions", {"name": name, "partitions": partitions})
        if unchanged:
            return self._describe(name)  # nothing to wait for, even with a partition leaderless
        if not self._clustered:
            self._wait_for_sync()
            refused = [f"{s}/{n}: {why}" for (s, n), why in self._problems() if s == name]
            if refused:
                raise UnavailableError(
                    f"stream {name!r} has {partitions} partitions, but not all can be served: {refused[0]}"
                )
        else:
            self._wait_until_served(name, f"grew to {partitions} partitions")
        return self._describe(name)

    def update_schema(self, name: str, document: SchemaDocument) -> StreamInfo:
        """Make ``document`` the next version of stream ``name``'s schema if it is compatible (the
        current one again changes nothing); return the stream as this broker then knows it."""
        if name.startswith(INTERNAL_PREFIX):
            raise InvalidArgumentError(f"stream {name!r} is internal: it has no schema")
        self._refuse_mirror_change(name, "change the schema")
        self._controller.run("update_schema", {"name": name, "schema": document.to_json()})
        refresh = getattr(self._coordinator, "refresh", None)
        if callable(refresh):
            refresh()  # the controller may be another broker: read what it wrote
        self._wait_for_sync()
        return self._describe(name)

    def elect_preferred_leaders(self) -> dict[str, Any]:
        """Move leadership back to each partition's preferred (first) replica where it is in sync."""
        result = self._controller.run("elect_preferred_leaders", {})
        self._wait_for_sync()
        return result if isinstance(result, dict) else {}

    def reassign_partitions(self, body: dict[str, Any]) -> dict[str, Any]:
        """Partition moves (see ``coordination.reassignment``); ``body["op"]`` says which.

        ``start`` (a ``plan``, a ``throttle`` in bytes/s), ``cancel`` (the
        ``partitions`` as ``[stream, number]`` pairs, or all), ``drain`` (a
        ``broker``, a ``throttle``) run on the controller; ``list`` and
        ``generate`` (``brokers``, optional ``streams``) answer here.
        """
        op = body.get("op")
        if op == "list":
            return {"partitions": self._reassignments()}
        if op == "generate":
            return self._generated_plan(body)
        if op not in ("start", "cancel", "drain"):
            raise InvalidArgumentError(f"op must be one of start, cancel, drain, list, generate, got {op!r}")
        if op == "start":  # the form is checked here, before the controller is asked
            moves = reassignment.parse_plan(body.get("plan"))
            body = {**body, "plan": [m.to_json() for m in moves]}
        reassignment.check_throttle(body.get("throttle", 0))
        result = self._controller.run("reassign_partitions", body)
        self._wait_for_sync()
        return result if isinstance(result, dict) else {}

    def _reassignments(self) -> list[dict[str, Any]]:
        return [
            {
                "stream": m.config.name,
                "partition": number,
                "leader": state.leader,
                "replicas": list(state.replicas),
                "target": list(state.target),
                "adding": list(state.adding),
                "removing": list(state.removing),
                "isr": list(state.isr),
                "throttle": state.throttle,
            }
            for m in self._coordinator.list_streams()
            for number, state in enumerate(m.partitions)
            if state.reassigning
        ]

    def _generated_plan(self, body: dict[str, Any]) -> dict[str, Any]:
        brokers, names = body.get("brokers"), body.get("streams")
        if not isinstance(brokers, list) or not all(isinstance(b, str) for b in brokers):
            raise InvalidArgumentError(f"generate needs 'brokers', a list of broker ids, got {brokers!r}")
        registered = {b.broker_id: b for b in self._coordinator.brokers()}
        unknown = sorted(set(brokers) - set(registered))
        if unknown:
            raise InvalidArgumentError(
                f"broker(s) {', '.join(unknown)} are not live (live: {', '.join(sorted(registered))})"
            )
        streams = [m for m in self._coordinator.list_streams() if not m.config.name.startswith("__")]
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise InvalidArgumentError(f"'streams' must be a list of stream names, got {names!r}")
            missing = sorted(set(names) - {m.config.name for m in streams})
            if missing:
                raise UnknownStreamError(f"no stream(s) named {', '.join(missing)}")
            streams = [m for m in streams if m.config.name in names]
        racks = {b: registered[b].rack for b in brokers if registered[b].rack}
        moves = reassignment.generated_plan(brokers, streams, racks)
        moved = {(m.stream, m.partition) for m in moves}
        current = [
            {"stream": m.config.name, "partition": n, "replicas": list(state.target)}
            for m in streams
            for n, state in enumerate(m.partitions)
            if (m.config.name, n) in moved
        ]
        return {"current": current, "proposed": [m.to_json() for m in moves]}

    def _problems(self) -> list[tuple[tuple[str, int], str]]:
        """Partitions held here that cannot be served, with why, by stream and number."""
        return sorted({**self._manager.offline, **self._runtime.ingest_failures()}.items())

    def _refuse_mirror_change(self, name: str, change: str) -> None:
        try:
            refuse_mirror_change(self._coordinator.get_stream(name).config, change)
        except UnknownStreamError:
            return  # the controller answers

    def _wait_until_served(self, name: str, done: str = "was created") -> None:
        """Wait until every partition of ``name`` is led by a broker that ingests it (``done``:
        what happened to the stream, for the error)."""
        deadline = time.monotonic() + SERVED_DEADLINE
        refresh = getattr(self._coordinator, "refresh", None)
        waiting: list[str] = []
        while time.monotonic() < deadline:
            if callable(refresh):
                refresh()
            try:
                metadata = self._coordinator.get_stream(name)
            except UnknownStreamError:
                time.sleep(0.05)
                continue
            waiting = [
                f"{name}/{n}"
                for n, state in enumerate(metadata.partitions)
                if not self._serves(state.leader, name, n)
            ]
            if not waiting:
                return
            time.sleep(0.05)
        raise RequestTimeoutError(
            f"stream {name!r} {done}, but {', '.join(waiting)} had no serving leader within "
            f"{SERVED_DEADLINE:g}s; it will be served once its leader is up"
        )

    def _serves(self, leader: str, stream: str, number: int) -> bool:
        if not leader:
            return False
        key = f"{stream}/{number}"
        if leader == self._runtime.broker_id:
            self._wait_for_sync()
            return key in self._leading()
        address = self._manager.peer_address_of(leader)
        if address is None:
            return False
        try:
            answer = self._controller.on_peer(address, ActionType.METADATA, {})
        except JetStreamError:
            return False
        return isinstance(answer, dict) and key in answer.get("leading", [])
