"""What a broker answers over Flight: reads, replica fetches and puts here; admin, cursors and
status in rooms of their own, which :class:`BrokerService` composes.

:class:`BrokerService` satisfies the API's ``BrokerView``.  It is built from the
broker's parts (the runtime, the replica manager, the coordinator), not from
the broker itself.  Requests that only a partition's leader may serve raise
``NotLeaderError`` naming the leader and its address elsewhere.  The admin
actions (the API's ``AdminService``) are handed on, one line each, to the room
that does them: stream changes and partition moves to
:class:`~broker_node.stream_admin.StreamAdmin`, which has the controller run
them (:class:`~broker_node.controller_calls.ControllerCalls`, forwarding to
whichever broker is controller); cursors to
:class:`~broker_node.cursor_service.CursorService`; status and health to
:class:`~broker_node.broker_status.BrokerStatus`; mirrors to
:class:`~broker_node.mirror_service.MirrorService`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from broker_node.api.server import ReplicaFetchAnswer
from broker_node.broker_status import BrokerStatus
from broker_node.controller_calls import ControllerCalls
from broker_node.coordination.base import Coordinator, StreamMetadata
from broker_node.cursor_service import CursorService
from broker_node.log import EpochEndOffset, ReplicaFrame
from broker_node.mirror_service import MirrorService
from broker_node.reachability import Reachability
from broker_node.replication.leader_repair import repair_copy
from broker_node.replication.manager import ReplicaManager
from broker_node.replication.partition import Partition, Role
from broker_node.runtime import Runtime
from broker_node.stream_admin import StreamAdmin
from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.envelope import Envelope
from pyspark_jetstream.protocol.errors import InvalidArgumentError, OffsetOutOfRangeError, UnavailableError
from pyspark_jetstream.protocol.flight import PartitionInfo, StreamInfo
from pyspark_jetstream.protocol.mirror import MirrorRequest, publish_refusal
from pyspark_jetstream.protocol.put import PutRequest
from pyspark_jetstream.protocol.replication import LeaderOffsets, ReplicaFetch
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import SchemaDocument


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
        self.controller = ControllerCalls(runtime.broker_id, manager, coordinator)
        """Runs what only the controller may do, here or on the controller."""
        self.streams = StreamAdmin(
            runtime,
            manager,
            coordinator,
            self.controller,
            clustered=clustered,
            wait_for_sync=wait_for_sync,
            describe=self.describe_stream,
            leading=self.leading,
        )
        self.cursors = CursorService(manager, coordinator)
        self.report = BrokerStatus(
            runtime, manager, coordinator, list_streams=self.list_streams, reachability=reachability
        )
        self._mirrors: MirrorService | None = None

    @property
    def mirrors(self) -> MirrorService | None:
        """Mirror actions (set by the wiring, which builds them from the same parts)."""
        return self._mirrors

    @mirrors.setter
    def mirrors(self, mirrors: MirrorService | None) -> None:
        self._mirrors = self.report.mirrors = mirrors

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

    # ---- streams as this broker knows them ---------------------------------------------------

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
            "leading": self.leading(),
            "streams": [info.to_json() for info in self.list_streams()],
        }

    def leading(self) -> list[str]:
        """Partitions this broker leads and ingests (internal ones need no subscription)."""
        ingesting = self._runtime.ingestor.ingesting() if self._runtime.ingestor is not None else set()
        return sorted(
            f"{s}/{n}"
            for (s, n), p in self._manager.leaders().items()
            if p.is_leader and (s.startswith("__") or (s, n) in ingesting)
        )

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

    # ---- admin: handed on to its rooms -----------------------------------------------------------

    def create_stream(self, config: StreamConfig) -> StreamInfo:
        """See :meth:`StreamAdmin.create_stream`."""
        return self.streams.create_stream(config)

    def delete_stream(self, name: str) -> None:
        """See :meth:`StreamAdmin.delete_stream`."""
        self.streams.delete_stream(name)

    def add_partitions(self, name: str, partitions: int) -> StreamInfo:
        """See :meth:`StreamAdmin.add_partitions`."""
        return self.streams.add_partitions(name, partitions)

    def update_schema(self, name: str, document: SchemaDocument) -> StreamInfo:
        """See :meth:`StreamAdmin.update_schema`."""
        return self.streams.update_schema(name, document)

    def elect_preferred_leaders(self) -> dict[str, Any]:
        """See :meth:`StreamAdmin.elect_preferred_leaders`."""
        return self.streams.elect_preferred_leaders()

    def reassign_partitions(self, body: dict[str, Any]) -> dict[str, Any]:
        """See :meth:`StreamAdmin.reassign_partitions`."""
        return self.streams.reassign_partitions(body)

    def controller_call(self, action: str, body: dict[str, Any]) -> object:
        """Another broker's forwarded controller action (see :meth:`ControllerCalls.here`)."""
        return self.controller.here(action, body)

    def set_cursor(self, consumer: str, stream: str, partition: int, offset: int) -> None:
        """See :meth:`CursorService.set_cursor`."""
        self.cursors.set_cursor(consumer, stream, partition, offset)

    def delete_cursor(self, consumer: str, stream: str, partition: int) -> None:
        """See :meth:`CursorService.delete_cursor`."""
        self.cursors.delete_cursor(consumer, stream, partition)

    def fetch_cursor(self, consumer: str, stream: str, partition: int) -> int | None:
        """See :meth:`CursorService.fetch_cursor`."""
        return self.cursors.fetch_cursor(consumer, stream, partition)

    def status(self) -> dict[str, Any]:
        """See :meth:`BrokerStatus.status`."""
        return self.report.status()

    def health(self) -> dict[str, Any]:
        """See :meth:`BrokerStatus.health`."""
        return self.report.health()

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
        if self._mirrors is None:
            raise UnavailableError("this broker is starting: it copies no mirror yet")
        return self._mirrors


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
