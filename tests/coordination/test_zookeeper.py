"""The ZooKeeper coordinator against a real ZooKeeper: election, fencing, sessions, failover decisions."""

from __future__ import annotations

import dataclasses
import re
import socket
import threading
import time

import pytest
from kazoo.client import KazooClient

from broker_node.coordination import wire
from broker_node.coordination.base import FEATURES, BrokerInfo, Move, SessionState
from broker_node.coordination.controller import Controller
from broker_node.coordination.errors import CoordinationError, NotControllerError
from broker_node.coordination.zookeeper import ZooKeeperCoordinator
from broker_node.coordination.zookeeper.znodes import CONTROLLER, CONTROLLER_EPOCH
from broker_node.coordination.zookeeper_config import ZooKeeperConfig
from broker_node.zookeeper_server import ZooKeeperServer, free_port
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.streams import StreamConfig
from pyspark_jetstream.protocol.value_schema import SchemaDocument, StreamSchema

from ..broker.harness import wait_until
from .conftest import waits_for_zookeeper


def broker(n: int) -> BrokerInfo:
    return BrokerInfo(f"b{n}", f"grpc://127.0.0.1:{1000 + n}", ())


@pytest.fixture
def cluster(zk_settings):
    """Start coordinators for brokers 1..n; all closed at the end."""
    started: list[ZooKeeperCoordinator] = []

    def start(*numbers: int, settings=zk_settings) -> list[ZooKeeperCoordinator]:
        out = []
        for n in numbers:
            coordinator = ZooKeeperCoordinator(settings)
            coordinator.start(broker(n))
            started.append(coordinator)
            out.append(coordinator)
        return out

    yield start
    for coordinator in started:
        coordinator.close()


def controller_of(coordinators) -> ZooKeeperCoordinator:
    ids = {c.controller() for c in coordinators}
    assert len(ids) == 1 and None not in ids, ids
    (controller,) = ids
    return next(c for c in coordinators if c._broker.broker_id == controller)


def test_one_controller_and_it_fails_over(cluster):
    coordinators = cluster(1, 2, 3)
    wait_until(
        lambda: all(c.controller() for c in coordinators) and len({c.controller() for c in coordinators}) == 1
    )
    first = controller_of(coordinators)
    first.close()
    rest = [c for c in coordinators if c is not first]
    started = time.monotonic()
    wait_until(
        lambda: (
            {c.controller() for c in rest} - {first._broker.broker_id, None}
            and len({c.controller() for c in rest}) == 1
        ),
        message="a new controller",
    )
    assert time.monotonic() - started < 5
    second = controller_of(rest)
    created = second.create_stream(StreamConfig(name="after", subject="after", replication_factor=2))
    assert len(created.partitions[0].replicas) == 2


def test_requests_to_a_broker_that_is_not_controller_name_the_controller(cluster):
    coordinators = cluster(1, 2)
    wait_until(
        lambda: (
            len({c.controller() for c in coordinators} - {None}) == 1
            and all(c.controller() for c in coordinators)
        )
    )
    leader = controller_of(coordinators)
    other = next(c for c in coordinators if c is not leader)
    with pytest.raises(NotControllerError, match=f"the controller is {leader._broker.broker_id}") as info:
        other.create_stream(StreamConfig(name="x", subject="x"))
    assert info.value.controller == leader._broker.broker_id and info.value.retriable


def test_replicas_and_leaders_spread_over_the_brokers(cluster):
    coordinators = cluster(1, 2, 3)
    wait_until(lambda: all(len(c.brokers()) == 3 and c.controller() for c in coordinators))
    leader = controller_of(coordinators)
    created = leader.create_stream(
        StreamConfig(name="spread", subject="spread", partitions=6, replication_factor=3)
    )
    leaders = [p.leader for p in created.partitions]
    assert sorted(leaders) == ["b1", "b1", "b2", "b2", "b3", "b3"]
    assert all(len(set(p.replicas)) == 3 and p.isr == p.replicas for p in created.partitions)


def three_and_a_victim(cluster, name: str, replication_factor: int):
    """Three coordinators and a 3-partition stream; the controller, the stream as created, a
    coordinator other than the controller (to stop), its id and the partitions it leads."""
    coordinators = cluster(1, 2, 3)
    wait_until(lambda: all(len(c.brokers()) == 3 and c.controller() for c in coordinators))
    leader = controller_of(coordinators)
    config = StreamConfig(name=name, subject=name, partitions=3, replication_factor=replication_factor)
    created = leader.create_stream(config)
    victim = next(c for c in coordinators if c is not leader)
    victim_id = victim._broker.broker_id
    led = [n for n, p in enumerate(created.partitions) if p.leader == victim_id]
    return coordinators, leader, created, victim, victim_id, led


def test_a_dead_leader_is_replaced_from_the_isr_and_unclean_election_is_off(cluster):
    coordinators, leader, created, victim, victim_id, led = three_and_a_victim(cluster, "fo", 2)
    victim.close()
    wait_until(
        lambda: all(
            p.leader not in ("", victim_id) and victim_id not in p.isr
            for p in leader.get_stream("fo").partitions
        ),
        message="new leaders",
    )
    for n in led:
        before, after = created.partitions[n], leader.get_stream("fo").partitions[n]
        assert after.leader in before.isr and after.leader_epoch == before.leader_epoch + 1
    # Every in-sync replica of a partition gone: no leader, and the last ISR is kept.
    survivor = next(c for c in coordinators if c is not leader and c is not victim)
    # The survivor learns of the stream through its watches, a moment after the controller.
    only_on_survivor = wait_until(
        lambda: any(m.config.name == "fo" for m in survivor.list_streams()) and survivor.get_stream("fo"),
        message="the survivor's view of the stream",
    )
    survivor_id = survivor._broker.broker_id
    survivor.close()

    def leaderless_keep_their_isr() -> bool:
        return all(
            p.leader == "" and p.isr
            for p in leader.get_stream("fo").partitions
            if set(p.replicas) <= {victim_id, survivor_id}
        )

    wait_until(leaderless_keep_their_isr, message="leaderless partitions keeping their last ISR")
    assert only_on_survivor


def test_a_broker_that_restarts_before_the_controller_looks_leaves_every_isr(cluster):
    """The controller held up while a broker goes and comes back: it still sees the restart."""
    _, leader, created, victim, victim_id, led = three_and_a_victim(cluster, "rb", 3)
    before = leader.registrations()
    gate = threading.Event()
    assert leader._election.controller is not None
    leader._election.controller.submit(gate.wait)
    try:
        victim.close()
        cluster(int(victim_id[1:]))
        after = leader.registrations()
        assert after.keys() == before.keys() and after[victim_id] != before[victim_id]
    finally:
        gate.set()

    def out_of_every_isr() -> bool:
        partitions = leader.get_stream("rb").partitions
        return all(victim_id not in p.isr and p.leader != victim_id for p in partitions)

    wait_until(out_of_every_isr, message="the restarted broker out of every ISR")
    for n in led:
        assert leader.get_stream("rb").partitions[n].leader_epoch == created.partitions[n].leader_epoch + 1


def test_a_fenced_controller_cannot_write(cluster, zk_settings):
    (coordinator,) = cluster(1)
    wait_until(lambda: coordinator.controller() == "b1")
    # Another controller epoch begins behind this one's back.
    client = KazooClient(hosts=zk_settings.hosts + zk_settings.chroot)
    client.start()
    raw, stat = client.get(CONTROLLER_EPOCH)
    client.set(CONTROLLER_EPOCH, wire.epoch_to_bytes(wire.epoch_from_bytes(raw) + 1), version=stat.version)
    client.stop()
    client.close()
    with pytest.raises(NotControllerError, match="fenced"):
        coordinator.create_stream(StreamConfig(name="late", subject="late"))
    assert coordinator.list_streams() == []


def test_a_controller_node_of_our_own_that_nobody_acts_on_is_given_up(cluster):
    # A create whose answer was lost leaves our ephemeral /controller behind with no controller
    # running here: campaigning again must notice and start over, not watch it forever.
    (coordinator,) = cluster(1)
    wait_until(lambda: coordinator.controller() == "b1")
    election = coordinator._election
    epoch = election.controller.epoch
    election.controller.stop()
    election.controller = None
    coordinator._session.submit(election.campaign)
    wait_until(
        lambda: election.controller is not None and election.controller.epoch > epoch,
        message="a controller again",
    )
    created = coordinator.create_stream(StreamConfig(name="again", subject="again"))
    assert created.partitions[0].leader == "b1"


def test_a_won_election_is_not_announced_before_the_controller_runs(cluster, zk_settings, monkeypatch):
    # Whoever reads "the controller is b1" sends b1 controller work at once: b1 must take it.
    # So the controller znode names b1 (with its epoch) only after b1's controller started.
    seen_at_start: list[str | None] = []
    start = Controller.start

    def start_and_look(controller: Controller) -> None:
        seen_at_start.append(coordinator._view.read(watch=False).controller)
        start(controller)

    monkeypatch.setattr(Controller, "start", start_and_look)
    (coordinator,) = cluster(1)
    wait_until(lambda: coordinator.controller() == "b1")
    assert seen_at_start == [None]
    coordinator.create_stream(StreamConfig(name="at-once", subject="at-once"))


def test_a_controller_znode_without_an_epoch_names_no_controller_yet(cluster, zk_settings):
    # Another broker won the election but has not taken the role up: nobody is controller yet.
    client = KazooClient(hosts=zk_settings.hosts)
    client.start()
    try:
        client.ensure_path(zk_settings.chroot)
        client.create(zk_settings.chroot + CONTROLLER, wire.controller_to_bytes("b9", -1), ephemeral=True)
        (coordinator,) = cluster(1)
        coordinator.refresh()
        assert coordinator.controller() is None
    finally:
        client.stop()
        client.close()
    wait_until(lambda: coordinator.controller() == "b1", message="b1 campaigns once the znode is gone")
    coordinator.create_stream(StreamConfig(name="after-b9", subject="after-b9"))


def test_a_broker_id_in_use_is_refused(cluster, zk_settings):
    cluster(1)
    with pytest.raises(CoordinationError, match="broker id 'b1' is already registered"):
        cluster(1, settings=dataclasses.replace(zk_settings, session_timeout=1.0))


def test_zookeeper_down_at_start_is_waited_for_and_said_until_stopped():
    settings = ZooKeeperConfig(hosts=f"127.0.0.1:{free_port()}", connect_timeout=0.5)
    line = waits_for_zookeeper(ZooKeeperCoordinator(settings), broker(1), r"for [1-9]\d*s")
    assert re.fullmatch(
        r"waiting for ZooKeeper at 127.0.0.1:\d+ for \d+s \(retrying with backoff\): is it running, and is "
        r"\[zookeeper\] hosts right\?",
        line,
    ), line


def test_an_expired_session_is_reported_and_the_broker_registers_again(cluster, zk_settings):
    (coordinator,) = cluster(1)
    states = []
    coordinator.add_session_listener(states.append)
    wait_until(lambda: coordinator.controller() == "b1" and coordinator.lease_valid())
    session_id, password = coordinator.session()
    # Expire it for real: a second client takes over the session and closes it.
    thief = KazooClient(hosts=zk_settings.hosts, client_id=(session_id, password))
    thief.start()
    thief.stop()
    thief.close()
    wait_until(lambda: SessionState.LOST in states, message="the session to be lost")
    assert not coordinator.lease_valid() or SessionState.CONNECTED in states
    wait_until(lambda: states[-1] is SessionState.CONNECTED, message="a new session")
    wait_until(lambda: [b.broker_id for b in coordinator.brokers()] == ["b1"], message="registered again")
    wait_until(lambda: coordinator.controller() == "b1", message="controller again")
    wait_until(coordinator.lease_valid, message="the lease to be renewed")
    assert coordinator.session()[0] != session_id


def test_a_server_whose_chosen_port_is_taken_before_it_binds_chooses_another(tmp_path):
    """Tests run side by side: the port chosen for ZooKeeper may be taken before the JVM binds it."""
    server = ZooKeeperServer(data_dir=tmp_path / "zk")
    taken = server.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with server:
            assert server.port != taken
            assert server.four_letter("ruok") == "imok"


@pytest.fixture
def beside_an_older_broker(zk_settings):
    """b1, the controller, with every feature, and b2 registered without any (an older version)."""
    first = ZooKeeperCoordinator(zk_settings)
    first.start(BrokerInfo("b1", "grpc://127.0.0.1:1001", (), "", FEATURES))
    older = ZooKeeperCoordinator(zk_settings)
    try:
        # The campaign runs on a thread after start returns: b2 may only register once b1 won,
        # or a loaded machine lets b2 win it (and the checks below belong to the controller).
        wait_until(lambda: first.controller() == "b1", message="b1 to win the controller campaign")
        older.start(broker(2))
        wait_until(lambda: len(first.brokers()) == 2, message="b2 registered")
        yield first, older
    finally:
        first.close()
        older.close()


def test_a_move_is_refused_while_a_live_broker_cannot_keep_it(beside_an_older_broker):
    # An older broker's writes would drop the move's fields from a partition's state.
    first, older = beside_an_older_broker
    first.create_stream(StreamConfig(name="old", subject="old"))
    moves = [Move("old", 0, ("b2",))]
    with pytest.raises(InvalidArgumentError, match="broker.s. b2 run a version that cannot move"):
        first.reassign(moves, 0)
    older.close()
    wait_until(lambda: len(first.brokers()) == 1)
    with pytest.raises(InvalidArgumentError, match="b2, which are not live"):
        first.reassign(moves, 0)  # checked by the controller now: b2 is gone


def test_schema_versions_reach_every_broker_through_the_coordinator(zk_settings):
    infos = [BrokerInfo(f"b{n}", f"grpc://127.0.0.1:{1000 + n}", (), "", FEATURES) for n in (1, 2)]
    coordinators = [ZooKeeperCoordinator(zk_settings) for _ in infos]
    try:
        for coordinator, info in zip(coordinators, infos, strict=True):
            coordinator.start(info)
        wait_until(lambda: all(len(c.brokers()) == 2 and c.controller() for c in coordinators))
        controller = controller_of(coordinators)
        other = next(c for c in coordinators if c is not controller)
        first = SchemaDocument.from_json({"fields": [{"name": "n", "type": "int32"}]})
        controller.create_stream(StreamConfig(name="t", subject="t", schema=StreamSchema.first(first)))
        second = SchemaDocument.from_json(
            {"fields": [{"name": "n", "type": "int32"}, {"name": "c", "type": "bool"}]}
        )
        with pytest.raises(NotControllerError):
            other.update_schema("t", second)
        updated = controller.update_schema("t", second)
        assert updated.config.schema is not None and updated.config.schema.version == 2
        wait_until(lambda: other.get_stream("t") == updated, message="the new version on the other broker")
    finally:
        for coordinator in coordinators:
            coordinator.close()


def test_a_schema_is_refused_while_a_live_broker_cannot_keep_it(beside_an_older_broker):
    # An older broker's writes of the stream (growing it) would drop the schema it does not know.
    first, older = beside_an_older_broker
    document = SchemaDocument.from_json({"fields": [{"name": "n", "type": "int32"}]})
    typed = StreamConfig(name="t", subject="t", schema=StreamSchema.first(document))
    with pytest.raises(
        InvalidArgumentError, match="broker.s. b2 run a version that cannot keep a stream schema"
    ):
        first.create_stream(typed)
    first.create_stream(StreamConfig(name="plain", subject="plain"))  # untyped streams are fine
    older.close()
    wait_until(lambda: len(first.brokers()) == 1)
    assert first.create_stream(typed).config == typed
