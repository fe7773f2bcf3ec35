"""``jetstream cursor``: get, set, list, delete and reset consumers' positions."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from pyspark_jetstream.cli.admin_commands import add_declared_commands
from pyspark_jetstream.cli.common import table
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.protocol.errors import InvalidArgumentError, UnknownStreamError
from pyspark_jetstream.protocol.flight import PartitionInfo


def add_commands(commands: Any) -> None:
    """``cursor get``, ``set``, ``list``, ``delete`` and ``reset``."""
    cursor = commands.add_parser(
        "cursor", help="get, set, list, reset or delete consumers' positions (cursors)"
    )
    cursor_commands = cursor.add_subparsers(dest="cursor_command", required=True)
    add_declared_commands(cursor_commands, "cursor")  # get, set
    listed = cursor_commands.add_parser("list", help="every stored position: CURRENT, LOG-END and LAG")
    listed.add_argument("--consumer", help="only this consumer")
    listed.add_argument("--json", action="store_true", help="one JSON object per cursor")
    listed.set_defaults(run=_cursor_list)
    forget = cursor_commands.add_parser("delete", help="forget a consumer's positions on a stream")
    forget.add_argument("consumer")
    forget.add_argument("stream")
    forget.add_argument("--partition", type=int, help="only this partition (default: all)")
    forget.set_defaults(run=_cursor_delete)
    reset = cursor_commands.add_parser("reset", help="move a consumer's positions on a stream")
    reset.add_argument("consumer")
    reset.add_argument("stream")
    reset.add_argument("--partition", type=int, help="only this partition (default: all)")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="each partition's first kept offset")
    target.add_argument(
        "--to-latest", action="store_true", help="each partition's end (nothing left to read)"
    )
    target.add_argument("--to-datetime", metavar="ISO_TIME", help="the first message at or after this time")
    target.add_argument("--to-offset", type=int, metavar="N", help="this offset (kept within the partition)")
    target.add_argument("--shift-by", type=int, metavar="N", help="move by N (negative: back)")
    reset.add_argument("--dry-run", action="store_true", help="show the new positions without storing them")
    reset.set_defaults(run=_cursor_reset)


def _stored_cursors(client: SyncClient) -> list[dict[str, Any]]:
    """Every stored cursor, from the broker that leads the cursor stream."""
    for status in client.cluster_status().values():
        if status.get("cursors"):
            return list(status["cursors"])
    return []


def _cursor_list(client: SyncClient, args: argparse.Namespace) -> None:
    ends: dict[str, list[int]] = {}
    rows = []
    for cursor in _stored_cursors(client):
        if args.consumer is not None and cursor["consumer"] != args.consumer:
            continue
        stream = cursor["stream"]
        if stream not in ends:
            try:
                ends[stream] = [p.high_watermark for p in client.describe_stream(stream).partitions]
            except UnknownStreamError:
                ends[stream] = []
        partition = cursor["partition"]
        end = ends[stream][partition] if partition < len(ends[stream]) else None
        rows.append(
            {
                "consumer": cursor["consumer"],
                "stream": stream,
                "partition": partition,
                "current": cursor["offset"],
                "log_end": end,
                "lag": None if end is None else max(end - cursor["offset"], 0),
            }
        )
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    table(
        ["CONSUMER", "STREAM", "PARTITION", "CURRENT", "LOG-END", "LAG"],
        [[str("-" if v is None else v) for v in row.values()] for row in rows],
    )


def _partitions_of(client: SyncClient, stream: str, partition: int | None) -> list[PartitionInfo]:
    partitions = list(client.describe_stream(stream).partitions)
    if partition is None:
        return partitions
    if not 0 <= partition < len(partitions):
        raise InvalidArgumentError(
            f"stream {stream!r} has partitions 0 to {len(partitions) - 1}, not {partition}"
        )
    return [partitions[partition]]


def _cursor_delete(client: SyncClient, args: argparse.Namespace) -> None:
    for p in _partitions_of(client, args.stream, args.partition):
        client.delete_cursor(args.consumer, args.stream, p.partition)
        print(f"cursor {args.consumer} on {args.stream}/{p.partition} deleted")


def _cursor_reset(client: SyncClient, args: argparse.Namespace) -> None:
    when = None
    if args.to_datetime is not None:
        try:
            when = datetime.fromisoformat(args.to_datetime)
        except ValueError:
            when = None
        if when is None or when.tzinfo is None:
            raise InvalidArgumentError(
                f"--to-datetime {args.to_datetime!r} must be an ISO time with a zone "
                "(2026-11-23T10:00:00+00:00)"
            )
    rows = []
    for p in _partitions_of(client, args.stream, args.partition):
        current = client.fetch_cursor(args.consumer, args.stream, p.partition)
        if args.to_earliest:
            new = p.log_start_offset
        elif args.to_latest:
            new = p.high_watermark
        elif when is not None:
            found = client.fetch(args.stream, p.partition, start=when, max_records=1)
            new = found.batches[0].column(0)[0].as_py() if found.num_rows else found.next_offset
        elif args.to_offset is not None:
            new = args.to_offset
        else:
            if current is None:
                raise InvalidArgumentError(
                    f"{args.consumer} has no cursor on {args.stream}/{p.partition} to shift; "
                    "use --to-earliest, --to-latest, --to-datetime or --to-offset"
                )
            new = current + args.shift_by
        new = min(max(new, p.log_start_offset), p.high_watermark)
        if not args.dry_run:
            client.set_cursor(args.consumer, args.stream, p.partition, new)
        rows.append(
            [args.consumer, args.stream, str(p.partition), "-" if current is None else str(current), str(new)]
        )
    table(
        ["CONSUMER", "STREAM", "PARTITION", "CURRENT", "NEW" + (" (dry run)" if args.dry_run else "")], rows
    )
