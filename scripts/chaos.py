"""``make chaos``: the fault matrix, long: faults at random against a real cluster under load.

Starts ZooKeeper, one nats-server and three brokers (each broker-to-broker
link through a proxy the nemesis can cut), runs producers with ``ALL`` acks
and idempotent retries and consumers that record every read (on a plain
stream, and on a typed one whose schema gains a field now and then), and injects
faults at random -- one kind, or two at once on different brokers -- for
``--minutes``.  Then it heals everything, waits for the replicas to catch up,
stops the cluster and checks the history against the files: lost and
duplicated acknowledged values, stale reads, offset gaps, divergent replicas
and the longest unavailability after a heal.  Prints the table, then one
JSON line of the figures; exits 1 if anything was lost, duplicated, stale,
missing, divergent or (on the typed stream) stored without typed columns that
agree with the value.  A run that fails or does not check out keeps its
files and the brokers' logs (the path is printed); ``--keep`` keeps them always.

    make chaos                      # 10 minutes, seed 1
    .venv/bin/python scripts/chaos.py --minutes 2 --seed 7 --keep /tmp/chaos
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.faults.matrix import random_faults, run_matrix  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to inject faults (default 10)")
    parser.add_argument(
        "--seed", type=int, default=1, help="the random seed: same seed, same faults in order"
    )
    parser.add_argument("--hold", type=float, default=4.0, help="seconds each fault is held (default 4)")
    parser.add_argument("--rest", type=float, default=4.0, help="seconds of calm after each heal (default 4)")
    parser.add_argument("--keep", type=Path, help="keep the cluster's files and logs in this directory")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.hold <= 0 or args.rest < 0:
        parser.error("--minutes and --hold must be positive, --rest not negative")

    base = args.keep or Path(tempfile.mkdtemp(prefix="jetstream-chaos-"))
    if args.keep and base.exists() and any(base.iterdir()):
        parser.error(f"--keep {base}: the directory is not empty")
    rng = random.Random(args.seed)
    started = time.monotonic()

    def progress(fault: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {fault}", flush=True)

    try:
        report = run_matrix(
            base / "cluster",
            faults=random_faults(rng),
            rng=rng,
            warm_up=3.0,
            hold=args.hold,
            rest=args.rest,
            until=started + args.minutes * 60,
            progress=progress,
            brokers=4,  # a broker to move replicas to (reassign)
        )
    except BaseException:
        if not args.keep:  # what failed is in the brokers' logs: keep them
            print(f"chaos: the run failed; its files and logs are kept in {base}", file=sys.stderr)
        raise
    print()
    print(f"chaos: seed {args.seed}, {args.minutes:g} minutes, {time.monotonic() - started:.0f} s in all")
    print(report.table())
    figures = {
        "seed": args.seed,
        "minutes": args.minutes,
        "faults": dict(report.faults),
        "operations": report.operations,
        "acked": report.acked,
        "reads": report.reads,
        "lost": report.lost,
        "duplicates": report.duplicates,
        "stale_reads": report.stale_reads,
        "gaps": report.gaps,
        "divergent_replicas": report.divergent_replicas,
        "typed_mismatches": report.typed_mismatches,
        "schema_changes": report.schema_changes,
        "longest_unavailability_s": round(report.longest_unavailability, 2),
    }
    print(json.dumps(figures))
    bad = (
        report.lost
        + report.duplicates
        + report.stale_reads
        + report.gaps
        + report.divergent_replicas
        + report.typed_mismatches
    )
    if bad and not args.keep:
        print(f"chaos: the history does not check out; files and logs kept in {base}", file=sys.stderr)
    elif not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
