"""The NATS connection of a client: connecting, its errors, and finding a broker through it.

nats-py reports each failed connect attempt, each lost connection and each
message dropped for a slow subscription to one error callback;
:class:`NatsErrors` is that callback.  While connecting it keeps the errors,
so that a failed connect raises its cause once (``UnauthenticatedError`` for
refused credentials, ``UnavailableError`` naming the cause otherwise) instead
of logging it; afterwards it logs each error on a line and hands it to the
client's own handler (the publisher's, which fails publishes NATS refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.errors import SlowConsumerError

from pyspark_jetstream.protocol.errors import UnauthenticatedError, UnavailableError
from pyspark_jetstream.protocol.streams import DISCOVERY_SUBJECT

from .credentials import Credentials

logger = logging.getLogger(__name__)

_TLS_EOF_WARNING = "returning true from eof_received() has no effect when using ssl"


def _not_the_tls_eof_warning(record: logging.LogRecord) -> bool:
    """asyncio's warning when a NATS connection over TLS reaches its end.

    nats-py opens a plain connection and upgrades it to TLS (NATS sends its INFO
    line first), so its stream protocol answers the end of the connection as a
    plain one would; asyncio then closes it as it should, and says so on stderr
    at every client's exit.  Only that line is dropped.
    """
    return record.msg != _TLS_EOF_WARNING


logging.getLogger("asyncio").addFilter(_not_the_tls_eof_warning)


async def discover_broker(
    nats_urls: Sequence[str], *, timeout: float = 10.0, credentials: Credentials | None = None
) -> str:
    """The Flight address of a broker that answers on NATS at ``nats_urls``."""
    nc = await connect_nats(list(nats_urls), timeout, credentials or Credentials())
    try:
        return await ask_for_broker(nc, list(nats_urls), timeout)
    finally:
        await nc.close()


class _SlowConsumerLog:
    """Messages NATS dropped for a slow subscription, logged once per ``every`` seconds."""

    every = 10.0

    def __init__(self) -> None:
        self.dropped = 0
        self.logged_at = -math.inf

    def note(self, error: Exception) -> None:
        self.dropped += 1
        now = time.monotonic()
        if now - self.logged_at >= self.every:
            logger.warning(
                "NATS dropped %d message(s) for a slow subscription (%s); a live tail reads what it "
                "missed over Flight",
                self.dropped,
                getattr(error, "subject", "?"),
            )
            self.logged_at, self.dropped = now, 0


_slow_consumers = _SlowConsumerLog()


async def _log_nats_error(error: Exception) -> None:
    """Log an error nats-py reports (a failed connect attempt, a lost connection, a slow consumer).

    nats-py's default callback logs each with its traceback: four of them for
    one unreachable server.  A line each is enough; an error that fails a call
    is raised by that call.  Slow-consumer drops (one error per message) are
    summed up every ten seconds.
    """
    if isinstance(error, SlowConsumerError):
        _slow_consumers.note(error)
        return
    logger.warning("NATS: %s", str(error) or type(error).__name__)


class NatsErrors:
    """nats-py's error callback: while connecting, keeps the errors (the cause of a failed
    connect is raised once, not logged); afterwards logs each and hands it to the client's
    own handler."""

    def __init__(self) -> None:
        self.last: Exception | None = None
        self.handler: Callable[[Exception], None] | None = None
        self.final = False
        """Set on an error no later attempt can change: refused credentials, an untrusted certificate."""

    async def report(self, error: Exception) -> None:
        """The callback (a coroutine function, as nats-py requires).

        While connecting, a final error is raised from here: nats-py awaits this
        callback inside ``connect``'s own error handling, so ``connect`` ends with
        it, at once and without being cancelled half-way through a TLS upgrade
        (which would leave its socket open).
        """
        if self.handler is None:
            # A final error is kept over what follows it: the server closes the connection after
            # its -ERR, so the next attempt (or this one's write) may only see a reset.
            if not self.final:
                self.last = error
            logger.debug("NATS, while connecting: %s", str(error) or type(error).__name__)
            if _is_refusal(error) or "certificate verify failed" in str(error).lower():
                self.final = True
                raise _GiveUpError from error
            return
        self.last = error
        self.handler(error)
        await _log_nats_error(error)


class _GiveUpError(Exception):
    """Raised through nats-py's connect to end it on an error no retry can change."""


def _is_refusal(error: Exception) -> bool:
    """Whether nats-server refused the connection's credentials."""
    return "authorization violation" in str(error).lower()


async def connect_nats(
    urls: list[str], timeout: float, credentials: Credentials, errors: NatsErrors | None = None
) -> NatsClient:
    """A NATS connection, or the error that prevented it: ``UnauthenticatedError`` as soon as
    the server refuses the credentials, ``UnavailableError`` naming the cause otherwise."""
    errors = errors if errors is not None else NatsErrors()
    nc = NatsClient()
    connecting = asyncio.ensure_future(
        nc.connect(
            servers=urls,
            connect_timeout=timeout,  # type: ignore[arg-type]  # nats-py takes seconds as a float
            max_reconnect_attempts=3,
            error_cb=errors.report,
            **credentials.nats_arguments(),
        )
    )
    # Bounded as a whole: a failed TLS handshake makes nats-py retry without end.  The
    # cancellation is the last resort; a refusal ends connect itself (NatsErrors.report).
    done, _ = await asyncio.wait({connecting}, timeout=timeout * 2)
    if not done:
        connecting.cancel()
        await asyncio.wait({connecting})
    failure = None if connecting.cancelled() else connecting.exception()
    if failure is None and not connecting.cancelled():
        return nc
    last = errors.last
    await drop_transport(nc)
    if last is not None and _is_refusal(last):
        raise UnauthenticatedError(_refusal_message(urls, credentials)) from None
    cause = last if last is not None else failure or TimeoutError()
    raise UnavailableError(
        f"cannot connect to NATS at {', '.join(urls)}: {str(cause) or type(cause).__name__}"
        f"{_nats_hint(str(cause))}"
    ) from None


async def drop_transport(nc: NatsClient) -> None:
    """Close the socket of a connect that failed on its last attempt.

    nats-py closes the sockets of the attempts it retries, not that of the
    attempt that raised; its ``close()`` would flush to the dead socket first.
    """
    transport = nc._transport  # nats-py offers no other way to it
    if transport is None:
        return
    writer = getattr(transport, "_io_writer", None)
    # A failed TLS upgrade has closed the socket already, and its writer never learns it.
    closed = writer is None or writer.transport.is_closing()
    transport.close()
    if not closed:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(transport.wait_closed(), 1.0)


def _refusal_message(urls: list[str], credentials: Credentials) -> str:
    where = ", ".join(urls)
    if credentials.user is None:
        return f"NATS at {where} needs a user and token, and none were given"
    return f"NATS at {where} refused user {credentials.user!r}: wrong user or token (Authorization Violation)"


def _nats_hint(cause: str) -> str:
    """What to do about a failed NATS connect, judged from its cause."""
    lowered = cause.lower()
    if "certificate" in lowered or "ssl" in lowered:
        return " (a TLS problem: give the CA that signed the server's certificate as tls.ca)"
    return "; is a broker or nats-server running there?"


async def ask_for_broker(nc: NatsClient, urls: list[str], timeout: float) -> str:
    try:
        reply = await nc.request(DISCOVERY_SUBJECT, b"", timeout=timeout)
        address: str = json.loads(reply.data)["flight"]
    except (NatsError, TimeoutError, ValueError, KeyError, TypeError) as exc:
        raise UnavailableError(
            f"no pyspark-jetstream broker answered on NATS at {', '.join(urls)} "
            f"({exc or type(exc).__name__}); start one with 'jetstream broker start' or pass broker='grpc://host:port'"
        ) from None
    return address
