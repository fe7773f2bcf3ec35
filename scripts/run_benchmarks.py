"""``make bench``: every benchmark's ``--quick`` run, its figures kept in one dated file.

Runs each ``bench/*_bench.py`` in turn (one at a time: they would skew each
other), shows its table as it goes, and writes ``bench/results/<UTC time>.json``::

    {"date": "2026-11-25T10:00:00Z", "commit": "<git HEAD>", "size": "quick",
     "machine": {"cpus": 2, "load_1min_before": 0.4, "python": "3.11.7"},
     "benchmarks": {"broker_bench": {<its JSON line>}, ...}}

A benchmark that fails is listed under ``"failed"`` with the end of its
output, and the script exits 1 after running the others.

    .venv/bin/python scripts/run_benchmarks.py [--size quick|smoke|full] [--only broker_bench ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"


def benchmarks() -> list[Path]:
    """Every benchmark script, by name."""
    return sorted(BENCH.glob("*_bench.py"))


def last_json_line(output: str) -> dict[str, float]:
    """The JSON object a benchmark's output ends with; ``ValueError`` if it does not end with one."""
    lines = output.strip().splitlines()
    if not lines:
        raise ValueError("it printed nothing")
    figures = json.loads(lines[-1])
    if not isinstance(figures, dict):
        raise ValueError(f"its last line is not a JSON object: {lines[-1][:200]}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("smoke", "quick", "full"), default="quick")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these benchmarks (e.g. broker_bench)")
    args = parser.parse_args(argv)
    chosen = [b for b in benchmarks() if not args.only or b.stem in args.only]
    unknown = set(args.only or ()) - {b.stem for b in chosen}
    if unknown:
        known = ", ".join(b.stem for b in benchmarks())
        parser.error(f"no benchmark named {', '.join(sorted(unknown))}; there are {known}")
    head = subprocess.run(["git", "rev-parse", "HEAD"], check=False, cwd=ROOT, capture_output=True, text=True)
    commit = head.stdout.strip()
    record: dict[str, object] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit,
        "size": args.size,
        "machine": {
            "cpus": os.cpu_count(),
            "load_1min_before": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
        },
    }
    figures: dict[str, dict[str, float]] = {}
    failed: dict[str, str] = {}
    flag = [] if args.size == "full" else [f"--{args.size}"]
    for script in chosen:
        print(f"== {script.stem} {' '.join(flag)}", flush=True)
        started = time.monotonic()
        run = subprocess.run(
            [sys.executable, str(script), *flag], check=False, cwd=ROOT, capture_output=True, text=True
        )
        print(run.stdout, end="", flush=True)
        try:
            if run.returncode != 0:
                raise ValueError(f"it exited with {run.returncode}")
            figures[script.stem] = last_json_line(run.stdout)
        except ValueError as exc:
            failed[script.stem] = f"{exc}: {(run.stdout + run.stderr)[-2000:]}"
            print(f"!! {script.stem} failed: {exc}\n{run.stderr[-2000:]}", flush=True)
        print(f"   ({time.monotonic() - started:.0f} s)", flush=True)
    record["benchmarks"] = figures
    if failed:
        record["failed"] = failed
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{record['date']}.json".replace(":", "")
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
