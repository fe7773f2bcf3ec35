"""What the commands share: one-line usage errors and failures, option types, tables."""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import NoReturn

from pyspark_jetstream.protocol.flight import StreamInfo
from pyspark_jetstream.protocol.streams import number_range

MIN_TIMEOUT = 0.1
MAX_TIMEOUT = 3600.0


def fail(message: str) -> None:
    """Print ``message`` as the one line a failure writes to stderr."""
    print(f"jetstream: {' '.join(message.split())}", file=sys.stderr)


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (the usage itself is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` on one line and exit 2."""
        self.exit(2, f"jetstream: {message} (see '{self.prog} --help')\n")


def parse_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not MIN_TIMEOUT <= value <= MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(f"must be {number_range(MIN_TIMEOUT, MAX_TIMEOUT)}, got {text!r}")
    return value


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``12h``, ``7d`` or ``2w``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"must be seconds or a number with s, m, h, d or w, got {text!r}")
    return float(match.group(1)) * _DURATION_UNITS.get(match.group(2) or "s", 1)


def parse_size(text: str) -> int:
    """Bytes from ``4096``, ``512KiB``, ``64MB``, ``1GiB`` (KB/MB/GB are powers of 1000)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(
            f"must be bytes or a number with KB, MB, GB, TB, KiB, MiB, GiB or TiB, got {text!r}"
        )
    value = float(match.group(1)) * _SIZE_UNITS[match.group(2)]
    if value != int(value):
        raise argparse.ArgumentTypeError(f"must be a whole number of bytes, got {text!r}")
    return int(value)


def partition_table(streams: list[StreamInfo]) -> None:
    rows = [
        [
            s.config["name"],
            str(p.partition),
            p.leader,
            ",".join(p.isr),
            str(p.log_start_offset),
            str(p.log_end_offset),
            str(p.high_watermark),
        ]
        for s in streams
        for p in s.partitions
    ]
    table(["stream", "partition", "leader", "isr", "log start", "log end", "high watermark"], rows)


def table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    if not rows:
        print("(none)")
