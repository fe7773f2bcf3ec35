"""Connecting a command to the deployment: credentials, a bounded connect, errors explained."""

from __future__ import annotations

import argparse
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark_jetstream.client import Credentials, SyncClient
from pyspark_jetstream.protocol.errors import (
    JetStreamError,
    PermissionDeniedError,
    RequestTimeoutError,
    UnauthenticatedError,
    UnavailableError,
)

CONNECT_ATTEMPTS = 4
RECONNECT_WAIT = 2.0
"""The client tries NATS up to ``CONNECT_ATTEMPTS`` times, each up to ``--timeout``, this far
apart: a connection that takes longer than all of them hangs, and the command gives up on it."""
FATAL_NATS_ERRORS = ("authorization violation", "certificate verify failed")
"""What NATS (or the TLS handshake) says when trying again cannot help: the command stops at once."""
CREDENTIALS_HINT = "give --user and --token (or $JETSTREAM_TOKEN), or --credentials FILE"


def credential_options(args: argparse.Namespace) -> dict[str, str]:
    """The credentials given on the command line or in the environment, as options."""
    given = {
        "user": args.user,
        "token": args.token,
        "tls.ca": args.tls_ca,
        "tls.cert": args.tls_cert,
        "tls.key": args.tls_key,
        "credentialsFile": args.credentials,
    }
    return {name: value for name, value in given.items() if value}


@contextmanager
def connect(
    args: argparse.Namespace, credentials: Credentials, nats_errors: list[str]
) -> Iterator[SyncClient]:
    """A client of the deployment, or the error that prevented one.

    The connection is made in a thread of its own so that a NATS server that
    never completes the handshake (a TLS certificate this machine does not
    trust makes nats-py retry without end) cannot hang the command, and so
    that a refusal no retry can change (``FATAL_NATS_ERRORS``) ends it at once.
    """
    made: list[SyncClient | Exception] = []

    def connect() -> None:
        try:
            made.append(
                SyncClient(
                    nats_urls=args.nats, broker=args.broker, timeout=args.timeout, credentials=credentials
                )
            )
        except Exception as exc:  # noqa: BLE001 - handed to the main thread, which raises it
            made.append(exc)

    thread = threading.Thread(target=connect, name="jetstream-connect", daemon=True)
    thread.start()
    started = time.monotonic()
    deadline = started + CONNECT_ATTEMPTS * (args.timeout + RECONNECT_WAIT)
    while not made and time.monotonic() < deadline:
        if any(fatal in e.lower() for e in nats_errors for fatal in FATAL_NATS_ERRORS):
            break  # nats-py would try again, and be refused again
        thread.join(0.05)
    if not made:
        waited = time.monotonic() - started
        raise UnavailableError(f"no connection to NATS at {args.nats} after {waited:.0f}s")
    if isinstance(made[0], Exception):
        raise made[0]
    with made[0] as client:
        yield client


class _Collect(logging.Handler):
    """Keeps the messages of what the client logs about NATS (its refusals, TLS failures)."""

    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


@contextmanager
def collect_nats_errors(verbose: bool) -> Iterator[list[str]]:
    """The client's logged warnings while the command runs (shown only with ``--verbose``)."""
    logger = logging.getLogger("pyspark_jetstream.client")
    collected: list[str] = []
    handler = _Collect(collected)
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    logger.propagate = verbose
    try:
        yield collected
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def explained(
    exc: JetStreamError, args: argparse.Namespace, credentials: Credentials, nats_errors: list[str]
) -> JetStreamError:
    """``exc`` with what NATS said and what to give, when credentials are the cause."""
    said = " ".join([*nats_errors, str(exc)]).lower()
    where = f"NATS at {args.nats}"
    if isinstance(exc, UnauthenticatedError):
        return UnauthenticatedError(f"{exc}: {CREDENTIALS_HINT}" if credentials.user is None else str(exc))
    if isinstance(exc, RequestTimeoutError):
        refused = re.search(r'permissions violation for publish to "([^"]+)"', said)
        if refused:
            who = f"user {credentials.user!r}" if credentials.user else "this client"
            return PermissionDeniedError(
                f"{where} refused to let {who} publish to {refused[1]!r}: "
                "it needs a 'write' grant on the stream"
            )
        return exc
    if "authorization violation" in said:
        if credentials.user is None:
            return UnauthenticatedError(f"{where} needs a user and token: {CREDENTIALS_HINT}")
        return UnauthenticatedError(f"{where} refused user {credentials.user!r}: wrong user or token")
    if "certificate verify failed" in said:
        if credentials.tls_ca is None:
            return UnavailableError(
                f"{where} uses TLS with a certificate this machine does not trust: give --tls-ca FILE "
                "(the CA that signed the brokers' certificates), or tls_ca in --credentials FILE"
            )
        return UnavailableError(
            f"{where} presents a certificate not signed by the CA in {credentials.tls_ca!r} (--tls-ca)"
        )
    if "tls" in said and credentials.tls_ca is None:
        return UnavailableError(f"{exc}; if the deployment uses TLS, give --tls-ca FILE")
    if args.broker and str(exc).startswith("cannot connect to NATS"):
        # The broker was given, so the user may not expect NATS to matter.
        return UnavailableError(
            f"{exc} (every command connects to NATS as well as to the broker at {args.broker}: "
            "give --nats URL or $JETSTREAM_NATS where NATS runs)"
        )
    return exc
