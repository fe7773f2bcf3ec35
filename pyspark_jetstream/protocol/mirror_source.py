"""Where a mirror copies from: the ``mirror`` field of a stream's config (see :mod:`.mirror`).

Kept apart from :mod:`.mirror` because :mod:`.streams` holds it in every
:class:`~.streams.StreamConfig` (and :mod:`.mirror` needs :mod:`.streams`).
Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgumentError, known_fields, shown

SCHEMES = ("grpc://", "grpc+tcp://", "grpc+tls://")
"""What a source server's address may start with (a broker's Flight address)."""
MAX_SERVERS = 64


def validate_servers(servers: object) -> tuple[str, ...]:
    """Return the source servers as a tuple if they are Flight addresses, else raise naming the bad one."""
    if isinstance(servers, str):
        servers = [s.strip() for s in servers.split(",") if s.strip()]
    if not isinstance(servers, list | tuple) or not servers:
        raise InvalidArgumentError(
            f"source servers must be one or more Flight addresses (grpc://host:port), got {shown(servers)}"
        )
    if len(servers) > MAX_SERVERS:
        raise InvalidArgumentError(f"give at most {MAX_SERVERS} source servers, got {len(servers)}")
    for server in servers:
        if (
            not isinstance(server, str)
            or not server.startswith(SCHEMES)
            or ":" not in server.split("//", 1)[1]
        ):
            raise InvalidArgumentError(
                f"source server {shown(server)} is not a Flight address: use grpc://host:port "
                "(or grpc+tls://host:port for a source over TLS)"
            )
    return tuple(servers)


@dataclass(frozen=True, kw_only=True)
class MirrorSource:
    """Where a mirror copies from (see the module docstring)."""

    stream: str
    """The source stream's name in its own cluster."""
    servers: tuple[str, ...]
    """Flight addresses of brokers of the source cluster (any of them: they name the leaders)."""
    credentials: str | None = None
    """Path of a credentials file on the mirror's brokers, for a secured source; ``None``: none."""
    promoted: bool = False
    """Whether the mirror was promoted: it copies no more and takes publishes."""

    def __post_init__(self) -> None:
        if not isinstance(self.stream, str) or not self.stream:
            raise InvalidArgumentError(f"mirror stream must be a stream name, got {shown(self.stream)}")
        object.__setattr__(self, "servers", validate_servers(self.servers))
        if self.credentials is not None and (not isinstance(self.credentials, str) or not self.credentials):
            raise InvalidArgumentError(
                f"mirror credentials must be the path of a credentials file, got {shown(self.credentials)}"
            )
        if not isinstance(self.promoted, bool):
            raise InvalidArgumentError(f"mirror promoted must be true or false, got {shown(self.promoted)}")

    @property
    def active(self) -> bool:
        """Whether the mirror still copies (and refuses publishes)."""
        return not self.promoted

    def where(self) -> str:
        """``'orders' on grpc://a:7001,grpc://b:7001``: for messages."""
        return f"{self.stream!r} on {','.join(self.servers)}"

    def to_json(self) -> dict[str, Any]:
        """The JSON form (see the module docstring)."""
        return {
            "stream": self.stream,
            "servers": list(self.servers),
            "credentials": self.credentials,
            "promoted": self.promoted,
        }

    @classmethod
    def from_json(cls, data: object) -> MirrorSource:
        """Parse the JSON form strictly: unknown or missing fields are errors."""
        known = (f.name for f in dataclasses.fields(cls))
        given = known_fields(data, known, what="mirror must be an object", fields="mirror field(s)")
        if "stream" not in given or "servers" not in given:
            raise InvalidArgumentError("a mirror needs its source 'stream' and 'servers'")
        return cls(
            stream=given["stream"],
            servers=validate_servers(given["servers"]),
            credentials=given.get("credentials"),
            promoted=given.get("promoted", False),
        )
