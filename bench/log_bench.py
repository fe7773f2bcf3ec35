"""Commit-log benchmark: append and read throughput against the machine's raw file bandwidth.

Measured in one run, on the same disk:

* append of 100-byte values in batches of 1, 100 and 10,000 messages;
* sequential read of the whole log after closing and reopening it (every
  batch checksum-verified, as a consumer receives it);
* the raw bandwidth: a plain Python loop that writes the same number of bytes
  to a file in chunks of the same size as the log's batches, then reads it back.

Both sides run against the page cache (nothing is fsynced: the log's default
policy), so the ratios compare CPU work per byte, which is what the log adds.
Volumes stay under about 1 GB per phase: past that this machine throttles
writers to disk speed, and which side gets throttled first is luck.
Prints a table; the last line is one JSON object.

    python bench/log_bench.py [--quick | --smoke] [--dir DIR]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sizes import last_line, parser, pick, size_of
from broker_node.log import Log, LogConfig, Record

VALUE_SIZE = 100


def _values(n: int) -> pa.Table:
    payload = os.urandom(VALUE_SIZE)
    return pa.table({"value": pa.array([payload] * n, pa.binary())})


def bench_append(directory: Path, batch_size: int, total: int) -> tuple[float, int, Log]:
    """Append ``total`` messages in batches of ``batch_size``; return seconds, bytes stored, the log."""
    log = Log.open(directory, LogConfig(segment_bytes=256 * 1024 * 1024, max_batch_bytes=64 * 1024 * 1024))
    if batch_size == 1:
        records = [[Record(os.urandom(VALUE_SIZE))] for _ in range(1000)]
        start = time.perf_counter()
        for i in range(total):
            log.append(records[i % 1000])
    else:
        batch = _values(batch_size)
        start = time.perf_counter()
        for _ in range(total // batch_size):
            log.append(batch)
    elapsed = time.perf_counter() - start
    return elapsed, log.size_bytes, log


def bench_read(directory: Path) -> tuple[float, int]:
    """Reopen the log and read it all, 16 MiB per call; return seconds and rows."""
    start = time.perf_counter()
    rows = 0
    with Log.open(directory) as log:
        offset = log.log_start_offset
        end = log.log_end_offset
        while offset < end:
            batches = log.read(offset, max_bytes=16 * 1024 * 1024)
            for batch in batches:
                rows += batch.num_rows
            offset = batches[-1].column(0)[-1].as_py() + 1
    return time.perf_counter() - start, rows


def bench_raw(directory: Path, total_bytes: int, chunk: int) -> tuple[float, float]:
    """Write then read ``total_bytes`` in ``chunk``-byte pieces; return bytes/s for each."""
    path = directory / "raw.bin"
    data = os.urandom(chunk)
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        written = 0
        while written < total_bytes:
            written += f.write(data)
    write_rate = written / (time.perf_counter() - start)
    start = time.perf_counter()
    read = 0
    with open(path, "rb", buffering=0) as f:
        while piece := f.read(chunk):
            read += len(piece)
    read_rate = read / (time.perf_counter() - start)
    path.unlink()
    return write_rate, read_rate


ROUNDS = 3


def _stored_bytes_estimate(root: Path, total: int) -> int:
    """Bytes the log stores for ``total`` messages in batches of 10,000 (one batch written to find out)."""
    directory = root / "estimate"
    with Log.open(directory) as log:
        log.append(_values(10_000))
        per_batch = log.size_bytes
    shutil.rmtree(directory)
    return per_batch * (total // 10_000)


def main() -> None:
    arguments = parser(__doc__, quick_help="smaller data, finishes within 90 s")
    arguments.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = arguments.parse_args()
    size = size_of(args)
    sizes = pick(
        size,
        smoke={1: 2_000, 100: 20_000, 10_000: 100_000},
        quick={1: 50_000, 100: 300_000, 10_000: 2_000_000},
        full={1: 200_000, 100: 2_000_000, 10_000: 5_000_000},
    )
    rounds = pick(size, smoke=1, quick=ROUNDS, full=ROUNDS)
    root = Path(tempfile.mkdtemp(prefix="log-bench-", dir=args.dir))
    samples: dict[str, list[float]] = {}

    def sample(name: str, value: float) -> None:
        samples.setdefault(name, []).append(value)

    try:
        # The machine is noisy and the page cache's writeback comes in bursts, so the
        # log and the raw loop alternate over several rounds and medians are reported.
        # Each phase starts with no dirty pages left by the previous one (os.sync).
        stored_estimate = _stored_bytes_estimate(root, sizes[10_000])
        for _ in range(rounds):
            # Every round starts from an empty directory, raw loop first, so both sides
            # write with the same files in the page cache.
            for leftover in root.iterdir():
                shutil.rmtree(leftover)
            os.sync()
            raw_write, raw_read = bench_raw(
                root, stored_estimate, stored_estimate // (sizes[10_000] // 10_000)
            )
            sample("raw_write_bytes_per_s", raw_write)
            sample("raw_read_bytes_per_s", raw_read)
            for batch_size, total in sizes.items():
                directory = root / f"batch{batch_size}"
                os.sync()
                elapsed, stored, log = bench_append(directory, batch_size, total)
                log.close()
                sample(f"append_msgs_per_s_batch{batch_size}", total / elapsed)
                sample(f"append_bytes_per_s_batch{batch_size}", stored / elapsed)
            big = root / "batch10000"
            os.sync()
            read_s, rows = bench_read(big)
            stored = sum(p.stat().st_size for p in big.glob("*.arrows"))
            sample("read_rows_per_s", rows / read_s)
            sample("read_bytes_per_s", stored / read_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    results = {name: statistics.median(values) for name, values in samples.items()}
    results["append_rows_per_s_batch10000"] = results["append_msgs_per_s_batch10000"]
    results["append_ratio_to_raw_write"] = (
        results["append_bytes_per_s_batch10000"] / results["raw_write_bytes_per_s"]
    )
    results["read_ratio_to_raw_read"] = results["read_bytes_per_s"] / results["raw_read_bytes_per_s"]

    rows_table = [
        *(
            (
                f"append, batches of {b:,}",
                results[f"append_msgs_per_s_batch{b}"],
                results[f"append_bytes_per_s_batch{b}"],
            )
            for b in sizes
        ),
        ("read whole log after reopen", results["read_rows_per_s"], results["read_bytes_per_s"]),
        ("raw file write (Python loop)", None, results["raw_write_bytes_per_s"]),
        ("raw file read (Python loop)", None, results["raw_read_bytes_per_s"]),
    ]
    print(f"medians of {rounds} rounds; MB/s counts bytes as stored (Arrow IPC framing included)")
    print(f"{'measure':<32} {'messages/s':>14} {'MB/s':>10}")
    for name, msgs, rate in rows_table:
        shown = "" if msgs is None else f"{msgs:,.0f}"
        print(f"{name:<32} {shown:>14} {rate / 1e6:>10.0f}")
    print(
        f"batched append / raw write = {results['append_ratio_to_raw_write']:.2f}x (target >= 0.5); "
        f"read / raw read = {results['read_ratio_to_raw_read']:.2f}x (target >= 0.5); "
        f"single appends = {results['append_msgs_per_s_batch1']:,.0f}/s (target >= 20,000)"
    )
    print(last_line(results, 3))


if __name__ == "__main__":
    main()
