"""A leader repairs its damaged ranges from an in-sync follower: with the follower's stored frames, or (a
follower without that answer) over the consumers' Flight read."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from pyarrow import flight

from broker_node.api.server import FlightApi
from broker_node.coordination.base import PartitionState
from broker_node.flight_service import BrokerService
from broker_node.log import Log, Record, typed_of
from broker_node.replication.leader_repair import repair_leader
from broker_node.replication.partition import Partition
from broker_node.runtime import Runtime
from pyspark_jetstream.protocol.errors import NotLeaderError
from pyspark_jetstream.protocol.flight import ReadRequest, error_message
from pyspark_jetstream.protocol.replication import parse_ticket as parse_replica_ticket
from pyspark_jetstream.protocol.schema import LOG_SCHEMA
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.typed_values import parse_json
from pyspark_jetstream.protocol.value_schema import SchemaDocument, StreamSchema

from ..log.helpers import rows
from ..log.test_damage import CONFIG, _damage, _fill

STREAM = StreamConfig(name="orders", subject="orders", replication_factor=2)


class FollowerReads(flight.FlightServerBase):
    """A follower of a version before the leader's repair fetch: it refuses a replica fetch as not
    leading, and serves ``from_replicas`` reads of its own log, up to its end."""

    def __init__(self, log: Log) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.log = log
        self.reads: list[ReadRequest] = []
        self.refused = 0

    def do_get(self, context, ticket):
        if parse_replica_ticket(ticket.ticket) is not None:
            self.refused += 1
            raise flight.FlightServerError(error_message(NotLeaderError("broker b does not lead orders/0")))
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
    assert server.refused == 1 and len(server.reads) == 1  # its frames first, then its rows


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


# ---- a typed stream: the copy is the follower's stored frames, typed columns with them ----------

TYPED = StreamSchema.first(
    SchemaDocument.from_json({"fields": [{"name": "n", "type": "int64"}, {"name": "word", "type": "string"}]})
)
TYPED_STREAM = StreamConfig(name="orders", subject="orders", replication_factor=2, schema=TYPED)
STATE = PartitionState("a", ("a", "b"), ("a", "b"), 1, version=1)


def _fill_typed(path) -> None:
    """40 typed batches of 3 messages over about ten segments, every row committed."""
    with Log.open(path, CONFIG) as log:
        log.assign_leader_epoch(1)
        for i in range(40):
            values = [b'{"n": %d, "word": "w%d"}' % (n, n) for n in range(i * 3, i * 3 + 3)]
            log.append([Record(v) for v in values], typed=parse_json(values, TYPED).typed)
        log.high_watermark = log.log_end_offset


class FollowerManager:
    """What ``BrokerService.replica_fetch`` asks of the replica manager, on a follower of ``partition``."""

    def __init__(self, partition: Partition) -> None:
        self.partition = partition

    def get(self, stream: str, number: int) -> Partition | None:
        return self.partition

    def require(self, stream: str, number: int, **_: object) -> Partition:
        raise NotLeaderError(f"broker b does not lead {stream}/{number}", stream=stream, partition=number)


@pytest.fixture
def typed_pair(tmp_path):
    """A damaged typed leader ``a`` and its in-sync follower ``b`` behind the real Flight API and
    the broker service's replica fetch; yields (leader, follower, api, requests seen)."""
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"
    _fill_typed(leader_dir)
    shutil.copytree(leader_dir, follower_dir)
    _damage(leader_dir, "bit flip")
    leader = Partition(TYPED_STREAM, 0, Log.open(leader_dir, CONFIG), "a", STATE)
    leader.become_leader(STATE)
    leader.log.verify(1 << 30)
    follower = Partition(TYPED_STREAM, 0, Log.open(follower_dir, CONFIG), "b", STATE)
    follower.become_follower(STATE)
    service = BrokerService(
        Runtime("b"),
        FollowerManager(follower),
        None,
        clustered=True,
        wait_for_sync=lambda: None,  # type: ignore[arg-type]
    )
    api = FlightApi("grpc://127.0.0.1:0", service)  # type: ignore[arg-type]
    yield leader, follower, api
    api.shutdown()
    follower.close()
    leader.close()


def _frames(partition: Partition) -> list[bytes]:
    return [f.data.to_pybytes() for f in partition.log.read_frames(0)]


def test_a_typed_leader_is_repaired_with_the_followers_frames_typed_columns_and_all(typed_pair):
    leader, follower, api = typed_pair
    [hole] = leader.log.damaged
    fixed = repair_leader(leader, {"b": f"grpc://127.0.0.1:{api.port}"}.get)
    assert [(d.first_offset, d.last_offset) for d in fixed] == [(hole.first_offset, hole.last_offset)]
    assert leader.log.damaged == []
    # Byte for byte the follower's log again: the repaired range kept its typed columns.
    assert _frames(leader) == _frames(follower)
    repaired = typed_of(leader.log.read_frames(hole.first_offset)[0].data)
    assert repaired is not None and repaired.batch.column("n").to_pylist()[0] == hole.first_offset
    assert api.requests[("replica_fetch", "ok")] == 1


def test_a_follower_gives_a_repair_copy_only_to_its_leader_in_its_epoch_and_when_in_sync(typed_pair):
    leader, follower, api = typed_pair
    address = {"b": f"grpc://127.0.0.1:{api.port}"}.get
    follower.update_state(PartitionState("a", ("a", "b"), ("a", "b"), 2, version=2))  # it knows epoch 2
    assert repair_leader(leader, address) == [] and leader.log.damaged != []  # a leader of epoch 1
    follower.update_state(PartitionState("a", ("a", "b"), ("a",), 1, version=3))  # out of the ISR
    assert repair_leader(leader, address) == [] and leader.log.damaged != []
    # Neither refusal fell back to a read of rows, which would have dropped the typed columns.
    assert not any(kind == "read" for kind, _ in api.requests)
    follower.update_state(PartitionState("a", ("a", "b"), ("a", "b"), 1, version=4))  # in sync again
    assert repair_leader(leader, address) != [] and _frames(leader) == _frames(follower)
