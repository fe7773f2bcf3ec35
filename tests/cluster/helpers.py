"""Checks against a running cluster: what each replica stores, who leads, publishing with retries."""

from __future__ import annotations

import time

import pyarrow as pa

from broker_node.log import Log
from pyspark_jetstream.client import AckPolicy, BrokerConnection, SyncClient
from pyspark_jetstream.protocol.errors import JetStreamError
from pyspark_jetstream.protocol.flight import ActionType, ReadRequest, StartPosition

from ..broker.harness import wait_until


def replica_table(address: str, stream: str, partition: int = 0) -> pa.Table:
    """Everything one broker stores of a partition up to its own high watermark (leader or follower)."""
    connection = BrokerConnection(address)
    try:
        batches = []
        offset = 0
        while True:
            result = connection.read(ReadRequest(stream, partition, start=_at(offset), from_replicas=True))
            batches += result.batches
            if result.next_offset >= result.high_watermark or not result.num_rows:
                return pa.Table.from_batches(batches) if batches else pa.table({})
            offset = result.next_offset
    finally:
        connection.close()


def _at(offset: int) -> StartPosition:
    return StartPosition("offset", offset)


def status(address: str) -> dict:
    """One broker's status."""
    connection = BrokerConnection(address)
    try:
        return connection.action(ActionType.STATUS, {})
    finally:
        connection.close()


def registered_brokers(address: str) -> set[str]:
    """The brokers registered in ZooKeeper, as the broker at ``address`` sees them."""
    connection = BrokerConnection(address)
    try:
        return {b["broker_id"] for b in connection.action(ActionType.METADATA, {})["brokers"]}
    finally:
        connection.close()


def partition_status(address: str, stream: str, partition: int = 0) -> dict | None:
    """What one broker reports of a partition it holds (``None`` if it holds none)."""
    return next(
        (p for p in status(address)["partitions"] if (p["stream"], p["partition"]) == (stream, partition)),
        None,
    )


def caught_up(cluster, stream: str, partitions: int = 1) -> bool:
    """Whether every running replica of every partition has the leader's log end and high watermark,
    and each knows every running replica in sync (a follower serves ``from_replicas`` reads only then)."""
    for partition in range(partitions):
        seen = [partition_status(a, stream, partition) for a in cluster.flights]
        seen = [s for s in seen if s is not None]
        ends = {(s["log_end_offset"], s["high_watermark"]) for s in seen}
        if len(ends) != 1 or next(iter(ends))[0] != next(iter(ends))[1]:
            return False
        if any(len(s["isr"]) != len(seen) for s in seen):
            return False
    return True


def stored_frames(broker, stream: str, partition: int = 0) -> list[bytes]:
    """The frames a stopped broker's log holds, byte for byte."""
    with Log.open(broker.data_dir / "streams" / stream / str(partition)) as log:
        return [f.data.to_pybytes() for f in log.read_frames(log.log_start_offset)]


def leader_of(client: SyncClient, stream: str, partition: int = 0) -> str:
    """The partition's leader now (waiting while it has none)."""
    return wait_until(
        lambda: client.describe_stream(stream).partitions[partition].leader or None,
        timeout=30,
        message=f"a leader of {stream}/{partition}",
    )


def publish_all(
    client: SyncClient,
    stream: str,
    values: list[bytes],
    producer: str,
    *,
    first: int = 0,
    deadline: float = 60,
):
    """Publish every value with ALL acks, an idempotent producer (sequences from ``first``) and
    retries; return the acks."""
    acks = []
    stop = time.monotonic() + deadline
    for sequence, value in enumerate(values, start=first):
        while True:
            try:
                ack = client.publish(
                    stream,
                    value,
                    ack_policy=AckPolicy.ALL,
                    producer_id=producer,
                    sequence=sequence,
                    timeout=2,
                )
                acks.append(ack)
                break
            except JetStreamError as exc:
                if not exc.retriable or time.monotonic() > stop:
                    raise
    return acks
