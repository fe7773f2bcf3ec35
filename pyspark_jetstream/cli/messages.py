"""``jetstream publish`` and ``jetstream tail``: messages in and out."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import Any

from pyspark_jetstream.client import AckPolicy, SyncClient
from pyspark_jetstream.protocol.errors import InvalidArgumentError


def add_commands(commands: Any) -> None:
    """``publish`` and ``tail``."""
    publish = commands.add_parser(
        "publish", help="publish a message (or each line of stdin with '-') and print its ack"
    )
    publish.add_argument("stream")
    publish.add_argument("value", help="the message; '-' publishes each line read from stdin")
    publish.add_argument("--key")
    publish.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    publish.add_argument("--partition", type=int)
    publish.add_argument("--subject", help="publish on this subject (streams on wildcard subjects)")
    publish.add_argument("--ack-policy", choices=[p.name.lower() for p in AckPolicy], default="leader")
    publish.set_defaults(run=_publish)

    tail = commands.add_parser(
        "tail",
        help="print a stream's messages, then follow new ones until Ctrl-C (--no-follow: stop at the end)",
        description="Print a stream's messages, one line each: where (partition/offset, or the offset "
        "alone with --partition), time, key, value. After the last one it waits for new messages "
        "until Ctrl-C; --no-follow stops at the end instead, --count N after N messages.",
    )
    tail.add_argument("stream")
    tail.add_argument(
        "--partition",
        type=int,
        help="only this partition; lines then start with the offset (without it: every partition, "
        "lines start with partition/offset)",
    )
    tail.add_argument(
        "--from", dest="start", default="earliest", help="earliest, latest, an offset or an ISO time"
    )
    tail.add_argument("--count", type=int, help="stop after this many messages")
    tail.add_argument("--no-follow", action="store_true", help="stop at the end instead of waiting for more")
    tail.set_defaults(run=_tail)


def _publish(client: SyncClient, args: argparse.Namespace) -> None:
    headers = []
    for header in args.header:
        name, sep, value = header.partition("=")
        if not sep or not name:
            raise InvalidArgumentError(f"--header {header!r} must look like NAME=VALUE")
        headers.append((name, value.encode()))
    values = (
        (line.rstrip("\n").encode() for line in sys.stdin) if args.value == "-" else [args.value.encode()]
    )
    for value in values:
        ack = client.publish(
            args.stream,
            value,
            key=args.key.encode() if args.key is not None else None,
            headers=headers,
            partition=args.partition,
            subject=args.subject,
            ack_policy=AckPolicy[args.ack_policy.upper()],
        )
        if ack is None:
            print("published (no ack requested)", flush=True)
        else:
            note = " (duplicate)" if ack.duplicate else ""
            print(f"stored in {ack.stream}/{ack.partition} at offset {ack.first_offset}{note}", flush=True)


def _tail(client: SyncClient, args: argparse.Namespace) -> None:
    start: Any = args.start
    if start not in ("earliest", "latest"):
        if start.isdigit():
            start = int(start)
        else:
            try:
                start = datetime.fromisoformat(start)
            except ValueError:
                raise InvalidArgumentError(
                    f"--from {start!r} is not earliest, latest, an offset or an ISO time"
                ) from None
    every = args.partition is None
    partitions = (
        list(range(len(client.describe_stream(args.stream).partitions))) if every else [args.partition]
    )
    seen = 0
    if args.no_follow:
        for partition in partitions:
            position = start
            while True:
                result = client.fetch(args.stream, partition, start=position, max_records=10_000)
                for row in result.to_table().to_pylist():
                    where = f"{partition}/{row['offset']}" if every else str(row["offset"])
                    _print_message(where, row["timestamp"], row["key"], row["value"])
                    seen += 1
                    if args.count is not None and seen >= args.count:
                        return
                if result.next_offset >= result.high_watermark or not result.num_rows:
                    break
                position = result.next_offset
        return
    for message in client.subscribe_partitions(args.stream, partitions, start=start):
        where = f"{message.partition}/{message.offset}" if every else str(message.offset)
        _print_message(where, message.timestamp, message.key, message.value)
        seen += 1
        if args.count is not None and seen >= args.count:
            return


def _print_message(where: str, timestamp: datetime, key: bytes | None, value: bytes | None) -> None:
    shown_key = "-" if key is None else key.decode(errors="replace")
    shown_value = "(null)" if value is None else value.decode(errors="replace")
    print(f"{where}\t{timestamp.isoformat()}\t{shown_key}\t{shown_value}", flush=True)
