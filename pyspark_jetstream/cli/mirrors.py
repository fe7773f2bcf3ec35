"""``jetstream stream create --mirror-of`` and the mirror part of ``stream info`` (``stream promote``
is declared with its action, in :class:`~pyspark_jetstream.client.admin.AdminActions`)."""

from __future__ import annotations

import argparse
from typing import Any

from pyspark_jetstream.cli.common import table
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.flight import StreamInfo
from pyspark_jetstream.protocol.streams import StreamConfig

MIRROR_OWN = {"partitions", "replication_factor", "min_insync_replicas"}
"""``stream create`` options a mirror takes; the others are its source's."""


def add_mirror_options(create: argparse.ArgumentParser, subject_or_source: Any) -> None:
    """``--mirror-of`` (in ``subject_or_source``, the group it shares with ``--subject``: a mirror
    listens on its source's), ``--source-servers`` and ``--source-credentials`` on ``stream create``."""
    subject_or_source.add_argument(
        "--mirror-of",
        metavar="STREAM",
        help="copy STREAM of another cluster, offset for offset (its config is taken from the source)",
    )
    create.add_argument(
        "--source-servers", metavar="URLS", help="the source cluster's Flight addresses, grpc://host:port,..."
    )
    create.add_argument(
        "--source-credentials",
        metavar="FILE",
        help="credentials file (user, token, tls_ca, ...) this cluster's brokers read to reach the source",
    )


def create_mirror(client: SyncClient, args: argparse.Namespace, given: set[str]) -> None:
    """``stream create NAME --mirror-of STREAM``; ``given``: the other options set on the command line."""
    if not args.source_servers:
        raise InvalidArgumentError(
            "--mirror-of needs --source-servers: the source cluster's Flight addresses"
        )
    foreign = sorted(given - MIRROR_OWN)
    if foreign:
        names = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise InvalidArgumentError(
            f"a mirror takes {names} from its source: leave them out (a mirror sets only --partitions, "
            "--replication-factor and --min-insync-replicas)"
        )
    info = client.create_mirror(
        args.name,
        args.mirror_of,
        args.source_servers,
        source_credentials=args.source_credentials,
        replication_factor=args.replication_factor,
        min_insync_replicas=args.min_insync_replicas,
        partitions=args.partitions if "partitions" in given else None,
    )
    config = StreamConfig.from_json(info.config)
    assert config.mirror is not None
    print(
        f"stream {args.name} mirrors {config.mirror.where()} with {len(info.partitions)} partition(s); "
        f"publishes on {config.subject} are refused until it is promoted"
    )


def print_mirror(client: SyncClient, info: StreamInfo) -> None:
    """The mirror lines of ``stream info``: the source, and each partition's copy."""
    config = StreamConfig.from_json(info.config)
    if config.mirror is None:
        return
    if config.mirror.promoted:
        print(f"\npromoted: once a mirror of {config.mirror.where()}; it takes publishes")
        return
    print(f"\nmirror of {config.mirror.where()}")
    rows = [
        [
            str(s.partition),
            s.state,
            str(s.mirror_end),
            str(s.source_end),
            str(s.lag_messages),
            f"{s.lag_seconds:g}",
            s.last_error or "-",
        ]
        for s in client.mirror_status(info.config["name"])
    ]
    table(["partition", "state", "mirror end", "source hw", "lag", "lag s", "last error"], rows)
