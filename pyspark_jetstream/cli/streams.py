"""``jetstream stream``: create, list, describe, update (add partitions, evolve the schema) and delete
streams."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pyspark_jetstream.cli.admin_commands import add_declared_commands
from pyspark_jetstream.cli.common import parse_duration, parse_size, partition_table, table
from pyspark_jetstream.cli.mirrors import add_mirror_options, create_mirror, print_mirror
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.flight import StreamInfo
from pyspark_jetstream.protocol.schema import COMPRESSIONS
from pyspark_jetstream.protocol.streams import (
    INTERNAL_PREFIX,
    MAX_PARTITIONS,
    StreamConfig,
    bounded_int,
    int_range,
)
from pyspark_jetstream.protocol.subjects import subjects_overlap
from pyspark_jetstream.protocol.value_schema import SchemaDocument, StreamSchema

SCHEMA_FIRST = (
    "what message values hold: a JSON schema document (docs/broker.md, Typed streams) or an Arrow IPC schema"
)
SCHEMA_NEXT = (
    "the schema's next version (compatible changes only: a new nullable field, int32 -> int64, "
    "float32 -> float64)"
)


def add_commands(commands: Any) -> None:
    """``stream create``, ``list``, ``describe``, ``update`` and ``delete``."""
    stream = commands.add_parser("stream", help="create, list, describe, update or delete streams")
    stream_commands = stream.add_subparsers(dest="stream_command", required=True)
    create = stream_commands.add_parser("create", help="create a stream (idempotent)")
    create.add_argument("name")
    subject_or_source = create.add_mutually_exclusive_group(required=True)
    subject_or_source.add_argument("--subject", help="NATS subject; wildcards * and > allowed")
    add_mirror_options(create, subject_or_source)
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--replication-factor", type=int, default=1, help="copies on as many brokers")
    create.add_argument(
        "--min-insync-replicas", type=int, default=1, help="ALL acks need this many in-sync replicas"
    )
    create.add_argument(
        "--unclean-leader-election",
        action="store_true",
        help="let an out-of-sync replica lead when no in-sync one is left (may lose committed data)",
    )
    create.add_argument("--group", help="load-balance group (shared NATS queue group)")
    create.add_argument("--retention-age", type=parse_duration, help="seconds, or 90s, 30m, 12h, 7d")
    create.add_argument("--retention-bytes", type=parse_size, help="bytes, or 512KiB, 64MB, 10GiB")
    create.add_argument("--retention-messages", type=int)
    create.add_argument("--compaction", action="store_true", help="keep the newest message per key")
    create.add_argument("--segment-bytes", type=parse_size, help="bytes, or 512KiB, 64MB, 1GiB")
    create.add_argument("--max-message-bytes", type=parse_size, help="bytes, or 512KiB, 1MiB")
    create.add_argument(
        "--duplicate-window",
        type=parse_duration,
        help="drop a repeated message id within this time: seconds, or 90s, 2m (default 120 s; 0: off)",
    )
    create.add_argument("--duplicate-max-ids", type=int, help="message ids remembered per partition")
    create.add_argument(
        "--compression", choices=COMPRESSIONS, default="none", help="codec for stored batches"
    )
    create.add_argument(
        "--no-ack-reply", action="store_true", help="do not ack plain messages on their reply subject"
    )
    create.add_argument("--schema", metavar="FILE", help=SCHEMA_FIRST)
    create.set_defaults(run=_stream_create)
    listing = stream_commands.add_parser("list", help="list streams")
    listing.add_argument("--all", action="store_true", help="internal streams (__cursors) too")
    listing.add_argument("--json", action="store_true", help="one JSON object per stream")
    listing.set_defaults(run=_stream_list)
    describe = stream_commands.add_parser(
        "describe", aliases=["info"], help="show a stream and its partitions (and a mirror's copy)"
    )
    describe.add_argument("name")
    describe.set_defaults(run=_stream_describe)
    update = stream_commands.add_parser(
        "update",
        help="add partitions to a stream (never fewer; keyed messages then hash over the new count), "
        "or give its schema a compatible next version",
    )
    update.add_argument("name")
    update.add_argument(
        "--partitions",
        type=_partition_count,
        help=f"the new partition count, up to {MAX_PARTITIONS} (more than now; the same changes nothing)",
    )
    update.add_argument("--schema", metavar="FILE", help=SCHEMA_NEXT)
    update.set_defaults(run=_stream_update)
    add_declared_commands(stream_commands, "stream")  # promote, delete


def _stream_create(client: SyncClient, args: argparse.Namespace) -> None:
    if args.mirror_of is not None:
        create_mirror(client, args, _given(args))
        return
    if args.source_servers or args.source_credentials:
        raise InvalidArgumentError("--source-servers and --source-credentials go with --mirror-of STREAM")
    options: dict[str, Any] = {
        "partitions": args.partitions,
        "replication_factor": args.replication_factor,
        "group": args.group,
        "retention_age": args.retention_age,
        "retention_bytes": args.retention_bytes,
        "retention_messages": args.retention_messages,
        "compaction": args.compaction,
        "compression": args.compression,
        "ack_reply": not args.no_ack_reply,
        "min_insync_replicas": args.min_insync_replicas,
        "unclean_leader_election": args.unclean_leader_election,
    }
    if args.segment_bytes is not None:
        options["segment_bytes"] = args.segment_bytes
    if args.max_message_bytes is not None:
        options["max_message_bytes"] = args.max_message_bytes
    if args.duplicate_window is not None:
        options["duplicate_window"] = args.duplicate_window
    if args.duplicate_max_ids is not None:
        options["duplicate_max_ids"] = args.duplicate_max_ids
    if args.schema is not None:
        options["schema"] = _read_schema(args.schema)
    info = client.create_stream(args.name, args.subject, **options)
    typed = _schema_of(info)
    print(
        f"stream {args.name} on {args.subject} with {len(info.partitions)} partition(s)"
        + (f", schema version {typed.version} ({typed.format})" if typed else "")
    )
    _note_overlaps(client, info)


def _given(args: argparse.Namespace) -> set[str]:
    """The ``stream create`` options given other than by default (a mirror refuses most)."""
    defaults = {"partitions": 1, "replication_factor": 1, "min_insync_replicas": 1, "compression": "none"}
    flags = ("unclean_leader_election", "compaction", "no_ack_reply")
    valued = (
        "group",
        "retention_age",
        "retention_bytes",
        "retention_messages",
        "segment_bytes",
        "max_message_bytes",
        "duplicate_window",
        "duplicate_max_ids",
        "schema",
    )
    given = {name for name, default in defaults.items() if getattr(args, name) != default}
    given |= {name for name in flags if getattr(args, name)}
    return given | {name for name in valued if getattr(args, name) is not None}


def _read_schema(path: str) -> SchemaDocument:
    """The schema document in file ``path`` (JSON form or Arrow IPC); one-line errors name the file."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read the schema file {path}: {exc.strerror}") from None
    try:
        return SchemaDocument.parse(raw)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{path}: {exc}") from None


def _schema_of(info: StreamInfo) -> StreamSchema | None:
    return StreamConfig.from_json(info.config).schema


def _partition_count(text: str) -> int:
    try:
        return bounded_int("partitions", int(text), 1, MAX_PARTITIONS)
    except (ValueError, InvalidArgumentError):
        raise argparse.ArgumentTypeError(f"must be {int_range(1, MAX_PARTITIONS)}, got {text!r}") from None


def _stream_update(client: SyncClient, args: argparse.Namespace) -> None:
    if args.partitions is None and args.schema is None:
        raise InvalidArgumentError("stream update needs --partitions or --schema (or both)")
    if args.schema is not None:
        _update_schema(client, args.name, _read_schema(args.schema))
    if args.partitions is not None:
        _add_partitions(client, args)


def _update_schema(client: SyncClient, name: str, document: SchemaDocument) -> None:
    before = _schema_of(client.describe_stream(name))
    after = _schema_of(client.update_schema(name, document))
    if after is None:  # refused by the broker; not reached
        return
    if before is not None and before.version == after.version:
        print(f"stream {name} already has this schema (version {after.version}): nothing changed")
        return
    print(f"stream {name} now has schema version {after.version}")


def _add_partitions(client: SyncClient, args: argparse.Namespace) -> None:
    before = len(client.describe_stream(args.name).partitions)
    info = client.add_partitions(args.name, args.partitions)
    after = len(info.partitions)
    if after == before:
        print(f"stream {args.name} already has {after} partition(s): nothing changed")
        return
    print(
        f"stream {args.name} now has {after} partitions (was {before}); keyed messages published from "
        "now on hash over all of them, so a key may go to another partition than its earlier messages"
    )
    _note_overlaps(client, info)


def _note_overlaps(client: SyncClient, info: StreamInfo) -> None:
    """Say which other streams listen on subjects overlapping this stream's partitions."""
    config = StreamConfig.from_json(info.config)
    mine = config.partition_subjects()
    sharing = sorted(
        other.config["name"]
        for other in client.list_streams()
        if other.config["name"] != config.name
        and any(
            subjects_overlap(a, b)
            for a in mine
            for b in StreamConfig.from_json(other.config).partition_subjects()
        )
    )
    if sharing:
        print(
            f"note: stream(s) {', '.join(sharing)} also listen on subjects that overlap "
            f"{config.name}'s partitions (on {config.subject!r}): each stores its own copy of those "
            "messages (a publish that names its stream is acked by it alone)"
        )


def _stream_list(client: SyncClient, args: argparse.Namespace) -> None:
    streams = [
        s for s in client.list_streams() if args.all or not s.config["name"].startswith(INTERNAL_PREFIX)
    ]
    if args.json:
        for s in streams:
            print(json.dumps(s.to_json()))
        return
    rows = [
        [
            s.config["name"],
            s.config["subject"],
            str(len(s.partitions)),
            str(sum(max(p.high_watermark - p.log_start_offset, 0) for p in s.partitions)),
            _schema_summary(_schema_of(s)),
        ]
        for s in streams
    ]
    table(["stream", "subject", "partitions", "messages", "schema"], rows)


def _schema_summary(schema: StreamSchema | None) -> str:
    if schema is None:
        return "-"
    return f"v{schema.version} {schema.format}: {', '.join(f.name for f in schema.current)}"


def _stream_describe(client: SyncClient, args: argparse.Namespace) -> None:
    info = client.describe_stream(args.name)
    schema = _schema_of(info)
    for key, value in info.config.items():
        if key != "schema":
            print(f"{key:<20} {value}")
    if schema is not None:
        print(f"{'schema':<20} version {schema.version} of {schema.version}, payload format {schema.format}")
        for line in schema.describe():
            print(f"  {line}")
    print()
    partition_table([info])
    print_mirror(client, info)
