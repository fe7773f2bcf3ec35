"""What this broker presents to the rest of a secured deployment: to its NATS server, to its
peers' Flight endpoints and replication listeners, and to a mirror's source cluster.

A broker presents credentials as a client does: a
:class:`pyspark_jetstream.protocol.credentials.Credentials` (its fields, checks
and a credentials file's parsing are the protocol's).  The files are read
here: this broker's own credentials (``[security] credentials_file``, else
``[security]``'s CA and, for mutual TLS, its certificate), a mirror's source
credentials file (read at each connection, so a fixed file is picked up), and
the TLS files each connection needs.  Errors name the file, never the token.
"""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path
from typing import Any

from pyarrow import flight

from broker_node.config import SecurityConfig
from broker_node.replication.fetcher import PeerLink
from pyspark_jetstream.protocol.credentials import Credentials
from pyspark_jetstream.protocol.errors import InvalidArgumentError


def load_credentials(path: str | Path) -> Credentials:
    """The credentials of a TOML credentials file; ``InvalidArgumentError`` naming the file when it
    cannot be read or parsed, or naming a TLS file it gives that does not exist."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read credentials file {str(path)!r}: {exc}") from None
    return _checked(Credentials.parse(text, str(path)))


def own_credentials(security: SecurityConfig) -> Credentials:
    """This broker's credentials file, else [security]'s CA (and certificate, for mutual TLS)."""
    own = load_credentials(security.credentials_file) if security.credentials_file else Credentials()
    if own.tls_ca is None and security.tls_ca:
        own = _checked(dataclasses.replace(own, tls_ca=security.tls_ca))
    if own.tls_cert is None and security.verify_clients:
        own = _checked(dataclasses.replace(own, tls_cert=security.tls_cert, tls_key=security.tls_key))
    return own


def flight_arguments(credentials: Credentials) -> dict[str, Any]:
    """Keyword arguments for ``pyarrow.flight.connect`` (TLS material and the auth header)."""
    arguments: dict[str, Any] = {
        name: Path(path).read_bytes() for name, path in credentials.flight_files().items()
    }
    if credentials.authorization is not None:
        arguments["middleware"] = [_BasicAuth(credentials.authorization)]
    return arguments


def nats_arguments(credentials: Credentials) -> dict[str, Any]:
    """Keyword arguments for ``nats.connect``: TLS, user and password, the principal's inbox."""
    tls = _tls_context(credentials)
    return {**({"tls": tls} if tls is not None else {}), **credentials.nats_user()}


def peer_link(credentials: Credentials) -> PeerLink:
    """How this broker's fetchers present themselves to their leaders: as its Flight calls do."""
    return PeerLink(_tls_context(credentials), credentials.authorization or "")


def _tls_context(credentials: Credentials) -> ssl.SSLContext | None:
    """A client TLS context trusting the credentials' CA, with their certificate (if any)."""
    if credentials.tls_ca is None and credentials.tls_cert is None:
        return None
    context = ssl.create_default_context(cafile=credentials.tls_ca)
    if credentials.tls_cert is not None and credentials.tls_key is not None:
        context.load_cert_chain(credentials.tls_cert, credentials.tls_key)
    return context


def _checked(credentials: Credentials) -> Credentials:
    """``credentials``, once every TLS file they give exists."""
    for option, path in credentials.files().items():
        if not Path(path).is_file():
            raise InvalidArgumentError(f"{option} {path!r} is not a readable file")
    return credentials


class _BasicAuth(flight.ClientMiddlewareFactory):
    """Adds the ``authorization`` header to every Flight call."""

    def __init__(self, header: str) -> None:
        self._header = header

    def start_call(self, info: flight.CallInfo) -> flight.ClientMiddleware:
        return _Header(self._header)

    def __repr__(self) -> str:
        return "_BasicAuth(*****)"


class _Header(flight.ClientMiddleware):
    def __init__(self, header: str) -> None:
        self._header = header

    def sending_headers(self) -> dict[str, str]:
        return {"authorization": self._header}
