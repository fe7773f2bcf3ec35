"""What a Python process of Spark keeps between tasks: Flight connections and a thread pool.

Spark keeps its Python workers between tasks (``spark.python.worker.reuse``,
on by default), and the driver's stream reader lives as long as its query.
A connection made once per process and kept -- its gRPC channel and the
cluster's metadata (who leads what) -- saves each task a connect and a
metadata round trip, leaving one round trip: the read.

A kept connection is found by everything it was made from: the broker
addresses given, the timeouts, and the credentials (with the size and
modification time of their TLS files, so a certificate renewed in place is
a new key).  A query with other credentials, or pointed at brokers
elsewhere, therefore never uses another query's connection.  A broker that
moved while its connection was kept is found again by the connection itself:
a call that finds it unreachable, or no longer leading, refreshes the
cluster's metadata and retries (see :class:`ClusterConnection`).  At most
:data:`KEPT` connections are kept, the least recently used dropped first.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from pyspark_jetstream.client.cluster import ClusterConnection
from pyspark_jetstream.client.credentials import Credentials

KEPT = 8
"""Connections kept per process (distinct broker addresses, timeouts and credentials)."""
READ_THREADS = 4
"""Threads of the process's read pool: a task's ranges are fetched this many at once."""


class FileStamp(NamedTuple):
    """A file as it is now: a file replaced or rewritten in place has another stamp."""

    path: str
    size: int
    modified_ns: int


class ConnectionKey(NamedTuple):
    """Everything a kept connection was made from."""

    servers: str
    timeout: float
    connect_timeout: float | None
    credentials: Credentials
    files: tuple[FileStamp | None, ...]


class _Kept:
    """This process's connections and read pool.  A process forked from one that had them starts
    with none (a gRPC channel and threads do not survive a fork)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.connections: OrderedDict[ConnectionKey, ClusterConnection] = OrderedDict()
        self.pool: ThreadPoolExecutor | None = None

    def here(self) -> _Kept:
        """Itself, emptied first if this is another process than the one that filled it (call
        with :attr:`lock` held)."""
        if self.pid != os.getpid():
            self.pid = os.getpid()
            self.connections = OrderedDict()
            self.pool = None
        return self


_kept = _Kept()


def _stamp(path: str | None) -> FileStamp | None:
    if path is None:
        return None
    try:
        found = os.stat(path)
    except OSError:
        return FileStamp(path, -1, -1)  # the connection made with it fails and says why
    return FileStamp(path, found.st_size, found.st_mtime_ns)


def connection_key(
    servers: str, credentials: Credentials | None, timeout: float, connect_timeout: float | None = None
) -> ConnectionKey:
    """The key of the connection to ``servers`` with ``credentials`` and the timeouts."""
    given = credentials if credentials is not None else Credentials()
    files = tuple(_stamp(p) for p in (given.tls_ca, given.tls_cert, given.tls_key))
    return ConnectionKey(servers, timeout, connect_timeout, given, files)


def shared_connection(
    servers: str,
    credentials: Credentials | None = None,
    timeout: float = 30.0,
    connect_timeout: float | None = None,
) -> ClusterConnection:
    """This process's connection to ``servers`` with ``credentials``, ``timeout`` and
    ``connect_timeout`` (see :class:`ClusterConnection`), made on first use.  Safe from any thread;
    the connection itself serves several threads at once."""
    key = connection_key(servers, credentials, timeout, connect_timeout)
    with _kept.lock:
        kept = _kept.here().connections
        found = kept.get(key)
        if found is not None:
            kept.move_to_end(key)
            return found
    made = ClusterConnection(
        servers, timeout=timeout, connect_timeout=connect_timeout, credentials=key.credentials
    )
    with _kept.lock:
        kept = _kept.here().connections
        found = kept.setdefault(key, made)
        kept.move_to_end(key)
        while len(kept) > KEPT:
            # Dropped, not closed: a thread may still be reading through it (its channel closes
            # when the last reference goes).
            kept.popitem(last=False)
    if found is not made:
        made.close()  # another thread made the same one first
    return found


def kept_keys() -> list[ConnectionKey]:
    """The keys of the connections kept now, least recently used first."""
    with _kept.lock:
        return list(_kept.here().connections)


def forget_connections() -> None:
    """Close and drop every kept connection (a process about to end, or a test's clean slate)."""
    with _kept.lock:
        connections = list(_kept.here().connections.values())
        _kept.connections.clear()
    for connection in connections:
        connection.close()


def read_pool() -> ThreadPoolExecutor:
    """This process's pool for reads fetched ahead and side by side, made on first use."""
    with _kept.lock:
        kept = _kept.here()
        if kept.pool is None:
            kept.pool = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="jetstream-read")
        return kept.pool
