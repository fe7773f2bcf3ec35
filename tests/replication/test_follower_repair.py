"""A follower repairs its damaged ranges from the leader's stored frames, a segment at a time."""

from __future__ import annotations

import asyncio
import shutil

import pyarrow as pa

from broker_node.coordination.base import PartitionState
from broker_node.log import Log
from broker_node.replication.fetcher import Fetcher
from broker_node.replication.partition import Partition
from pyspark_jetstream.protocol.streams import StreamConfig

from ..log.helpers import rows
from ..log.test_damage import CONFIG, _fill

STREAM = StreamConfig(name="orders", subject="orders", replication_factor=2)


def _flip_two_batches_of_one_segment(path) -> list[tuple[int, int]]:
    """Flip a bit in the first and the last batch of the log's second segment; their offsets."""
    with Log.open(path, CONFIG) as log:
        segment = log._segments[1]
        index = segment.index
        picked = [0, len(index) - 1]
        where = [(index.positions[i], index.bases[i], index.lasts[i]) for i in picked]
        data_path = segment.path
    data = bytearray(data_path.read_bytes())
    for position, _, _ in where:
        data[position + 60] ^= 0x04
    data_path.write_bytes(bytes(data))
    return [(first, last) for _, first, last in where]


def test_two_damaged_batches_of_one_segment_are_repaired_together(tmp_path):
    follower_dir, leader_dir = tmp_path / "follower", tmp_path / "leader"
    expected = _fill(follower_dir)
    shutil.copytree(follower_dir, leader_dir)
    ranges = _flip_two_batches_of_one_segment(follower_dir)
    state = PartitionState("a", ("a", "b"), ("a", "b"), 1, version=1)
    partition = Partition(STREAM, 0, Log.open(follower_dir, CONFIG), "b", state)
    partition.become_follower(state)
    leader = Log.open(leader_dir, CONFIG)
    asked: list[int] = []

    def leader_answer(start: int) -> pa.Table:
        asked.append(start)
        frames = leader.try_read_frames(start, max_bytes=8 * 1024 * 1024)
        stored = [f.data.to_pybytes() for f in frames or []]
        return pa.table({"frame": pa.array(stored, pa.large_binary())})

    loop = asyncio.new_event_loop()  # never run: the repair is called directly
    fetcher = Fetcher(partition, "a", 1, lambda _: "", lambda _: None, loop=loop)
    fetcher._do_get = leader_answer  # the leader's replica fetch, served from its log
    try:
        partition.log.verify(1 << 30)  # the scrub finds both
        damaged = partition.log.damaged
        assert [(d.first_offset, d.last_offset) for d in damaged] == ranges
        assert len({d.path for d in damaged}) == 1
        fetcher._repair()
        assert asked == [first for first, _ in ranges]
        assert partition.log.damaged == []
        assert rows(partition.log) == expected
    finally:
        partition.close()
        leader.close()
        loop.close()
