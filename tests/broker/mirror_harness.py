"""Two deployments on this machine, a source and its mirror, and the checks a mirror test makes."""

from __future__ import annotations

import pyarrow as pa

from pyspark_jetstream.client import BrokerConnection, SyncClient
from pyspark_jetstream.protocol.flight import ReadRequest, StartPosition

from .harness import wait_until

COPIED_COLUMNS = [
    "offset",
    "timestamp",
    "key",
    "value",
    "headers",
    "subject",
    "reply",
    "producer_id",
    "sequence",
]
"""Every column a mirror keeps as the source has it (all but ``leader_epoch``, the cluster's own)."""


def partition_table(address: str, stream: str, partition: int, *, from_replicas: bool = False) -> pa.Table:
    """Every committed row of one partition as the broker at ``address`` serves it, in the copied columns."""
    connection = BrokerConnection(address)
    try:
        batches: list[pa.RecordBatch] = []
        start = StartPosition("earliest")
        while True:
            result = connection.read(ReadRequest(stream, partition, start=start, from_replicas=from_replicas))
            batches += result.batches
            if result.next_offset >= result.high_watermark or not result.num_rows:
                break
            start = StartPosition("offset", result.next_offset)
    finally:
        connection.close()
    if not batches:
        return pa.table({name: [] for name in COPIED_COLUMNS})
    return pa.Table.from_batches(batches).select(COPIED_COLUMNS)


def caught_up(mirror: SyncClient, name: str, source: SyncClient, source_name: str | None = None) -> bool:
    """Whether every partition of mirror ``name`` holds everything ``source`` (a client of the source
    cluster) has committed of its stream now, with no error."""
    ends = [p.high_watermark for p in source.describe_stream(source_name or name).partitions]
    statuses = mirror.mirror_status(name)
    return len(statuses) == len(ends) and all(
        s.mirror_end == end and s.lag_messages == 0 and s.last_error is None
        for s, end in zip(statuses, ends, strict=True)
    )


def wait_caught_up(
    mirror: SyncClient, name: str, source: SyncClient, source_name: str | None = None, timeout: float = 30.0
) -> None:
    """Wait until mirror ``name`` has everything its source has (see :func:`caught_up`)."""
    wait_until(
        lambda: caught_up(mirror, name, source, source_name),
        timeout=timeout,
        message=f"mirror {name} to catch up",
    )


def assert_identical(source: str, stream: str, mirror: str, name: str, partitions: int) -> None:
    """Each partition of ``name`` at ``mirror`` holds exactly what ``stream`` at ``source`` holds."""
    for partition in range(partitions):
        theirs = partition_table(source, stream, partition)
        ours = partition_table(mirror, name, partition)
        assert ours.num_rows == theirs.num_rows, (
            f"partition {partition}: {ours.num_rows} != {theirs.num_rows}"
        )
        assert ours.equals(theirs), f"partition {partition} differs"
