"""Mirror benchmark: how fast a mirror copies, and how far behind it is at a steady rate.

Two deployments on this machine, each a broker with its own embedded
nats-server and metadata (``LocalBroker``): the source and the mirror's.
100-byte values.

1. copy rate: 10,000-row Arrow batches published to an RF=1 stream of the
   source (``LEADER`` acks, one batch in flight: the source's own batch
   publish, ``rf1_batch_rows_per_s``); then a mirror of it is created in the
   other deployment and timed until it holds every row
   (``mirror_rows_per_s``).  ``mirror_ratio_to_rf1_batch`` is the second over
   the first (the target is 0.8 or more): a mirror keeps up with the fastest
   way into its source;
2. lag at a steady 1,000 messages/s: plain NATS publishes with a send
   timestamp into the source, read by a live tail of the *mirror*
   (``mirror_lag_p99_ms``: from the publish to the mirror's reader, so it
   holds the source's commit, the copy, the mirror's commit and its live
   tail), beside the same tail read from the source itself
   (``source_tail_p99_ms``, the peer measured in the same run; the RF3 live
   tail's p99 is ``cluster_bench``'s ``rf3_p99_latency_ms``).

Prints a table; the last line is one JSON object.

    python bench/mirror_bench.py [--quick | --smoke]
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nats
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.broker_bench import _percentile, tail_latencies
from bench.sizes import last_line, parser, pick, size_of
from pyspark_jetstream.client import Client
from pyspark_jetstream.local import LocalBroker

VALUE = b"x" * 100
BATCH_ROWS = 10_000


async def copy_rates(source: Client, mirror: Client, address: str, rows: int) -> tuple[float, float]:
    """Rows/s of the source's own batch publish, and of a mirror copying the same rows."""
    await source.create_stream("copy", "bench.copy")
    batch = pa.table({"value": [VALUE] * BATCH_ROWS})
    started = time.perf_counter()
    for _ in range(rows // BATCH_ROWS):
        await source.publish_batch("copy", batch)
    published = time.perf_counter() - started
    started = time.perf_counter()
    await mirror.create_mirror("copy", "copy", address)
    while True:
        statuses = await mirror.mirror_status("copy")
        if statuses[0].mirror_end >= rows:
            break
        if time.perf_counter() - started > 600:
            raise RuntimeError(f"the mirror copied {statuses[0].mirror_end} of {rows} rows in 600 s")
        await asyncio.sleep(0.01)
    copied = time.perf_counter() - started
    return rows / published, rows / copied


async def run(size: str) -> dict[str, float]:
    rows = pick(size, smoke=20_000, quick=1_000_000, full=5_000_000)
    seconds = pick(size, smoke=0.6, quick=8.0, full=30.0)
    workdir = Path(tempfile.mkdtemp(prefix="mirror-bench-"))
    source_broker = LocalBroker(workdir / "source", broker_id="source-1", log_level="WARNING").start()
    mirror_broker = LocalBroker(workdir / "mirror", broker_id="mirror-1", log_level="WARNING").start()
    results: dict[str, float] = {}
    try:
        source = await Client.connect(
            nats_urls=source_broker.nats_url, broker=source_broker.flight, timeout=60
        )
        mirror = await Client.connect(
            nats_urls=mirror_broker.nats_url, broker=mirror_broker.flight, timeout=60
        )
        nc = await nats.connect(source_broker.nats_url)
        try:
            published, copied = await copy_rates(source, mirror, source_broker.flight, rows)
            results["rf1_batch_rows_per_s"] = published
            results["mirror_rows_per_s"] = copied
            results["mirror_ratio_to_rf1_batch"] = copied / published
            await source.create_stream("lat", "bench.lat")
            await mirror.create_mirror("lat", "lat", source_broker.flight)
            mirrored = await tail_latencies(mirror, nc, "lat", seconds)
            results["mirror_lag_p99_ms"] = _percentile(mirrored, 0.99)
            results["mirror_lag_p50_ms"] = _percentile(mirrored, 0.50)
            await source.create_stream("peer", "bench.peer")
            direct = await tail_latencies(source, nc, "peer", seconds)
            results["source_tail_p99_ms"] = _percentile(direct, 0.99)
        finally:
            await nc.close()
            await source.close()
            await mirror.close()
    finally:
        mirror_broker.stop()
        source_broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def main() -> None:
    args = parser(__doc__.split("\n\n")[0], quick_help="1,000,000 rows, 8 s at 1,000 msg/s").parse_args()
    results = asyncio.run(run(size_of(args)))
    print(f"{'figure':<28} value")
    for name, value in sorted(results.items()):
        print(f"{name:<28} {value:,.2f}")
    print(last_line(results))


if __name__ == "__main__":
    main()
