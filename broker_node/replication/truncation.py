"""Where a replica's log must be cut before it follows a leader: truncation by leader epoch.

Truncating to the high watermark alone can lose acknowledged messages or keep
diverged ones (Kafka's KIP-101); instead the replica asks the leader where its
own latest epoch ends there, and cuts at the first point where the two logs
may differ (KIP-279's rule, repeated while the leader answers with an epoch
the replica does not have).  Pure: :func:`truncation` is a generator that
yields each epoch to ask the leader about and is sent the leader's answer, so
a caller asks however it talks to the leader (the follower's fetcher asks on
its replication connection); :func:`truncation_offset` drives it with a
function.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

from broker_node.log import UNDEFINED, EpochEndOffset

MAX_ROUNDS = 64
"""Rounds before giving up on agreement and keeping nothing unverified (never reached in practice)."""

Steps = Generator[int, EpochEndOffset, int]
"""Yields an epoch to ask the leader about, is sent the leader's answer, returns the cut."""


def truncation(
    latest_epoch: int | None,
    log_start_offset: int,
    local_end_for: Callable[[int], EpochEndOffset],
) -> Steps:
    """The offset the replica's log must be truncated to (everything from it on may differ).

    ``latest_epoch`` is the replica's newest epoch (``None`` with no data); each
    epoch ``e`` yielded is answered with the leader's ``EpochEndOffset`` for it
    (the largest epoch <= e it has, and where that ends); ``local_end_for(e)``
    is the same from the replica's own cache.  The result may be past the
    replica's log end (nothing to cut).
    """
    epoch = latest_epoch
    for _ in range(MAX_ROUNDS):
        if epoch is None or epoch == UNDEFINED:
            return log_start_offset
        theirs = yield epoch
        if theirs.epoch == UNDEFINED:
            return log_start_offset  # the leader has nothing this old: keep nothing unverified
        ours = local_end_for(theirs.epoch)
        if ours.epoch == theirs.epoch:
            return max(min(theirs.end_offset, ours.end_offset), log_start_offset)
        # The leader's epoch is one we never had: ask about our newest one below it.
        epoch = ours.epoch
    return log_start_offset


def truncation_offset(
    latest_epoch: int | None,
    log_start_offset: int,
    leader_end_for: Callable[[int], EpochEndOffset],
    local_end_for: Callable[[int], EpochEndOffset],
) -> int:
    """:func:`truncation` with the leader's answers from ``leader_end_for(e)``."""
    steps = truncation(latest_epoch, log_start_offset, local_end_for)
    try:
        epoch = next(steps)
        while True:
            epoch = steps.send(leader_end_for(epoch))
    except StopIteration as done:
        cut: int = done.value
        return cut
