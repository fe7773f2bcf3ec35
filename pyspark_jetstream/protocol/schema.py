"""The Arrow schema of a stream's log: one row per message.

This schema is both the on-disk format of a segment and the wire format of a
Flight read, so what the broker stores is what a consumer receives.

Columns, in order:

==============  ==============================================  ========
column          type                                            nullable
==============  ==============================================  ========
offset          int64                                           no
timestamp       timestamp[us, tz=UTC] (log append time)         no
leader_epoch    int32                                           no
key             binary                                          yes
value           binary (null is a tombstone for compaction)     yes
headers         list<struct<key: string, value: binary>>        yes
subject         string (the NATS subject it arrived on)         yes
reply           string (the NATS reply subject, if any)         yes
producer_id     string (idempotent producer, with sequence)     yes
sequence        int64 (producer epoch << 32 | sequence)         yes
==============  ==============================================  ========

``offset``, ``timestamp`` and ``leader_epoch`` are assigned by the log; the
other columns (the *input columns*) come from the producer.  Types are the
32-bit-offset ones (``binary``, ``string``) because Spark's Arrow conversion
expects exactly those.
"""

from __future__ import annotations

import pyarrow as pa

FORMAT_VERSION = 1
"""Version of the log schema and segment layout; stored in every segment."""

COMPRESSIONS: tuple[str, ...] = ("none", "lz4", "zstd")
"""Codecs a stream may store its batches with (Arrow IPC buffer compression)."""

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

ASSIGNED_FIELDS: tuple[pa.Field, ...] = (
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
    pa.field("leader_epoch", pa.int32(), nullable=False),
)
INPUT_FIELDS: tuple[pa.Field, ...] = (
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", HEADER_TYPE),
    pa.field("subject", pa.string()),
    pa.field("reply", pa.string()),
    pa.field("producer_id", pa.string()),
    pa.field("sequence", pa.int64()),
)

LOG_SCHEMA = pa.schema(ASSIGNED_FIELDS + INPUT_FIELDS)
INPUT_SCHEMA = pa.schema(INPUT_FIELDS)
INPUT_COLUMNS: frozenset[str] = frozenset(INPUT_SCHEMA.names)
