"""``make chaos``, second part: a leader's memory while it replicates a gigabyte.

Starts ZooKeeper, one nats-server and three brokers, publishes ``--mb`` of
64 KiB values one at a time with ``ALL`` acks into a replication factor 3
stream, and checks that the leader's anonymous memory stays within its
largest follower's plus 150 MB.  Prints the figures, then one JSON line;
exits 1 when the leader is over the bound.

    .venv/bin/python scripts/soak.py --mb 1024
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyspark_jetstream.client import SyncClient  # noqa: E402
from pyspark_jetstream.local import LocalCluster  # noqa: E402
from tests.cluster.soak import soak  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="megabytes to replicate (default 1024)")
    args = parser.parse_args(argv)
    if args.mb <= 0:
        parser.error(f"--mb must be positive, got {args.mb}")
    started = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="jetstream-soak-"))
    with (
        LocalCluster(3, base_dir=base / "cluster") as cluster,
        SyncClient(nats_urls=cluster.nats_url, broker=cluster.flight, timeout=30) as client,
    ):
        result = soak(cluster, client, args.mb)
    print(f"{result} ({time.monotonic() - started:.0f} s)")
    print(
        json.dumps(
            {
                "replicated_mb": round(result.replicated_mb),
                "leader_mb": round(result.leader_mb, 1),
                "followers_mb": {b: round(mb, 1) for b, mb in result.followers_mb.items()},
                "bound_mb": round(result.bound_mb, 1),
                "within_bound": result.within_bound,
            }
        )
    )
    return 0 if result.within_bound else 1


if __name__ == "__main__":
    sys.exit(main())
