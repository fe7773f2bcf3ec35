"""The Flight server's admin actions: one handler per :class:`ActionType`, found in a table.

The server parses the action's name and JSON body and authenticates the
caller; a handler checks what the principal may do, reads its arguments and
asks the broker.  Each handler checks in the order the refusals should come:
a caller without the right is refused before its arguments are looked at,
except for cursors, whose rights depend on the consumer and stream named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from broker_node.log import EpochEndOffset
from pyspark_jetstream.protocol.errors import InvalidArgumentError, LimitExceededError, shown
from pyspark_jetstream.protocol.flight import ActionType, StreamInfo, validate_body_int
from pyspark_jetstream.protocol.mirror import MirrorRequest
from pyspark_jetstream.protocol.streams import MAX_PARTITIONS, StreamConfig, bounded_int
from pyspark_jetstream.protocol.value_schema import SchemaDocument

T = TypeVar("T")

ACTION_DESCRIPTIONS = {
    ActionType.CREATE_STREAM: "Create a stream; body: a stream config object. Idempotent.",
    ActionType.DELETE_STREAM: 'Delete a stream; body: {"name": ...}.',
    ActionType.ADD_PARTITIONS: (
        'Grow a stream to more partitions (never fewer); body: {"name", "partitions"}. Idempotent.'
    ),
    ActionType.UPDATE_SCHEMA: (
        'Give a typed stream\'s schema its next version; body: {"name", "schema": {"format", "fields"}}. '
        "Compatible changes only; the current schema again changes nothing."
    ),
    ActionType.DESCRIBE_STREAM: 'Describe a stream and its partitions; body: {"name": ...}.',
    ActionType.LIST_STREAMS: "Describe every stream.",
    ActionType.SET_CURSOR: 'Store a consumer position; body: {"consumer", "stream", "partition", "offset"}.',
    ActionType.DELETE_CURSOR: 'Forget a consumer position; body: {"consumer", "stream", "partition"}.',
    ActionType.FETCH_CURSOR: 'Read a consumer position; body: {"consumer", "stream", "partition"}.',
    ActionType.STATUS: "Broker status: health, streams, partitions, cursors and lag.",
    ActionType.HEALTH: 'Whether the broker can ingest and serve everything: {"ok", "problems"}.',
    ActionType.METADATA: "The cluster: brokers, the controller, every partition's leader and ISR.",
    ActionType.ELECT_PREFERRED_LEADERS: "Lead each partition from its first replica where it is in sync.",
    ActionType.REASSIGN_PARTITIONS: (
        'Move partitions between brokers; body: {"op": "start", "plan", "throttle"}, {"op": "cancel", '
        '"partitions"}, {"op": "drain", "broker", "throttle"}, {"op": "list"} or {"op": "generate", '
        '"brokers", "streams"}.'
    ),
    ActionType.OFFSETS_FOR_LEADER_EPOCH: (
        'Where an epoch ends on the leader; body: {"stream", "partition", "epoch"}.'
    ),
    ActionType.CONTROLLER_CALL: (
        'Between brokers: an admin action run by the controller; body: {"action", "body"}.'
    ),
    ActionType.IDENTIFY: 'Which broker answers at this address: {"broker_id", "flight"}.',
    ActionType.CREATE_MIRROR: (
        'Create a mirror of another cluster\'s stream; body: {"name", "mirror": {"stream", "servers", '
        '"credentials"}, "replication_factor", "min_insync_replicas", "partitions", "subject"}. Idempotent.'
    ),
    ActionType.PROMOTE_STREAM: 'Stop a mirror for good and let it take publishes; body: {"name": ...}.',
    ActionType.MIRROR_STATUS: 'How each partition of a mirror stands; body: {"name", "local"}.',
}


class AdminService(Protocol):
    """What the actions need of the broker."""

    def offsets_for_leader_epoch(self, stream: str, partition: int, epoch: int) -> EpochEndOffset: ...
    def metadata(self) -> dict[str, Any]: ...
    def elect_preferred_leaders(self) -> dict[str, Any]: ...
    def reassign_partitions(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def controller_call(self, action: str, body: dict[str, Any]) -> object: ...
    def identify(self) -> dict[str, object]: ...
    def create_stream(self, config: StreamConfig) -> StreamInfo: ...
    def delete_stream(self, name: str) -> None: ...
    def add_partitions(self, name: str, partitions: int) -> StreamInfo: ...
    def update_schema(self, name: str, document: SchemaDocument) -> StreamInfo: ...
    def describe_stream(self, name: str) -> StreamInfo: ...
    def list_streams(self) -> list[StreamInfo]: ...
    def set_cursor(self, consumer: str, stream: str, partition: int, offset: int) -> None: ...
    def delete_cursor(self, consumer: str, stream: str, partition: int) -> None: ...
    def fetch_cursor(self, consumer: str, stream: str, partition: int) -> int | None: ...
    def status(self) -> dict[str, Any]: ...
    def health(self) -> dict[str, Any]: ...
    def create_mirror(self, request: MirrorRequest) -> StreamInfo: ...
    def promote_stream(self, name: str) -> StreamInfo: ...
    def mirror_status(self, name: str, *, local: bool) -> list[dict[str, Any]]: ...


class AdminAccess(Protocol):
    """What the actions need of access control."""

    def check(
        self, principal: str, action: str, *, stream: str | None = None, consumer: str | None = None
    ) -> None: ...
    def allows(self, principal: str, action: str, *, stream: str) -> bool: ...
    def check_cluster(self, principal: str, what: str) -> None: ...


class Actions:
    """Runs an admin action for a principal (Flight threads, any number at once)."""

    def __init__(self, broker: AdminService, access: AdminAccess, max_streams: int | None) -> None:
        self.broker = broker
        self.access = access
        self.max_streams = max_streams
        """Streams the cluster may hold (``[security] max_streams``); ``None``: no limit."""

    def run(self, kind: ActionType, principal: str, args: dict[str, Any]) -> object:
        """The JSON-ready result of action ``kind`` with body ``args``, run for ``principal``."""
        return HANDLERS[kind](self, principal, args)

    # ---- streams ----------------------------------------------------------------------

    def create_stream(self, principal: str, args: dict[str, Any]) -> object:
        config = StreamConfig.from_json(args)
        self.access.check(principal, "admin", stream=config.name)
        self._check_stream_cap(config.name)
        return self.broker.create_stream(config).to_json()

    def delete_stream(self, principal: str, args: dict[str, Any]) -> object:
        name = _arg(args, "name", str)
        self.access.check(principal, "admin", stream=name)
        self.broker.delete_stream(name)
        return {}

    def add_partitions(self, principal: str, args: dict[str, Any]) -> object:
        name = _arg(args, "name", str)
        self.access.check(principal, "admin", stream=name)
        # Checked here, naming a bad value whatever its type, before the controller is asked.
        partitions = bounded_int("partitions", args.get("partitions"), 1, MAX_PARTITIONS)
        return self.broker.add_partitions(name, partitions).to_json()

    def update_schema(self, principal: str, args: dict[str, Any]) -> object:
        name = _arg(args, "name", str)
        self.access.check(principal, "admin", stream=name)
        # Checked here, naming a bad field, before the controller is asked.
        document = SchemaDocument.from_json(args.get("schema"))
        return self.broker.update_schema(name, document).to_json()

    def create_mirror(self, principal: str, args: dict[str, Any]) -> object:
        request = MirrorRequest.from_json(args)
        self.access.check(principal, "admin", stream=request.name)
        self._check_stream_cap(request.name)
        return self.broker.create_mirror(request).to_json()

    def promote_stream(self, principal: str, args: dict[str, Any]) -> object:
        name = _arg(args, "name", str)
        self.access.check(principal, "admin", stream=name)
        return self.broker.promote_stream(name).to_json()

    def mirror_status(self, principal: str, args: dict[str, Any]) -> object:
        name = _arg(args, "name", str)
        if not self._sees(principal, name):
            self.access.check(principal, "read", stream=name)  # raises, naming the principal
        local = args.get("local", False)
        if not isinstance(local, bool):
            raise InvalidArgumentError(f"'local' must be true or false, got {shown(local)}")
        return self.broker.mirror_status(name, local=local)

    def describe_stream(self, principal: str, args: dict[str, Any]) -> object:
        name = _arg(args, "name", str)
        if not self._sees(principal, name):
            self.access.check(principal, "read", stream=name)  # raises, naming the principal
        return self.broker.describe_stream(name).to_json()

    def list_streams(self, principal: str, args: dict[str, Any]) -> object:
        return [
            info.to_json()
            for info in self.broker.list_streams()
            if self._sees(principal, info.config["name"])
        ]

    # ---- the broker and the cluster ----------------------------------------------------

    def status(self, principal: str, args: dict[str, Any]) -> object:
        self.access.check(principal, "admin", stream="*")
        return self.broker.status()

    def health(self, principal: str, args: dict[str, Any]) -> object:
        return self.broker.health()

    def metadata(self, principal: str, args: dict[str, Any]) -> object:
        return self.broker.metadata()

    def identify(self, principal: str, args: dict[str, Any]) -> object:
        return self.broker.identify()

    def elect_preferred_leaders(self, principal: str, args: dict[str, Any]) -> object:
        self.access.check(principal, "admin", stream="*")
        return self.broker.elect_preferred_leaders()

    def reassign_partitions(self, principal: str, args: dict[str, Any]) -> object:
        self.access.check(principal, "admin", stream="*")
        return self.broker.reassign_partitions(args)

    def controller_call(self, principal: str, args: dict[str, Any]) -> object:
        self.access.check_cluster(principal, ActionType.CONTROLLER_CALL.value)
        inner = args.get("body")
        if not isinstance(inner, dict):
            raise InvalidArgumentError(f"controller_call needs a 'body' object, got {shown(inner)}")
        return self.broker.controller_call(_arg(args, "action", str), inner)

    def offsets_for_leader_epoch(self, principal: str, args: dict[str, Any]) -> object:
        self.access.check_cluster(principal, ActionType.OFFSETS_FOR_LEADER_EPOCH.value)
        answer = self.broker.offsets_for_leader_epoch(
            _arg(args, "stream", str), _arg(args, "partition", int), _arg(args, "epoch", int)
        )
        return {"epoch": answer.epoch, "end_offset": answer.end_offset}

    # ---- cursors ------------------------------------------------------------------------

    def set_cursor(self, principal: str, args: dict[str, Any]) -> object:
        consumer, stream, partition = self._cursor_of(principal, args)
        self.broker.set_cursor(consumer, stream, partition, _arg(args, "offset", int))
        return {}

    def delete_cursor(self, principal: str, args: dict[str, Any]) -> object:
        self.broker.delete_cursor(*self._cursor_of(principal, args))
        return {}

    def fetch_cursor(self, principal: str, args: dict[str, Any]) -> object:
        return {"offset": self.broker.fetch_cursor(*self._cursor_of(principal, args))}

    def _cursor_of(self, principal: str, args: dict[str, Any]) -> tuple[str, str, int]:
        """The consumer, stream and partition a cursor action names, once the principal may use them."""
        consumer, stream = _arg(args, "consumer", str), _arg(args, "stream", str)
        partition = _arg(args, "partition", int)
        self.access.check(principal, "cursor", consumer=consumer)
        self.access.check(principal, "read", stream=stream)
        return consumer, stream, partition

    # ---- checks -------------------------------------------------------------------------

    def _sees(self, principal: str, name: str) -> bool:
        return any(self.access.allows(principal, a, stream=name) for a in ("read", "write", "admin"))

    def _check_stream_cap(self, name: str) -> None:
        if self.max_streams is None:
            return
        names = {info.config["name"] for info in self.broker.list_streams()}
        if name not in names and len(names) >= self.max_streams:
            raise LimitExceededError(
                f"cannot create stream {name!r}: the cluster holds {len(names)} streams, its limit "
                f"([security] max_streams) is {self.max_streams}"
            )


HANDLERS: dict[ActionType, Callable[[Actions, str, dict[str, Any]], object]] = {
    ActionType.CREATE_STREAM: Actions.create_stream,
    ActionType.DELETE_STREAM: Actions.delete_stream,
    ActionType.ADD_PARTITIONS: Actions.add_partitions,
    ActionType.UPDATE_SCHEMA: Actions.update_schema,
    ActionType.DESCRIBE_STREAM: Actions.describe_stream,
    ActionType.LIST_STREAMS: Actions.list_streams,
    ActionType.STATUS: Actions.status,
    ActionType.HEALTH: Actions.health,
    ActionType.METADATA: Actions.metadata,
    ActionType.IDENTIFY: Actions.identify,
    ActionType.ELECT_PREFERRED_LEADERS: Actions.elect_preferred_leaders,
    ActionType.REASSIGN_PARTITIONS: Actions.reassign_partitions,
    ActionType.CONTROLLER_CALL: Actions.controller_call,
    ActionType.OFFSETS_FOR_LEADER_EPOCH: Actions.offsets_for_leader_epoch,
    ActionType.SET_CURSOR: Actions.set_cursor,
    ActionType.DELETE_CURSOR: Actions.delete_cursor,
    ActionType.FETCH_CURSOR: Actions.fetch_cursor,
    ActionType.CREATE_MIRROR: Actions.create_mirror,
    ActionType.PROMOTE_STREAM: Actions.promote_stream,
    ActionType.MIRROR_STATUS: Actions.mirror_status,
}
"""Every action's handler (:data:`ACTION_DESCRIPTIONS` says what each takes; tests/api/test_actions.py
checks that none is missing)."""


def _arg(args: dict[str, Any], name: str, kind: type[T]) -> T:
    """Field ``name`` of an action body, of type ``kind``; integers are checked by the protocol's bounds."""
    value = args.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidArgumentError(f"{name!r} must be a {kind.__name__}, got {shown(value)}")
    if isinstance(value, int):
        validate_body_int(name, value)  # an offset must fit int64, a partition the partition range
    return value
