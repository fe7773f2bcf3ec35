"""Settings of the ZooKeeper coordinator (the ``[zookeeper]`` table of the broker's TOML)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ZooKeeperConfig:
    """Where a cluster's metadata lives.  Durations in seconds.

    An empty ``hosts`` means no cluster: a single broker keeps its metadata
    in ``<data_dir>/metadata.json``.
    """

    hosts: str = ""
    """ZooKeeper connect string, e.g. ``"zk1:2181,zk2:2181,zk3:2181"``."""
    chroot: str = "/pyspark-jetstream"
    """Path under which this cluster keeps everything; several clusters may share
    one ZooKeeper with different chroots."""
    session_timeout: float = 3.0
    """A broker that ZooKeeper has not heard from for this long loses its session:
    its partitions' leadership moves to in-sync replicas.  It stops leading by
    itself after two thirds of it without contact.  Shorter means faster
    failover and more spurious failovers under load."""
    connect_timeout: float = 30.0
    """How long start-up keeps trying to reach ZooKeeper (with backoff) before
    failing with an error that names it."""
    cursor_replication_factor: int = 3
    """Replicas of the internal cursor stream; it is created once this many
    brokers are live."""
    controlled_shutdown_timeout: float = 30.0
    """How long a stopping broker waits for the controller to move its
    leadership to other in-sync replicas before it stops anyway."""

    def __post_init__(self) -> None:
        if not isinstance(self.hosts, str):
            raise ValueError(f"hosts must be a connect string, got {self.hosts!r}")
        if not isinstance(self.chroot, str) or not self.chroot.startswith("/") or self.chroot.endswith("/"):
            raise ValueError(f"chroot must start with '/' and not end with one, got {self.chroot!r}")
        for name, low, high in (
            ("session_timeout", 1.0, 120.0),
            ("connect_timeout", 0.1, 3600.0),
            ("controlled_shutdown_timeout", 0.0, 3600.0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
                raise ValueError(f"{name} must be {low:g} to {high:g} seconds, got {value!r}")
        value = self.cursor_replication_factor
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 16:
            raise ValueError(f"cursor_replication_factor must be 1 to 16, got {value!r}")
