"""``jetstream outbox init | run | status | dead-letters``: the harvester from the command line."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
from typing import Any

from pyspark_jetstream.protocol.errors import InvalidArgumentError

from .harvester import Harvester, init_outbox
from .harvester_config import HarvesterConfig
from .outbox_table import open_store


def add_commands(commands: Any) -> None:
    """Add ``outbox`` and its subcommands to the CLI's subparsers."""
    outbox = commands.add_parser("outbox", help="the transactional outbox harvester")
    sub = outbox.add_subparsers(dest="outbox_command", required=True)
    for name, text in (
        ("init", "create the outbox and dead-letter tables"),
        ("run", "harvest: publish the outbox's rows into streams until Ctrl-C or SIGTERM"),
        ("status", "rows waiting, rows in flight (marked) and dead letters"),
        ("dead-letters", "list the rows given up on, or put them back (--requeue)"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("--config", help="a TOML file with an [outbox] table (see conf/outbox.toml)")
        command.add_argument("--database", help="sqlite:///path.db or postgresql://... (instead of --config)")
        command.add_argument("--table", default=None, help="the outbox table (default: outbox)")
        if name in ("status", "dead-letters"):
            command.add_argument("--json", action="store_true", help="print JSON")
        if name == "dead-letters":
            command.add_argument(
                "--requeue", type=int, nargs="+", metavar="ID", help="dead letters to requeue"
            )
            command.add_argument("--requeue-all", action="store_true", help="requeue every dead letter")


def run(args: argparse.Namespace) -> int:
    """Run an ``outbox`` subcommand; raises ``JetStreamError`` for the caller to report."""
    config = _config(args)
    if args.outbox_command == "init":
        init_outbox(config.database, config.table)
        print(
            f"outbox table {config.table} and {config.table}_dead_letters ready in {_shown(config.database)}"
        )
        return 0
    if args.outbox_command == "run":
        logging.basicConfig(
            level=logging.DEBUG if args.verbose else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        return asyncio.run(_harvest(config))
    store = open_store(config.database, config.table)
    try:
        if args.outbox_command == "status":
            backlog = store.backlog()
            dead = len(store.dead_letters())
            if args.json:
                print(json.dumps({"table": config.table, "backlog": backlog, "dead_letters": dead}))
            else:
                print(f"outbox {config.table}: {backlog} rows waiting, {dead} dead letters")
            return 0
        ids = [d.id for d in store.dead_letters()] if args.requeue_all else list(args.requeue or [])
        if ids:
            moved = store.requeue(ids)
            print(f"requeued {moved} of {len(ids)} dead letters (as new rows, after those waiting)")
            return 0 if moved == len(ids) else 1
        letters = store.dead_letters()
        if args.json:
            print(json.dumps([_letter(d) for d in letters]))
        else:
            print(f"{'ID':>6} {'ROW':>8} {'STREAM':<16} {'ATTEMPTS':>8}  ERROR")
            for d in letters:
                print(
                    f"{d.id:>6} {d.original_id:>8} {d.stream or d.subject or '':<16} "
                    f"{d.attempts:>8}  {d.error}"
                )
        return 0
    finally:
        store.close()


async def _harvest(config: HarvesterConfig) -> int:
    harvester = Harvester(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, harvester.stop)
    await harvester.run()
    return 0


_CREDENTIAL_KEYS = {
    "credentialsFile": "credentials_file",
    "user": "user",
    "token": "token",
    "tls.ca": "tls_ca",
    "tls.cert": "tls_cert",
    "tls.key": "tls_key",
}
"""The CLI's credential options (as ``Credentials.from_options`` names them) and the config's keys."""


def _config(args: argparse.Namespace) -> HarvesterConfig:
    """The configuration of ``--config`` or ``--database``; the command line's credentials
    (``--credentials``, ``--user``, ``--token``, ``--tls-*``) override the file's."""
    given = {_CREDENTIAL_KEYS[k]: v for k, v in getattr(args, "credentials_given", {}).items()}
    if args.config:
        config = HarvesterConfig.from_file(args.config)
        if args.table or args.database:
            raise InvalidArgumentError("give --config, or --database and --table, not both")
        return dataclasses.replace(config, **given) if given else config
    if not args.database:
        raise InvalidArgumentError("give --config FILE (with an [outbox] table) or --database URL")
    return HarvesterConfig(database=args.database, table=args.table or "outbox", nats=args.nats, **given)


def _shown(database: str) -> str:
    """A database URL without its password."""
    from urllib.parse import urlparse

    parsed = urlparse(database)
    if parsed.password:
        return database.replace(f":{parsed.password}@", ":***@")
    return database


def _letter(d: Any) -> dict[str, Any]:
    return {
        "id": d.id,
        "row": d.original_id,
        "stream": d.stream,
        "subject": d.subject,
        "key": None if d.key is None else d.key.decode(errors="replace"),
        "attempts": d.attempts,
        "error": d.error,
        "failed_at": d.failed_at,
    }


__all__ = ["add_commands", "run"]
