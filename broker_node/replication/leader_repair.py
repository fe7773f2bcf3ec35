"""A leader's damaged ranges, repaired from an in-sync follower.

A follower repairs its own damage from its leader as it fetches (see
``fetcher``).  A leader has nobody to fetch from, so the maintenance pass
reads each damaged range from its in-sync followers instead, with the
consumers' Flight read (``from_replicas``: a follower answers up to its own
high watermark), and writes the copy back with ``Log.repair``.  Every
damaged range of the log goes in one call, since a segment is rewritten
whole.  A follower that cannot give a good copy (its own range is damaged
too, or it is behind) is skipped; the next pass tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import flight

from broker_node.log import LogError
from broker_node.log.damage import DamagedRange
from broker_node.log.logging_labels import Labels
from pyspark_jetstream.protocol.errors import JetStreamError
from pyspark_jetstream.protocol.flight import ReadRequest, StartPosition
from pyspark_jetstream.protocol.schema import LOG_SCHEMA

from .partition import Partition, Role

logger = logging.getLogger(__name__)

READ_TIMEOUT = 10.0


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
            copies = _read_ranges(connect(address), partition, damaged)
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


def _read_ranges(
    client: flight.FlightClient, partition: Partition, damaged: Sequence[DamagedRange]
) -> list[pa.RecordBatch]:
    """Each damaged range as the follower ``client`` reaches stores it, one batch per range."""
    try:
        copies = []
        for hole in damaged:
            first, last = hole.first_offset, hole.last_offset
            request = ReadRequest(
                partition.stream,
                partition.number,
                StartPosition("offset", first),
                max_records=last - first + 1,
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
    finally:
        client.close()
