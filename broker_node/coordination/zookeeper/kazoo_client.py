"""The kazoo client a coordinator talks to ZooKeeper through: its TLS and its digest identity.

Security (see :class:`..zookeeper_config.ZooKeeperConfig`): with ``tls_ca`` or
``tls_cert`` the connection is TLS (the server's certificate checked against
``tls_ca``, and its host name unless ``tls_check_hostname`` is off; this
broker's certificate presented).  With ``digest_user`` the session
authenticates as that digest identity and every znode the coordinator
creates, the chroot included, carries one ACL entry: all permissions for that
identity, none for anyone else.  Znodes that existed before keep their ACL (a
warning says so for the chroot, :func:`warn_if_open`).  Without either: plain
TCP, open znodes.  The digest password never reaches a log: kazoo logs its
``Auth`` requests whole, and the filter here hides them.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.protocol.serialization import Auth
from kazoo.retry import KazooRetry
from kazoo.security import make_digest_acl

from ..errors import CoordinationError
from ..zookeeper_config import ZooKeeperConfig

logger = logging.getLogger(__name__)


def new_client(settings: ZooKeeperConfig) -> KazooClient:
    """A kazoo client for ``settings``, not started: it retries its connection with backoff,
    for ever; ``CoordinationError`` naming the file when a TLS file or the digest password
    file cannot be used."""
    return KazooClient(
        hosts=settings.hosts,
        timeout=settings.session_timeout,
        connection_retry=KazooRetry(max_tries=-1, delay=0.2, max_delay=2.0),
        logger=_kazoo_logger(),
        **_security_arguments(settings),
    )


def warn_if_open(client: KazooClient, path: str) -> None:
    """Warn when ``path`` (made before digest authentication was on) is open to anyone."""
    try:
        acls, _ = client.get_acls(path)
    except KazooException:
        return
    if any(acl.id.scheme != "digest" for acl in acls):
        logger.warning(
            "%s in ZooKeeper was created before digest_user was set and is not protected by it "
            "(nor are the znodes made then): move the cluster to a new chroot, or set their ACLs",
            path,
        )


def tls_hint(tls: bool) -> str:
    """What to check when ZooKeeper over TLS cannot be reached."""
    if not tls:
        return ""
    return (
        "; over TLS: does hosts name ZooKeeper's secureClientPort, does tls_ca sign its "
        "certificate (for that host name), does it trust tls_cert? (kazoo's log has the TLS error)"
    )


def _security_arguments(settings: ZooKeeperConfig) -> dict[str, Any]:
    """KazooClient's TLS and digest arguments from the settings (none by default)."""
    arguments: dict[str, Any] = {}
    if settings.tls:
        try:
            context = ssl.create_default_context(cafile=settings.tls_ca or None)
            context.check_hostname = settings.tls_check_hostname
            if settings.tls_cert:
                context.load_cert_chain(settings.tls_cert, settings.tls_key)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise CoordinationError(
                f"cannot use the [zookeeper] TLS files (tls_ca {settings.tls_ca!r}, tls_cert "
                f"{settings.tls_cert!r}, tls_key {settings.tls_key!r}): {exc}"
            ) from None
        arguments.update(handler=_TlsHandler(context), use_ssl=True)
    if settings.digest:
        try:
            password = settings.read_digest_password()
        except ValueError as exc:
            raise CoordinationError(str(exc)) from None
        with contextlib.suppress(OSError):
            if Path(settings.digest_password_file).stat().st_mode & 0o077:
                logger.warning(
                    "the ZooKeeper digest password file %s is readable by others than its owner "
                    "(chmod 600 it)",
                    settings.digest_password_file,
                )
        user = settings.digest_user
        arguments["auth_data"] = [("digest", f"{user}:{password}")]
        arguments["default_acl"] = [make_digest_acl(user, password, all=True)]
    return arguments


class _RedactCredentials(logging.Filter):
    """Hides the credentials of the ``Auth`` requests kazoo logs whole (at DEBUG) when it sends them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, Auth) for a in record.args):
            record.args = tuple(
                a._replace(auth="<redacted>") if isinstance(a, Auth) else a for a in record.args
            )
        return True


_REDACT_CREDENTIALS = _RedactCredentials()


def _kazoo_logger() -> logging.Logger:
    """The logger the coordinator's kazoo clients log to, with credentials redacted."""
    kazoo_logger = logging.getLogger("kazoo.client")
    if _REDACT_CREDENTIALS not in kazoo_logger.filters:
        kazoo_logger.addFilter(_REDACT_CREDENTIALS)
    return kazoo_logger


class _TlsHandler(SequentialThreadingHandler):
    """kazoo's threading handler, with connections made over TLS by our own context.

    kazoo's own TLS trusts the system's CAs besides the given one, and leaves
    the socket of a failed handshake open; this trusts exactly ``tls_ca``
    (the system's CAs only without one) and closes what fails.
    """

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        self._context = context

    def create_connection(
        self,
        address: tuple[str, int],
        hostname: str | None = None,
        timeout: float | None = None,
        **ignored: Any,
    ) -> ssl.SSLSocket:
        """A connected TLS socket; kazoo's TLS arguments are ignored (the context has them)."""
        sock = socket.create_connection(address, timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return self._context.wrap_socket(sock, server_hostname=hostname)
        except BaseException:
            sock.close()  # a failed handshake closes the TLS socket itself; this is the plain one
            raise
