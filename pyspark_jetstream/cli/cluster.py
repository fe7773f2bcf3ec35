"""``jetstream status``, ``health`` and ``cluster``: a broker's and the cluster's state."""

from __future__ import annotations

import argparse
from typing import Any

from pyspark_jetstream.cli.admin_commands import add_declared_commands
from pyspark_jetstream.cli.common import partition_table, table
from pyspark_jetstream.cli.reassign import add_commands as add_reassign_commands
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.protocol.flight import StreamInfo


def add_commands(commands: Any) -> None:
    """``status``, ``health``, ``cluster status``, ``cluster elect-leaders``, ``reassign`` and ``drain``."""
    commands.add_parser("status", help="streams, partitions, cursors and lag").set_defaults(run=_status)
    commands.add_parser(
        "health",
        help="'ok' only when the broker asked has no problem and every partition of every stream has a "
        "live leader and all its replicas in sync; else 'degraded' and one line per problem (partitions "
        "without a leader, under min_insync_replicas, under-replicated; the broker's own), exit 1",
    ).set_defaults(run=_health)
    cluster = commands.add_parser("cluster", help="brokers, the controller, replicas and lag")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True)
    cluster_commands.add_parser(
        "status", help="every partition: leader, replicas, ISR, high watermark and each replica's lag"
    ).set_defaults(run=_cluster_status)
    add_declared_commands(cluster_commands, "cluster")  # elect-leaders
    add_reassign_commands(cluster_commands)


def _status(client: SyncClient, args: argparse.Namespace) -> None:
    status = client.status()
    print(f"broker {status['broker_id']}  flight {status['flight']}  nats {', '.join(status['nats'])}")
    print()
    partition_table([StreamInfo.from_json(s) for s in status["streams"]])
    print()
    table(
        ["consumer", "stream", "partition", "offset", "lag"],
        [
            [c["consumer"], c["stream"], str(c["partition"]), str(c["offset"]), str(c["lag"])]
            for c in status["cursors"]
        ],
    )


def _health(client: SyncClient, args: argparse.Namespace) -> None:
    metadata = client.metadata()
    live = {b["broker_id"] for b in metadata["brokers"]}
    problems = partition_problems([StreamInfo.from_json(s) for s in metadata["streams"]], live)
    problems += client.health()["problems"]
    if not problems:
        print("ok")
        return
    print(f"degraded: {len(problems)} problem(s)")
    for problem in problems:
        print(problem)
    raise SystemExit(1)


def partition_problems(streams: list[StreamInfo], live: set[str]) -> list[str]:
    """One line per partition that is not fully served, worst first: without a leader (or led by a
    broker that is not registered), with fewer in-sync replicas than ``min_insync_replicas``
    (writes with ack ALL fail), or with a replica out of sync (one failure from the above)."""
    leaderless, under_min, under_replicated = [], [], []
    for stream in streams:
        name, least = stream.config["name"], int(stream.config.get("min_insync_replicas", 1))
        for p in stream.partitions:
            where = f"{name}/{p.partition}"
            replicas, isr = ",".join(p.replicas), ",".join(sorted(p.isr))  # the ISR has no order
            if not p.leader or p.leader not in live:
                led = f"its leader {p.leader} is down" if p.leader else "no leader"
                leaderless.append(f"{where}: {led} (replicas {replicas}, ISR {isr or 'empty'})")
            elif len(p.isr) < least:
                under_min.append(
                    f"{where}: ISR {isr} is under min_insync_replicas={least}: writes with ack ALL fail"
                )
            elif set(p.replicas) - set(p.isr):
                missing = ",".join(r for r in p.replicas if r not in p.isr)
                under_replicated.append(f"{where}: under-replicated, {missing} out of the ISR {isr}")
    return leaderless + under_min + under_replicated


def _cluster_status(client: SyncClient, args: argparse.Namespace) -> None:
    metadata = client.metadata()
    statuses = client.cluster_status()
    print(f"controller {metadata['controller'] or '(none)'}")
    probes = _probes(statuses)
    unreachable = [
        f"advertised address {address} of {broker_id} is unreachable from {prober}: {error}"
        for broker_id, seen in sorted(probes.items())
        for prober, (address, error) in sorted(seen.items())
        if error is not None
    ]
    table(
        ["broker", "flight", "reached by brokers", "health"],
        [
            [
                b["broker_id"],
                b["flight"],
                _reached_by(probes.get(b["broker_id"], {})),
                _broker_health(statuses.get(b["broker_id"]), shown=unreachable),
            ]
            for b in metadata["brokers"]
        ],
    )
    if unreachable:
        print()
        print("\n".join(unreachable))
    print()
    held = {
        (p["stream"], p["partition"], broker_id): p
        for broker_id, status in statuses.items()
        for p in status.get("partitions", [])
    }
    rows = []
    for stream in metadata["streams"]:
        name = stream["config"]["name"]
        for p in stream["partitions"]:
            leader = held.get((name, p["partition"], p["leader"]))
            ends = [_replica_end(held.get((name, p["partition"], r)), r, leader) for r in p["replicas"]]
            rows.append(
                [
                    name,
                    str(p["partition"]),
                    p["leader"] or "(none)",
                    str(p["leader_epoch"]),
                    ",".join(p["isr"]),
                    "?" if leader is None else str(leader["high_watermark"]),
                    "  ".join(ends),
                ]
            )
    table(["stream", "partition", "leader", "epoch", "isr", "high watermark", "log end offsets"], rows)


def _probes(statuses: dict[str, Any]) -> dict[str, dict[str, tuple[str, str | None]]]:
    """``{broker: {prober: (advertised address, error or None)}}``: what each broker that answered
    found when it probed the others' advertised Flight addresses (its own included)."""
    probes: dict[str, dict[str, tuple[str, str | None]]] = {}
    for prober, status in statuses.items():
        for probe in status.get("reachability", []):
            probes.setdefault(probe["broker_id"], {})[prober] = (probe["flight"], probe["error"])
    return probes


def _reached_by(seen: dict[str, tuple[str, str | None]]) -> str:
    """Which brokers reached a broker at its advertised address, and which did not."""
    if not seen:
        return "?"
    reached = [prober for prober, (_, error) in sorted(seen.items()) if error is None]
    missed = [prober for prober, (_, error) in sorted(seen.items()) if error is not None]
    if not missed:
        return ",".join(reached)
    return f"{','.join(reached) or 'none'} (NOT {','.join(missed)})"


def _broker_health(status: dict[str, Any] | None, *, shown: list[str]) -> str:
    """A broker's own health, as this command reached it; problems in ``shown`` (the unreachable
    addresses, listed under the table) are left out."""
    if status is None:
        return "unreachable from here"
    if "error" in status:
        return f"unreachable from here: {status['error']}"
    problems = [p for p in status["health"]["problems"] if p not in shown]
    if not problems:
        return "ok" if status["health"]["ok"] else "see below"
    return "; ".join(problems)


def _replica_end(mine: dict[str, Any] | None, replica: str, leader: dict[str, Any] | None) -> str:
    if mine is None:
        return f"{replica}=?"
    end = mine["log_end_offset"]
    lag = "" if leader is None else f" (lag {max(leader['log_end_offset'] - end, 0)})"
    return f"{replica}={end}{lag}"
