"""Spark integration: the ``jetstream`` Python Data Source and a session helper."""

from .progress import offsets_behind
from .session import jetstream_session, register
from .source import JetStreamDataSource

__all__ = ["JetStreamDataSource", "jetstream_session", "offsets_behind", "register"]
