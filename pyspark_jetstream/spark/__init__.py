"""Spark integration: the ``jetstream`` Python Data Source and a session helper."""

from .progress import offsets_behind
from .session import jetstream_session, register
from .shipping import package_zip, ship_to_executors
from .source import JetStreamDataSource

__all__ = [
    "JetStreamDataSource",
    "jetstream_session",
    "offsets_behind",
    "package_zip",
    "register",
    "ship_to_executors",
]
