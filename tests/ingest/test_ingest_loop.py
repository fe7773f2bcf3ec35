"""Ingestion never waits on the event loop for a busy log: one partition's compaction stalls no other."""

from __future__ import annotations

import asyncio
import threading
import time

from broker_node.config import IngestConfig, NatsConfig
from broker_node.coordination.base import PartitionState
from broker_node.ingest.ingestor import Ingestor
from broker_node.log import Log
from broker_node.log_terms import LOG_TERMS
from broker_node.replication.partition import Partition
from pyspark_jetstream.client import Client
from pyspark_jetstream.protocol.streams import StreamConfig


def test_a_log_held_by_maintenance_does_not_stall_the_other_partitions(tmp_path, nats_server):
    state = PartitionState("b1", ("b1",), ("b1",))
    partitions = {}
    for name in ("busy", "free"):
        config = StreamConfig(name=name, subject=name)
        partition = Partition(config, 0, Log.open(tmp_path / name), "b1", state)
        partition.become_leader(state)
        partitions[(name, 0)] = partition
    held = threading.Event()
    release = threading.Event()

    def hold_the_busy_log() -> None:
        with partitions[("busy", 0)].log._lock:  # as a long compaction does
            held.set()
            release.wait(10)

    async def run() -> tuple[float, float]:
        ingestor = Ingestor([nats_server.url], NatsConfig(), IngestConfig(), lambda: {}, "t", terms=LOG_TERMS)
        await ingestor.start()
        await ingestor.sync(partitions)
        client = await Client.connect(nats_urls=nats_server.url, broker="grpc://127.0.0.1:1", timeout=30)
        client._streams = {name: StreamConfig(name=name, subject=name) for name in ("busy", "free")}
        holder = threading.Thread(target=hold_the_busy_log)
        holder.start()
        held.wait(10)
        started = time.monotonic()
        waiting = asyncio.ensure_future(client.publish("busy", b"waits"))
        free = await client.publish("free", b"goes through")
        free_after = time.monotonic() - started
        assert free.first_offset == 0 and not waiting.done()
        release.set()
        busy = await waiting
        busy_after = time.monotonic() - started
        assert busy.first_offset == 0
        holder.join()
        await client.close()
        await ingestor.close()
        return free_after, busy_after

    free_after, busy_after = asyncio.run(run())
    assert free_after < 5  # the other partition was acked while the busy log was held
    assert busy_after >= free_after  # the busy one waited for its log, off the loop
    for partition in partitions.values():
        partition.close()
