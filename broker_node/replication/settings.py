"""Settings of replication between brokers (the ``[replication]`` table of the broker's TOML)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ReplicationConfig:
    """How followers fetch and when they fall out of sync (the ``[replication]`` table).  Seconds."""

    replica_max_lag: float = 10.0
    """A follower that has not caught up with the leader's log end for this long leaves the ISR."""
    fetch_max_bytes: int = 8 * 1024 * 1024
    """Most bytes of stored batches one fetch brings (at least one batch)."""
    fetch_max_wait: float = 0.5
    """How long a leader holds a fetch that finds nothing new."""

    def __post_init__(self) -> None:
        for name, low, high in (("replica_max_lag", 0.1, 3600.0), ("fetch_max_wait", 0.0, 30.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
                raise ValueError(f"{name} must be {low:g} to {high:g} seconds, got {value!r}")
        value = self.fetch_max_bytes
        if isinstance(value, bool) or not isinstance(value, int) or not 1024 <= value <= 1 << 30:
            raise ValueError(f"fetch_max_bytes must be 1 KiB to 1 GiB, got {value!r}")
