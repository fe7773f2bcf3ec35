"""The harvester's configuration (the ``[outbox]`` table of a TOML file, or keyword arguments),
and the status it reports.

Every value is checked when the configuration is made, and a bad one is named
with what it should be (``InvalidArgumentError``), so a harvester never starts
with a setting it would refuse later.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pyspark_jetstream.client import Credentials
from pyspark_jetstream.protocol.errors import InvalidArgumentError

from .outbox_table import checked_table


@dataclass(frozen=True, slots=True)
class HarvesterConfig:
    """What ``jetstream outbox run --config FILE`` reads from the file's ``[outbox]`` table."""

    database: str
    """``sqlite:///path/outbox.db`` or ``postgresql://user@host:port/db``."""
    table: str = "outbox"
    nats: str = ""
    """NATS servers, comma-separated (required): rows are published there, and a broker is found there."""
    servers: str = ""
    """A broker's Flight address (grpc://host:port), if it cannot be found through NATS."""
    zookeeper: str = ""
    """ZooKeeper hosts: elect the leader there instead of with the database's lock."""
    batch_size: int = 500
    max_in_flight: int = 1000
    max_attempts: int = 5
    backoff: float = 0.5
    max_backoff: float = 30.0
    deadline: float = 5.0
    """NELI: a leader that cannot confirm its leadership for this long stops; a new one waits this long."""
    poll: float = 0.05
    """Seconds between marks while the outbox is empty."""
    ack_timeout: float = 30.0
    shutdown_timeout: float = 10.0
    ack_policy: str = "all"
    report_every: float = 10.0
    credentials_file: str = ""
    """A credentials file (TOML: ``user``, ``token``, ``tls_ca``, ``tls_cert``, ``tls_key``) for a
    secured deployment; the keys below override its values."""
    user: str = ""
    token: str = field(default="", repr=False)
    """The user's token; better kept in ``credentials_file``, readable by the harvester alone."""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""

    def __post_init__(self) -> None:
        checked_table(self.table)
        self.credentials()  # a missing file or a user without its token fails here, naming it
        if not self.nats.strip():
            raise InvalidArgumentError(
                "outbox: 'nats' is required (nats://host:port[,...]): rows are published through NATS"
            )
        for name, low, high in (
            ("batch_size", 1, 100_000),
            ("max_in_flight", 1, 1_000_000),
            ("max_attempts", 1, 1_000),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise InvalidArgumentError(
                    f"outbox: {name} must be an integer from {low} to {high}, got {value!r}"
                )
        for name in (
            "backoff",
            "max_backoff",
            "deadline",
            "poll",
            "ack_timeout",
            "shutdown_timeout",
            "report_every",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 3600:
                raise InvalidArgumentError(f"outbox: {name} must be seconds from 0 to 3600, got {value!r}")
        if self.ack_policy not in ("leader", "all"):
            raise InvalidArgumentError(f"outbox: ack_policy must be leader or all, got {self.ack_policy!r}")

    def credentials(self) -> Credentials:
        """What the harvester presents to NATS and the brokers (empty: an unsecured deployment)."""
        for name in ("credentials_file", "user", "token", "tls_ca", "tls_cert", "tls_key"):
            if not isinstance(getattr(self, name), str):
                raise InvalidArgumentError(f"outbox: {name} must be a string")
        try:
            return Credentials.from_options(
                {
                    "credentialsFile": self.credentials_file,
                    "user": self.user,
                    "token": self.token,
                    "tls.ca": self.tls_ca,
                    "tls.cert": self.tls_cert,
                    "tls.key": self.tls_key,
                }
            )
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"outbox: {exc}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> HarvesterConfig:
        """The ``[outbox]`` table of a TOML file; unknown keys are errors naming them."""
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgumentError(f"outbox config {path}: {exc}") from None
        section = data.get("outbox")
        if not isinstance(section, dict):
            raise InvalidArgumentError(f"outbox config {path}: no [outbox] table")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise InvalidArgumentError(
                f"outbox config {path}: unknown key(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        if "database" not in section:
            raise InvalidArgumentError(f"outbox config {path}: 'database' is required")
        return cls(**section)


@dataclass(slots=True)
class HarvesterStatus:
    """What the harvester reports (``status()``, and its log every ``report_every`` seconds)."""

    role: str = "standby"
    leader_id: str = ""
    backlog: int | None = None
    in_flight: int = 0
    published: int = 0
    duplicates: int = 0
    failures: int = 0
    dead_lettered: int = 0
    terms: int = 0
    election: str = ""
    last_error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
