"""Who is calling, and whether they may: the broker's side of ``[security]``.

:class:`AccessControl` holds the ACL in force (see
:mod:`pyspark_jetstream.protocol.acl`).  With no ``acl_file`` everything is
allowed, as before security existed.  With one, every Flight call must carry
credentials: ``authorization: Basic`` with a user and its token (checked
against the user's bcrypt hash; a success is remembered as a SHA-256 of the
pair, so bcrypt's cost is paid once per token), or a client certificate
whose subject alternative name is a known principal (mutual TLS).  Denials
are one-line errors naming the principal, the action and the stream, logged
at WARNING without any credential.

The document comes from the file (re-read when its modification time or size
changes, checked at most once a second) or, in a cluster, from ZooKeeper
(every broker enforces the text stored there; :meth:`AccessControl.use_text`).
A document that fails to parse is logged and the previous one stays in force.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark_jetstream.protocol.acl import Acl, parse_acl
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    LimitExceededError,
    PermissionDeniedError,
    UnauthenticatedError,
)

logger = logging.getLogger(__name__)

RELOAD_CHECK_SECONDS = 1.0
ANONYMOUS = "anonymous"
"""The principal of every call when no ACL is configured."""


class AccessControl:
    """The ACL in force, authentication of calls, and the checks (see the module docstring)."""

    def __init__(
        self,
        acl_file: str = "",
        *,
        on_change: Callable[[], None] = lambda: None,
        reload: bool = True,
        publish: Callable[[str], None] | None = None,
    ) -> None:
        """``publish``: in a cluster, where an edited file's text goes (ZooKeeper), to come back
        to every broker through :meth:`offer_text`; without it the edit is enforced here."""
        self.acl_file = Path(acl_file) if acl_file else None
        self._on_change = on_change
        self._publish = publish
        self._reload = reload
        self._lock = threading.Lock()
        self._acl: Acl | None = None
        self._text: str | None = None
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self._verified: dict[bytes, str] = {}
        self._follows: dict[str, int] = {}
        if self.acl_file is not None:
            text = self._read_file()
            self.use_text(text, where=str(self.acl_file))  # a bad file stops start-up, naming it

    @property
    def enabled(self) -> bool:
        """Whether an ACL is configured (calls need credentials; everything not granted is denied)."""
        return self.acl_file is not None or self._acl is not None

    @property
    def acl(self) -> Acl | None:
        """The document in force (``None``: everything allowed)."""
        self._maybe_reload()
        return self._acl

    @property
    def text(self) -> str | None:
        """The text of the document in force."""
        return self._text

    def use_text(self, text: str, where: str = "the ACL") -> None:
        """Enforce ``text`` from now on; raises ``InvalidArgumentError`` (naming ``where``) if it is bad."""
        acl = parse_acl(text, where)
        with self._lock:
            changed = text != self._text
            self._acl, self._text = acl, text
            self._verified.clear()
        if changed:
            logger.info(
                "access control: enforcing %s (%d users, %d grants)", where, len(acl.users), len(acl.grants)
            )
            self._on_change()

    def offer_text(self, text: str | None, where: str) -> None:
        """Like :meth:`use_text`, but a bad document (or none) is logged and the current one kept."""
        if text is None:
            return
        try:
            self.use_text(text, where)
        except InvalidArgumentError as exc:
            logger.error("access control: keeping the ACL in force; %s", exc)

    def adopt_cluster_text(self, text: str | None) -> None:
        """The cluster's stored ACL changed, or is first read (any thread): enforce it, as every
        broker does.  None stored yet: this broker's document becomes the cluster's (``publish``)."""
        if text is None:
            if self._text is not None and self._publish is not None:
                self._publish(self._text)
            return
        self.offer_text(text, "the ACL in ZooKeeper")

    def _read_file(self) -> str:
        assert self.acl_file is not None
        try:
            stat = self.acl_file.stat()
            text = self.acl_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read the ACL file {self.acl_file}: {exc}") from None
        self._stamp = (stat.st_mtime_ns, stat.st_size)
        return text

    def _maybe_reload(self) -> None:
        if self.acl_file is None or not self._reload:
            return
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_SECONDS:
            return
        self._checked = now
        try:
            stat = self.acl_file.stat()
        except OSError as exc:
            logger.error("access control: cannot read %s (%s); keeping the ACL in force", self.acl_file, exc)
            return
        if (stat.st_mtime_ns, stat.st_size) == self._stamp:
            return
        try:
            text = self._read_file()
            parse_acl(text, str(self.acl_file))
        except InvalidArgumentError as exc:
            logger.error("access control: %s; keeping the ACL in force", exc)
            return
        if self._publish is None:
            self.offer_text(text, str(self.acl_file))
            return
        try:
            self._publish(text)
        except Exception as exc:  # noqa: BLE001 - a coordinator's failure: kept, retried, logged
            logger.error("access control: cannot store the edited %s for the cluster: %s", self.acl_file, exc)
            self._stamp = None  # try again at the next check

    # ---- authentication ----------------------------------------------------------------

    def authenticate(self, authorization: str | None, peer_identity: str) -> str:
        """The principal making a call: from its ``authorization`` header, else its client
        certificate (``peer_identity``); raises ``UnauthenticatedError`` when the ACL needs one."""
        acl = self.acl
        if acl is None:
            return ANONYMOUS
        if authorization:
            return self._check_basic(acl, authorization)
        if peer_identity and peer_identity in acl.users:
            return peer_identity
        if peer_identity:
            raise UnauthenticatedError(f"client certificate {peer_identity!r} names no principal of the ACL")
        raise UnauthenticatedError(
            "this broker needs credentials: a user and token (user/token options, or a credentials "
            "file) or a client certificate"
        )

    def _check_basic(self, acl: Acl, authorization: str) -> str:
        scheme, _, encoded = authorization.partition(" ")
        try:
            user, _, token = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            user, token = "", ""
        if scheme.lower() != "basic" or not user or not token:
            raise UnauthenticatedError("malformed authorization header: expected Basic with user:token")
        key = hashlib.sha256(f"{user}\0{token}".encode()).digest()
        with self._lock:
            known = self._verified.get(key)
        if known is not None:
            return known
        entry = acl.users.get(user)
        if entry is None or entry.token_bcrypt is None or not _bcrypt_matches(token, entry.token_bcrypt):
            logger.warning("access control: refused credentials for user %r", user)
            raise UnauthenticatedError(f"wrong user or token (user {user!r})")
        with self._lock:
            self._verified[key] = user
        return user

    # ---- authorization -----------------------------------------------------------------

    def check(
        self, principal: str, action: str, *, stream: str | None = None, consumer: str | None = None
    ) -> None:
        """Raise ``PermissionDeniedError`` (and log it) unless ``principal`` may do ``action``."""
        acl = self.acl
        if acl is None or acl.allows(principal, action, stream=stream, consumer=consumer):
            return
        what = f"stream {stream!r}" if stream is not None else "the cluster"
        if consumer is not None:
            what = f"consumer {consumer!r}"
        message = f"principal {principal!r} may not {action} {what}"
        logger.warning(
            "access control: denied: %s", message, extra={"principal": principal, "action": action}
        )
        raise PermissionDeniedError(message, principal=principal, action=action, stream=stream)

    def allows(self, principal: str, action: str, *, stream: str) -> bool:
        """Whether ``principal`` may do ``action`` on ``stream`` (for filtering lists)."""
        acl = self.acl
        return acl is None or acl.allows(principal, action, stream=stream)

    def check_cluster(self, principal: str, what: str) -> None:
        """Raise unless ``principal`` is a broker of the cluster (replication, controller calls)."""
        acl = self.acl
        if acl is None or acl.is_cluster(principal):
            return
        message = f"principal {principal!r} may not {what}: only brokers may"
        logger.warning("access control: denied: %s", message, extra={"principal": principal, "action": what})
        raise PermissionDeniedError(message, principal=principal, action=what)

    def open_follow(self, principal: str) -> Callable[[], None]:
        """Count a follow read of ``principal``; raise ``LimitExceededError`` past its limit.
        Returns the function that ends it."""
        acl = self.acl
        limit = acl.max_follow_readers(principal) if acl is not None else None
        with self._lock:
            open_now = self._follows.get(principal, 0)
            if limit is not None and open_now >= limit:
                raise LimitExceededError(
                    f"principal {principal!r} has {open_now} follow reads open, its limit "
                    f"(max_follow_readers) is {limit}; close one first"
                )
            self._follows[principal] = open_now + 1

        def close() -> None:
            with self._lock:
                self._follows[principal] -= 1

        return close

    def nats_config(self, stream_subjects: Mapping[str, Sequence[str]], tls: Mapping[str, Any] | None) -> str:
        """A nats-server configuration enforcing the ACL (users, permissions) and ``tls``."""
        blocks: dict[str, Any] = {}
        acl = self.acl
        if acl is not None:
            passwords = {name: u.token_bcrypt for name, u in acl.users.items() if u.token_bcrypt is not None}
            blocks["authorization"] = acl.nats_authorization(stream_subjects, passwords)
        if tls:
            blocks["tls"] = dict(tls)
        return "".join(f"{name}: {json.dumps(value, indent=2)}\n" for name, value in blocks.items())


def _bcrypt_matches(token: str, hashed: str) -> bool:
    import bcrypt

    return bool(bcrypt.checkpw(token.encode(), hashed.encode()))


def hash_token(token: str) -> str:
    """A bcrypt hash of ``token`` for an ACL file's ``token_bcrypt``."""
    import bcrypt

    return bcrypt.hashpw(token.encode(), bcrypt.gensalt(10)).decode()
