"""Access control: who a principal is, what it may do, and the NATS permissions that follow.

An ACL document (TOML; ``conf/secure/acl.toml`` is an example) names the
principals, how each proves who it is, and the grants::

    [users.alice]
    token_bcrypt = "$2b$10$..."      # jetstream acl hash-token prints one
    max_follow_readers = 8           # Flight follow reads open at once (0: none)

    [users.broker]
    token_bcrypt = "$2b$10$..."
    cluster = true                   # a broker: replication, controller calls, every subject

    [[grants]]
    principal = "alice"              # or "*": every authenticated principal
    streams = ["orders", "orders.*"] # shell-style patterns on stream names
    actions = ["read", "write"]

    [[grants]]
    principal = "alice"
    consumers = ["alice-*"]          # cursors of these consumer names
    actions = ["cursor"]

A principal proves its name with a bearer token (checked against
``token_bcrypt``) or with a client certificate whose subject alternative name
is the name (mutual TLS).  Once a document is loaded, everything not granted
is denied.  The actions: ``read`` (fetch, follow, describe, the live tail),
``write`` (publish to the stream's subject), ``admin`` (create, delete; on
``*``: the broker's status and preferred-leader elections) and ``cursor``
(read, store and delete the cursors of matching consumer names, which also
needs ``read`` on the stream).

Pure functions: parsing, decisions and the NATS configuration are computed
here; reading files, hashing and serving are the caller's.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidArgumentError, shown
from .streams import DISCOVERY_SUBJECT
from .tail import TAIL_PREFIX

STREAM_ACTIONS = frozenset({"read", "write", "admin"})
CONSUMER_ACTIONS = frozenset({"cursor"})
ACTIONS = STREAM_ACTIONS | CONSUMER_ACTIONS
ANYONE = "*"
PRINCIPAL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""Principal names: they become NATS user names and a token of the principal's inbox subject."""
DEFAULT_MAX_FOLLOW_READERS = 64
INBOX_ROOT = "_INBOX"
LOCKED_USER = "_nobody"
LOCKED_PASSWORD = "$2b$10$" + "." * 53
"""A bcrypt-shaped hash no password matches: the NATS login of an ACL with no token users."""
BCRYPT_PATTERN = re.compile(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}")


def inbox_prefix(principal: str) -> str:
    """The NATS inbox prefix of ``principal``: acks to it are for its subscriptions alone."""
    return f"{INBOX_ROOT}_{principal}"


def validate_principal(name: object) -> str:
    """``name`` if it is a valid principal name, else raise naming it."""
    if not isinstance(name, str) or not PRINCIPAL_PATTERN.fullmatch(name):
        raise InvalidArgumentError(
            f"principal name {shown(name)} is invalid: use 1-64 letters, digits, '_' or '-', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class User:
    """A principal the document knows."""

    name: str
    token_bcrypt: str | None = None
    cluster: bool = False
    max_follow_readers: int = DEFAULT_MAX_FOLLOW_READERS

    def __repr__(self) -> str:  # the hash is not a secret, but nothing of a credential is shown
        return f"User({self.name!r}, cluster={self.cluster})"


@dataclass(frozen=True)
class Grant:
    """Actions of one principal (or everyone) on streams or consumer names matching patterns."""

    principal: str
    actions: frozenset[str]
    streams: tuple[str, ...] = ()
    consumers: tuple[str, ...] = ()

    def covers(self, principal: str, action: str, *, stream: str | None, consumer: str | None) -> bool:
        """Whether this grant allows ``action`` for ``principal`` on ``stream`` / ``consumer``."""
        if self.principal not in (principal, ANYONE) or action not in self.actions:
            return False
        if action in CONSUMER_ACTIONS:
            return consumer is not None and _matches(consumer, self.consumers)
        return stream is not None and _matches(stream, self.streams)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


@dataclass(frozen=True)
class Acl:
    """A parsed ACL document (see the module docstring)."""

    users: Mapping[str, User] = field(default_factory=dict)
    grants: tuple[Grant, ...] = ()

    def allows(
        self, principal: str, action: str, *, stream: str | None = None, consumer: str | None = None
    ) -> bool:
        """Whether ``principal`` may do ``action`` (cluster principals may do everything)."""
        user = self.users.get(principal)
        if user is None:
            return False
        if user.cluster:
            return True
        return any(g.covers(principal, action, stream=stream, consumer=consumer) for g in self.grants)

    def is_cluster(self, principal: str) -> bool:
        """Whether ``principal`` is a broker of the cluster."""
        user = self.users.get(principal)
        return user is not None and user.cluster

    def max_follow_readers(self, principal: str) -> int:
        """How many follow reads ``principal`` may hold open at once."""
        user = self.users.get(principal)
        return user.max_follow_readers if user is not None else 0

    def nats_authorization(
        self, stream_subjects: Mapping[str, Sequence[str]], passwords: Mapping[str, str]
    ) -> dict[str, Any]:
        """The ``authorization`` block of a nats-server configuration enforcing this document.

        ``stream_subjects`` maps each stream to its partitions' subjects; ``passwords`` each
        principal to the password NATS checks (its ``token_bcrypt``: nats-server
        takes bcrypt hashes).  Brokers may publish and subscribe everywhere;
        everyone else may publish only to the subjects of streams it may write
        and to the discovery subject, and subscribe only to its own inbox
        prefix and the live tails of streams it may read.  Nobody but brokers
        may subscribe to a stream's subject, to discovery or to another's inbox.
        """
        users = []
        for name in sorted(self.users):
            user = self.users[name]
            if name not in passwords:
                continue  # a principal with no token cannot log in to NATS (a certificate alone)
            entry: dict[str, Any] = {"user": name, "password": passwords[name]}
            if user.cluster:
                entry["permissions"] = {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
            else:
                writable = sorted(
                    {
                        subject
                        for stream, subjects in stream_subjects.items()
                        if self.allows(name, "write", stream=stream)
                        for subject in subjects
                    }
                )
                readable = sorted(
                    f"{TAIL_PREFIX}.*.{stream}"
                    for stream in stream_subjects
                    if self.allows(name, "read", stream=stream)
                )
                entry["permissions"] = {
                    "publish": {"allow": [*writable, DISCOVERY_SUBJECT]},
                    "subscribe": {"allow": [f"{inbox_prefix(name)}.>", *readable]},
                }
            users.append(entry)
        if not users:  # an empty list would leave nats-server open to anyone: lock it instead
            users.append({"user": LOCKED_USER, "password": LOCKED_PASSWORD})
        return {"users": users}


def parse_acl(text: str, where: str = "the ACL") -> Acl:
    """Parse an ACL document; an error names ``where``, the entry and the bad value."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgumentError(f"{where} is not valid TOML: {exc}") from None
    unknown = sorted(set(document) - {"users", "grants"})
    if unknown:
        raise InvalidArgumentError(f"unknown table(s) {', '.join(unknown)} in {where}; known: users, grants")
    users_table = document.get("users", {})
    if not isinstance(users_table, dict):
        raise InvalidArgumentError(f"[users] of {where} must be a table of principals")
    users = {name: _user(name, entry, where) for name, entry in users_table.items()}
    grants_list = document.get("grants", [])
    if not isinstance(grants_list, list):
        raise InvalidArgumentError(f"grants of {where} must be an array of tables ([[grants]])")
    grants = tuple(_grant(i, entry, users, where) for i, entry in enumerate(grants_list))
    return Acl(users=users, grants=grants)


_USER_KEYS = {"token_bcrypt", "cluster", "max_follow_readers"}
_GRANT_KEYS = {"principal", "actions", "streams", "consumers"}


def _table(entry: object, known: set[str], here: str) -> dict[str, object]:
    """``entry`` as a table of ``known`` keys; ``InvalidArgumentError`` naming ``here`` otherwise."""
    if not isinstance(entry, dict):
        raise InvalidArgumentError(f"{here} must be a table")
    unknown = sorted(set(entry) - known)
    if unknown:
        raise InvalidArgumentError(
            f"unknown option(s) {', '.join(unknown)} in {here}; known: {', '.join(sorted(known))}"
        )
    return entry


def _user(name: str, entry: object, where: str) -> User:
    validate_principal(name)
    entry = _table(entry, _USER_KEYS, f"[users.{name}] of {where}")
    token = entry.get("token_bcrypt")
    if token is not None and (not isinstance(token, str) or not BCRYPT_PATTERN.fullmatch(token)):
        raise InvalidArgumentError(
            f"token_bcrypt of [users.{name}] in {where} is not a bcrypt hash; "
            "make one with: jetstream acl hash-token"
        )
    cluster = entry.get("cluster", False)
    if not isinstance(cluster, bool):
        raise InvalidArgumentError(f"cluster of [users.{name}] in {where} must be true or false")
    readers = entry.get("max_follow_readers", DEFAULT_MAX_FOLLOW_READERS)
    if isinstance(readers, bool) or not isinstance(readers, int) or not 0 <= readers <= 100_000:
        raise InvalidArgumentError(
            f"max_follow_readers of [users.{name}] in {where} must be 0 to 100000, got {shown(readers)}"
        )
    return User(name, token, cluster, readers)


def _grant(index: int, entry: object, users: Mapping[str, User], where: str) -> Grant:
    here = f"grant #{index + 1} of {where}"
    entry = _table(entry, _GRANT_KEYS, here)
    principal = entry.get("principal")
    if principal != ANYONE:
        validate_principal(principal)
        if principal not in users:
            raise InvalidArgumentError(f"{here} names principal {principal!r}, which is not in [users]")
    actions = entry.get("actions")
    if not isinstance(actions, list) or not actions or not all(a in ACTIONS for a in actions):
        raise InvalidArgumentError(
            f"actions of {here} must be a non-empty list of {', '.join(sorted(ACTIONS))}, "
            f"got {shown(actions)}"
        )
    streams = _patterns(entry.get("streams", []), "streams", here)
    consumers = _patterns(entry.get("consumers", []), "consumers", here)
    if set(actions) & STREAM_ACTIONS and not streams:
        raise InvalidArgumentError(
            f"{here} grants {sorted(set(actions) & STREAM_ACTIONS)} but names no streams"
        )
    if "cursor" in actions and not consumers:
        raise InvalidArgumentError(f"{here} grants 'cursor' but names no consumers")
    return Grant(str(principal), frozenset(actions), streams, consumers)


def _patterns(value: object, name: str, here: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidArgumentError(
            f"{name} of {here} must be a list of non-empty patterns, got {shown(value)}"
        )
    return tuple(value)
