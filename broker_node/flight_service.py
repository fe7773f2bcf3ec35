"""What a broker answers over Flight: reads, replica fetches, admin, cursors, status.

:class:`BrokerService` satisfies the API's ``BrokerView``.  It is built from the
broker's parts (the runtime, the replica manager, the coordinator), not from
the broker itself.  Requests that only a partition's leader may serve raise
``NotLeaderError`` naming the leader and its address elsewhere; stream
creation and deletion, which only the controller may do, are forwarded to it
(``controller_call``), so a client never needs to know who the controller is.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyarrow import flight

from broker_node.api.server import ReplicaFetchAnswer
from broker_node.coordination import reassignment
from broker_node.coordination.base import Coordinator, StreamMetadata
from broker_node.coordination.errors import NotControllerError
from broker_node.log import EpochEndOffset, Record, ReplicaFrame
from broker_node.mirror_service import MirrorService
from broker_node.reachability import Reachability
from broker_node.replication.cursors import CURSOR_STREAM, cursor_key
from broker_node.replication.leader_repair import repair_copy
from broker_node.replication.manager import ReplicaManager
from broker_node.replication.partition import Partition, Role
from broker_node.runtime import Runtime
from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.envelope import Envelope
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    OffsetOutOfRangeError,
    RequestTimeoutError,
    UnavailableError,
    UnknownStreamError,
)
from pyspark_jetstream.protocol.flight import (
    ActionType,
    PartitionInfo,
    StreamInfo,
    encode_json,
    error_from_message,
)
from pyspark_jetstream.protocol.mirror import MirrorRequest, publish_refusal, refuse_mirror_change
from pyspark_jetstream.protocol.put import PutRequest
from pyspark_jetstream.protocol.replication import LeaderOffsets, ReplicaFetch
from pyspark_jetstream.protocol.streams import INTERNAL_PREFIX, StreamConfig, validate_stream_name
from pyspark_jetstream.protocol.value_schema import SchemaDocument

logger = logging.getLogger(__name__)

CONTROLLER_DEADLINE = 30.0
"""Seconds an admin request keeps trying to reach the controller (it may be changing)."""
SERVED_DEADLINE = 30.0
"""Seconds ``create_stream`` waits for every partition's leader to serve it."""
CURSOR_COMMIT_TIMEOUT = 10.0


class BrokerService:
    """The broker as the Flight API sees it (see the module docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        manager: ReplicaManager,
        coordinator: Coordinator,
        *,
        clustered: bool,
        wait_for_sync: Callable[[], None],
        reachability: Reachability | None = None,
    ) -> None:
        """``runtime``: the broker's addresses and running parts, filled in as it starts;
        ``wait_for_sync``: from a Flight thread, apply pending metadata changes here first;
        ``reachability``: this broker's probes of the brokers' advertised addresses (a cluster's)."""
        self._runtime = runtime
        self._manager = manager
        self._coordinator = coordinator
        self._clustered = clustered
        self._wait_for_sync = wait_for_sync
        self._reachability = reachability
        self._cursor_lock = threading.Lock()
        self.mirrors: MirrorService | None = None
        """Mirror actions (set by the wiring, which builds them from the same parts)."""

    @property
    def flight_address(self) -> str:
        """Where this broker serves Flight."""
        return self._runtime.flight_address

    def discovery(self) -> dict[str, object]:
        """The answer to a discovery request on NATS."""
        return {"broker_id": self._runtime.broker_id, "flight": self._runtime.flight_address}

    def identify(self) -> dict[str, object]:
        """Which broker answers here (a peer's probe of the address it advertises checks it)."""
        return self.discovery()

    # ---- reads ---------------------------------------------------------------------------------

    def readable(self, stream: str, number: int, *, from_replicas: bool = False) -> Partition:
        """The partition to read from here: its leader, or an in-sync follower when allowed."""
        return self._manager.require(stream, number, leader=False, from_replicas=from_replicas)

    def replica_fetch(self, request: ReplicaFetch) -> ReplicaFetchAnswer:
        """A repair copy (see :mod:`pyspark_jetstream.protocol.replication`): as leader, the stored
        frames from ``request.fetch_offset`` on, for a follower repairing a damaged range; as an
        in-sync follower, the committed ones, for its leader repairing its own.  A read: nothing
        is recorded, no high watermark moves."""
        following = self._manager.get(request.stream, request.partition)
        if (
            following is not None
            and following.role is Role.FOLLOWER
            and request.replica == following.state.leader
        ):
            frames = repair_copy(
                following, request.replica, request.leader_epoch, request.fetch_offset, request.max_bytes
            )
            return _replica_answer(following, frames, request.leader_epoch)
        partition = self._led_for(request)
        frames = partition.log.read_frames(request.fetch_offset, max_bytes=request.max_bytes)
        return _replica_answer(partition, frames, request.leader_epoch)

    def _led_for(self, request: ReplicaFetch) -> Partition:
        """The partition ``request`` fetches, led here in the request's epoch, holding its offset."""
        partition = self._manager.led_for(
            request.stream, request.partition, request.replica, request.leader_epoch
        )
        log = partition.log
        start, end = log.log_start_offset, log.log_end_offset
        if not start <= request.fetch_offset <= end:
            raise OffsetOutOfRangeError(
                f"{request.replica} fetches {request.stream}/{request.partition} from "
                f"{request.fetch_offset}, but the leader holds offsets {start} to {end}",
                stream=request.stream,
                partition=request.partition,
                offset=request.fetch_offset,
                log_start_offset=start,
                log_end_offset=end,
            )
        return partition

    def offsets_for_leader_epoch(self, stream: str, partition: int, epoch: int) -> EpochEndOffset:
        """Where ``epoch`` ends in the leader's log (the largest epoch it has <= ``epoch``)."""
        leader = self._manager.require(stream, partition, leader=True)
        return leader.log.end_offset_for_epoch(epoch)

    # ---- admin ----------------------------------------------------------------------------------

    def create_stream(self, config: StreamConfig) -> StreamInfo:
        """Create (or confirm) a stream and return once every partition's leader serves it.

        A new stream that cannot be served on a single broker (NATS refuses
        its subscription, or its directory holds another stream's data) is
        deleted again and the reason raised: nothing half-made stays behind.
        """
        validate_stream_name(config.name)  # internal names are the broker's own
        existed = any(m.config.name == config.name for m in self._coordinator.list_streams())
        self._controller("create_stream", config.to_json())
        if not self._clustered:
            self._wait_for_sync()
            problems = {**self._manager.offline, **self._ingest_failures()}
            refused = [why for (stream, _), why in sorted(problems.items()) if stream == config.name]
            if refused and not existed:
                self._coordinator.delete_stream(config.name)
                self._wait_for_sync()
                raise InvalidArgumentError(f"stream {config.name!r} was not created: {refused[0]}")
        else:
            self._wait_until_served(config.name)
        return self.describe_stream(config.name)

    def delete_stream(self, name: str) -> None:
        """Delete a stream and its data (the data of each replica as its broker applies the change)."""
        if name.startswith("__"):
            raise InvalidArgumentError(f"stream {name!r} is internal and cannot be deleted")
        self._controller("delete_stream", {"name": name})
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
        self._controller("add_partitions", {"name": name, "partitions": partitions})
        if unchanged:
            return self.describe_stream(name)  # nothing to wait for, even with a partition leaderless
        if not self._clustered:
            self._wait_for_sync()
            problems = {**self._manager.offline, **self._ingest_failures()}
            refused = [f"{s}/{n}: {why}" for (s, n), why in sorted(problems.items()) if s == name]
            if refused:
                raise UnavailableError(
                    f"stream {name!r} has {partitions} partitions, but not all can be served: {refused[0]}"
                )
        else:
            self._wait_until_served(name, f"grew to {partitions} partitions")
        return self.describe_stream(name)

    def update_schema(self, name: str, document: SchemaDocument) -> StreamInfo:
        """Make ``document`` the next version of stream ``name``'s schema if it is compatible (the
        current one again changes nothing); return the stream as this broker then knows it."""
        if name.startswith(INTERNAL_PREFIX):
            raise InvalidArgumentError(f"stream {name!r} is internal: it has no schema")
        self._refuse_mirror_change(name, "change the schema")
        self._controller("update_schema", {"name": name, "schema": document.to_json()})
        refresh = getattr(self._coordinator, "refresh", None)
        if callable(refresh):
            refresh()  # the controller may be another broker: read what it wrote
        self._wait_for_sync()
        return self.describe_stream(name)

    def elect_preferred_leaders(self) -> dict[str, Any]:
        """Move leadership back to each partition's preferred (first) replica where it is in sync."""
        result = self._controller("elect_preferred_leaders", {})
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
        result = self._controller("reassign_partitions", body)
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

    def controller_call(self, action: str, body: dict[str, Any]) -> object:
        """Run an admin action as the controller (``NotControllerError`` if this broker is not)."""
        coordinator = self._coordinator
        if action == "reassign_partitions":
            return self._reassign_here(body)
        if action == "create_stream":
            created = coordinator.create_stream(StreamConfig.from_json(body))
            return {"name": created.config.name}
        if action == "delete_stream":
            name = body.get("name")
            if not isinstance(name, str):
                raise InvalidArgumentError(f"delete_stream needs a 'name', got {body!r}")
            coordinator.delete_stream(name)
            return {}
        if action == "add_partitions":
            name, partitions = body.get("name"), body.get("partitions")
            if not isinstance(name, str):
                raise InvalidArgumentError(f"add_partitions needs a 'name', got {body!r}")
            grown = coordinator.add_partitions(name, partitions)  # type: ignore[arg-type] # checked there
            return {"name": name, "partitions": len(grown.partitions)}
        if action == "update_schema":
            name = body.get("name")
            if not isinstance(name, str):
                raise InvalidArgumentError(f"update_schema needs a 'name', got {body!r}")
            updated = coordinator.update_schema(name, SchemaDocument.from_json(body.get("schema")))
            return {"name": name, "schema": updated.config.schema and updated.config.schema.version}
        if action == "elect_preferred_leaders":
            return coordinator.elect_preferred_leaders()
        if action == "promote_mirror":
            name = body.get("name")
            if not isinstance(name, str):
                raise InvalidArgumentError(f"promote_mirror needs a 'name', got {body!r}")
            coordinator.promote_mirror(name)
            return {"name": name}
        raise InvalidArgumentError(f"unknown controller action {action!r}")

    def _reassign_here(self, body: dict[str, Any]) -> dict[str, Any]:
        coordinator = self._coordinator
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
            raise InvalidArgumentError(
                f"cancel takes 'partitions' as [stream, number] pairs, got {partitions!r}"
            )
        return coordinator.cancel_reassignments([(p[0], p[1]) for p in partitions])

    def on_controller(self, action: str, body: dict[str, Any]) -> object:
        """Run controller action ``action`` here if this broker is controller, else on the controller."""
        return self._controller(action, body)

    def _controller(self, action: str, body: dict[str, Any]) -> object:
        """Run ``action`` here if this broker is controller, else on the controller."""
        deadline = time.monotonic() + CONTROLLER_DEADLINE
        while True:
            try:
                return self.controller_call(action, body)
            except NotControllerError as exc:
                controller = exc.fields.get("controller") or self._coordinator.controller()
                address = self._manager.peer_address_of(str(controller)) if controller else None
                if address is not None and controller != self._runtime.broker_id:
                    try:
                        return _call(
                            self._manager.connect_peer(address),
                            address,
                            ActionType.CONTROLLER_CALL,
                            {"action": action, "body": body},
                        )
                    except NotControllerError:
                        pass  # it stopped being controller: ask again
                if time.monotonic() > deadline:
                    raise UnavailableError(
                        f"no controller answered within {CONTROLLER_DEADLINE:g}s ({exc}); retry later",
                    ) from None
                time.sleep(0.1)

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
            answer = _call(self._manager.connect_peer(address), address, ActionType.METADATA, {})
        except JetStreamError:
            return False
        return isinstance(answer, dict) and key in answer.get("leading", [])

    def _leading(self) -> list[str]:
        """Partitions this broker leads and ingests (internal ones need no subscription)."""
        ingesting = self._runtime.ingestor.ingesting() if self._runtime.ingestor is not None else set()
        return sorted(
            f"{s}/{n}"
            for (s, n), p in self._manager.leaders().items()
            if p.is_leader and (s.startswith("__") or (s, n) in ingesting)
        )

    def describe_stream(self, name: str) -> StreamInfo:
        """A stream's config, and its partitions' leadership and offsets (-1 where not held here)."""
        return self._describe(self._coordinator.get_stream(name))

    def list_streams(self) -> list[StreamInfo]:
        """Every stream (internal ones included), by name."""
        return [self._describe(m) for m in self._coordinator.list_streams()]

    def _describe(self, metadata: StreamMetadata) -> StreamInfo:
        infos = []
        for number, state in enumerate(metadata.partitions):
            partition = self._manager.get(metadata.config.name, number)
            log = partition.log if partition is not None else None
            infos.append(
                PartitionInfo(
                    partition=number,
                    leader=state.leader,
                    replicas=state.replicas,
                    isr=state.isr,
                    leader_epoch=state.leader_epoch,
                    log_start_offset=log.log_start_offset if log else -1,
                    log_end_offset=log.log_end_offset if log else -1,
                    high_watermark=partition.high_watermark if partition else -1,
                )
            )
        return StreamInfo(metadata.config.to_json(), tuple(infos))

    def metadata(self) -> dict[str, Any]:
        """The cluster as this broker sees it: brokers, controller, leaders; what it leads itself."""
        coordinator = self._coordinator
        return {
            "broker_id": self._runtime.broker_id,
            "controller": coordinator.controller(),
            "brokers": [
                {
                    "broker_id": b.broker_id,
                    "flight": b.flight_address,
                    "nats": list(b.nats_urls),
                    "rack": b.rack,
                    "features": list(b.features),
                }
                for b in coordinator.brokers()
            ],
            "leading": self._leading(),
            "streams": [info.to_json() for info in self.list_streams()],
        }

    # ---- mirrors (see broker_node.mirror_service) ---------------------------------------------

    def create_mirror(self, request: MirrorRequest) -> StreamInfo:
        """Create a mirror of another cluster's stream (see ``MirrorService.create``)."""
        return self._mirror_service().create(request)

    def promote_stream(self, name: str) -> StreamInfo:
        """Promote mirror ``name`` (see ``MirrorService.promote``)."""
        return self._mirror_service().promote(name)

    def mirror_status(self, name: str, *, local: bool) -> list[dict[str, Any]]:
        """Each partition of mirror ``name``: how its copy stands (see ``MirrorService.status``)."""
        return self._mirror_service().status(name, local=local)

    def _mirror_service(self) -> MirrorService:
        if self.mirrors is None:
            raise UnavailableError("this broker is starting: it copies no mirror yet")
        return self.mirrors

    def _refuse_mirror_change(self, name: str, change: str) -> None:
        try:
            refuse_mirror_change(self._coordinator.get_stream(name).config, change)
        except UnknownStreamError:
            return  # the controller answers

    # ---- writes over Flight ----------------------------------------------------------------------

    def open_put(self, request: PutRequest) -> None:
        """Check that ``request``'s partition is led and ingested here (else ``NotLeaderError``
        naming the leader, or ``UnavailableError``) before its chunks are read."""
        partition = self._manager.require(request.stream, request.partition, leader=True)
        mirror = partition.config.mirror
        if mirror is not None and mirror.active:
            raise InvalidArgumentError(publish_refusal(request.stream, mirror))
        ingestor = self._runtime.ingestor
        if ingestor is None or (request.stream, request.partition) not in ingestor.ingesting():
            raise UnavailableError(
                f"{request.stream}/{request.partition} is led here but not ingested yet; try again",
                stream=request.stream,
                partition=request.partition,
            )

    def chunk_limit(self, request: PutRequest) -> int:
        """The partition's batch limit: the most bytes one chunk may decode to."""
        return self._manager.require(request.stream, request.partition, leader=True).max_batch_bytes

    def put_chunk(
        self, request: PutRequest, sequence: int, batch: pa.RecordBatch
    ) -> concurrent.futures.Future[Ack]:
        """Store one chunk of ``request`` as the producer's envelope batch with ``sequence``; the
        future's ack is its answer (refusals included)."""
        ingestor = self._runtime.ingestor
        if ingestor is None:
            raise UnavailableError("the broker is not ingesting (starting or stopping)")
        envelope = Envelope(
            ack_policy=request.ack_policy,
            producer_id=request.producer_id,
            sequence=sequence,
            batch=batch,
            stream=request.stream,
            partition=request.partition,
            producer_epoch=request.producer_epoch,
        )
        return ingestor.put(envelope, sequence)

    # ---- cursors --------------------------------------------------------------------------------

    def set_cursor(self, consumer: str, stream: str, partition: int, offset: int) -> None:
        """Store ``consumer``'s position in the cursor stream, and return once it is committed."""
        if offset < 0:
            raise InvalidArgumentError(f"cursor offset must not be negative, got {offset}")
        self._write_cursor(consumer, stream, partition, offset)

    def delete_cursor(self, consumer: str, stream: str, partition: int) -> None:
        """Forget ``consumer``'s position (a tombstone in the cursor stream); return once committed."""
        self._write_cursor(consumer, stream, partition, None)

    def _write_cursor(self, consumer: str, stream: str, partition: int, offset: int | None) -> None:
        key = cursor_key(consumer, stream, partition)
        self._check_partition(stream, partition)
        cursors = self._manager.require(CURSOR_STREAM, 0, leader=True)
        committed = threading.Event()
        failure: list[JetStreamError] = []
        with self._cursor_lock:  # the log and the table see cursor writes in one order
            cursors.check_min_insync()
            value = None if offset is None else str(offset).encode()
            offsets = cursors.append([Record(value, key=key)])
            if cursors.cursors is not None:
                if offset is None:
                    cursors.cursors.forget(key)
                else:
                    cursors.cursors.put(key, offset)

        def done(error: JetStreamError | None) -> None:
            if error is not None:
                failure.append(error)
            committed.set()

        cursors.when_committed(offsets[-1], done)
        if not committed.wait(CURSOR_COMMIT_TIMEOUT):
            raise RequestTimeoutError(
                f"the cursor of {consumer} on {stream}/{partition} is stored but not committed to the "
                f"in-sync replicas within {CURSOR_COMMIT_TIMEOUT:g}s"
            )
        if failure:
            raise failure[0]

    def fetch_cursor(self, consumer: str, stream: str, partition: int) -> int | None:
        """The stored position, or ``None`` if the consumer never set one."""
        key = cursor_key(consumer, stream, partition)
        self._check_partition(stream, partition)
        cursors = self._manager.require(CURSOR_STREAM, 0, leader=True)
        return cursors.cursors.get(key) if cursors.cursors is not None else None

    def _check_partition(self, stream: str, number: int) -> None:
        metadata = self._coordinator.get_stream(stream)
        if not 0 <= number < len(metadata.partitions):
            raise UnknownStreamError(
                f"stream {stream!r} has partitions 0 to {len(metadata.partitions) - 1}, not {number}",
                stream=stream,
                partition=number,
            )

    # ---- status ---------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Identity, health, streams, the partitions held here, and cursors with their lag."""
        return {
            "broker_id": self._runtime.broker_id,
            "flight": self._runtime.flight_address,
            "nats": self._runtime.advertised_nats,
            "controller": self._coordinator.controller(),
            "event_loop": self._runtime.event_loop,
            "health": self.health(),
            "reachability": (
                [p.to_json() for p in self._reachability.results()] if self._reachability else []
            ),
            "streams": [info.to_json() for info in self.list_streams()],
            "partitions": [self._partition_status(p) for p in self._manager.held()],
            "cursors": self._cursors(),
            "mirrors": self.mirrors.local_statuses() if self.mirrors is not None else [],
        }

    def _partition_status(self, partition: Partition) -> dict[str, Any]:
        log = partition.log
        fetcher = self._manager.fetchers().get((partition.stream, partition.number))
        return {
            "stream": partition.stream,
            "partition": partition.number,
            "role": partition.role.value,
            "leader": partition.state.leader,
            "leader_epoch": partition.state.leader_epoch,
            "isr": list(partition.state.isr),
            "log_start_offset": log.log_start_offset,
            "log_end_offset": log.log_end_offset,
            "size_bytes": log.size_bytes,
            "high_watermark": partition.high_watermark,
            "followers": partition.follower_log_ends() if partition.role is Role.LEADER else {},
            "fetch_error": fetcher.last_error if fetcher is not None else None,
            "damaged": [[d.first_offset, d.last_offset, d.detail] for d in log.damaged],
        }

    def _cursors(self) -> list[dict[str, Any]]:
        manager = self._manager
        holder = manager.get(CURSOR_STREAM, 0)
        if holder is None or holder.role is not Role.LEADER or holder.cursors is None:
            return []
        out = []
        for key, offset in holder.cursors.items():
            consumer, stream, number = key.decode().rsplit("/", 2)
            partition = manager.get(stream, int(number))
            hw = partition.high_watermark if partition is not None and partition.role is Role.LEADER else None
            out.append(
                {
                    "consumer": consumer,
                    "stream": stream,
                    "partition": int(number),
                    "offset": offset,
                    "lag": None if hw is None else max(hw - offset, 0),
                }
            )
        return out

    def health(self) -> dict[str, Any]:
        """Whether the broker can do its job: ``{"ok": bool, "problems": [one line each]}``.

        A problem is anything that stops it ingesting, replicating or serving
        some data: the embedded nats-server or the NATS connection down, the
        coordinator out of reach, a broker whose advertised Flight address it
        cannot reach, a partition it cannot open, a subscription NATS refused,
        a follower that cannot fetch, damaged batches, data the metadata does
        not know.
        """
        problems = []
        if self._runtime.nats is not None and not self._runtime.nats.running:
            problems.append("the embedded nats-server is not running (restarting it)")
        if self._runtime.ingestor is None or not self._runtime.ingestor.connected:
            problems.append(
                f"not connected to NATS at {', '.join(self._runtime.nats_urls)}: nothing is ingested"
            )
        lease = getattr(self._coordinator, "lease_valid", None)
        waiting = getattr(self._coordinator, "waiting", None)
        if waiting:
            problems.append(waiting)
        elif callable(lease) and not lease():
            problems.append(f"out of touch with {self._coordinator.describe()}: not leading anything")
        if self._reachability is not None:
            problems += self._reachability.problems()
        for (stream, number), reason in sorted({**self._manager.offline, **self._ingest_failures()}.items()):
            problems.append(f"{stream}/{number}: {reason}")
        for key, fetcher in sorted(self._manager.fetchers().items()):
            if fetcher.last_error:
                problems.append(
                    f"{key[0]}/{key[1]}: cannot fetch from leader {fetcher.leader}: {fetcher.last_error}"
                )
        if self.mirrors is not None:
            problems += self.mirrors.problems()
        for partition in self._manager.held():
            for damaged in partition.log.damaged:
                problems.append(
                    f"{partition.stream}/{partition.number}: offsets {damaged.first_offset} to "
                    f"{damaged.last_offset} are damaged ({damaged.detail})"
                )
        problems += [f"{directory}: {reason}" for directory, reason in sorted(self._manager.strays.items())]
        return {"ok": not problems, "problems": problems}

    def _ingest_failures(self) -> dict[tuple[str, int], str]:
        return self._runtime.ingestor.failures if self._runtime.ingestor is not None else {}


def _call(client: flight.FlightClient, address: str, action: ActionType, body: dict[str, Any]) -> object:
    """An admin action on another broker (``client`` reaches it at ``address``); its errors as
    ``JetStreamError``."""
    try:
        results = list(
            client.do_action(
                flight.Action(action.value, encode_json(body)),
                flight.FlightCallOptions(timeout=SERVED_DEADLINE),
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


def _replica_answer(partition: Partition, frames: list[ReplicaFrame], epoch: int) -> ReplicaFetchAnswer:
    """A replica fetch's answer: ``frames`` and the offsets of ``partition``'s log now, in leader
    epoch ``epoch`` (the one the fetch was checked against)."""
    log = partition.log
    offsets = LeaderOffsets(
        high_watermark=partition.high_watermark,
        log_start_offset=log.log_start_offset,
        log_end_offset=log.log_end_offset,
        leader_epoch=epoch,
    )
    return ReplicaFetchAnswer(frames, offsets)
