"""What a client, or a broker talking to its peers, presents to a secured deployment: a CA to
trust, a certificate, a user and token.

The same :class:`Credentials` go to NATS (TLS, user and password, and an ack
inbox of the principal's own) and to every broker's Flight endpoint (TLS, a
client certificate for mutual TLS, and ``authorization: Basic`` with the user
and token on each call).  They come from keyword arguments, from a
credentials file (TOML with the keys ``user``, ``token``, ``tls_ca``,
``tls_cert``, ``tls_key``: :meth:`Credentials.parse` reads its text), or from
Spark-style options (``user``, ``token``, ``tls.ca``, ``tls.cert``,
``tls.key``, ``credentialsFile``: :meth:`Credentials.overridden`).

This module is pure: reading a credentials file, checking that the files it
names exist and reading them are the caller's (the client's
``pyspark_jetstream.client.credentials``, the broker's ``peer_credentials``).

The token is never shown: not in ``repr``, not in errors, not in logs.
"""

from __future__ import annotations

import base64
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Self

from .acl import inbox_prefix, validate_principal
from .errors import InvalidArgumentError

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

    def __repr__(self) -> str:
        token = REDACTED if self.token is not None else None
        return (
            f"Credentials(user={self.user!r}, token={token!r}, tls_ca={self.tls_ca!r}, "
            f"tls_cert={self.tls_cert!r}, tls_key={self.tls_key!r})"
        )

    @property
    def empty(self) -> bool:
        """Whether nothing is set (an unsecured deployment)."""
        return self == type(self)()

    def files(self) -> dict[str, str]:
        """The files these credentials name, by option (``tls.ca``, ``tls.cert``, ``tls.key``)."""
        named = {"tls.ca": self.tls_ca, "tls.cert": self.tls_cert, "tls.key": self.tls_key}
        return {option: path for option, path in named.items() if path is not None}

    @property
    def authorization(self) -> str | None:
        """The ``authorization`` header value of the user and token, if set."""
        if self.user is None or self.token is None:
            return None
        return basic_authorization(self.user, self.token)

    def flight_files(self) -> dict[str, str]:
        """The files whose bytes go to ``pyarrow.flight.connect``, by its keyword argument."""
        named: dict[str, str | None] = {"tls_root_certs": self.tls_ca}
        if self.tls_cert is not None and self.tls_key is not None:
            named.update(cert_chain=self.tls_cert, private_key=self.tls_key)
        return {argument: path for argument, path in named.items() if path is not None}

    def nats_user(self) -> dict[str, Any]:
        """``nats.connect``'s keyword arguments for the user: password and the principal's inbox."""
        if self.user is None:
            return {}
        return {"user": self.user, "password": self.token, "inbox_prefix": inbox_prefix(self.user)}

    @classmethod
    def parse(cls, text: str, source: str) -> Self:
        """Credentials from a credentials file's ``text`` (TOML, keys as the fields); errors name
        ``source`` (the file), never a value."""
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidArgumentError(f"cannot read credentials file {source!r}: {exc}") from None
        known = set(OPTION_KEYS.values())
        unknown = sorted(set(document) - known)
        if unknown:
            raise InvalidArgumentError(
                f"unknown key(s) {', '.join(unknown)} in credentials file {source!r}; "
                f"known: {', '.join(sorted(known))}"
            )
        if not all(isinstance(v, str) for v in document.values()):
            raise InvalidArgumentError(f"every value in credentials file {source!r} must be a string")
        return cls(**document)

    def overridden(self, options: Mapping[str, str]) -> Self:
        """These credentials with each of ``options`` (``user``, ``token``, ``tls.*``) given, and
        not empty, in place of its field."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update({OPTION_KEYS[k]: v for k, v in options.items() if k in OPTION_KEYS and v})
        return type(self)(**values)


def basic_authorization(user: str, token: str) -> str:
    """The ``authorization`` header value for ``user`` and ``token``."""
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode("ascii")
