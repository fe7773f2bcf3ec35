"""Moving partitions between brokers in a real cluster: a plan, a drain, kill -9 during a move, bad plans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.local import LocalCluster
from pyspark_jetstream.protocol.errors import InvalidArgumentError, UnknownStreamError

from ..broker.harness import run_cli, wait_until
from .conftest import FAST
from .helpers import leader_of, publish_all, status

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # started first when the suite runs in parallel (tests/conftest.py)


def values_in(client: SyncClient, stream: str, partition: int = 0) -> list[bytes]:
    """Every committed value of the partition, read to its high watermark."""
    values: list[bytes] = []
    offset = 0
    while True:
        result = client.fetch(stream, partition, start=offset, max_records=10_000)
        values += result.to_table().column("value").to_pylist()
        if result.next_offset >= result.high_watermark:
            return values
        offset = result.next_offset


def moved(client: SyncClient, stream: str, target: list[str]) -> bool:
    return (
        not client.reassignments() and list(client.describe_stream(stream).partitions[0].replicas) == target
    )


def holds(cluster, broker_id: str, stream: str) -> bool:
    return (cluster.broker(broker_id).data_dir / "streams" / stream / "0").exists()


def test_a_partition_moves_off_its_leader_while_written_and_nothing_acked_is_lost(cluster, client):
    client.create_stream("mv", "mv", replication_factor=2, min_insync_replicas=2)
    first = publish_all(client, "mv", [b"a%03d" % i for i in range(150)], "p")
    leader = leader_of(client, "mv")
    replicas = list(client.describe_stream("mv").partitions[0].replicas)
    (spare,) = {"broker-1", "broker-2", "broker-3"} - set(replicas)
    (kept,) = set(replicas) - {leader}
    epoch = client.describe_stream("mv").partitions[0].leader_epoch
    target = [spare, kept]
    plan = {"partitions": [{"stream": "mv", "partition": 0, "replicas": target}]}
    assert client.reassign(plan) == {"started": ["mv/0"], "under_way": []}
    # Written during the move (the leader changes under it: the publisher follows).
    during = publish_all(client, "mv", [b"b%03d" % i for i in range(100)], "p", first=150)
    wait_until(lambda: moved(client, "mv", target), timeout=60, message="the move to finish")
    state = client.describe_stream("mv").partitions[0]
    assert state.leader == spare and state.leader_epoch == epoch + 1
    assert sorted(state.isr) == sorted(target)
    # The old leader closed the partition and deleted its copy; the new one holds it.
    wait_until(lambda: not holds(cluster, leader, "mv"), timeout=30, message="the old copy deleted")
    assert holds(cluster, spare, "mv")
    assert len(first) + len(during) == 250
    assert values_in(client, "mv") == [b"a%03d" % i for i in range(150)] + [b"b%03d" % i for i in range(100)]
    assert "partition.json" not in str(status(cluster.broker(leader).flight)["health"])


def test_a_throttled_move_survives_kill_9_of_the_controller_the_old_leader_and_the_new_replica(
    cluster, client
):
    client.create_stream("big", "big", replication_factor=2)
    payload = b"x" * 2000
    acked = publish_all(client, "big", [payload + b"%05d" % i for i in range(1000)], "p")  # ~2 MB
    replicas = list(client.describe_stream("big").partitions[0].replicas)
    leader = leader_of(client, "big")
    (spare,) = {"broker-1", "broker-2", "broker-3"} - set(replicas)
    (kept,) = set(replicas) - {leader}
    target = [kept, spare]  # the leader is dropped
    throttle = 400_000
    started = time.monotonic()
    client.reassign(
        {"partitions": [{"stream": "big", "partition": 0, "replicas": target}]}, throttle=throttle
    )
    wait_until(lambda: holds(cluster, spare, "big"), timeout=30, message="the new replica to start")
    # Throttled: after a second the new replica holds at most the rate's worth (plus one chunk).
    time.sleep(1.0)
    elapsed = time.monotonic() - started
    fetched = next(
        (p["size_bytes"] for p in status(cluster.broker(spare).flight)["partitions"] if p["stream"] == "big"),
        0,
    )
    assert fetched <= throttle * elapsed + 2 * max(throttle // 4, 64 * 1024), (fetched, elapsed)
    assert client.reassignments(), "the move finished before the faults"
    # kill -9 the controller, the old leader and the new replica, one after the other, mid-move.
    controller = client.metadata()["controller"]
    for victim in dict.fromkeys([controller, leader, spare]):
        cluster.broker(victim).kill()
        cluster.broker(victim).start()
    with SyncClient(nats_urls=cluster.nats_url, broker=cluster.flight, timeout=20) as again:
        wait_until(
            lambda: moved(again, "big", target), timeout=90, message="the move to finish after restarts"
        )
        wait_until(lambda: not holds(cluster, leader, "big"), timeout=30, message="the dropped copy deleted")
        assert len(acked) == 1000
        assert values_in(again, "big") == [payload + b"%05d" % i for i in range(1000)]


def test_a_drained_broker_holds_nothing_and_bad_plans_move_nothing(tmp_path):
    # Cursors on two of the three brokers, so every partition has somewhere to go.
    base = tmp_path / "cluster"
    with (
        LocalCluster(3, base_dir=base, extra_config=FAST, cursor_replication_factor=2) as cluster,
        SyncClient(nats_urls=cluster.nats_url, broker=cluster.flight, timeout=20) as client,
    ):
        drain_and_refuse(cluster, client)


def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The real ``jetstream`` command against the cluster."""
    return run_cli("--nats", cluster.nats_url, *args, timeout=120)


def readme_moving_commands() -> list[str]:
    """docs/cluster.md's block on moving partitions (tests/test_readme.py leaves it to this test)."""
    page = (ROOT / "docs" / "cluster.md").read_text()
    block = page.split("## Moving partitions", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_the_readmes_block_on_moving_partitions_runs_as_written(cluster, client, tmp_path):
    environment = {**os.environ, "JETSTREAM_NATS": cluster.nats_url}
    environment.pop("JETSTREAM_BROKER", None)
    there = set(tmp_path.iterdir())  # the cluster's own files
    for line in readme_moving_commands():
        done = subprocess.run(
            ["bash", "-c", line.replace("jetstream ", f"{sys.executable} -m pyspark_jetstream.cli ", 1)],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, (line, done.stdout, done.stderr)
    # The last --verify waited until every partition of the plan was done.
    assert all(
        set(p.replicas) == {"broker-1", "broker-2"} for p in client.describe_stream("clicks").partitions
    )
    assert not client.reassignments()
    gone = cluster.broker("broker-3").data_dir / "streams" / "clicks"
    wait_until(lambda: not gone.exists(), timeout=30, message="broker-3's copies deleted")
    plan = json.loads((tmp_path / "plan.json").read_text())
    # What the block wrote where a reader runs it (the checkout's root) is ignored by git.
    written = sorted(p.name for p in set(tmp_path.iterdir()) - there)
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", *written], capture_output=True, text=True, check=False
    ).stdout.split()
    assert ignored == written, f"not ignored by git: {sorted(set(written) - set(ignored))}"
    assert plan["partitions"] and all(e["stream"] == "clicks" for e in plan["partitions"])
    # A bad plan: one line on stderr, exit status 1, nothing moved.
    (tmp_path / "bad.json").write_text(
        '{"partitions": [{"stream": "clicks", "partition": 0, "replicas": ["b8"]}]}'
    )
    refused = cli(cluster, "cluster", "reassign", "--plan", str(tmp_path / "bad.json"))
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "b8, which are not live" in refused.stderr
    assert not client.reassignments()
    # --verify of a plan that did not happen says so, and fails (a script must not go on).
    unverified = cli(cluster, "cluster", "reassign", "--verify", "--plan", str(tmp_path / "bad.json"))
    assert unverified.returncode == 1 and "clicks/0: not moved" in unverified.stdout


def drain_and_refuse(cluster: LocalCluster, client: SyncClient) -> None:
    client.create_stream("dr", "dr", partitions=3, replication_factor=2)
    publish_all(client, "dr", [b"v%d" % i for i in range(30)], "p")
    before = {n: list(p.replicas) for n, p in enumerate(client.describe_stream("dr").partitions)}
    refusals = [
        (
            [{"stream": "dr", "partition": 0, "replicas": ["broker-1", "broker-9"]}],
            "broker-9, which are not live",
        ),
        ([{"stream": "nope", "partition": 0, "replicas": ["broker-1", "broker-2"]}], "no stream 'nope'"),
        ([{"stream": "dr", "partition": 5, "replicas": ["broker-1", "broker-2"]}], "has partitions 0 to 2"),
        ([{"stream": "dr", "partition": 0, "replicas": ["broker-1", "broker-1"]}], "more than once"),
        ([{"stream": "dr", "partition": 0, "replicas": ["broker-1"]}], "replication factor is 2"),
        (
            [
                {"stream": "dr", "partition": 1, "replicas": ["broker-1", "broker-3"]},
                {"stream": "dr", "partition": 0, "replicas": ["broker-7", "broker-3"]},
            ],
            "broker-7",
        ),
    ]
    for plan, words in refusals:
        with pytest.raises((InvalidArgumentError, UnknownStreamError)) as refused:
            client.reassign({"partitions": plan})
        assert words in str(refused.value) and "\n" not in str(refused.value)
    # Nothing moved, not even the valid first entry of the last plan.
    assert not client.reassignments()
    assert {n: list(p.replicas) for n, p in enumerate(client.describe_stream("dr").partitions)} == before
    with pytest.raises(InvalidArgumentError, match="holds no replica"):
        client.drain("broker-9")

    result = client.drain("broker-3")
    assert result["started"]
    wait_until(
        lambda: (
            not client.reassignments()
            and all("broker-3" not in p.replicas for p in client.describe_stream("dr").partitions)
        ),
        timeout=60,
        message="broker-3 drained",
    )
    wait_until(
        lambda: not (cluster.broker("broker-3").data_dir / "streams" / "dr").exists(),
        timeout=30,
        message="broker-3's copies deleted",
    )
    assert all("broker-3" not in p.replicas for s in client.list_streams() for p in s.partitions)
    stored = sorted(v for n in range(3) for v in values_in(client, "dr", n))
    assert stored == sorted(b"v%d" % i for i in range(30))


def test_a_cancelled_move_goes_back_and_the_added_copy_is_deleted(cluster, client):
    client.create_stream("cx", "cx", replication_factor=2)
    acked = publish_all(client, "cx", [b"y" * 2000 + b"%04d" % i for i in range(500)], "p")  # ~1 MB
    before = client.describe_stream("cx").partitions[0]
    (spare,) = {"broker-1", "broker-2", "broker-3"} - set(before.replicas)
    target = [spare, before.replicas[1]]
    # 64 KiB/s: the move takes about 15 s, so the cancel lands in the middle of it.
    client.reassign({"partitions": [{"stream": "cx", "partition": 0, "replicas": target}]}, throttle=65_536)
    wait_until(lambda: holds(cluster, spare, "cx"), timeout=30, message="the new replica to start")
    assert client.cancel_reassignment([("cx", 0)]) == {"cancelled": ["cx/0"]}
    after = client.describe_stream("cx").partitions[0]
    assert after.replicas == before.replicas and after.leader == before.leader
    assert after.leader_epoch == before.leader_epoch  # the leader stayed: no new epoch
    assert not client.reassignments()
    wait_until(lambda: not holds(cluster, spare, "cx"), timeout=30, message="the added copy deleted")
    assert client.cancel_reassignment() == {"cancelled": []}
    assert len(acked) == 500 and len(values_in(client, "cx")) == 500
