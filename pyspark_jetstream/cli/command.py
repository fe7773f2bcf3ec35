"""The ``jetstream`` command: its global options, the broker command, and running a command."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence

from pyspark_jetstream.cli.acl import add_commands as add_acl_commands
from pyspark_jetstream.cli.acl import hash_token
from pyspark_jetstream.cli.cluster import add_commands as add_cluster_commands
from pyspark_jetstream.cli.common import Parser, fail, parse_timeout
from pyspark_jetstream.cli.connection import collect_nats_errors, connect, credential_options, explained
from pyspark_jetstream.cli.cursors import add_commands as add_cursors_commands
from pyspark_jetstream.cli.messages import add_commands as add_messages_commands
from pyspark_jetstream.cli.streams import add_commands as add_streams_commands
from pyspark_jetstream.client import Credentials, SyncClient
from pyspark_jetstream.client.hints import unknown_stream
from pyspark_jetstream.protocol.errors import (
    JetStreamError,
    RequestTimeoutError,
    UnauthenticatedError,
    UnavailableError,
    UnknownStreamError,
)

BROKER_MODULES = ("zlib_ng", "kazoo", "prometheus_client")
"""What ``jetstream broker start`` needs beyond the client: the ``[broker]`` extra."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "broker":
        # The broker is its own program (it takes --config, --data-dir, ...); become it.
        missing = [m for m in BROKER_MODULES if importlib.util.find_spec(m) is None]
        if missing:
            print(
                f"jetstream: running a broker needs the [broker] extra ({', '.join(missing)} missing): "
                "pip install 'pyspark-jetstream[broker]'",
                file=sys.stderr,
            )
            return 2
        os.execv(sys.executable, [sys.executable, "-m", "broker_node", *extra])
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "acl" and args.acl_command == "hash-token":
        return hash_token(args)
    if args.command == "outbox":
        from pyspark_jetstream.outbox import cli as outbox_cli

        try:
            args.credentials_given = credential_options(args)
            return outbox_cli.run(args)
        except JetStreamError as exc:
            fail(str(exc))
            return 1
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.CRITICAL, format="jetstream: %(name)s: %(message)s"
    )
    credentials = Credentials()
    try:
        with collect_nats_errors(args.verbose) as nats_errors:
            try:
                credentials = Credentials.from_options(credential_options(args))
                with connect(args, credentials, nats_errors) as client:
                    try:
                        args.run(client, args)
                    except UnknownStreamError as exc:
                        raise _with_hint(exc, client, args) from None
            except (UnavailableError, UnauthenticatedError, RequestTimeoutError) as exc:
                raise explained(exc, args, credentials, nats_errors) from None
    except JetStreamError as exc:
        fail(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if args.verbose:
            raise
        # A bug or an unforeseen failure: still one line; --verbose shows the traceback.
        fail(f"unexpected {type(exc).__name__}: {exc} (run with --verbose for details)")
        return 1
    return 0


def _with_hint(exc: UnknownStreamError, client: SyncClient, args: argparse.Namespace) -> UnknownStreamError:
    """``exc`` with the closest stream's name and the commands that list and create streams, as
    the Spark source says it, when it is about the stream the command names."""
    stream = getattr(args, "stream", None) or getattr(args, "name", None)
    if not isinstance(stream, str) or not str(exc).startswith(f"no stream named {stream!r}"):
        return exc
    return unknown_stream(exc, stream, lambda: [info.config["name"] for info in client.list_streams()])


def _environment(name: str, default: str | None = None) -> str | None:
    """``$name``, or ``default`` when it is unset or empty (``JETSTREAM_NATS=`` unsets it, as in a
    shell, rather than naming an empty URL)."""
    return os.environ.get(name) or default


def build_parser() -> argparse.ArgumentParser:
    """The ``jetstream`` parser: global options, then each command group in help order."""
    parser = Parser(prog="jetstream", description="pyspark-jetstream command line")
    parser.add_argument(
        "--nats", default=_environment("JETSTREAM_NATS", "nats://127.0.0.1:4222"), help="NATS URL"
    )
    parser.add_argument("--broker", default=_environment("JETSTREAM_BROKER"), help="broker Flight address")
    parser.add_argument(
        "--timeout", type=parse_timeout, default=10.0, help="seconds to wait for answers (0.1 to 3600)"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show what the library logs, and tracebacks"
    )
    secured = parser.add_argument_group("credentials of a secured deployment")
    secured.add_argument(
        "--credentials",
        metavar="FILE",
        default=_environment("JETSTREAM_CREDENTIALS"),
        help="TOML with user, token, tls_ca, tls_cert, tls_key (default $JETSTREAM_CREDENTIALS)",
    )
    secured.add_argument("--user", help="the principal to act as (with a token)")
    secured.add_argument(
        "--token",
        default=_environment("JETSTREAM_TOKEN"),
        help="the user's token; prefer $JETSTREAM_TOKEN or --credentials (others can see command lines)",
    )
    secured.add_argument("--tls-ca", metavar="FILE", help="PEM CA that signed the brokers' certificates")
    secured.add_argument("--tls-cert", metavar="FILE", help="PEM client certificate (mutual TLS)")
    secured.add_argument("--tls-key", metavar="FILE", help="PEM key of --tls-cert")
    parser.add_argument("--version", action="version", version=f"jetstream {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    broker = commands.add_parser("broker", help="run a broker")
    broker_commands = broker.add_subparsers(dest="broker_command", required=True)
    broker_commands.add_parser(
        "start",
        help="start a broker: --config FILE, --data-dir DIR, ... ('broker start --help' lists them)",
        add_help=False,  # --help goes to the broker program itself
    )

    add_acl_commands(commands)

    from pyspark_jetstream.outbox.cli import add_commands as add_outbox_commands

    add_outbox_commands(commands)
    add_streams_commands(commands)
    add_messages_commands(commands)
    add_cursors_commands(commands)
    add_cluster_commands(commands)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("pyspark-jetstream")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"
