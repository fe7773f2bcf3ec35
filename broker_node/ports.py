"""A port the broker cannot listen on because another process holds it, said in one line.

A second broker started on the ports of a first fails deep inside
nats-server ("bind: address already in use" in its log) or gRPC ("Server did
not start properly", naming no port).  When a listener fails to start, the
wiring asks :func:`refuse_if_taken` whether its port is held; if it is, the error the
user sees names the port, the option that sets it and the fix.  Nothing is
checked before the listeners start: a nats-server left running by a crashed
broker of the same data directory is stopped first (its pid file), and would
otherwise look like another broker.
"""

from __future__ import annotations

import errno
import socket


class PortInUseError(OSError):
    """A port the configuration names is held by another process; the message names the port,
    the option that sets it and the fix."""


def refuse_if_taken(host: str, port: int, option: str) -> None:
    """Raise :class:`PortInUseError` if another process listens on ``host:port`` (set by
    ``option``, as ``[flight] port``); the caller re-raises its own error otherwise.

    Binds the port as a listener would, with ``SO_REUSEADDR`` so that
    connections of a stopped process still in ``TIME_WAIT`` do not count, and
    lets go at once.
    """
    if port <= 0:
        return  # the system picks a free one
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror:
        return  # not a port problem: the listener's own error stands
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return
        else:
            return
    raise PortInUseError(
        f"port {port} on {host} ({option}) is in use, probably by another broker: stop that one "
        f"(Ctrl-C in its terminal), or give this one another {option}",
    )
