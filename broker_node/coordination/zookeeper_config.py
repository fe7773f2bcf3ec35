"""Settings of the ZooKeeper coordinator (the ``[zookeeper]`` table of the broker's TOML)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
    """While start-up cannot reach ZooKeeper (it keeps trying, with backoff,
    until it can or the broker is stopped), a line is logged every this many
    seconds."""
    cursor_replication_factor: int = 3
    """Replicas of the internal cursor stream; it is created once this many
    brokers are live."""
    controlled_shutdown_timeout: float = 30.0
    """How long a stopping broker waits for the controller to move its
    leadership to other in-sync replicas before it stops anyway."""
    tls_ca: str = ""
    """PEM file of the CA(s) that sign ZooKeeper's server certificate.  Setting
    it (or ``tls_cert``) connects over TLS, to ZooKeeper's ``secureClientPort``;
    empty (the default) and without ``tls_cert``: plain TCP."""
    tls_cert: str = ""
    """PEM file of the certificate this broker presents to ZooKeeper (which asks
    for one unless its ``ssl.clientAuth`` says otherwise); goes with ``tls_key``."""
    tls_key: str = ""
    """PEM file of ``tls_cert``'s private key, unencrypted."""
    tls_check_hostname: bool = True
    """Over TLS, whether ZooKeeper's certificate must name the host (or IP) of
    the connect string, as well as be signed by ``tls_ca``."""
    digest_user: str = ""
    """ZooKeeper digest user: with it, the broker authenticates as
    ``digest_user`` and every znode it creates is readable and writable only
    by that identity.  Empty (the default): no authentication, open znodes.
    Znodes created before it was set keep their (open) ACL."""
    digest_password_file: str = ""
    """File holding ``digest_user``'s password (one line; the trailing newline
    is dropped).  Read at start; the password itself is never logged."""

    @property
    def tls(self) -> bool:
        """Whether the connection to ZooKeeper is TLS."""
        return bool(self.tls_ca or self.tls_cert)

    @property
    def digest(self) -> bool:
        """Whether the broker authenticates with a digest user and protects its znodes."""
        return bool(self.digest_user)

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
        for name in ("tls_ca", "tls_cert", "tls_key", "digest_user", "digest_password_file"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {getattr(self, name)!r}")
        if not isinstance(self.tls_check_hostname, bool):
            raise ValueError(f"tls_check_hostname must be true or false, got {self.tls_check_hostname!r}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together: set both (or neither)")
        if bool(self.digest_user) != bool(self.digest_password_file):
            raise ValueError("digest_user and digest_password_file go together: set both (or neither)")
        if ":" in self.digest_user or self.digest_user != self.digest_user.strip():
            raise ValueError(
                f"digest_user must have no ':' and no surrounding spaces, got {self.digest_user!r}"
            )

    def read_digest_password(self) -> str:
        """The password in ``digest_password_file``; ``ValueError`` naming the file (never the
        content) if it cannot be read or is empty."""
        path = Path(self.digest_password_file)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(
                f"cannot read the ZooKeeper digest password file {path}: {exc.strerror}"
            ) from None
        except UnicodeDecodeError:  # its message would quote a byte of the password
            raise ValueError(f"the ZooKeeper digest password file {path} is not UTF-8 text") from None
        password = text.rstrip("\r\n")
        if not password or "\n" in password:
            raise ValueError(f"the ZooKeeper digest password file {path} must hold the password on one line")
        return password
