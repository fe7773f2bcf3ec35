"""Loading configuration files onto the broker's frozen dataclasses.

One TOML file (see ``conf/``) holds a table per part of the broker; each
table maps key by key onto a dataclass with named defaults.  Unknown keys
are errors that name the key, the table and the file, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from broker_node.log import LogConfig

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message names it."""


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


def load_log_config(path: str | Path) -> LogConfig:
    """The ``[log]`` table of the TOML file at ``path`` as a :class:`LogConfig`."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc}") from None
    return from_mapping(LogConfig, document.get("log", {}), f"[log] of {path}")
