"""``jetstream cluster reassign`` and ``cluster drain``: moving partitions between brokers.

Modelled on Kafka's ``kafka-reassign-partitions``: ``--generate`` proposes a
plan, ``--plan FILE`` starts it, ``--verify`` shows each moving partition's
progress, ``--cancel`` puts partitions back.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from pyspark_jetstream.cli.common import fail, parse_size, table
from pyspark_jetstream.client import SyncClient

VERIFY_EVERY = 2.0
"""Seconds between two looks of ``--verify --wait``."""


def add_commands(cluster_commands: Any) -> None:
    """``cluster reassign`` and ``cluster drain``."""
    reassign = cluster_commands.add_parser(
        "reassign", help="move partitions between brokers: --generate a plan, run it, --verify, --cancel"
    )
    mode = reassign.add_mutually_exclusive_group()
    mode.add_argument(
        "--generate", action="store_true", help="print a plan spreading --streams over --brokers"
    )
    mode.add_argument("--verify", action="store_true", help="progress of each partition being moved")
    reassign.add_argument(
        "--wait", action="store_true", help="with --verify: again every 2 s until nothing moves"
    )
    mode.add_argument(
        "--cancel", action="store_true", help="put partitions being moved back (--plan's, or all)"
    )
    reassign.add_argument(
        "--plan",
        type=Path,
        help='plan file {"partitions": [{"stream", "partition", "replicas"}]}; alone: start moving',
    )
    reassign.add_argument("--brokers", help="with --generate: broker ids, comma-separated")
    reassign.add_argument("--streams", help="with --generate: stream names, comma-separated (default: all)")
    reassign.add_argument(
        "--throttle",
        type=parse_size,
        default=0,
        help="bytes/s each new replica's broker may fetch (e.g. 50MB)",
    )
    reassign.set_defaults(run=_reassign)
    drain = cluster_commands.add_parser("drain", help="move every replica off a broker before retiring it")
    drain.add_argument("broker")
    drain.add_argument(
        "--throttle", type=parse_size, default=0, help="bytes/s per receiving broker (e.g. 50MB)"
    )
    drain.set_defaults(run=_drain)


def _reassign(client: SyncClient, args: argparse.Namespace) -> None:
    if args.generate:
        if not args.brokers:
            fail("--generate needs --brokers b1,b2,...")
            raise SystemExit(2)
        streams = args.streams.split(",") if args.streams else None
        generated = client.generate_reassignment(_names(args.brokers), streams)
        if not generated["proposed"]:
            print("every partition is where the plan would put it", file=sys.stderr)
            return
        print(
            f"current replicas (to go back): {json.dumps({'partitions': generated['current']})}",
            file=sys.stderr,
        )
        print(json.dumps({"partitions": generated["proposed"]}))
        return
    plan = _read_plan(args.plan) if args.plan else None
    if not (args.verify or args.cancel):
        if plan is None:
            fail("say what to do: --plan FILE (start moving), --generate, --verify or --cancel")
            raise SystemExit(2)
        result = client.reassign(plan, throttle=args.throttle)
        if result["started"]:
            print(f"moving {', '.join(result['started'])}")
        if result.get("under_way"):
            print(f"moving already as the plan says: {', '.join(result['under_way'])}")
        if not result["started"] and not result.get("under_way"):
            print("every partition is where the plan puts it already")
        return
    if args.cancel:
        wanted = None if plan is None else [(e["stream"], e["partition"]) for e in plan["partitions"]]
        cancelled = client.cancel_reassignment(wanted)["cancelled"]
        print(f"cancelled {', '.join(cancelled)}" if cancelled else "no partition was being moved")
        return
    while (moving := _verify(client, plan)) and args.wait:
        time.sleep(VERIFY_EVERY)
        print()
    if plan is not None and not args.wait and moving:
        return  # in progress: not a failure
    if plan is not None and _not_done(client, plan):
        raise SystemExit(1)  # some partition of the plan is not where the plan puts it


def _drain(client: SyncClient, args: argparse.Namespace) -> None:
    result = client.drain(args.broker, throttle=args.throttle)
    for entry in result["plan"]:
        print(f"{entry['stream']}/{entry['partition']} -> {','.join(entry['replicas'])}")
    moving = len(result["started"])
    print(f"moving {moving} partition(s) off {args.broker}; follow it: jetstream cluster reassign --verify")


def _not_done(client: SyncClient, plan: dict[str, Any]) -> bool:
    """Whether a partition of ``plan`` is not on the plan's replicas (in their order)."""
    described = {s.config["name"]: s for s in client.list_streams()}
    for entry in plan["partitions"]:
        info = described.get(entry["stream"])
        if info is None or entry["partition"] >= len(info.partitions):
            return True
        if list(info.partitions[entry["partition"]].replicas) != entry["replicas"]:
            return True
    return False


def _verify(client: SyncClient, plan: dict[str, Any] | None) -> bool:
    """Print each moving partition's progress (and the plan's partitions' state); whether any of
    them (of the plan's, with a plan) is still moving."""
    moving = {(p["stream"], p["partition"]): p for p in client.reassignments()}
    statuses = client.cluster_status()
    held = {
        (p["stream"], p["partition"], broker_id): p
        for broker_id, status in statuses.items()
        for p in status.get("partitions", [])
    }
    rows = []
    for (stream, number), p in sorted(moving.items()):
        leader = held.get((stream, number, p["leader"]))
        for replica in p["adding"]:
            mine = held.get((stream, number, replica))
            rows.append(
                [
                    f"{stream}/{number}",
                    ",".join(p["target"]),
                    replica,
                    *_progress(mine, leader, p["throttle"]),
                ]
            )
    if rows:
        table(["partition", "target", "new replica", "log end", "bytes behind", "eta"], rows)
    if plan is not None:
        described = {s.config["name"]: s for s in client.list_streams()}
        for entry in plan["partitions"]:
            key = (entry["stream"], entry["partition"])
            info = described.get(entry["stream"])
            replicas = None
            if info is not None and entry["partition"] < len(info.partitions):
                replicas = list(info.partitions[entry["partition"]].replicas)
            if key in moving:
                state = "in progress"
            elif replicas == entry["replicas"]:
                state = "done"
            else:
                state = f"not moved (replicas {','.join(replicas) if replicas else '?'})"
            print(f"{key[0]}/{key[1]}: {state}")
    elif not rows:
        print("no partition is being moved")
    if plan is not None:
        return any((e["stream"], e["partition"]) in moving for e in plan["partitions"])
    return bool(moving)


def _progress(mine: dict[str, Any] | None, leader: dict[str, Any] | None, throttle: int) -> list[str]:
    if mine is None or leader is None:
        return ["?", "?", "?"]
    behind = max(leader["size_bytes"] - mine["size_bytes"], 0)
    eta = "caught up" if not behind else f"{behind / throttle:.0f} s" if throttle else "-"
    return [f"{mine['log_end_offset']} of {leader['log_end_offset']}", str(behind), eta]


def _read_plan(path: Path) -> dict[str, Any]:
    try:
        plan = json.loads(path.read_text())
    except OSError as exc:
        fail(f"cannot read the plan {path}: {exc.strerror or exc}")
        raise SystemExit(1) from None
    except ValueError as exc:
        fail(f"the plan {path} is not JSON: {exc}")
        raise SystemExit(1) from None
    if isinstance(plan, list):
        plan = {"partitions": plan}
    entries = plan.get("partitions") if isinstance(plan, dict) else None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict)
        and isinstance(e.get("stream"), str)
        and isinstance(e.get("partition"), int)
        and isinstance(e.get("replicas"), list)
        for e in entries
    ):
        fail(f'the plan {path} must be {{"partitions": [{{"stream", "partition", "replicas"}}, ...]}}')
        raise SystemExit(1)
    return {"partitions": entries}


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]
