"""The broker's configuration: frozen dataclasses with named defaults, loaded from TOML.

One TOML file (see ``conf/broker.toml``) holds a table per part of the broker;
each table maps key by key onto a dataclass.  Unknown keys are errors that
name the key, the table and the file, never silently ignored.  Durations are
in seconds.  Every number is bounded (ranges inclusive, given with each
option and in ``conf/broker.toml``); an error names the option, the value and
the range.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from broker_node.coordination.zookeeper_config import ZooKeeperConfig
from broker_node.log import LogConfig
from broker_node.replication.replication_config import ReplicationConfig
from pyspark_jetstream.protocol.streams import GiB, KiB, bounded_int, bounded_number

T = TypeVar("T")

MAX_PORT = 65535
MAX_WAITING_READERS = 100_000
MAX_OPEN_PUTS = 100_000
MIN_INTERVAL = 0.01
"""Shortest maintenance interval or reconnect wait: below 10 ms the broker
would spend its time on the timer, or hammer an unreachable server."""
MAX_RECONNECT_WAIT = 3600.0
MAX_MAINTENANCE_INTERVAL = 24 * 3600.0
"""Retention and compaction at least daily, or disks fill between passes."""
MAX_RECONNECT_ATTEMPTS = 1_000_000
MAX_BATCH_MESSAGES = 1_000_000
MIN_BATCH_BYTES = 1 * KiB
MAX_BATCH_BYTES = 1 * GiB
"""The same range as the log's ``max_batch_bytes``, which a coalesced batch must fit."""
MAX_DELAY = 60.0
"""``max_delay`` adds up to this much latency to every message."""


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names it."""


@dataclass(frozen=True, kw_only=True)
class NatsConfig:
    """Which NATS servers the broker uses."""

    servers: tuple[str, ...] = ()
    """NATS URLs to connect to; empty means start an embedded nats-server."""
    embedded_host: str = "127.0.0.1"
    """Address the embedded nats-server listens on (with ``servers`` empty)."""
    embedded_port: int = 4222
    """Client port of the embedded server (1 to 65535); -1 picks a free one."""
    reconnect_wait: float = 1.0
    """Seconds between reconnect attempts (0.01 to 3600)."""
    max_reconnect_attempts: int = -1
    """0 to 1,000,000; -1 reconnects forever."""

    def __post_init__(self) -> None:
        if not isinstance(self.servers, tuple) or not all(isinstance(s, str) and s for s in self.servers):
            raise ValueError(
                f"servers must be NATS URLs (strings like nats://host:4222), got {self.servers!r}"
            )
        port = self.embedded_port
        if isinstance(port, bool) or not isinstance(port, int) or not (port == -1 or 1 <= port <= MAX_PORT):
            raise ValueError(f"embedded_port must be -1 (a free port) or 1 to {MAX_PORT}, got {port!r}")
        bounded_number("reconnect_wait", self.reconnect_wait, MIN_INTERVAL, MAX_RECONNECT_WAIT)
        attempts = self.max_reconnect_attempts
        if (
            isinstance(attempts, bool)
            or not isinstance(attempts, int)
            or not -1 <= attempts <= MAX_RECONNECT_ATTEMPTS
        ):
            raise ValueError(
                f"max_reconnect_attempts must be -1 (forever) or 0 to {MAX_RECONNECT_ATTEMPTS}, "
                f"got {attempts!r}"
            )


@dataclass(frozen=True, kw_only=True)
class FlightConfig:
    """Where the broker serves Arrow Flight."""

    host: str = "127.0.0.1"
    """Address Flight listens on; one beyond loopback needs TLS and an ACL (or ``[security]
    insecure``)."""
    port: int = 9292
    """0 to 65535; 0 picks a free port."""
    advertised_host: str | None = None
    """Host name clients should use, if not ``host`` (e.g. behind NAT): the only address of this
    broker that clients, followers and the controller are given, so all of them must reach it
    (each broker of a cluster checks that it does, see :mod:`broker_node.reachability`)."""
    max_waiting_readers: int = 256
    """Follow reads and long-polling reads that may wait for data at once, every principal
    together: each holds a Flight thread while it waits.  Past it a read is refused with
    ``limit_exceeded``; many live readers belong on the live tail, which holds no thread."""
    max_open_puts: int = 4096
    """Producers' puts (the Spark sink's chunks, put to this partition leader) open at once,
    every principal together: each holds two threads while open.  Past it a put is refused with
    ``limit_exceeded``, not retried: the sink's task fails naming the limit (Spark retries it up
    to ``spark.task.maxFailures``)."""

    def __post_init__(self) -> None:
        port = self.port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= MAX_PORT:
            raise ValueError(
                f"port must be an integer from 0 to {MAX_PORT}, got {port!r} (0 picks a free port)"
            )
        bounded_int("max_waiting_readers", self.max_waiting_readers, 1, MAX_WAITING_READERS)
        bounded_int("max_open_puts", self.max_open_puts, 1, MAX_OPEN_PUTS)


@dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    """Where the broker serves Prometheus ``/metrics`` and ``/healthz`` over HTTP."""

    host: str = "127.0.0.1"
    """Address the HTTP server of the metrics listens on."""
    port: int = -1
    """-1 (the default) serves nothing; 0 picks a free port; else 1 to 65535."""

    def __post_init__(self) -> None:
        port = self.port
        if isinstance(port, bool) or not isinstance(port, int) or not -1 <= port <= MAX_PORT:
            raise ValueError(
                f"port must be an integer from -1 to {MAX_PORT}, got {port!r} (-1: off, 0: a free port)"
            )


@dataclass(frozen=True, kw_only=True)
class IngestConfig:
    """How messages arriving one at a time are coalesced into batches."""

    max_batch_messages: int = 10_000
    """1 to 1,000,000."""
    max_batch_bytes: int = 8 * 1024 * 1024
    """1 KiB to 1 GiB."""
    max_delay: float = 0.0
    """Extra seconds to wait for more messages (0 to 60); 0 flushes as soon as the queue is drained."""
    live_tail: bool = True
    """Publish each committed batch of the partitions led here on NATS for tailing consumers."""

    def __post_init__(self) -> None:
        if not isinstance(self.live_tail, bool):
            raise ValueError(f"live_tail must be true or false, got {self.live_tail!r}")
        bounded_int("max_batch_messages", self.max_batch_messages, 1, MAX_BATCH_MESSAGES)
        bounded_int("max_batch_bytes", self.max_batch_bytes, MIN_BATCH_BYTES, MAX_BATCH_BYTES, unit="bytes")
        bounded_number("max_delay", self.max_delay, 0, MAX_DELAY)


@dataclass(frozen=True, kw_only=True)
class SecurityConfig:
    """TLS, who may connect, and what each principal may do (see ``conf/secure/``)."""

    tls_cert: str = ""
    """PEM certificate of this broker: Flight serves ``grpc+tls``, the embedded nats-server TLS."""
    tls_key: str = ""
    """PEM private key of ``tls_cert``."""
    tls_ca: str = ""
    """PEM CA that signed the brokers' certificates (and the clients', with ``verify_clients``)."""
    verify_clients: bool = False
    """Mutual TLS: Flight and the embedded nats-server require a client certificate from ``tls_ca``."""
    acl_file: str = ""
    """Principals, their tokens (bcrypt) and grants (``conf/secure/acl.toml``), reloaded when the
    file changes; in a cluster kept in ZooKeeper.  Set: every call needs credentials and everything
    not granted is denied."""
    credentials_file: str = ""
    """This broker's own user and token (and client certificate): its NATS login and its calls to
    peers.  The user must be a ``cluster = true`` principal of the ACL."""
    max_streams: int = 10_000
    """Streams the cluster may hold (1 to 1,000,000): a cap on creation for every principal."""
    insecure: bool = False
    """Allow listening on a non-loopback address with no TLS or no ACL."""

    def __post_init__(self) -> None:
        for name in ("tls_cert", "tls_key", "tls_ca", "acl_file", "credentials_file"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ValueError(f"{name} must be a file path (a string), got {value!r}")
            if value and not Path(value).is_file():
                raise ValueError(f"{name} {value!r} is not a readable file")
        for name in ("verify_clients", "insecure"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together (the certificate and its private key)")
        if self.verify_clients and not (self.tls_cert and self.tls_ca):
            raise ValueError("verify_clients needs tls_cert, tls_key and tls_ca")
        bounded_int("max_streams", self.max_streams, 1, 1_000_000)

    @property
    def tls(self) -> bool:
        """Whether the broker serves TLS."""
        return bool(self.tls_cert)


@dataclass(frozen=True, kw_only=True)
class BrokerConfig:
    """Everything a broker process needs."""

    broker_id: str = "broker-1"
    """This broker's id (``id`` in the file): unique in a cluster, the same across restarts."""
    rack: str = ""
    """Where the broker sits (a rack, a zone): generated reassignment plans and drains spread a
    partition's replicas over racks.  Empty: not declared."""
    data_dir: Path = Path("data")
    """Where streams, cursors and metadata are stored (a relative path is taken from the directory
    the broker runs in).  One broker at a time: a second one on it is refused (``broker.lock``)."""
    maintenance_interval: float = 30.0
    """Seconds between retention and compaction passes, leader repairs and handing freed memory back
    to the system (0.01 to 86400)."""
    nats: NatsConfig = field(default_factory=NatsConfig)
    flight: FlightConfig = field(default_factory=FlightConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    """Defaults for every partition's log; a stream's own settings override them."""
    zookeeper: ZooKeeperConfig = field(default_factory=ZooKeeperConfig)
    """A cluster's coordinator; with no hosts the broker is a single broker of its own."""
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.rack, str) or len(self.rack) > 64 or not self.rack.isprintable():
            raise ValueError(f"rack must be a name of at most 64 printable characters, got {self.rack!r}")
        bounded_number(
            "maintenance_interval", self.maintenance_interval, MIN_INTERVAL, MAX_MAINTENANCE_INTERVAL
        )

    def exposed_insecurely(self) -> list[str]:
        """The listeners bound beyond loopback while TLS or the ACL is off (``insecure`` allows it)."""
        security = self.security
        if security.insecure or (security.tls and security.acl_file):
            return []
        listeners = [("flight", self.flight.host)]
        if not self.nats.servers:
            listeners.append(("nats embedded", self.nats.embedded_host))
        if self.metrics.port >= 0:
            listeners.append(("metrics", self.metrics.host))
        return [f"[{name}] {host}" for name, host in listeners if not _loopback(host)]

    def refuse_insecure_exposure(self) -> None:
        """``ConfigError`` when a listener would be open beyond loopback without TLS and an ACL."""
        exposed = self.exposed_insecurely()
        if exposed:
            raise ConfigError(
                f"refusing to listen on {', '.join(exposed)} without TLS and an ACL: anyone who can reach "
                "it could read, write and delete every stream. Set [security] tls_cert, tls_key and "
                "acl_file (see conf/secure/), bind to 127.0.0.1, or set [security] insecure = true"
            )


def _loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or name (a name is resolved by nothing: only localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_SECTIONS: dict[str, type] = {
    "nats": NatsConfig,
    "flight": FlightConfig,
    "ingest": IngestConfig,
    "metrics": MetricsConfig,
    "log": LogConfig,
    "zookeeper": ZooKeeperConfig,
    "replication": ReplicationConfig,
    "security": SecurityConfig,
}


def from_mapping(cls: type[T], values: Mapping[str, Any], where: str) -> T:
    """Build dataclass ``cls`` from ``values``; ``where`` names the source in errors."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        if cls is BrokerConfig:  # as the file spells them: its sections are tables, broker_id is id
            known = (known - set(_SECTIONS) - {"broker_id"}) | {"id"}
        raise ConfigError(
            f"unknown option(s) {', '.join(_with_guess(name, known) for name in unknown)} in {where}; "
            f"known options: {', '.join(sorted(known))}"
        )
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _with_guess(name: str, known: set[str]) -> str:
    """``name`` quoted, with the known name it was probably meant to be."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f"'{name}' (did you mean '{close[0]}'?)" if close else f"'{name}'"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc}") from None


def load_log_config(path: str | Path) -> LogConfig:
    """The ``[log]`` table of the TOML file at ``path`` as a :class:`LogConfig`."""
    path = Path(path)
    return from_mapping(LogConfig, _read_toml(path).get("log", {}), f"[log] of {path}")


def load_broker_config(path: str | Path | None, **overrides: Any) -> BrokerConfig:
    """Load ``path`` (or the defaults when ``None``) as a :class:`BrokerConfig`.

    ``overrides`` replace top-level ``[broker]`` options (e.g. ``data_dir``).
    """
    document = _read_toml(Path(path)) if path is not None else {}
    where = f"of {path}" if path is not None else "of the defaults"
    unknown = sorted(set(document) - {"broker", *_SECTIONS})
    if unknown:
        tables = {"broker", *_SECTIONS}
        raise ConfigError(
            f"unknown table(s) {', '.join(_with_guess(name, tables) for name in unknown)} {where}; "
            f"known: broker, {', '.join(_SECTIONS)}"
        )
    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        values = dict(document.get(name, {}))
        if name == "nats" and "servers" in values:
            values["servers"] = tuple(values["servers"])
        sections[name] = from_mapping(cls, values, f"[{name}] {where}")
    top = dict(document.get("broker", {}))
    if "id" in top:
        top["broker_id"] = top.pop("id")
    top.update({k: v for k, v in overrides.items() if v is not None})
    if "data_dir" in top:
        top["data_dir"] = Path(top["data_dir"])
    config = from_mapping(BrokerConfig, {**top, **sections}, f"[broker] {where}")
    if not config.broker_id or not isinstance(config.broker_id, str):
        raise ConfigError(f"[broker] id must be a non-empty string, got {config.broker_id!r}")
    return config
