"""Moving partitions between brokers: plans and the partition states they go through; no I/O.

A reassignment of one partition goes in three steps, each a partition state
the controller writes (Kafka's KIP-455 shape):

1. **Started**: ``replicas`` becomes the target replicas (in the plan's
   order: the first is the preferred leader) followed by the ones the plan
   drops, marked ``removing``; the new ones are marked ``adding``.  The
   brokers added open the partition as followers and fetch it from the
   leader, at most ``throttle`` bytes/s each.
2. They catch up and the leader adds them to the ISR, as for any follower.
3. **Completed** once every target replica is in the ISR: ``replicas``
   becomes the target, leadership moves to a target replica if the leader
   is being removed (a new leader epoch), and the removed brokers close the
   partition and delete their copy.

Everything is stored in the partition's own state, so a new controller or a
restarted broker carries on from whatever step was written last.  A cancel
goes back to the original replicas, in their order (the added ones delete
their copy).

A plan is a list of ``{"stream", "partition", "replicas"}``; every entry is
checked before anything moves (:func:`checked_plan`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from pyspark_jetstream.protocol.errors import InvalidArgumentError, UnknownStreamError
from pyspark_jetstream.protocol.streams import MAX_REPLICATION_FACTOR, is_name_list

from .base import Move, PartitionState, StreamMetadata

MAX_THROTTLE = 1 << 40
"""Largest replication throttle accepted (bytes/s); 0 means no limit."""
MIN_THROTTLE = 64 * 1024
"""Smallest replication throttle accepted (bytes/s): below it a move of any real partition
would take days (``--throttle 50`` is 50 bytes/s, likely meant as 50MB)."""


def parse_plan(plan: object) -> list[Move]:
    """The moves of a plan in its JSON form (``{"partitions": [...]}`` or the bare list).

    Only the form is checked here; :func:`checked_plan` checks it against the cluster.
    """
    entries = plan.get("partitions") if isinstance(plan, dict) else plan
    if not isinstance(entries, list) or not entries:
        raise InvalidArgumentError(
            'a reassignment plan is {"partitions": [{"stream": ..., "partition": ..., '
            f'"replicas": [...]}}, ...]}} with at least one entry, got {_shown(plan)}'
        )
    moves = []
    for number, entry in enumerate(entries, 1):
        where = f"plan entry {number}"
        if not isinstance(entry, dict) or set(entry) != {"stream", "partition", "replicas"}:
            raise InvalidArgumentError(
                f"{where} must have exactly 'stream', 'partition' and 'replicas', got {_shown(entry)}"
            )
        stream, partition, replicas = entry["stream"], entry["partition"], entry["replicas"]
        if not isinstance(stream, str) or not stream:
            raise InvalidArgumentError(f"{where}: 'stream' must be a stream name, got {_shown(stream)}")
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise InvalidArgumentError(
                f"{where}: 'partition' must be a partition number, got {_shown(partition)}"
            )
        if not is_name_list(replicas):
            raise InvalidArgumentError(
                f"{where} ({stream}/{partition}): 'replicas' must be a non-empty list of broker ids, "
                f"got {_shown(replicas)}"
            )
        if len(replicas) > MAX_REPLICATION_FACTOR:
            raise InvalidArgumentError(
                f"{where} ({stream}/{partition}): {len(replicas)} replicas, at most {MAX_REPLICATION_FACTOR}"
            )
        duplicates = sorted(b for b, n in Counter(replicas).items() if n > 1)
        if duplicates:
            raise InvalidArgumentError(
                f"{where} ({stream}/{partition}) names broker(s) {', '.join(duplicates)} more than once"
            )
        moves.append(Move(stream, partition, tuple(replicas)))
    return moves


def checked_plan(
    moves: Sequence[Move], streams: Iterable[StreamMetadata], live: Collection[str]
) -> list[tuple[StreamMetadata, Move]]:
    """Each move with its stream, once every one fits the cluster; else the first misfit, in one line.

    Refused: an unknown stream or partition, a partition named twice, a
    broker that is not live, fewer replicas than the stream's
    ``min_insync_replicas`` or another count than its replication factor.
    A partition being moved already takes the new target (see :func:`started`).
    """
    by_name = {m.config.name: m for m in streams}
    seen: set[tuple[str, int]] = set()
    checked = []
    for move in moves:
        name = f"{move.stream}/{move.partition}"
        metadata = by_name.get(move.stream)
        if metadata is None:
            raise UnknownStreamError(f"the plan moves {name}, but there is no stream {move.stream!r}")
        if move.partition >= len(metadata.partitions):
            last = len(metadata.partitions) - 1
            raise UnknownStreamError(f"the plan moves {name}, but {move.stream!r} has partitions 0 to {last}")
        if (move.stream, move.partition) in seen:
            raise InvalidArgumentError(f"the plan names {name} twice")
        seen.add((move.stream, move.partition))
        unknown = [b for b in move.replicas if b not in live]
        if unknown:
            raise InvalidArgumentError(
                f"the plan puts {name} on broker(s) {', '.join(unknown)}, which are not live "
                f"(live: {', '.join(sorted(live)) or 'none'})"
            )
        config = metadata.config
        if len(move.replicas) < config.min_insync_replicas:
            raise InvalidArgumentError(
                f"the plan gives {name} {len(move.replicas)} replica(s), fewer than its stream's "
                f"min_insync_replicas ({config.min_insync_replicas}): no write could be acknowledged"
            )
        if len(move.replicas) != config.replication_factor:
            raise InvalidArgumentError(
                f"the plan gives {name} {len(move.replicas)} replica(s), but its stream's replication "
                f"factor is {config.replication_factor} (a reassignment moves replicas, it does not add any)"
            )
        checked.append((metadata, move))
    return checked


def started(state: PartitionState, target: Sequence[str], throttle: int) -> PartitionState | None:
    """The state that begins moving ``state`` to ``target`` (``None``: nothing to do)."""
    target = tuple(target)
    if state.reassigning and throttle == state.throttle and state.target == target:
        return None  # the same move again
    # A new plan for a partition being moved replaces its move (Kafka's KIP-455): what the new
    # target lacks is dropped once the target is in sync, and a cancel still goes back to the
    # replicas from before the first move.
    previous = state.original
    removing = tuple(b for b in state.replicas if b not in target)
    adding = tuple(b for b in target if b not in previous)
    if not adding and not removing:
        # The same brokers: only the preferred order changes, at once (no data moves).
        same = replace(state, replicas=target, adding=(), removing=(), throttle=0, previous=())
        return same if same != state else None
    return replace(
        state,
        replicas=target + removing,
        adding=adding,
        removing=removing,
        throttle=throttle,
        previous=previous,
    )


def completed(state: PartitionState, live: Collection[str]) -> PartitionState | None:
    """The state that ends a reassignment whose target replicas are all in sync (else ``None``).

    The leader stays if it is a target replica; otherwise the first target
    replica that is live and in sync takes over in a new leader epoch.
    """
    if not state.reassigning or not state.leader:
        return None
    target = state.target
    if not all(b in state.isr for b in target):
        return None
    leader, epoch = state.leader, state.leader_epoch
    if leader not in target:
        leader = next((b for b in target if b in live), "")
        if not leader:
            return None
        epoch += 1
    return replace(
        state,
        leader=leader,
        leader_epoch=epoch,
        replicas=target,
        isr=tuple(b for b in target if b in state.isr),
        adding=(),
        removing=(),
        throttle=0,
        previous=(),
    )


def cancelled(state: PartitionState, live: Collection[str]) -> PartitionState:
    """The state that goes back to the original replicas (``InvalidArgumentError`` if none can lead)."""
    original = state.original
    leader, epoch = state.leader, state.leader_epoch
    if leader not in original:
        leader = next((b for b in original if b in state.isr and b in live), "")
        if not leader:
            raise InvalidArgumentError(
                f"cannot cancel: none of the original replicas {', '.join(original)} is live and in sync "
                f"to take over from {state.leader or 'the missing leader'}"
            )
        epoch += 1
    isr = tuple(b for b in original if b in state.isr)
    return replace(
        state,
        leader=leader,
        leader_epoch=epoch,
        replicas=original,
        isr=isr or (leader,),
        adding=(),
        removing=(),
        throttle=0,
        previous=(),
    )


def drain_plan(
    broker: str,
    streams: Iterable[StreamMetadata],
    live: Sequence[str],
    racks: Mapping[str, str] | None = None,
) -> list[Move]:
    """Moves that take every replica off ``broker``, each to the least loaded live broker.

    A replacement takes the drained broker's place in the replica list (so a
    preferred leader is replaced by a preferred leader) and, when brokers
    declare racks, a rack the partition's other replicas do not use yet if
    there is one.
    """
    streams = list(streams)
    racks = racks or {}
    candidates = [b for b in sorted(set(live)) if b != broker]
    load = Counter(b for m in streams for p in m.partitions for b in p.target)
    moves = []
    for metadata in streams:
        for number, state in enumerate(metadata.partitions):
            replicas = state.target
            if broker not in replicas:
                continue
            others = [b for b in replicas if b != broker]
            free = [b for b in candidates if b not in others]
            if not free:
                raise InvalidArgumentError(
                    f"cannot drain {broker}: {metadata.config.name}/{number} needs {len(replicas)} brokers "
                    f"and only {', '.join(candidates) or 'no other'} are live"
                )
            used_racks = {racks.get(b) for b in others} - {None}
            choice = min(free, key=lambda b: (racks.get(b) in used_racks, load[b], b))
            load[choice] += 1
            load[broker] -= 1
            moves.append(
                Move(metadata.config.name, number, tuple(choice if b == broker else b for b in replicas))
            )
    if not moves:
        raise InvalidArgumentError(f"broker {broker} holds no replica: nothing to drain")
    return moves


def generated_plan(
    brokers: Sequence[str],
    streams: Iterable[StreamMetadata],
    racks: Mapping[str, str] | None = None,
) -> list[Move]:
    """Moves that spread every partition of ``streams`` evenly over ``brokers``.

    Partition by partition, the broker leading the fewest partitions so far
    becomes the preferred leader, and the brokers holding the fewest
    replicas so far the other replicas, preferring racks the partition does
    not use yet (when brokers declare racks) and then brokers that hold the
    partition already (less data to move).  Partitions already where they
    would go are left out.
    """
    chosen = sorted(set(brokers))
    if not chosen:
        raise InvalidArgumentError("name at least one broker to spread the partitions over")
    racks = racks or {}
    leaders: Counter[str] = Counter()
    replicas: Counter[str] = Counter()
    moves = []
    for metadata in streams:
        factor = metadata.config.replication_factor
        if factor > len(chosen):
            raise InvalidArgumentError(
                f"stream {metadata.config.name!r} has replication factor {factor}, more than the "
                f"{len(chosen)} broker(s) given ({', '.join(chosen)})"
            )
        for number, state in enumerate(metadata.partitions):
            current = state.target
            leader = min(chosen, key=lambda b: (leaders[b], replicas[b], b != current[0], b))
            picked = [leader]
            while len(picked) < factor:
                used = {racks.get(b) for b in picked}
                picked.append(
                    min(
                        (b for b in chosen if b not in picked),
                        key=lambda b: (racks.get(b) in used, replicas[b], b not in current, b),
                    )
                )
            leaders[leader] += 1
            replicas.update(picked)
            if tuple(picked) != current:
                moves.append(Move(metadata.config.name, number, tuple(picked)))
    return moves


def check_throttle(throttle: object) -> int:
    """A replication throttle in bytes/s (0: none), or ``InvalidArgumentError`` naming the value."""
    if (
        not isinstance(throttle, int)
        or isinstance(throttle, bool)
        or not (throttle == 0 or MIN_THROTTLE <= throttle <= MAX_THROTTLE)
    ):
        raise InvalidArgumentError(
            f"throttle must be 0 (no limit) or {MIN_THROTTLE} to {MAX_THROTTLE} bytes per second "
            f"(64KiB to 1TiB; sizes take units: 50MB), got {_shown(throttle)}"
        )
    return throttle


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
