"""What every benchmark shares: its three sizes, its last line, and the machine's CPU clock.

* ``--smoke``: seconds; exercises every measure so the suite can check the
  benchmark still runs and still prints every figure (``tests/test_benchmarks.py``);
  its numbers mean nothing.
* ``--quick``: minutes; the figures ``make bench`` records in ``bench/results/``.
* neither: the full sizes ``bench/RESULTS.md`` names.

The last line a benchmark prints is one JSON object of its figures.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

SIZES = ("smoke", "quick", "full")


def parser(description: str | None, *, quick_help: str) -> argparse.ArgumentParser:
    """An argument parser with the exclusive ``--smoke`` and ``--quick`` flags."""
    made = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = made.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help=quick_help)
    group.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, seconds: checks that it runs; the figures mean nothing",
    )
    return made


def size_of(args: argparse.Namespace) -> str:
    """``smoke``, ``quick`` or ``full`` from parsed arguments."""
    return "smoke" if args.smoke else "quick" if args.quick else "full"


def pick(size: str, *, smoke: T, quick: T, full: T) -> T:
    """The value for ``size``."""
    return {"smoke": smoke, "quick": quick, "full": full}[size]


def last_line(results: Mapping[str, float], digits: int = 4) -> str:
    """The JSON line a benchmark ends with: its figures, sorted, rounded."""
    return json.dumps({k: round(v, digits) for k, v in sorted(results.items())})


def machine_cpu_seconds() -> float:
    """CPU time the whole machine has been busy so far, all cores (Linux ``/proc/stat``: user,
    nice, system, irq, softirq and steal; not idle or iowait)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
