"""A file log's leader-epoch cache aligned, at open, with the batches recovery kept.

The stored batches are the truth: each carries the epoch it was written in.
The checkpoint (:mod:`.epochs`) may lag them (a newer epoch's first batch
written, the file not yet) or hold epochs begun at the log end with no data
yet; both are kept and filled in.  A checkpoint that contradicts them -- an
epoch newer than a batch's own in force at its offset (damage, an edit) --
would keep the partition from ever taking its role: it is rebuilt from the
batches, with one warning naming the file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from .epochs import LeaderEpochCache
from .segment import Segment

LEADER_EPOCH_CHECKPOINT = "leader-epoch.checkpoint"


def reconcile_epochs(
    epochs: LeaderEpochCache,
    segments: Sequence[Segment],
    log_start_offset: int,
    log_end_offset: int,
    *,
    log: logging.LoggerAdapter[logging.Logger],
    checkpoint: Path,
) -> None:
    """Align ``epochs``, checkpointed in ``checkpoint``, with the batches of ``segments`` (see the
    module docstring); ``log`` takes the warning."""
    epochs.truncate_from_end(log_end_offset, inclusive=False)
    stored: list[tuple[int, int]] = []  # (epoch, first offset), from the batches alone
    contradiction = None
    for segment in segments:
        index = segment.index
        for i in range(len(index)):
            if i in segment.damage:
                continue  # a lost stretch's epoch is a guess
            epoch, base = index.epochs[i], index.bases[i]
            if not stored or epoch > stored[-1][0]:
                stored.append((epoch, base))
            if contradiction is None:
                contradiction = _contradiction(epochs, epoch, base, index.lasts[i])
    if contradiction is not None:
        log.warning(
            "%s does not match the segments (%s); rebuilt it from them",
            checkpoint,
            contradiction,
        )
        epochs.replace(stored)
    else:
        for epoch, base in stored:
            latest = epochs.latest_epoch
            if latest is None or epoch > latest:
                epochs.assign(epoch, base)
    epochs.truncate_from_start(log_start_offset)


def _contradiction(epochs: LeaderEpochCache, epoch: int, base: int, last: int) -> str | None:
    """How ``epochs`` contradicts a stored batch of ``epoch`` from ``base`` to ``last``, if it
    does: it must put that very epoch in force over the whole batch, unless it lags (knows
    no epoch that new yet: the batch was written before its epoch reached the file)."""
    latest = epochs.latest_epoch
    at_base, at_last = epochs.epoch_at(base), epochs.epoch_at(last)
    if at_last is not None and at_last > epoch:
        return f"epoch {at_last} in force within the batch at offset {base}, written in epoch {epoch}"
    if at_base != epoch and latest is not None and latest >= epoch:
        return f"epoch {at_base} in force at offset {base}, whose batch was written in epoch {epoch}"
    return None
