"""Spark integration: the ``jetstream`` Python Data Source, session helpers and a local Spark
Connect server."""

from .local_connect import LocalConnectServer
from .progress import offsets_behind
from .session import jetstream_session, register
from .shipping import package_zip, ship_to_executors
from .source import JetStreamDataSource

__all__ = [
    "JetStreamDataSource",
    "LocalConnectServer",
    "jetstream_session",
    "offsets_behind",
    "package_zip",
    "register",
    "ship_to_executors",
]
