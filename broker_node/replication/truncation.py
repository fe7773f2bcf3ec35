"""Where a replica's log must be cut before it follows a leader: truncation by leader epoch.

Truncating to the high watermark alone can lose acknowledged messages or keep
diverged ones (Kafka's KIP-101); instead the replica asks the leader where its
own latest epoch ends there, and cuts at the first point where the two logs
may differ (KIP-279's rule, repeated while the leader answers with an epoch
the replica does not have).  Pure: the two ends are passed in as functions.
"""

from __future__ import annotations

from collections.abc import Callable

from broker_node.log import UNDEFINED, EpochEndOffset

MAX_ROUNDS = 64
"""Rounds before giving up on agreement and keeping nothing unverified (never reached in practice)."""


def truncation_offset(
    latest_epoch: int | None,
    log_start_offset: int,
    leader_end_for: Callable[[int], EpochEndOffset],
    local_end_for: Callable[[int], EpochEndOffset],
) -> int:
    """The offset the replica's log must be truncated to (everything from it on may differ).

    ``latest_epoch`` is the replica's newest epoch (``None`` with no data);
    ``leader_end_for(e)`` is the leader's answer for epoch ``e`` (largest epoch
    <= e it has, and where that ends), ``local_end_for(e)`` the same from the
    replica's own cache.  The result may be past the replica's log end
    (nothing to cut).
    """
    epoch = latest_epoch
    for _ in range(MAX_ROUNDS):
        if epoch is None or epoch == UNDEFINED:
            return log_start_offset
        theirs = leader_end_for(epoch)
        if theirs.epoch == UNDEFINED:
            return log_start_offset  # the leader has nothing this old: keep nothing unverified
        ours = local_end_for(theirs.epoch)
        if ours.epoch == theirs.epoch:
            return max(min(theirs.end_offset, ours.end_offset), log_start_offset)
        # The leader's epoch is one we never had: ask about our newest one below it.
        epoch = ours.epoch
    return log_start_offset
