"""What ingestion needs from the rest of the broker, stated in its own terms.

Ingestion reaches a partition only through :class:`IngestPartition` (which
``broker_node.replication.partition.Partition`` satisfies), reads its
settings through :class:`BatchLimits` and :class:`ReconnectSettings`
(``broker_node.config``'s ``IngestConfig`` and ``NatsConfig`` satisfy them),
and speaks the log's vocabulary -- how a message becomes a record, what a
record weighs against ``max_message_bytes``, which append errors become which
ack errors -- through a :class:`LogTerms` the broker's wiring hands it.  So
ingestion imports neither the log nor the configuration: what it relies on
is written down here, once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pyspark_jetstream.protocol.ack import Ack
from pyspark_jetstream.protocol.errors import ErrorCode, JetStreamError
from pyspark_jetstream.protocol.streams import StreamConfig

MessageIds = Sequence[tuple[str, int]]
"""The message ids of records to append, ``(id, index of the record)``: the partition remembers
them with the append."""
StreamLookup = Callable[[str], StreamConfig | None]
"""A stream's configuration by name (``None``: no such stream), for ``Nats-Expected-Stream``."""
Refusal = tuple[ErrorCode, str]
"""Why a message was not stored: the ack's error and message."""


class IngestPartition(Protocol):
    """What ingestion needs of a partition.

    ``records`` are what :attr:`LogTerms.record` builds, or an Arrow table in
    the log's input columns.
    """

    stream: str
    number: int
    config: StreamConfig

    @property
    def max_batch_bytes(self) -> int: ...
    @property
    def appends_sync(self) -> bool: ...
    def append(self, records: Any, *, message_ids: MessageIds = ()) -> range: ...
    def try_append(self, records: Any, *, message_ids: MessageIds = ()) -> range | None: ...
    def append_idempotent(
        self,
        records: Any,
        producer_id: str,
        epoch: int,
        sequence: int,
        *,
        target: bool = True,
        message_ids: MessageIds = (),
        wait: bool = True,
    ) -> Ack | None: ...
    def check_min_insync(self) -> None: ...
    def when_committed(self, last_offset: int, callback: Callable[[JetStreamError | None], None]) -> None: ...
    def message_id_offset(self, message_id: str) -> int | None: ...


class BatchLimits(Protocol):
    """How messages arriving one at a time are coalesced (see :mod:`.batcher`)."""

    @property
    def max_batch_messages(self) -> int: ...
    @property
    def max_batch_bytes(self) -> int: ...
    @property
    def max_delay(self) -> float: ...


class ReconnectSettings(Protocol):
    """How the broker's NATS connection reconnects (see :mod:`.ingestor`)."""

    @property
    def reconnect_wait(self) -> float: ...
    @property
    def max_reconnect_attempts(self) -> int: ...


@dataclass(frozen=True, slots=True)
class LogTerms:
    """The log's vocabulary for what ingestion hands a partition, given by the broker's wiring."""

    record: Callable[..., Any]
    """One message as a record to append: ``record(value, key=, headers=, subject=, reply=)``."""
    size: Callable[[Any], int]
    """A record's size, as the log holds it against the stream's ``max_message_bytes``."""
    errors: tuple[type[Exception], ...]
    """The log's errors an append may raise: they become refusals (any other error goes on up)."""
    error_code: Callable[[Exception], ErrorCode]
    """The ack error for an append that raised one of :attr:`errors`."""

    @property
    def append_errors(self) -> tuple[type[Exception], ...]:
        """The errors of a failed append that become refusals: the log's, and ``JetStreamError``."""
        return (JetStreamError, *self.errors)

    def refusal(self, exc: Exception) -> ErrorCode:
        """The ack error for a failed append (one of :attr:`append_errors`)."""
        if isinstance(exc, JetStreamError):
            return exc.code
        return self.error_code(exc)


def log_fields(stream: str, partition: int) -> dict[str, object]:
    """``extra`` of a log line about one partition: the same ``stream`` and ``partition`` fields
    the rest of the broker writes, so an operator follows one partition by filtering on them."""
    return {"stream": stream, "partition": partition}
