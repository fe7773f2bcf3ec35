"""The log's terms for ingestion: how a message becomes a record, its size, the acks of log errors.

Ingestion does not import the log (see ``docs/ARCHITECTURE.md``); the broker
hands it :data:`LOG_TERMS`, which say it in the log's own types.
"""

from __future__ import annotations

from broker_node.ingest.port import LogTerms
from broker_node.log import InvalidRecordsError, LogError, Record, RecordTooLargeError
from broker_node.log.append_input import record_size
from pyspark_jetstream.protocol.errors import ErrorCode


def append_error_code(exc: Exception) -> ErrorCode:
    """The ack error for an append that raised ``exc``, a ``LogError``."""
    if isinstance(exc, RecordTooLargeError):
        return ErrorCode.TOO_LARGE
    if isinstance(exc, InvalidRecordsError):
        return ErrorCode.INVALID_ARGUMENT
    return ErrorCode.STORAGE


LOG_TERMS = LogTerms(record=Record, size=record_size, errors=(LogError,), error_code=append_error_code)
