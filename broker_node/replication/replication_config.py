"""Settings of replication between brokers (the ``[replication]`` table of the broker's TOML)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class ReplicationConfig:
    """How followers fetch and when they fall out of sync (the ``[replication]`` table).  Seconds."""

    replica_max_lag: float = 10.0
    """A follower that has not caught up with the leader's log end for this long leaves the ISR."""
    fetch_max_bytes: int = 8 * 1024 * 1024
    """Most bytes of stored batches one fetch brings (at least one batch)."""
    fetch_max_wait: float = 0.5
    """How long a leader holds a fetch that finds nothing new."""
    peer_addresses: dict[str, str] = field(default_factory=dict)
    """Broker id -> the Flight address this broker uses to reach that peer, instead of
    the address the peer advertises to clients: a separate replication network, NAT,
    or a fault-injecting proxy.  Peers not listed are reached where they advertise."""
    port: int = 0
    """The port of this broker's replication listener (on ``[flight] host``), which its followers
    connect to; 0 picks a free one.  Brokers register it, so followers find it."""
    peer_replication_addresses: dict[str, str] = field(default_factory=dict)
    """Broker id -> the replication address (``tcp://host:port``, ``tls://host:port`` with TLS)
    this broker uses to reach that peer's replication listener, instead of the one it registers:
    as ``peer_addresses``, for the replication connections."""

    def __post_init__(self) -> None:
        for name, low, high in (("replica_max_lag", 0.1, 3600.0), ("fetch_max_wait", 0.0, 30.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
                raise ValueError(f"{name} must be {low:g} to {high:g} seconds, got {value!r}")
        for broker, address in self.peer_addresses.items():
            if not isinstance(address, str) or not address.startswith("grpc"):
                raise ValueError(
                    f"peer_addresses[{broker!r}] must be a grpc://host:port address, got {address!r}"
                )
        for broker, address in self.peer_replication_addresses.items():
            scheme, _, where = address.partition("://") if isinstance(address, str) else ("", "", "")
            host, _, port = where.rpartition(":")
            if scheme not in ("tcp", "tls") or not host or not port.isdigit():
                raise ValueError(
                    f"peer_replication_addresses[{broker!r}] must be a tcp://host:port or "
                    f"tls://host:port address, got {address!r}"
                )
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0 to 65535 (0: any free port), got {self.port!r}")
        value = self.fetch_max_bytes
        if isinstance(value, bool) or not isinstance(value, int) or not 1024 <= value <= 1 << 30:
            raise ValueError(f"fetch_max_bytes must be 1 KiB to 1 GiB, got {value!r}")
