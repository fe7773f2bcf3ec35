"""``jetstream health`` on a real cluster: ``ok`` only with every partition led and fully in sync;
``degraded`` (exit 1) naming partitions without a leader, under min ISR or under-replicated."""

from __future__ import annotations

from pyspark_jetstream.cli.cluster import partition_problems
from pyspark_jetstream.protocol.flight import PartitionInfo, StreamInfo

from ..broker.harness import run_cli, wait_until


def health(cluster) -> tuple[int, list[str]]:
    """``jetstream health`` against a running broker: exit code and output lines."""
    done = run_cli("--nats", cluster.nats_url, "--broker", cluster.flight, "--timeout", "10", "health")
    return done.returncode, (done.stdout + done.stderr).splitlines()


def wait_or_show(last: list[str], condition, timeout: float, message: str) -> None:
    """:func:`wait_until`, failing with what health said last."""
    try:
        wait_until(condition, timeout=timeout, message=message)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; health said {last}") from None


def test_health_is_degraded_while_partitions_lack_a_leader_or_replicas(cluster, client):
    client.create_stream("full", "full", replication_factor=3, min_insync_replicas=2)
    client.create_stream("single", "single", partitions=3, replication_factor=1)
    wait_until(lambda: health(cluster) == (0, ["ok"]), timeout=30, message="a healthy cluster")
    lonely = next(
        p.partition for p in client.describe_stream("single").partitions if p.replicas == ("broker-3",)
    )

    cluster.broker("broker-3").kill()

    last: list[str] = []

    def degraded_with(*wanted: str):
        def check() -> bool:
            code, lines = health(cluster)
            last[:] = lines
            return code == 1 and lines[0].startswith("degraded: ") and all(w in lines for w in wanted)

        return check

    wait_or_show(
        last,
        degraded_with(
            f"single/{lonely}: no leader (replicas broker-3, ISR broker-3)",
            "full/0: under-replicated, broker-3 out of the ISR broker-1,broker-2",
        ),
        timeout=60,
        message="health to name the leaderless and the under-replicated partitions",
    )
    cluster.broker("broker-2").kill()
    wait_or_show(
        last,
        degraded_with("full/0: ISR broker-1 is under min_insync_replicas=2: writes with ack ALL fail"),
        timeout=60,
        message="health to name the partition under min ISR",
    )
    code, lines = health(cluster)
    assert code == 1
    problems = lines[1:]
    assert lines[0] == f"degraded: {len(problems)} problem(s)"
    # Worst first: no leader, then under min ISR, then under-replicated.
    kinds = [
        0 if "leader" in p else 1 if "min_insync" in p else 2
        for p in problems
        if p.startswith(("single", "full"))
    ]
    assert kinds == sorted(kinds), problems


def test_partition_problems_name_a_leader_that_is_down():
    def info(leader: str, isr: tuple[str, ...]) -> StreamInfo:
        partition = PartitionInfo(0, leader, ("a", "b"), isr, 1, 0, 0, 0)
        return StreamInfo({"name": "s", "min_insync_replicas": 1}, (partition,))

    assert partition_problems([info("a", ("a", "b"))], {"a", "b"}) == []
    assert partition_problems([info("a", ("a", "b"))], {"b"}) == [
        "s/0: its leader a is down (replicas a,b, ISR a,b)"
    ]
    assert partition_problems([info("", ("a",))], {"b"}) == ["s/0: no leader (replicas a,b, ISR a)"]
    assert partition_problems([info("b", ("b",))], {"a", "b"}) == [
        "s/0: under-replicated, a out of the ISR b"
    ]
