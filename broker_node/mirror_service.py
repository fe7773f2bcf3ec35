"""What a broker answers about mirrors: creating one, promoting it, and how each copy stands.

``create_mirror`` reads the source stream from the source cluster (through
the same Flight calls a copier uses, with the mirror's credentials), refuses
what cannot be a mirror -- a source stream that does not exist, a partition
count other than the source's, a source that (through mirrors of mirrors)
copies the very stream being created -- and creates the stream with the
source's configuration (subject, partitions, retention, compaction,
compression, schema...) and the mirror's own replication factor and
``min_insync_replicas``, through the ordinary stream creation.

``promote_stream`` asks the controller to mark the mirror promoted in the
metadata (ZooKeeper, or the single broker's metadata file), so that no broker
resumes the copy after a restart; each partition's leader stops its copier
when it applies the change, and from then on takes publishes at its log end.

``mirror_status`` reports each partition of a mirror from its leader
(:class:`~pyspark_jetstream.protocol.mirror.MirrorStatus`): this broker's
copiers, and the other leaders' asked over Flight.  The copiers store copied
cursors through :meth:`MirrorService.write_cursor`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

from pyarrow import flight

from broker_node.coordination.base import Coordinator
from broker_node.replication.manager import ReplicaManager
from broker_node.replication.mirror_set import Mirrors
from broker_node.replication.source_cluster import Connect, SourceCluster, brokers_of
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    NotLeaderError,
    UnavailableError,
)
from pyspark_jetstream.protocol.flight import ActionType, StreamInfo, encode_json, error_from_message
from pyspark_jetstream.protocol.mirror import MirrorRequest, MirrorSource, MirrorStatus
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import schema_to_json

logger = logging.getLogger(__name__)

MAX_HOPS = 8
"""Mirrors of mirrors followed when looking for a loop (a longer chain is not checked further)."""
PEER_TIMEOUT = 10.0


@dataclasses.dataclass(eq=False, repr=False)
class MirrorService:
    """Mirror actions, built from the broker's parts (see the module docstring)."""

    broker_id: str
    manager: ReplicaManager
    coordinator: Coordinator
    mirrors: Mirrors
    connector: Callable[[MirrorSource], Connect]
    _: dataclasses.KW_ONLY
    create_stream: Callable[[StreamConfig], StreamInfo]
    controller: Callable[[str, dict[str, Any]], object]
    describe: Callable[[str], StreamInfo]
    write_cursor_here: Callable[[str, str, int, int | None], None]
    wait_for_sync: Callable[[], None]

    # ---- create and promote -------------------------------------------------------------------

    def create(self, request: MirrorRequest) -> StreamInfo:
        """Create the mirror ``request`` asks for (see the module docstring); idempotent."""
        source = request.source
        config = self._source_config(request)
        if request.partitions is not None and request.partitions != config.partitions:
            raise InvalidArgumentError(
                f"stream {request.name!r}: partitions={request.partitions}, but the source {source.where()} "
                f"has {config.partitions}; a mirror has its source's partition count (leave it out)"
            )
        schema = config.schema
        if schema is not None:
            # Nothing is ingested into a mirror: the source's dead-letter stream is not ours.
            schema = dataclasses.replace(schema, on_invalid="refuse", dead_letter=None)
        mirror_config = dataclasses.replace(
            config,
            name=request.name,
            subject=request.subject or config.subject,
            replication_factor=request.replication_factor,
            min_insync_replicas=request.min_insync_replicas,
            group=None,
            schema=schema,
            mirror=source,
        )
        logger.info("creating stream %s as a mirror of %s", request.name, source.where())
        return self.create_stream(mirror_config)

    def _source_config(self, request: MirrorRequest) -> StreamConfig:
        """The source stream's config, once no mirror on the way back to it leads to ``request``'s
        stream in this cluster (a loop)."""
        own = {b.flight_address for b in self.coordinator.brokers()}
        servers, stream = request.source.servers, request.source.stream
        path = [f"{request.name!r} here"]
        first: StreamConfig | None = None
        for hop in range(MAX_HOPS):
            cluster = SourceCluster(servers, self.connector(request.source))
            try:
                metadata = cluster.metadata()
                here = bool(own & set(brokers_of(metadata)))
                path.append(f"{stream!r} {'here' if here else 'on ' + ','.join(servers)}")
                if here and stream == request.name:
                    raise InvalidArgumentError(
                        f"mirror loop: {' mirrors '.join(path)}; a stream cannot copy itself: mirror "
                        "from the stream that takes the publishes"
                    )
                described = cluster.describe(stream, metadata)
            except JetStreamError as exc:
                if hop == 0 or isinstance(exc, InvalidArgumentError):
                    raise  # the source itself (its error is the answer), or the loop
                break  # an upstream this cluster cannot reach: no loop through it can be seen
            finally:
                cluster.close()
            first = first or described.config
            upstream = described.config.mirror
            if upstream is None or not upstream.active:
                break
            servers, stream = upstream.servers, upstream.stream
        assert first is not None
        return first

    def promote(self, name: str) -> StreamInfo:
        """Promote mirror ``name``: it stops copying for good and takes publishes from its end offset."""
        self.controller("promote_mirror", {"name": name})
        refresh = getattr(self.coordinator, "refresh", None)
        if callable(refresh):
            refresh()  # the controller may be another broker: read what it wrote
        self.wait_for_sync()
        return self.describe(name)

    def follow_schema(self, name: str, source: StreamConfig) -> None:
        """Give mirror ``name`` the source's schema versions it lacks (a copier found values that its
        schema does not take)."""
        if source.schema is None:
            return
        mine = self.coordinator.get_stream(name).config.schema
        have = mine.version if mine is not None else 0
        for version in source.schema.versions[have:]:
            document = {"format": source.schema.format, "fields": schema_to_json(version)}
            self.controller("update_schema", {"name": name, "schema": document})
        self.wait_for_sync()

    # ---- status -------------------------------------------------------------------------------

    def status(self, name: str, *, local: bool) -> list[dict[str, Any]]:
        """How each partition of mirror ``name`` stands (``local``: only those led here)."""
        metadata = self.coordinator.get_stream(name)  # raises UnknownStreamError
        mirror = metadata.config.mirror
        if mirror is None:
            raise InvalidArgumentError(f"stream {name!r} is not a mirror")
        found = {s.partition: s for s in self.mirrors.statuses() if s.stream == name}
        if local:
            return [s.to_json() for _, s in sorted(found.items())]
        asked: set[str] = set()
        for state in metadata.partitions:
            leader = state.leader
            if not leader or leader == self.broker_id or leader in asked:
                continue
            asked.add(leader)
            for answer in self._ask_peer(leader, name):
                found.setdefault(answer.partition, answer)
        out = []
        for number, state in enumerate(metadata.partitions):
            status = found.get(number)
            if status is None:
                state_name = "promoted" if mirror.promoted else "starting"
                why = None if mirror.promoted or state.leader else "no leader now"
                status = MirrorStatus(name, number, mirror.where(), None, state_name, -1, -1, -1, -1.0, why)
            out.append(status.to_json())
        return out

    def local_statuses(self) -> list[dict[str, Any]]:
        """Every mirrored partition led here (for the broker's status and metrics)."""
        return [s.to_json() for s in self.mirrors.statuses()]

    def problems(self) -> list[str]:
        """Copies stopped by a mismatch, one line each (a source out of reach is no problem of this
        broker's: its status shows it)."""
        return [
            f"{s.stream}/{s.partition}: mirror stopped: {s.last_error}"
            for s in self.mirrors.statuses()
            if s.state == "stopped"
        ]

    def _ask_peer(self, broker_id: str, name: str) -> list[MirrorStatus]:
        address = self.manager.peer_address_of(broker_id)
        if address is None:
            return []
        try:
            answer = _peer_action(
                self.manager.connect_peer(address), ActionType.MIRROR_STATUS, {"name": name, "local": True}
            )
        except JetStreamError as exc:
            logger.info("no mirror status from %s: %s", broker_id, exc)
            return []
        return [MirrorStatus.from_json(item) for item in answer] if isinstance(answer, list) else []

    # ---- cursors ------------------------------------------------------------------------------

    def write_cursor(self, consumer: str, stream: str, partition: int, offset: int | None) -> None:
        """Store a cursor copied from a source (``None``: delete it), here or on the cursor
        stream's leader."""
        try:
            self.write_cursor_here(consumer, stream, partition, offset)
            return
        except NotLeaderError as exc:
            address = exc.fields.get("leader_address")
            if not isinstance(address, str):
                raise
        body = {"consumer": consumer, "stream": stream, "partition": partition}
        if offset is None:
            _peer_action(self.manager.connect_peer(address), ActionType.DELETE_CURSOR, body)
        else:
            _peer_action(
                self.manager.connect_peer(address), ActionType.SET_CURSOR, {**body, "offset": offset}
            )


def _peer_action(client: flight.FlightClient, action: ActionType, body: dict[str, Any]) -> object:
    """An action on another broker of this cluster; its errors as ``JetStreamError``."""
    try:
        results = list(
            client.do_action(
                flight.Action(action.value, encode_json(body)), flight.FlightCallOptions(timeout=PEER_TIMEOUT)
            )
        )
    except flight.FlightError as exc:
        known = error_from_message(str(exc), getattr(exc, "extra_info", None))
        if known is not None:
            raise known from None
        raise UnavailableError(f"a broker of this cluster failed: {exc}") from None
    finally:
        client.close()
    return json.loads(results[0].body.to_pybytes()) if results else None
