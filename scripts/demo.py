"""The main job on the embedded default: `make demo`.

1. starts a broker with its own embedded nats-server, in a temporary directory;
2. creates the stream ``orders`` on the NATS subject ``shop.orders.*``;
3. publishes a sample dataset of JSON orders with a plain NATS client (no
   pyspark-jetstream code on the producer side);
4. runs a Spark Structured Streaming query over the stream with
   ``format("jetstream")`` and prints each micro-batch's rows and rows/s;
5. prints the result and the query's cursor in the log, shuts down and removes its directory.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyspark_jetstream.client import SyncClient  # noqa: E402
from pyspark_jetstream.local import LocalBroker  # noqa: E402
from pyspark_jetstream.spark import jetstream_session  # noqa: E402

ORDERS = 200_000
COUNTRIES = ["de", "fr", "it", "nl", "pl", "se", "es", "pt"]


async def publish_orders(nats_url: str) -> float:
    """Publish the sample orders as plain NATS messages; return the seconds it took."""
    rng = random.Random(7)
    nc = await nats.connect(nats_url)
    started = time.perf_counter()
    for i in range(ORDERS):
        country = rng.choice(COUNTRIES)
        order = {"order_id": i, "country": country, "amount": round(rng.uniform(5, 500), 2)}
        await nc.publish(f"shop.orders.{country}", json.dumps(order).encode())
    await nc.flush()
    elapsed = time.perf_counter() - started
    await nc.close()
    return elapsed


def main() -> None:
    """Run the demo end to end."""
    workdir = Path(tempfile.mkdtemp(prefix="jetstream-demo-"))
    print(f"starting a broker with an embedded nats-server in {workdir}")
    broker = LocalBroker(workdir / "data").start()
    nats_url = str(broker.nats_url)
    try:
        with SyncClient(nats_urls=nats_url) as client:
            print(f"the broker serves Arrow Flight at {client.broker}, NATS at {nats_url}")
            client.create_stream("orders", "shop.orders.*")
            seconds = asyncio.run(publish_orders(nats_url))
            print(f"published {ORDERS:,} orders with a plain NATS client in {seconds:.1f}s")
            while client.describe_stream("orders").partitions[0].high_watermark < ORDERS:
                time.sleep(0.05)

            spark = jetstream_session("pyspark-jetstream demo")
            spark.sparkContext.setLogLevel("ERROR")
            orders = (
                spark.readStream.format("jetstream")
                .option("servers", client.broker)
                .option("stream", "orders")
                .option("startingOffsets", "earliest")
                .option("maxRecordsPerTrigger", "50000")
                .option("consumerId", "demo")
                .load()
                .selectExpr(
                    "from_json(cast(value as string), 'order_id long, country string, amount double') AS o"
                )
                .select("o.*")
            )
            totals = orders.groupBy("country").agg({"amount": "sum", "order_id": "count"})
            print("running a Structured Streaming query over format('jetstream') (Trigger.AvailableNow):")
            query = (
                totals.writeStream.format("memory")
                .queryName("totals")
                .outputMode("complete")
                .option("checkpointLocation", str(workdir / "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            for progress in query.recentProgress:
                if progress["numInputRows"]:
                    print(
                        f"  micro-batch {progress['batchId']}: {progress['numInputRows']:>7,} rows "
                        f"at {progress['processedRowsPerSecond']:>10,.0f} rows/s"
                    )
            print("orders and revenue per country:")
            spark.sql(
                "SELECT country, `count(order_id)` AS orders, round(`sum(amount)`, 2) AS revenue "
                "FROM totals ORDER BY country"
            ).show()
            counted = spark.sql("SELECT sum(`count(order_id)`) AS n FROM totals").first()[0]  # type: ignore[index]
            print(f"counted {counted:,} of {ORDERS:,} orders")
            spark.stop()
            cursor = client.fetch_cursor("demo", "orders", 0)
            end = client.describe_stream("orders").partitions[0].high_watermark
            print(
                f"the query's cursor in the log: orders/0 at offset {cursor} of {end} "
                f"(lag {end - cursor}: the next offset it reads)"
            )
            if counted != ORDERS:
                raise SystemExit("the demo lost or duplicated orders")
    finally:
        print(f"broker stopped (exit code {broker.stop()})")
        shutil.rmtree(workdir, ignore_errors=True)  # the log and the checkpoint: 25 MB a run


if __name__ == "__main__":
    main()
