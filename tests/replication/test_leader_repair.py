"""A leader repairs its damaged ranges from an in-sync follower, over the consumers' Flight read."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from pyarrow import flight

from broker_node.coordination.base import PartitionState
from broker_node.log import Log
from broker_node.replication.leader_repair import repair_leader
from broker_node.replication.partition import Partition
from pyspark_jetstream.protocol.flight import ReadRequest
from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.streams import StreamConfig

from ..log.helpers import rows
from ..log.test_damage import CONFIG, _damage, _fill

STREAM = StreamConfig(name="orders", subject="orders", replication_factor=2)


class FollowerReads(flight.FlightServerBase):
    """A follower's read path: ``from_replicas`` reads of its own log, up to its end."""

    def __init__(self, log: Log) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.log = log
        self.reads: list[ReadRequest] = []

    def do_get(self, context, ticket):
        request = ReadRequest.from_ticket(ticket.ticket)
        self.reads.append(request)
        assert request.from_replicas
        batches = self.log.read(int(request.start.value), max_records=request.max_records)
        return flight.RecordBatchStream(pa.Table.from_batches(batches, schema=LOG_SCHEMA))


@pytest.fixture
def damaged_leader(tmp_path):
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"
    expected = _fill(leader_dir)
    shutil.copytree(leader_dir, follower_dir)
    _, first, last = _damage(leader_dir, "bit flip")
    state = PartitionState("a", ("a", "b"), ("a", "b"), 1, version=1)
    leader = Partition(STREAM, 0, Log.open(leader_dir, CONFIG), "a", state)
    leader.become_leader(state)
    leader.log.verify(1 << 30)  # the scrub finds the damage
    assert [(d.first_offset, d.last_offset) for d in leader.log.damaged] == [(first, last)]
    follower = Log.open(follower_dir, CONFIG)
    server = FollowerReads(follower)
    yield leader, server, expected
    server.shutdown()
    follower.close()
    leader.close()


def test_a_damaged_leader_takes_a_good_copy_from_an_in_sync_follower(damaged_leader):
    leader, server, expected = damaged_leader
    fixed = repair_leader(leader, {"b": f"grpc://127.0.0.1:{server.port}"}.get)
    assert len(fixed) == 1 and leader.log.damaged == []
    assert rows(leader.log) == expected
    assert len(server.reads) == 1


def test_nothing_is_asked_of_followers_out_of_the_isr_or_unknown(damaged_leader):
    leader, server, _ = damaged_leader
    assert repair_leader(leader, {}.get) == []  # no address for b
    leader.update_state(PartitionState("a", ("a", "b"), ("a",), 1, version=2))
    assert repair_leader(leader, {"b": f"grpc://127.0.0.1:{server.port}"}.get) == []  # b left the ISR
    assert server.reads == [] and leader.log.damaged != []


def test_a_follower_that_cannot_serve_the_range_leaves_the_damage_for_the_next_pass(damaged_leader):
    leader, _, _ = damaged_leader
    assert repair_leader(leader, {"b": "grpc://127.0.0.1:1"}.get) == []  # nobody there
    assert leader.log.damaged != []
