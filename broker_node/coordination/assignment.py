"""Replica assignment and leader election rules: pure functions of metadata, no I/O.

Assignment spreads a new stream's partitions over the live brokers the way
Kafka does without racks: partition *p*'s replicas are consecutive brokers
(in a fixed order) starting at ``(start + p) mod n``, and each partition's
first replica is its preferred leader, so leaders spread evenly.  ``start``
is chosen to even out the leaders the brokers already have.  Partitions added
to a stream later (:func:`grown_config`) are assigned the same way, as if they
were a new stream's.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection, Iterable, Sequence

from pyspark_jetstream.protocol.errors import InvalidArgumentError, NotEnoughReplicasError
from pyspark_jetstream.protocol.streams import MAX_PARTITIONS, StreamConfig, bounded_int

from .base import PartitionState


def assign_replicas(
    brokers: Sequence[str], partitions: int, replication_factor: int, current_leaders: Iterable[str] = ()
) -> list[tuple[str, ...]]:
    """Replicas of each partition, preferred leader first.

    ``brokers`` are the live broker ids; ``current_leaders`` the leaders of
    every existing partition (to spread new leaders onto the least loaded
    brokers).  Raises ``NotEnoughReplicasError`` when the replication factor
    exceeds the live brokers.
    """
    if replication_factor < 1 or partitions < 1:
        raise InvalidArgumentError(
            f"need at least one partition and one replica, got {partitions} and {replication_factor}"
        )
    ordered = sorted(set(brokers))
    if replication_factor > len(ordered):
        raise NotEnoughReplicasError(
            f"replication factor {replication_factor} needs {replication_factor} live brokers, "
            f"but {len(ordered)} are live ({', '.join(ordered) or 'none'})"
        )
    load = Counter(current_leaders)
    start = min(range(len(ordered)), key=lambda i: (load[ordered[i]], i))
    n = len(ordered)
    return [tuple(ordered[(start + p + k) % n] for k in range(replication_factor)) for p in range(partitions)]


def grown_config(config: StreamConfig, partitions: object) -> StreamConfig | None:
    """``config`` with ``partitions`` partitions, or ``None`` if it has that many already.

    Partitions are only ever added: asking for fewer raises
    ``InvalidArgumentError`` saying why, and so does a count outside the
    bounds of :class:`StreamConfig` (naming the value) or one the stream's
    subject cannot take.
    """
    count = bounded_int("partitions", partitions, 1, MAX_PARTITIONS)
    if count == config.partitions:
        return None
    if count < config.partitions:
        raise InvalidArgumentError(
            f"stream {config.name!r} has {config.partitions} partitions and cannot go down to {count}: "
            "partitions can only be added (removing one would drop its messages and move its keys)"
        )
    return dataclasses.replace(config, partitions=count)


def new_partitions(assignment: Iterable[tuple[str, ...]]) -> tuple[PartitionState, ...]:
    """The states of partitions just assigned: led by their preferred replica, every replica in sync."""
    return tuple(PartitionState(replicas[0], replicas, replicas, leader_epoch=0) for replicas in assignment)


def elect_leader(
    state: PartitionState, live: Collection[str], *, exclude: Collection[str] = (), unclean: bool = False
) -> tuple[str, tuple[str, ...]] | None:
    """The new ``(leader, isr)`` when the current leader must go, or ``None`` if nobody can lead.

    The leader is the first replica (in preferred order) that is live, in the
    ISR and not excluded (a broker shutting down).  The new ISR keeps the
    live members of the old one, minus excluded brokers.  With ``unclean``
    and no such replica, a live replica outside the ISR may lead (data loss:
    it may lack committed messages); its ISR is then just itself.
    """
    isr = [b for b in state.isr if b in live and b not in exclude]
    for candidate in state.replicas:
        if candidate in isr:
            return candidate, tuple(b for b in state.replicas if b in isr)
    if unclean:
        # A replica being added by a move may hold little yet: the others first.
        for candidate in (*[r for r in state.replicas if r not in state.adding], *state.adding):
            if candidate in live and candidate not in exclude:
                return candidate, (candidate,)
    return None


def preferred_leader(state: PartitionState, live: Collection[str]) -> str | None:
    """The preferred replica if it should take over leadership now, else ``None``."""
    preferred = state.replicas[0] if state.replicas else None
    if preferred is None or preferred == state.leader or preferred not in state.isr or preferred not in live:
        return None
    return preferred
