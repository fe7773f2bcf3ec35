"""The pyspark-jetstream client: streams, publishing over NATS, reading over Arrow Flight.

``Client`` is asynchronous; ``SyncClient`` offers the same calls for scripts
and notebooks.

The names below are loaded when first used, so that a process that only reads
over Flight (a Spark task) never imports NATS's client and what it brings.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark_jetstream.protocol.ack import Ack
    from pyspark_jetstream.protocol.envelope import AckPolicy
    from pyspark_jetstream.protocol.errors import JetStreamError
    from pyspark_jetstream.protocol.read_shape import ColumnFilter

    from .client import Client
    from .cluster import ClusterConnection
    from .connection import BrokerConnection, FetchResult
    from .credentials import Credentials
    from .partitioners import RoundRobin, key_hash
    from .reading import Message
    from .sync import SyncClient

_WHERE = {
    "Ack": "pyspark_jetstream.protocol.ack",
    "AckPolicy": "pyspark_jetstream.protocol.envelope",
    "JetStreamError": "pyspark_jetstream.protocol.errors",
    "ColumnFilter": "pyspark_jetstream.protocol.read_shape",
    "Client": "pyspark_jetstream.client.client",
    "Message": "pyspark_jetstream.client.reading",
    "ClusterConnection": "pyspark_jetstream.client.cluster",
    "BrokerConnection": "pyspark_jetstream.client.connection",
    "FetchResult": "pyspark_jetstream.client.connection",
    "Credentials": "pyspark_jetstream.client.credentials",
    "RoundRobin": "pyspark_jetstream.client.partitioners",
    "key_hash": "pyspark_jetstream.client.partitioners",
    "SyncClient": "pyspark_jetstream.client.sync",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "Ack",
    "AckPolicy",
    "BrokerConnection",
    "Client",
    "ClusterConnection",
    "ColumnFilter",
    "Credentials",
    "FetchResult",
    "JetStreamError",
    "Message",
    "RoundRobin",
    "SyncClient",
    "key_hash",
]
