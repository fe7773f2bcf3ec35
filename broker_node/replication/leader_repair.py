"""A leader's damaged ranges, repaired from an in-sync follower.

A follower repairs its own damage from its leader as it fetches (see
``fetcher``).  A leader has nobody to fetch from, so the maintenance pass
asks its in-sync followers instead: a replica fetch sent to a follower by
its own leader, which the follower answers with its stored frames below its
high watermark, byte for byte (a typed stream's typed columns with them, so
the repaired leader stays identical to its followers), and writes the copy
back with ``Log.repair``.  A follower of a version without that answer
refuses it as not leading; then the range of a stream without a schema is
read with the consumers' Flight read (``from_replicas``) as rows (a typed
stream never has such a follower: a schema is refused while one is live).
Every damaged range of
the log goes in one call, since a segment is rewritten whole.  A follower
that cannot give a good copy (its own range is damaged too, or it is
behind) is skipped; the next pass tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import flight

from broker_node.log import LogError, ReplicaFrame
from broker_node.log.damage import DamagedRange
from broker_node.log.logging_labels import Labels
from broker_node.log.typed_frames import frames_in_range
from pyspark_jetstream.protocol.errors import (
    JetStreamError,
    NotLeaderError,
    OffsetOutOfRangeError,
    UnavailableError,
)
from pyspark_jetstream.protocol.flight import ReadRequest, StartPosition, error_from_message
from pyspark_jetstream.protocol.replication import ReplicaFetch
from pyspark_jetstream.protocol.schema import LOG_SCHEMA

from .fetcher import stored_frames
from .partition import Partition, Role

logger = logging.getLogger(__name__)

READ_TIMEOUT = 10.0
COPY_BYTES = 64 * 1024 * 1024
"""The most stored bytes asked of a follower for one damaged range (a segment's worth)."""


def repair_leader(
    partition: Partition,
    address_of: Callable[[str], str | None],
    *,
    connect: Callable[[str], flight.FlightClient] = flight.connect,
) -> list[DamagedRange]:
    """Repair what is damaged in a leader's log from one of its in-sync followers; return what
    was repaired (nothing if it does not lead, holds no damage, or no follower could help)."""
    if partition.role is not Role.LEADER:
        return []
    damaged = partition.log.damaged
    if not damaged:
        return []
    log = Labels(partition.stream, partition.number).bind(logger)
    for replica in partition.isr:
        if replica == partition.broker_id:
            continue
        address = address_of(replica)
        if address is None:
            continue
        try:
            copies = _copy_ranges(connect(address), partition, damaged)
            fixed = partition.log.repair(copies)
        except (flight.FlightError, JetStreamError, LogError, pa.ArrowException, ValueError) as exc:
            log.warning("cannot repair offsets from %s yet: %s", replica, exc)
            continue
        for repaired in fixed:
            log.warning(
                "repaired offsets %d to %d from in-sync follower %s",
                repaired.first_offset,
                repaired.last_offset,
                replica,
            )
        return fixed
    return []


def _copy_ranges(
    client: flight.FlightClient,
    partition: Partition,
    damaged: Sequence[DamagedRange],
) -> list[pa.Buffer] | list[pa.RecordBatch]:
    """Each damaged range as the follower ``client`` reaches stores it: its frames, or (from a
    follower without the leader's repair fetch) its rows, one batch per range."""
    try:
        try:
            return _frames_of_ranges(client, partition, damaged)
        except NotLeaderError:
            # A follower of an older version has no repair fetch (nor could it hold a typed
            # stream: the controller refuses a schema while such a broker is live).  So a typed
            # stream's refusal is this follower's view of the leadership lagging: the next pass.
            if partition.config.schema is not None:
                raise
            return _read_ranges(client, partition, damaged)
    finally:
        client.close()


def _frames_of_ranges(
    client: flight.FlightClient, partition: Partition, damaged: Sequence[DamagedRange]
) -> list[pa.Buffer]:
    """Each damaged range's frames as the in-sync follower ``client`` reaches stores them."""
    copies: list[pa.Buffer] = []
    for hole in damaged:
        first, last = hole.first_offset, hole.last_offset
        request = ReplicaFetch(
            partition.stream,
            partition.number,
            partition.broker_id,
            first,
            partition.state.leader_epoch,
            COPY_BYTES,
            0.0,
        )
        options = flight.FlightCallOptions(timeout=READ_TIMEOUT)
        try:
            table = client.do_get(flight.Ticket(request.to_ticket()), options).read_all()
        except flight.FlightError as exc:
            known = error_from_message(str(exc), getattr(exc, "extra_info", None))
            raise known or exc from None
        part = frames_in_range(stored_frames(table), first, last, partition.log.config.compression)
        if not part:
            raise ValueError(f"the follower holds nothing of offsets {first} to {last} yet")
        copies += part
    return copies


def _read_ranges(
    client: flight.FlightClient, partition: Partition, damaged: Sequence[DamagedRange]
) -> list[pa.RecordBatch]:
    """Each damaged range as the follower ``client`` reaches stores it, one batch per range."""
    copies = []
    for hole in damaged:
        first, last = hole.first_offset, hole.last_offset
        request = ReadRequest(
            partition.stream,
            partition.number,
            StartPosition("offset", first),
            max_records=last - first + 1,
            columns=tuple(LOG_SCHEMA.names),  # the log's columns only, a typed stream's too
            from_replicas=True,
        )
        options = flight.FlightCallOptions(timeout=READ_TIMEOUT)
        table = client.do_get(flight.Ticket(request.to_ticket()), options).read_all()
        table = pa.Table.from_arrays(table.columns, schema=LOG_SCHEMA)
        offsets = table.column("offset")
        table = table.filter(pc.and_(pc.greater_equal(offsets, first), pc.less_equal(offsets, last)))
        if table.num_rows == 0:
            raise ValueError(f"the follower holds nothing of offsets {first} to {last} yet")
        copies.append(table.combine_chunks().to_batches()[0])
    return copies


def repair_copy(
    partition: Partition, leader: str, leader_epoch: int, start: int, max_bytes: int
) -> list[ReplicaFrame]:
    """``partition``'s stored frames (it is an in-sync follower) from ``start`` on, below its high
    watermark, byte for byte (a typed batch's typed columns with them), for its leader ``leader``
    to repair a damaged range of its own log (see :func:`repair_leader`); nothing is recorded.

    ``NotLeaderError`` if the asker does not lead this partition in ``leader_epoch`` as
    this replica knows it, ``UnavailableError`` if this replica is not in sync,
    ``OffsetOutOfRangeError`` if ``start`` is not below its high watermark."""
    state = partition.state
    if partition.role is not Role.FOLLOWER or leader != state.leader or leader_epoch != state.leader_epoch:
        raise NotLeaderError(
            f"{leader} asks for a repair copy of {partition.stream}/{partition.number} in leader epoch "
            f"{leader_epoch}, but broker {partition.broker_id} is {partition.role.value} there with "
            f"{state.leader} leading in epoch {state.leader_epoch}",
            stream=partition.stream,
            partition=partition.number,
        )
    where = f"{partition.stream}/{partition.number}"
    if partition.broker_id not in state.isr:
        raise UnavailableError(
            f"broker {partition.broker_id} is not in sync for {where}: it gives no repair copy",
            stream=partition.stream,
            partition=partition.number,
        )
    log, high_watermark = partition.log, partition.high_watermark
    if not log.log_start_offset <= start < high_watermark:
        raise OffsetOutOfRangeError(
            f"a repair copy of {where} from {start}, but broker {partition.broker_id} "
            f"holds committed offsets {log.log_start_offset} to {high_watermark - 1}",
            stream=partition.stream,
            partition=partition.number,
            offset=start,
            log_start_offset=log.log_start_offset,
            log_end_offset=high_watermark,
        )
    return log.read_frames(start, max_bytes=max_bytes, upper_bound=high_watermark)
