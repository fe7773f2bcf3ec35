"""Which stream and partition a log line is about.

The log does not know streams; whoever opens one (the broker) names it with
:class:`Labels`, and every line the log and its segments write then starts
with ``stream/partition:`` and carries ``stream`` and ``partition`` on the
log record (``extra``), which ``--log-format json`` writes as fields.  The
rest of the broker uses the same labels for its lines about a partition, so
an operator can follow one partition through ingestion, replication,
retention and recovery by filtering on two fields.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Labels:
    """A stream and, for lines about one partition, its number (``None``: not known or not one)."""

    stream: str | None = None
    partition: int | None = None

    @property
    def fields(self) -> dict[str, object]:
        """The labels that are set, as ``extra=`` for a logging call."""
        fields: dict[str, object] = {}
        if self.stream is not None:
            fields["stream"] = self.stream
        if self.partition is not None:
            fields["partition"] = self.partition
        return fields

    @property
    def prefix(self) -> str:
        """``stream/partition: `` (or ``stream: ``), or nothing without a stream."""
        if self.stream is None:
            return ""
        if self.partition is None:
            return f"{self.stream}: "
        return f"{self.stream}/{self.partition}: "

    def bind(self, logger: logging.Logger) -> logging.LoggerAdapter[logging.Logger]:
        """``logger``, writing each line with these labels (prefix and fields)."""
        return _Labelled(logger, self)


NO_LABELS = Labels()
"""A log nobody named (tests, tools): its lines name only its directory."""


class _Labelled(logging.LoggerAdapter[logging.Logger]):
    def __init__(self, logger: logging.Logger, labels: Labels) -> None:
        super().__init__(logger, labels.fields)
        # The message is a %-format string: a '%' in a label must stay literal.
        self._prefix = labels.prefix.replace("%", "%%")

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return (f"{self._prefix}{msg}" if self._prefix else msg), kwargs
