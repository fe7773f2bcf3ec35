"""What a client presents to a secured deployment, and the files it reads for it.

:class:`Credentials` is :class:`pyspark_jetstream.protocol.credentials.Credentials`
(the fields, their checks, a credentials file's and options' parsing: pure,
shared with the broker) with the client's I/O: the files it names must exist
when it is made, :meth:`Credentials.load` reads a credentials file,
:meth:`Credentials.from_options` a ``credentialsFile`` option's, and the
Flight and NATS connection arguments read the TLS files.

The token is never shown: not in ``repr``, not in errors, not in logs.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyarrow import flight

from pyspark_jetstream.protocol import credentials as pure
from pyspark_jetstream.protocol.credentials import (
    CREDENTIALS_FILE_OPTION,
    OPTION_KEYS,
    REDACTED,
    basic_authorization,
)
from pyspark_jetstream.protocol.errors import InvalidArgumentError

__all__ = [
    "CREDENTIALS_FILE_OPTION",
    "OPTION_KEYS",
    "REDACTED",
    "Credentials",
    "basic_authorization",
]


class Credentials(pure.Credentials):
    """TLS material and a user's token (see the module docstring); all optional.  The TLS files
    must exist: ``InvalidArgumentError`` naming the one that does not."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for option, path in self.files().items():
            if not Path(path).is_file():
                raise InvalidArgumentError(f"{option} {path!r} is not a readable file")

    @classmethod
    def load(cls, path: str | Path) -> Credentials:
        """Credentials from a TOML file (keys as the fields); errors name the file, never a value."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read credentials file {str(path)!r}: {exc}") from None
        return cls.parse(text, str(path))

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Credentials:
        """Credentials from options (``user``, ``token``, ``tls.*``, ``credentialsFile``);
        an option given directly overrides the file's."""
        path = options.get(CREDENTIALS_FILE_OPTION)
        base = cls.load(path) if path else cls()
        return base.overridden(options)

    # ---- Flight ----------------------------------------------------------------------

    def flight_arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``pyarrow.flight.connect`` (TLS material and the auth header)."""
        arguments: dict[str, Any] = {
            name: Path(path).read_bytes() for name, path in self.flight_files().items()
        }
        if self.authorization is not None:
            arguments["middleware"] = [_BasicAuth(self.authorization)]
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
        return {**arguments, **self.nats_user()}


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
