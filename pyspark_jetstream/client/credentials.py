"""What a client presents to a secured deployment: a CA to trust, a certificate, a user and token.

The same :class:`Credentials` go to NATS (TLS, user and password, and an ack
inbox of the principal's own) and to every broker's Flight endpoint (TLS, a
client certificate for mutual TLS, and ``authorization: Basic`` with the user
and token on each call).  They come from keyword arguments, from a
credentials file (TOML with the keys ``user``, ``token``, ``tls_ca``,
``tls_cert``, ``tls_key``), or from Spark-style options (``user``,
``token``, ``tls.ca``, ``tls.cert``, ``tls.key``, ``credentialsFile``).

The token is never shown: not in ``repr``, not in errors, not in logs.
"""

from __future__ import annotations

import base64
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyarrow import flight

from pyspark_jetstream.protocol.acl import inbox_prefix, validate_principal
from pyspark_jetstream.protocol.errors import InvalidArgumentError

OPTION_KEYS = {
    "user": "user",
    "token": "token",
    "tls.ca": "tls_ca",
    "tls.cert": "tls_cert",
    "tls.key": "tls_key",
}
"""Option names (Spark, the CLI's config) and the fields they set."""
CREDENTIALS_FILE_OPTION = "credentialsFile"
REDACTED = "*****"


@dataclass(frozen=True)
class Credentials:
    """TLS material and a user's token (see the module docstring); all optional."""

    user: str | None = None
    token: str | None = field(default=None, repr=False)
    tls_ca: str | None = None
    """PEM file of the CA that signed the brokers' and NATS's certificates."""
    tls_cert: str | None = None
    """PEM file of this client's certificate (mutual TLS), with ``tls_key``."""
    tls_key: str | None = None

    def __post_init__(self) -> None:
        if self.user is not None:
            validate_principal(self.user)
        if self.token is not None and not (isinstance(self.token, str) and self.token):
            raise InvalidArgumentError("token must be a non-empty string")
        if (self.token is None) != (self.user is None):
            raise InvalidArgumentError("give user and token together (the token is the user's password)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgumentError(
                "give tls.cert and tls.key together (a client certificate and its key)"
            )
        for name in ("tls_ca", "tls_cert", "tls_key"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise InvalidArgumentError(f"{name.replace('_', '.')} {path!r} is not a readable file")

    def __repr__(self) -> str:
        token = REDACTED if self.token is not None else None
        return (
            f"Credentials(user={self.user!r}, token={token!r}, tls_ca={self.tls_ca!r}, "
            f"tls_cert={self.tls_cert!r}, tls_key={self.tls_key!r})"
        )

    @property
    def empty(self) -> bool:
        """Whether nothing is set (an unsecured deployment)."""
        return self == Credentials()

    @classmethod
    def load(cls, path: str | Path) -> Credentials:
        """Credentials from a TOML file (keys as the fields); errors name the file, never a value."""
        try:
            document = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgumentError(f"cannot read credentials file {str(path)!r}: {exc}") from None
        known = set(OPTION_KEYS.values())
        unknown = sorted(set(document) - known)
        if unknown:
            raise InvalidArgumentError(
                f"unknown key(s) {', '.join(unknown)} in credentials file {str(path)!r}; "
                f"known: {', '.join(sorted(known))}"
            )
        if not all(isinstance(v, str) for v in document.values()):
            raise InvalidArgumentError(f"every value in credentials file {str(path)!r} must be a string")
        return cls(**document)

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Credentials:
        """Credentials from options (``user``, ``token``, ``tls.*``, ``credentialsFile``);
        an option given directly overrides the file's."""
        path = options.get(CREDENTIALS_FILE_OPTION)
        base = cls.load(path) if path else cls()
        values = {f: getattr(base, f) for f in OPTION_KEYS.values()}
        values.update({OPTION_KEYS[k]: v for k, v in options.items() if k in OPTION_KEYS and v})
        return cls(**values)

    # ---- Flight ----------------------------------------------------------------------

    def flight_arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``pyarrow.flight.connect`` (TLS material and the auth header)."""
        arguments: dict[str, Any] = {}
        if self.tls_ca is not None:
            arguments["tls_root_certs"] = Path(self.tls_ca).read_bytes()
        if self.tls_cert is not None and self.tls_key is not None:
            arguments["cert_chain"] = Path(self.tls_cert).read_bytes()
            arguments["private_key"] = Path(self.tls_key).read_bytes()
        if self.user is not None and self.token is not None:
            arguments["middleware"] = [_BasicAuth(basic_authorization(self.user, self.token))]
        return arguments

    # ---- NATS ------------------------------------------------------------------------

    def nats_arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``: TLS, user and password, the principal's inbox."""
        arguments: dict[str, Any] = {}
        if self.tls_ca is not None or self.tls_cert is not None:
            context = ssl.create_default_context(cafile=self.tls_ca)
            if self.tls_cert is not None and self.tls_key is not None:
                context.load_cert_chain(self.tls_cert, self.tls_key)
            arguments["tls"] = context
        if self.user is not None:
            arguments["user"] = self.user
            arguments["password"] = self.token
            arguments["inbox_prefix"] = inbox_prefix(self.user)
        return arguments


def basic_authorization(user: str, token: str) -> str:
    """The ``authorization`` header value for ``user`` and ``token``."""
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode("ascii")


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
