"""What a broker says of itself: its status (identity, streams, the partitions it holds, cursors
and their lag, mirrors) and its health (every problem that stops it ingesting, replicating or
serving some data, one line each).

Read at request time from the broker's parts; nothing is kept here.  ``jetstream status``,
``jetstream health``, ``cluster status`` and the metrics' health endpoint show these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from broker_node.coordination.base import Coordinator
from broker_node.mirror_service import MirrorService
from broker_node.reachability import Reachability
from broker_node.replication.cursors import CURSOR_STREAM
from broker_node.replication.manager import ReplicaManager
from broker_node.replication.partition import Partition, Role
from broker_node.runtime import Runtime
from pyspark_jetstream.protocol.flight import StreamInfo


@dataclass(eq=False, repr=False)
class BrokerStatus:
    """A broker's status and health, read from its parts (any thread)."""

    runtime: Runtime
    manager: ReplicaManager
    coordinator: Coordinator
    _: KW_ONLY
    list_streams: Callable[[], list[StreamInfo]]
    reachability: Reachability | None = None
    mirrors: MirrorService | None = field(default=None, init=False)
    """The mirror actions, whose copies and problems are reported too (set by the wiring)."""

    def status(self) -> dict[str, Any]:
        """Identity, health, streams, the partitions held here, and cursors with their lag."""
        return {
            "broker_id": self.runtime.broker_id,
            "flight": self.runtime.flight_address,
            "nats": self.runtime.advertised_nats,
            "controller": self.coordinator.controller(),
            "event_loop": self.runtime.event_loop,
            "health": self.health(),
            "reachability": ([p.to_json() for p in self.reachability.results()] if self.reachability else []),
            "streams": [info.to_json() for info in self.list_streams()],
            "partitions": [self._partition_status(p) for p in self.manager.held()],
            "cursors": self._cursors(),
            "mirrors": self.mirrors.local_statuses() if self.mirrors is not None else [],
        }

    def _partition_status(self, partition: Partition) -> dict[str, Any]:
        log = partition.log
        fetcher = self.manager.fetchers().get((partition.stream, partition.number))
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
            "followers": partition.followers.follower_log_ends() if partition.role is Role.LEADER else {},
            "fetch_error": fetcher.last_error if fetcher is not None else None,
            "damaged": [[d.first_offset, d.last_offset, d.detail] for d in log.damaged],
        }

    def _cursors(self) -> list[dict[str, Any]]:
        manager = self.manager
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
        if self.runtime.nats is not None and not self.runtime.nats.running:
            problems.append("the embedded nats-server is not running (restarting it)")
        if self.runtime.ingestor is None or not self.runtime.ingestor.connected:
            problems.append(
                f"not connected to NATS at {', '.join(self.runtime.nats_urls)}: nothing is ingested"
            )
        lease = getattr(self.coordinator, "lease_valid", None)
        waiting = getattr(self.coordinator, "waiting", None)
        if waiting:
            problems.append(waiting)
        elif callable(lease) and not lease():
            problems.append(f"out of touch with {self.coordinator.describe()}: not leading anything")
        if self.reachability is not None:
            problems += self.reachability.problems()
        offline = {**self.manager.offline, **self.runtime.ingest_failures()}
        for (stream, number), reason in sorted(offline.items()):
            problems.append(f"{stream}/{number}: {reason}")
        for key, fetcher in sorted(self.manager.fetchers().items()):
            if fetcher.last_error:
                problems.append(
                    f"{key[0]}/{key[1]}: cannot fetch from leader {fetcher.leader}: {fetcher.last_error}"
                )
        if self.mirrors is not None:
            problems += self.mirrors.problems()
        for partition in self.manager.held():
            for damaged in partition.log.damaged:
                problems.append(
                    f"{partition.stream}/{partition.number}: offsets {damaged.first_offset} to "
                    f"{damaged.last_offset} are damaged ({damaged.detail})"
                )
        problems += [f"{directory}: {reason}" for directory, reason in sorted(self.manager.strays.items())]
        return {"ok": not problems, "problems": problems}
