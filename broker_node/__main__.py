"""``python -m broker_node [--config FILE] [--data-dir DIR]``: run a broker until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from datetime import UTC, datetime

from broker_node.broker import Broker
from broker_node.config import ConfigError, load_broker_config
from broker_node.metadata_rebuild import rebuild
from broker_node.owner import watch_owner
from pyspark_jetstream.protocol.errors import JetStreamError


async def run(broker: Broker) -> None:
    """Start ``broker``, serve until a stop signal, then shut down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.ensure_future(broker.start())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        # Stopped while starting (waiting for ZooKeeper, say): the coordinator stops waiting, and
        # the start closes what it had started.
        await asyncio.to_thread(broker.coordinator.close)
        with contextlib.suppress(JetStreamError):
            await starting
        return
    stopped.cancel()
    starting.result()
    try:
        await stop.wait()
    finally:
        await broker.close()


def serve(broker: Broker) -> None:
    """Run ``broker`` on uvloop's event loop where it is installed (the broker extra installs it
    except on Windows), else on asyncio's own.  uvloop measured 5-10% more awaited publishes a
    second and a lower live-tail p50 (bench/RESULTS.md)."""
    try:
        import uvloop
    except ImportError:
        logging.getLogger(__name__).info("uvloop is not installed: asyncio's event loop")
        asyncio.run(run(broker))
        return
    uvloop.run(run(broker))


_RECORD_ATTRIBUTES = frozenset(logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
}
"""What every log record has; anything else on a record came from ``extra=``."""


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO, UTC), level, logger, message, the fields the
    line was logged with (``extra=``: ``stream`` and ``partition`` for a line about one), and
    the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _RECORD_ATTRIBUTES and name not in entry:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run a broker; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m broker_node", description="Run a pyspark-jetstream broker."
    )
    parser.add_argument("--config", help="broker TOML file (default: built-in defaults)")
    parser.add_argument("--data-dir", help="override [broker] data_dir")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text lines (default) or one JSON object per line, for log shippers",
    )
    parser.add_argument(
        "--owner-fd",
        type=int,
        help="the read end of a pipe held by the process this broker ends with (LocalBroker's)",
    )
    parser.add_argument(
        "--rebuild-metadata",
        action="store_true",
        help="write a lost or unreadable metadata.json again from the partitions' own records, then exit",
    )
    args = parser.parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter()
        if args.log_format == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    try:
        config = load_broker_config(args.config, data_dir=args.data_dir)
        if args.rebuild_metadata:
            for line in rebuild(config):
                print(f"jetstream broker: {line}")
            return 0
        owner = watch_owner(args.owner_fd) if args.owner_fd is not None else None
        serve(Broker(config, owner=owner))
    except (ConfigError, JetStreamError, OSError) as exc:
        print(f"jetstream broker: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    status = main()
    # Everything is closed by now.  Leave without the interpreter's teardown, which can
    # race native threads (gRPC, a fetcher stopped without waiting) and crash the exit.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
