"""The broker's configuration: frozen dataclasses with named defaults, loaded from TOML.

One TOML file (see ``conf/broker.toml``) holds a table per part of the broker;
each table maps key by key onto a dataclass.  Unknown keys are errors that
name the key, the table and the file, never silently ignored.  Durations are
in seconds.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from broker_node.log import LogConfig

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names it."""


@dataclass(frozen=True, kw_only=True)
class NatsConfig:
    """Which NATS servers the broker uses."""

    servers: tuple[str, ...] = ()
    """NATS URLs to connect to; empty means start an embedded nats-server."""
    embedded_host: str = "127.0.0.1"
    embedded_port: int = 4222
    """Client port of the embedded server; -1 picks a free one."""
    reconnect_wait: float = 1.0
    max_reconnect_attempts: int = -1
    """-1 reconnects forever."""


@dataclass(frozen=True, kw_only=True)
class FlightConfig:
    """Where the broker serves Arrow Flight."""

    host: str = "127.0.0.1"
    port: int = 9292
    """0 picks a free port."""
    advertised_host: str | None = None
    """Host name clients should use, if not ``host`` (e.g. behind NAT)."""


@dataclass(frozen=True, kw_only=True)
class IngestConfig:
    """How messages arriving one at a time are coalesced into batches."""

    max_batch_messages: int = 10_000
    max_batch_bytes: int = 8 * 1024 * 1024
    max_delay: float = 0.0
    """Extra seconds to wait for more messages; 0 flushes as soon as the queue is drained."""

    def __post_init__(self) -> None:
        if self.max_batch_messages < 1 or self.max_batch_bytes < 1 or self.max_delay < 0:
            raise ValueError(f"invalid ingest settings: {self}")


@dataclass(frozen=True, kw_only=True)
class BrokerConfig:
    """Everything a broker process needs."""

    broker_id: str = "broker-1"
    data_dir: Path = Path("data")
    maintenance_interval: float = 30.0
    """Seconds between retention and compaction passes."""
    nats: NatsConfig = field(default_factory=NatsConfig)
    flight: FlightConfig = field(default_factory=FlightConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    log: LogConfig = field(default_factory=LogConfig)
    """Defaults for every partition's log; a stream's own settings override them."""


_SECTIONS: dict[str, type] = {
    "nats": NatsConfig,
    "flight": FlightConfig,
    "ingest": IngestConfig,
    "log": LogConfig,
}


def from_mapping(cls: type[T], values: Mapping[str, Any], where: str) -> T:
    """Build dataclass ``cls`` from ``values``; ``where`` names the source in errors."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)} in {where}; known options: {', '.join(sorted(known))}"
        )
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


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
        raise ConfigError(
            f"unknown table(s) {', '.join(unknown)} {where}; known: broker, {', '.join(_SECTIONS)}"
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
