"""Configuration of one partition's commit log.

All durations are in seconds (float).  ``None`` for a retention limit means
"no limit of that kind".  Every option is bounded (ranges inclusive, given
with each option); a value outside its range raises ``InvalidArgumentError``
(a ``ValueError``) naming the option, the value and the range.  Sizes share
their bounds with a stream's configuration
(:mod:`pyspark_jetstream.protocol.streams`), which overrides them per stream.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pyspark_jetstream.protocol.schema import COMPRESSIONS
from pyspark_jetstream.protocol.streams import (
    MAX_AGE,
    MAX_MESSAGE_BYTES,
    MAX_SEGMENT_BYTES,
    MIN_SEGMENT_BYTES,
    GiB,
    KiB,
    MiB,
    bounded_int,
    bounded_number,
    check_retention,
)

MIN_BATCH_BYTES = 1 * KiB
MAX_BATCH_BYTES = 1 * GiB
"""A batch is built in memory as one Arrow IPC frame, whose size the index keeps
as 32 bits; a gigabyte is far above what NATS (64 MiB payloads) can deliver."""
MIN_SEGMENT_MAX_AGE = 1.0
"""Rolling more often than every second only multiplies segment files."""
MIN_FSYNC_INTERVAL = 0.001
"""An fsync takes 0.1 to 10 ms: more often than every millisecond is ``always``."""
MAX_INTERVAL = 3600.0
"""Longest fsync or checkpoint interval: an hour of possibly unsynced data."""


class FsyncPolicy(enum.Enum):
    """When appended data is forced to disk.

    ``NEVER`` (the default) leaves flushing to the operating system: an append
    costs a ``write`` into the page cache and survives a crash of the broker
    process, but the last seconds of writes may be lost if the machine itself
    loses power.  Durability then comes from replication.
    ``INTERVAL`` fsyncs at most once every ``fsync_interval`` seconds (checked
    on each append, and by ``Log.sync_if_due()``, which the broker calls on a
    timer): bounded loss on power failure for one fsync per interval.
    ``ALWAYS`` fsyncs the segment and its indexes after every append: nothing
    acknowledged is lost, at the price of one or more disk flushes (typically
    0.1 to 10 ms each) per append.
    """

    NEVER = "never"
    INTERVAL = "interval"
    ALWAYS = "always"


@dataclass(frozen=True, kw_only=True)
class LogConfig:
    """How a partition's log stores, rolls, retains and compacts its data."""

    segment_bytes: int = 64 * MiB
    """Roll to a new segment before one would grow past this many bytes (1 KiB to 4 GiB)."""
    segment_max_age: float = 7 * 24 * 3600.0
    """Roll a non-empty active segment once its first message is this old (1 s to 100 years)."""
    retention_age: float | None = None
    """Delete closed segments whose newest message is older than this (0 to 100 years)."""
    retention_bytes: int | None = None
    """Delete the oldest closed segments while the log is larger than this (0 to 2**63 - 1)."""
    retention_messages: int | None = None
    """Delete the oldest closed segments while the log holds more messages than this (0 to 2**63 - 1)."""
    compaction: bool = False
    """Keep only the newest message per key in closed segments."""
    tombstone_retention: float = 24 * 3600.0
    """How long compaction keeps a tombstone (a null value) before dropping it (0 to 100 years)."""
    max_message_bytes: int = 1 * MiB
    """Largest accepted message: key + value + header keys and values (1 byte to 64 MiB)."""
    max_batch_bytes: int = 16 * MiB
    """Largest accepted appended batch, as stored (Arrow IPC framing included; 1 KiB to 1 GiB)."""
    compression: str = "none"
    """Codec for stored batches: ``none``, ``lz4`` or ``zstd`` (batches under
    ``COMPRESS_MIN_BYTES`` are always stored plain).  Reads decompress, so they
    no longer hand out memory-mapped data; see conf/log.toml for the trade."""
    fsync: FsyncPolicy = FsyncPolicy.NEVER
    """When appends are forced to disk: ``never`` (durability from replication; a power loss may
    lose the last seconds), ``interval`` (at most ``fsync_interval`` seconds) or ``always``
    (nothing acknowledged is lost, for a disk flush per append)."""
    fsync_interval: float = 1.0
    """Seconds between fsyncs under ``FsyncPolicy.INTERVAL`` (0.001 to 3600)."""
    high_watermark_checkpoint_interval: float = 1.0
    """Seconds between checkpoints of the high watermark, also written on flush and close (0 to 3600)."""

    def __post_init__(self) -> None:
        # The floor of 1 KiB, not a production size: the log's own tests roll
        # segments every few messages with 1.5-4 KB segments.
        bounded_int("segment_bytes", self.segment_bytes, MIN_SEGMENT_BYTES, MAX_SEGMENT_BYTES, unit="bytes")
        bounded_number("segment_max_age", self.segment_max_age, MIN_SEGMENT_MAX_AGE, MAX_AGE)
        bounded_int("max_message_bytes", self.max_message_bytes, 1, MAX_MESSAGE_BYTES, unit="bytes")
        bounded_int("max_batch_bytes", self.max_batch_bytes, MIN_BATCH_BYTES, MAX_BATCH_BYTES, unit="bytes")
        bounded_number("fsync_interval", self.fsync_interval, MIN_FSYNC_INTERVAL, MAX_INTERVAL)
        bounded_number("tombstone_retention", self.tombstone_retention, 0, MAX_AGE)
        bounded_number(
            "high_watermark_checkpoint_interval", self.high_watermark_checkpoint_interval, 0, MAX_INTERVAL
        )
        check_retention(self.retention_age, self.retention_bytes, self.retention_messages)
        if not isinstance(self.compaction, bool):
            raise ValueError(f"compaction must be true or false, got {self.compaction!r}")
        if self.compression not in COMPRESSIONS:
            choices = ", ".join(COMPRESSIONS)
            raise ValueError(f"compression must be one of {choices}, got {self.compression!r}")
        if not isinstance(self.fsync, FsyncPolicy):
            object.__setattr__(self, "fsync", _fsync_policy(self.fsync))


def _fsync_policy(value: object) -> FsyncPolicy:
    try:
        return FsyncPolicy(value)
    except ValueError:
        choices = ", ".join(p.value for p in FsyncPolicy)
        raise ValueError(f"fsync must be one of {choices}, got {value!r}") from None
