"""The leader's memory under replication: a soak run shared by the suite and ``make chaos``.

A partition leader keeps nothing of what it replicates once its followers
have it, so its anonymous memory (``RssAnon``: heap, not the memory-mapped
segments) stays near its followers' however many bytes pass through it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pyspark_jetstream.client import AckPolicy, SyncClient
from pyspark_jetstream.local import LocalCluster

VALUE_BYTES = 64 * 1024
HEADROOM_MB = 150
"""How far above its largest follower the leader's anonymous memory may be."""


@dataclass(frozen=True)
class SoakResult:
    """What a soak run measured, in MB of anonymous resident memory."""

    replicated_mb: float
    leader: str
    leader_mb: float
    followers_mb: dict[str, float]

    @property
    def bound_mb(self) -> float:
        """The most the leader may hold: its largest follower plus :data:`HEADROOM_MB`."""
        return max(self.followers_mb.values()) + HEADROOM_MB

    @property
    def within_bound(self) -> bool:
        """Whether the leader stayed within :attr:`bound_mb`."""
        return self.leader_mb <= self.bound_mb

    def __str__(self) -> str:
        followers = ", ".join(f"{b} {mb:.0f} MB" for b, mb in sorted(self.followers_mb.items()))
        return (
            f"after {self.replicated_mb:.0f} MB replicated: leader {self.leader} {self.leader_mb:.0f} MB, "
            f"followers {followers}; bound {self.bound_mb:.0f} MB"
        )


def anonymous_mb(pid: int) -> float:
    """A process's anonymous resident memory (``RssAnon``) in MB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no RssAnon line")


def soak(cluster: LocalCluster, client: SyncClient, total_mb: int, stream: str = "soak") -> SoakResult:
    """Publish ``total_mb`` of 64 KiB values one at a time with ``ALL`` acks into a replication
    factor 3 stream (min ISR 2), then measure every broker's anonymous memory."""
    client.create_stream(stream, f"{stream}.in", replication_factor=3, min_insync_replicas=2)
    leader = client.describe_stream(stream).partitions[0].leader
    value = os.urandom(VALUE_BYTES)
    count = total_mb * 1024 * 1024 // VALUE_BYTES
    for _ in range(count):
        client.publish(stream, value, ack_policy=AckPolicy.ALL)
    sizes = {}
    for broker in cluster.brokers:
        assert broker.process is not None, f"{broker.broker_id} is not running"
        sizes[broker.broker_id] = anonymous_mb(broker.process.pid)
    return SoakResult(
        replicated_mb=count * VALUE_BYTES / (1024 * 1024),
        leader=leader,
        leader_mb=sizes.pop(leader),
        followers_mb=sizes,
    )
