"""The commit log: segmented, checksummed Arrow IPC storage for one partition.

Imports nothing but pyarrow and the shared protocol schema: no NATS, no
ZooKeeper, no Flight.
"""

from .append_input import Record
from .damage import DamagedRange
from .epochs import UNDEFINED, EpochEndOffset
from .errors import (
    CorruptSegmentError,
    InvalidRecordsError,
    LogClosedError,
    LogError,
    LogStorageError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from .log import Log
from .log_config import FsyncPolicy, LogConfig
from .log_store import LogStore
from .memory import MemoryLog
from .reads import ReplicaFrame, TypedRead
from .schema_versions import stored_versions
from .typed_frames import typed_columns, typed_of

__all__ = [
    "UNDEFINED",
    "CorruptSegmentError",
    "DamagedRange",
    "EpochEndOffset",
    "FsyncPolicy",
    "InvalidRecordsError",
    "Log",
    "LogClosedError",
    "LogConfig",
    "LogError",
    "LogStorageError",
    "LogStore",
    "MemoryLog",
    "OffsetOutOfRangeError",
    "Record",
    "RecordTooLargeError",
    "ReplicaFrame",
    "TypedRead",
    "stored_versions",
    "typed_columns",
    "typed_of",
]
