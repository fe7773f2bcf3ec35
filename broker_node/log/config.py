"""Configuration of one partition's commit log.

All durations are in seconds (float).  ``None`` for a retention limit means
"no limit of that kind".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pyspark_jetstream.protocol.schema import COMPRESSIONS

MiB = 1024 * 1024


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
    """Roll to a new segment before one would grow past this many bytes."""
    segment_max_age: float = 7 * 24 * 3600.0
    """Roll a non-empty active segment once its first message is this old."""
    retention_age: float | None = None
    """Delete closed segments whose newest message is older than this."""
    retention_bytes: int | None = None
    """Delete the oldest closed segments while the log is larger than this."""
    retention_messages: int | None = None
    """Delete the oldest closed segments while the log holds more messages than this."""
    compaction: bool = False
    """Keep only the newest message per key in closed segments."""
    tombstone_retention: float = 24 * 3600.0
    """How long compaction keeps a tombstone (a null value) before dropping it."""
    max_message_bytes: int = 1 * MiB
    """Largest accepted message: key + value + header keys and values."""
    max_batch_bytes: int = 16 * MiB
    """Largest accepted appended batch, as stored (Arrow IPC framing included)."""
    compression: str = "none"
    """Codec for stored batches: ``none``, ``lz4`` or ``zstd`` (batches under
    ``COMPRESS_MIN_BYTES`` are always stored plain).  Reads decompress, so they
    no longer hand out memory-mapped data; see conf/log.toml for the trade."""
    fsync: FsyncPolicy = FsyncPolicy.NEVER
    fsync_interval: float = 1.0
    """Seconds between fsyncs under ``FsyncPolicy.INTERVAL``."""
    high_watermark_checkpoint_interval: float = 1.0
    """Seconds between checkpoints of the high watermark (also written on flush and close)."""

    def __post_init__(self) -> None:
        _positive("segment_bytes", self.segment_bytes)
        _positive("segment_max_age", self.segment_max_age)
        _positive("max_message_bytes", self.max_message_bytes)
        _positive("max_batch_bytes", self.max_batch_bytes)
        _positive("fsync_interval", self.fsync_interval)
        _non_negative("tombstone_retention", self.tombstone_retention)
        _non_negative("high_watermark_checkpoint_interval", self.high_watermark_checkpoint_interval)
        for name in ("retention_age", "retention_bytes", "retention_messages"):
            value = getattr(self, name)
            if value is not None:
                _non_negative(name, value)
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


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{name} must be zero or a positive number, got {value!r}")
