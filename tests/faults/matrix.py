"""The fault matrix: a workload, a nemesis and a checker, Jepsen-style, on a real cluster.

Workload: producers publish unique values with ``ALL`` acks, an idempotent
producer id and retries (a value counts as acknowledged only when its ack
arrives); consumers read committed data from the leaders, and from in-sync
followers, and record every ``(partition, offset, value)`` they were served.
Besides the plain stream, a typed stream (a schema; its leader parses each
JSON value at ingest and stores the typed columns in the frame) gets a
producer and a consumer of its own, and its schema gains a field now and
then while the faults run.

Nemesis: one fault at a time, or two together on different brokers (chosen
in order or at random, seeded), injected, held, then healed:

* ``kill-leader``, ``kill-follower``, ``kill-controller``: SIGKILL, restart later;
* ``pause-leader``: SIGSTOP for longer than the session timeout, then SIGCONT;
* ``expire-session``: the leader's ZooKeeper session expired by another client;
* ``partition-leader``: every link between the leader and the other brokers cut;
* ``restart-zookeeper``: ZooKeeper killed and started again;
* ``lose-tail``: a follower killed and its newest segments cut short (lost page cache);
* ``bit-flip``: a follower killed and one bit of a closed segment flipped;
* ``full-disk``: no file of a broker may grow any more (EFBIG), then it may again;
* ``reassign``: one replica of a partition moved to a broker that lacks it (throttled), and
  the controller, the old leader or the new replica SIGKILLed during the move, restarted later
  (only with a fourth broker: ``run_matrix(brokers=4)``).

Checker (``judge``), once everything is healed and caught up: every acknowledged value is
in the final log exactly once; offsets are contiguous; every value a consumer
was served is the value the final log holds at that offset (nothing
uncommitted or later truncated was served); all replicas are byte for byte
identical (the typed columns and their schema version with them); every row
of the typed stream holds typed columns that agree with its JSON value; and
the cluster acknowledged writes again within a bound after each fault was
healed.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
from kazoo.client import KazooClient

from broker_node.log import Log
from broker_node.log.frames import decode
from broker_node.log.typed_frames import typed_of
from pyspark_jetstream.client import AckPolicy, Client
from pyspark_jetstream.protocol.errors import JetStreamError

from .cluster import FaultCluster, cut_tail, flip_a_bit, partition_dirs

STREAM = "chaos"
TYPED_STREAM = "chaos-typed"
"""One partition, a schema; its producer's values are JSON objects of these fields (its producer id,
epoch and sequence: names of the log's own columns are refused as field names)."""
TYPED_FIELDS = [
    {"name": "writer", "type": "string"},
    {"name": "round", "type": "int64"},
    {"name": "count", "type": "int64"},
]
SCHEMA_CHANGES = 10
"""At most this many schema changes of the typed stream (a new nullable field each), one every
``schema_every`` seconds of a run (each version stays in the stream's metadata)."""
Place = tuple[str, int]
"""A stream partition: (stream, partition number)."""
# Followers leave the ISR after 2 s without catching up; sessions expire after 3 s.
FAST = "[replication]\nreplica_max_lag = 2.0\n"
PARTITIONS = 2
REASSIGN_THROTTLE = 200_000
"""Bytes/s a moved replica is fetched at: slow enough for the kill to land during the move."""
FAULTS = (
    "kill-leader",
    "kill-follower",
    "kill-controller",
    "pause-leader",
    "expire-session",
    "partition-leader",
    "restart-zookeeper",
    "lose-tail",
    "bit-flip",
    "full-disk",
    "reassign",
)


@dataclass
class History:
    """What the workload saw."""

    acked: dict[bytes, tuple[Place, int]] = field(default_factory=dict)
    """value -> (stream partition, offset) of its ack"""
    served: list[tuple[Place, int, bytes]] = field(default_factory=list)
    operations: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    ack_times: list[float] = field(default_factory=list)
    schema_changes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Report:
    """The checker's findings."""

    faults: Counter[str]
    operations: int
    acked: int
    reads: int
    lost: int
    duplicates: int
    stale_reads: int
    gaps: int
    divergent_replicas: int
    typed_mismatches: int
    """rows of the typed stream whose typed columns are missing or disagree with their value"""
    schema_changes: int
    longest_unavailability: float
    errors: Counter[str]
    damage: Counter[str] = field(default_factory=Counter)
    """what the file faults did (bytes cut, bits flipped)"""

    def table(self) -> str:
        """The findings as a printable table."""
        rows = [("faults injected", ", ".join(f"{k} x{v}" for k, v in sorted(self.faults.items())))]
        rows += [
            ("operations (publish attempts)", str(self.operations)),
            ("acknowledged", str(self.acked)),
            ("reads checked (values served)", str(self.reads)),
            ("lost (acked, not in the log)", str(self.lost)),
            ("duplicates", str(self.duplicates)),
            ("stale or uncommitted reads", str(self.stale_reads)),
            ("offset gaps", str(self.gaps)),
            ("divergent replicas", str(self.divergent_replicas)),
            ("typed rows missing or disagreeing", str(self.typed_mismatches)),
            ("schema changes of the typed stream", str(self.schema_changes)),
            ("longest unavailability after a heal (s)", f"{self.longest_unavailability:.2f}"),
            (
                "damage done to files",
                ", ".join(f"{k} x{v}" for k, v in sorted(self.damage.items())) or "none",
            ),
            ("refusals seen (retried)", ", ".join(f"{k} x{v}" for k, v in self.errors.most_common(6))),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


class Workload:
    """Producers and consumers on their own event loop thread (see the module docstring)."""

    def __init__(
        self, cluster: FaultCluster, producers: int = 3, consumers: int = 4, schema_every: float = 30.0
    ) -> None:
        self.cluster = cluster
        self._schema_every = schema_every
        self.history = History()
        self._producers = producers
        self._consumers = consumers
        self._stop = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="workload")
        self._tasks: list[asyncio.Future[None]] = []
        self.client: Client | None = None

    def start(self) -> None:
        self._thread.start()
        self._call(self._start())

    def stop(self) -> None:
        self._stop.set()
        self._call(self._finish())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def _call(self, coroutine: object) -> object:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(120)  # type: ignore[arg-type]

    async def _start(self) -> None:
        cluster = self.cluster
        self.client = await Client.connect(
            nats_urls=cluster.nats_url, broker=",".join(cluster.flights), timeout=5, max_pending=64
        )
        await self.client.create_stream(
            STREAM,
            STREAM,
            partitions=PARTITIONS,
            replication_factor=3,
            min_insync_replicas=2,
            segment_bytes=16_384,
        )
        await self.client.create_stream(
            TYPED_STREAM,
            TYPED_STREAM,
            replication_factor=3,
            min_insync_replicas=2,
            segment_bytes=16_384,
            schema={"format": "json", "fields": TYPED_FIELDS},
        )
        for n in range(self._producers):
            self._tasks.append(
                asyncio.ensure_future(self._produce(f"producer-{n}", (STREAM, n % PARTITIONS)))
            )
        self._tasks.append(asyncio.ensure_future(self._produce("typed-0", (TYPED_STREAM, 0))))
        for n in range(self._consumers):
            place = (STREAM, n % PARTITIONS)
            self._tasks.append(asyncio.ensure_future(self._consume(place, from_replicas=n >= PARTITIONS)))
        self._tasks.append(asyncio.ensure_future(self._consume((TYPED_STREAM, 0), from_replicas=False)))
        self._tasks.append(asyncio.ensure_future(self._evolve()))

    async def _finish(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.client is not None:
            await self.client.close()

    async def _produce(self, producer: str, place: Place) -> None:
        assert self.client is not None
        history = self.history
        stream, partition = place
        epoch, sequence = 0, 0
        while not self._stop.is_set():
            if stream == TYPED_STREAM:
                value = json.dumps({"writer": producer, "round": epoch, "count": sequence}).encode()
            else:
                value = f"{producer}/{epoch}/{sequence}".encode()
            history.operations += 1
            try:
                ack = await self.client.publish(
                    stream,
                    value,
                    partition=partition,
                    ack_policy=AckPolicy.ALL,
                    producer_id=producer,
                    producer_epoch=epoch,
                    sequence=sequence,
                    timeout=1.0,
                )
            except JetStreamError as exc:
                history.errors[type(exc).__name__] += 1
                if not exc.retriable:
                    # The producer's state is gone (e.g. an unclean election); start a new epoch.
                    epoch, sequence = epoch + 1, 0
                await asyncio.sleep(0.05)
                continue
            assert ack is not None
            with history.lock:
                history.acked[value] = (place, ack.first_offset)
                history.ack_times.append(time.monotonic())
            sequence += 1

    async def _consume(self, place: Place, from_replicas: bool) -> None:
        assert self.client is not None
        stream, partition = place
        offset = 0
        while not self._stop.is_set():
            try:
                result = await self.client.fetch(
                    stream, partition, start=offset, max_wait=0.5, from_replicas=from_replicas
                )
            except JetStreamError as exc:
                self.history.errors[f"read {type(exc).__name__}"] += 1
                await asyncio.sleep(0.1)
                continue
            served = [
                (place, o, v)
                for batch in result.batches
                for o, v in zip(
                    batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True
                )
            ]
            with self.history.lock:
                self.history.served += served
            offset = max(offset, result.next_offset)

    async def _evolve(self) -> None:
        """A new nullable field in the typed stream's schema every ``schema_every`` seconds, up to
        :data:`SCHEMA_CHANGES`.  One refused while ZooKeeper or the controller is down is tried
        again a second later, so a change lands soon after the fault heals rather than a whole
        turn later (a turn can fall inside the next fault again)."""
        assert self.client is not None
        fields = list(TYPED_FIELDS)
        pause = self._schema_every
        while not self._stop.is_set() and self.history.schema_changes < SCHEMA_CHANGES:
            await asyncio.sleep(pause)
            wanted = [*fields, {"name": f"note_{len(fields)}", "type": "string"}]
            try:
                await self.client.update_schema(TYPED_STREAM, {"format": "json", "fields": wanted})
            except JetStreamError as exc:
                self.history.errors[f"schema {type(exc).__name__}"] += 1
                pause = min(self._schema_every, 1.0)
                continue
            pause = self._schema_every
            fields = wanted
            self.history.schema_changes += 1


def injection_order(faults: str) -> list[str]:
    """The kinds of ``faults`` (joined by ``+``) in the order to inject them: ZooKeeper's restart
    last, since the others need it up to be injected (an expired session is stolen through it, a
    reassignment and the leader's and controller's names are read through the brokers from it)."""
    kinds = faults.split("+")
    return sorted(kinds, key=lambda kind: kind == "restart-zookeeper")


class Nemesis:
    """Injects and heals one fault at a time (see the module docstring)."""

    def __init__(self, cluster: FaultCluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.injected: Counter[str] = Counter()
        self.damage: Counter[str] = Counter()
        self.heals: list[float] = []

    def _leader(self, partition: int | None = None) -> str:
        from pyspark_jetstream.client import BrokerConnection
        from pyspark_jetstream.protocol.flight import ActionType

        number = self.rng.randrange(PARTITIONS) if partition is None else partition
        for address in self.cluster.flights:
            try:
                connection = BrokerConnection(address, timeout=5)
                info = connection.action(ActionType.DESCRIBE_STREAM, {"name": STREAM})
                connection.close()
            except JetStreamError:
                continue
            leader = info["partitions"][number]["leader"]
            if leader:
                return leader
        return self.rng.choice(self.cluster.ids)

    def _controller(self) -> str:
        from pyspark_jetstream.client import BrokerConnection
        from pyspark_jetstream.protocol.flight import ActionType

        for address in self.cluster.flights:
            with contextlib.suppress(JetStreamError):
                connection = BrokerConnection(address, timeout=5)
                controller = connection.action(ActionType.METADATA, {})["controller"]
                connection.close()
                if controller:
                    return str(controller)
        return self.rng.choice(self.cluster.ids)

    def run(self, faults: str, hold: float) -> None:
        """Inject ``faults`` (one kind, or several joined by ``+``, each on a different broker), hold
        them ``hold`` seconds, heal them in reverse order -- ZooKeeper first whatever its place: a
        broker healed by a restart waits for ZooKeeper only up to its connect timeout, and each
        heal here waits for its broker to be up before the next one begins."""
        heals: list[Callable[[], None]] = []
        busy: set[str] = set()
        for fault in injection_order(faults):
            heal, hold = self._inject(fault, hold, busy)
            heals.append(heal)
        time.sleep(hold)
        zookeeper = self.cluster.zookeeper.start
        for heal in sorted(reversed(heals), key=lambda heal: heal != zookeeper):
            heal()
        self.heals.append(time.monotonic())

    def _pick(self, wanted: str, busy: set[str]) -> str | None:
        """``wanted``, or another broker if a fault already holds it; ``None`` if every one is held."""
        if wanted not in busy:
            chosen: str | None = wanted
        else:
            chosen = next((b for b in self.cluster.ids if b not in busy), None)
        if chosen is not None:
            busy.add(chosen)
        return chosen

    def _inject(self, fault: str, hold: float, busy: set[str]) -> tuple[Callable[[], None], float]:
        cluster = self.cluster
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        if fault == "restart-zookeeper":
            self.injected[fault] += 1
            cluster.zookeeper.kill()
            return cluster.zookeeper.start, hold
        if fault == "reassign":
            return self._reassign(busy), hold
        if fault == "kill-controller":
            wanted = self._controller()
        elif fault in ("kill-leader", "pause-leader", "expire-session", "partition-leader"):
            wanted = self._leader()
        elif fault == "full-disk":
            wanted = self.rng.choice(cluster.ids)
        else:
            leader = self._leader()
            wanted = self.rng.choice([b for b in cluster.ids if b != leader])
        victim = self._pick(wanted, busy)
        if victim is None:
            return (lambda: None), hold
        self.injected[fault] += 1
        broker = cluster.broker(victim)
        if fault == "pause-leader":
            broker.pause()
            return broker.resume, max(hold, cluster.session_timeout + 2)
        if fault == "expire-session":
            session_id, password = cluster.session(victim)
            thief = KazooClient(hosts=cluster.zookeeper.hosts, client_id=(session_id, password))
            thief.start(10)
            thief.stop()
            thief.close()
            return (lambda: None), hold  # the broker registers again by itself
        if fault == "partition-leader":
            cluster.isolate(victim)
            return cluster.heal_network, hold
        if fault == "full-disk":
            cluster.limit_file_size(victim, 1024)
            return (lambda: cluster.limit_file_size(victim, None)), hold
        broker.kill()
        if fault == "lose-tail":
            for directory in partition_dirs(broker, STREAM):
                self.damage["bytes cut"] += cut_tail(directory, self.rng)
        if fault == "bit-flip":
            for directory in partition_dirs(broker, STREAM):
                self.damage["bits flipped"] += flip_a_bit(directory, self.rng) is not None
        return broker.start, hold

    def _reassign(self, busy: set[str]) -> Callable[[], None]:
        """Move one replica of a partition to a broker without it; kill -9 one broker taking part."""
        from pyspark_jetstream.client import BrokerConnection
        from pyspark_jetstream.protocol.flight import ActionType

        cluster = self.cluster
        number = self.rng.randrange(PARTITIONS)
        for address in cluster.flights:
            try:
                connection = BrokerConnection(address, timeout=5)
                try:
                    info = connection.action(ActionType.DESCRIBE_STREAM, {"name": STREAM})
                    state = info["partitions"][number]
                    spares = [b for b in cluster.ids if b not in state["replicas"]]
                    if not spares or not state["leader"]:
                        return lambda: None
                    out = self.rng.choice(state["replicas"])
                    spare = self.rng.choice(spares)
                    target = [spare if b == out else b for b in state["replicas"]]
                    plan = [{"stream": STREAM, "partition": number, "replicas": target}]
                    body = {"op": "start", "plan": plan, "throttle": REASSIGN_THROTTLE}
                    connection.action(ActionType.REASSIGN_PARTITIONS, body)
                finally:
                    connection.close()
                break
            except JetStreamError:
                continue  # a partition already moving (refused), or a broker down: try another
        else:
            return lambda: None
        self.injected["reassign"] += 1
        # Then kill -9 the controller, the old leader or the new replica in the middle of it.
        wanted = self.rng.choice([self._controller(), state["leader"], spare])
        victim = self._pick(wanted, busy)
        if victim is None:
            return lambda: None
        broker = cluster.broker(victim)
        broker.kill()
        return broker.start


def settle(cluster: FaultCluster, timeout: float = 120) -> None:
    """Wait until every partition is led, every replica in sync and caught up."""
    from pyspark_jetstream.client import BrokerConnection
    from pyspark_jetstream.protocol.flight import ActionType

    expected = {STREAM: PARTITIONS, TYPED_STREAM: 1}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = []
            for address in cluster.flights:
                connection = BrokerConnection(address, timeout=5)
                states.append(connection.action(ActionType.STATUS, {}))
                connection.close()
            held = [(s["broker_id"], p) for s in states for p in s["partitions"] if p["stream"] in expected]
            ends = {(p["stream"], p["partition"], p["log_end_offset"], p["high_watermark"]) for _, p in held}
            served = {(broker_id, p["stream"], p["partition"]) for broker_id, p in held}
            stored = {
                (b.broker_id, stream, int(d.name))
                for b in cluster.brokers
                for stream in expected
                for d in partition_dirs(b, stream)
            }
            settled = (
                stored == served
                and len(held) == 3 * sum(expected.values())
                and all(len(p["isr"]) == 3 and not p["damaged"] for _, p in held)
                and len(ends) == sum(expected.values())
                and all(e[2] == e[3] for e in ends)
            )
            if settled:
                return
        except JetStreamError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the cluster did not settle within {timeout:g}s")


class Replica(NamedTuple):
    """One copy of a partition."""

    values: dict[int, bytes]
    """its values by offset"""
    frames: list[bytes]
    """its stored frames, byte for byte"""
    typed_mismatches: int
    """rows of a typed stream's copy whose typed columns are missing or disagree with the value"""


def read_replicas(cluster: FaultCluster) -> dict[Place, list[Replica]]:
    """Every replica of each partition, read from the files of the stopped cluster."""
    replicas: dict[Place, list[Replica]] = {}
    for broker in cluster.brokers:
        for stream in (STREAM, TYPED_STREAM):
            for directory in partition_dirs(broker, stream):
                with Log.open(directory) as log:
                    values = {}
                    for batch in log.scan():
                        offsets, data = batch.column("offset").to_pylist(), batch.column("value").to_pylist()
                        values.update(zip(offsets, data, strict=True))
                    end = log.log_end_offset
                    frames = [f.data for f in log.read_frames(log.log_start_offset, upper_bound=end)]
                mismatches = (
                    sum(_typed_mismatches(frame) for frame in frames) if stream == TYPED_STREAM else 0
                )
                copy = Replica(values, [f.to_pybytes() for f in frames], mismatches)
                replicas.setdefault((stream, int(directory.name)), []).append(copy)
    return replicas


def _typed_mismatches(frame: pa.Buffer) -> int:
    """The rows of a typed stream's ``frame`` without typed columns, or whose typed columns do not
    hold what their JSON value says (the fields of version 1, which every version keeps)."""
    rows = decode(frame).column("value").to_pylist()
    typed = typed_of(frame)
    if typed is None:
        return len(rows)
    stored = typed.batch.select([f["name"] for f in TYPED_FIELDS]).to_pylist()
    return sum(1 for value, columns in zip(rows, stored, strict=True) if json.loads(value) != columns)


def judge(
    history: History,
    replicas: dict[Place, list[Replica]],
    injected: Counter[str],
    heals: Sequence[float],
    damage: Counter[str] | None = None,
) -> Report:
    """Compare the history with what the replicas store; see the module docstring.

    The first replica of each partition is taken as its final log; every other
    replica must match it byte for byte (settle() saw all of them at the high
    watermark, so nothing uncommitted is left to differ).
    """
    final = {p: copies[0].values for p, copies in replicas.items()}
    stored_where = {(p, v) for p, log in final.items() for v in log.values()}
    values = Counter(v for log in final.values() for v in log.values())
    lost = sum(1 for value, (p, _) in history.acked.items() if (p, value) not in stored_where)
    duplicates = sum(count - 1 for count in values.values() if count > 1)
    stale = sum(1 for p, o, v in history.served if final.get(p, {}).get(o) != v)
    gaps = sum(
        1
        for log in final.values()
        if sorted(log) != list(range(min(log, default=0), min(log, default=0) + len(log)))
    )
    divergent = sum(
        1 for copies in replicas.values() for other in copies[1:] if other.frames != copies[0].frames
    )
    typed_mismatches = sum(copy.typed_mismatches for copies in replicas.values() for copy in copies)
    acks = sorted(history.ack_times)
    waits = []
    for healed in heals:
        at = bisect.bisect_left(acks, healed)
        waits.append(float("inf") if at == len(acks) else acks[at] - healed)
    return Report(
        faults=injected,
        operations=history.operations,
        acked=len(history.acked),
        reads=len(history.served),
        lost=lost,
        duplicates=duplicates,
        stale_reads=stale,
        gaps=gaps,
        divergent_replicas=divergent,
        typed_mismatches=typed_mismatches,
        schema_changes=history.schema_changes,
        longest_unavailability=max(waits, default=0.0),
        errors=history.errors,
        damage=damage or Counter(),
    )


def random_faults(rng: random.Random, together: float = 0.3) -> Iterator[str]:
    """Faults at random, forever: one kind, or (with probability ``together``) two kinds at once.

    The faults that damage files (``lose-tail``, ``bit-flip``) come alone: a
    replica that lost acknowledged data while another replica crashes as well
    is more failure than ISR replication without fsync on every append
    tolerates (Kafka's model too), so it would measure the model, not the code.
    """
    alone = ("lose-tail", "bit-flip")
    while True:
        first = rng.choice(FAULTS)
        if first in alone or rng.random() >= together:
            yield first
        else:
            yield first + "+" + rng.choice([f for f in FAULTS if f not in alone and f != first])


def run_matrix(
    base_dir: Path,
    *,
    faults: Iterable[str],
    rng: random.Random,
    warm_up: float,
    hold: float,
    rest: float,
    until: float | None = None,
    progress: Callable[[str], None] = lambda _: None,
    brokers: int = 3,
    schema_every: float = 30.0,
) -> Report:
    """Start a cluster and the workload, inject ``faults`` one after the other (each held ``hold``
    seconds, then ``rest`` seconds of calm) until they run out or the clock passes ``until``
    (``time.monotonic()``), settle, stop, check.  ``brokers``: 4 gives ``reassign`` a broker to
    move replicas to (the stream has 3).  ``schema_every``: seconds between the typed stream's
    schema changes."""
    cluster = FaultCluster(
        brokers, base_dir=base_dir, extra_config=FAST, maintenance_interval=1.0, log_level="DEBUG"
    )
    with cluster:
        workload = Workload(cluster, schema_every=schema_every)
        workload.start()
        nemesis = Nemesis(cluster, rng)
        try:
            time.sleep(warm_up)
            for fault in faults:
                if until is not None and time.monotonic() >= until:
                    break
                progress(fault)
                nemesis.run(fault, hold)
                time.sleep(rest)
                # Unavailability is measured to the first ack after the heal: wait for it (bounded).
                _wait_until(
                    workload.history,
                    lambda h, healed=nemesis.heals[-1]: bool(h.ack_times) and h.ack_times[-1] >= healed,
                    60,
                )
            # A schema change may still be in flight after the last fault (its attempts during the
            # faults wait out their timeouts): the run ends once one has landed (bounded).
            _wait_until(workload.history, lambda h: h.schema_changes >= 1, 60)
        finally:
            workload.stop()
        settle(cluster)
    # The context manager stopped every broker: the check reads their files.
    return judge(workload.history, read_replicas(cluster), nemesis.injected, nemesis.heals, nemesis.damage)


def _wait_until(history: History, done: Callable[[History], bool], timeout: float) -> None:
    """Wait until ``done(history)`` holds (checked under its lock), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with history.lock:
            if done(history):
                return
        time.sleep(0.1)
