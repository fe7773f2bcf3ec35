"""``jetstream``: run a broker, manage streams, publish, tail, cursors, status.

Client commands find the deployment through ``--nats`` (default
``$JETSTREAM_NATS`` or ``nats://127.0.0.1:4222``) and ask a broker there for
its Flight address, unless ``--broker`` (or ``$JETSTREAM_BROKER``) gives it.
Every failure prints one line on stderr: errors exit 1, usage errors 2.  What
the library logs on the way (a failed connect attempt, ...) shows only with
``--verbose``: the line names the error that ended the command.

A secured deployment takes ``--credentials FILE`` (or
``$JETSTREAM_CREDENTIALS``: TOML with ``user``, ``token``, ``tls_ca``,
``tls_cert``, ``tls_key``), or ``--user`` with ``--token`` (better
``$JETSTREAM_TOKEN``: a command line is visible to every user of the machine)
and ``--tls-ca``, ``--tls-cert``, ``--tls-key``; options given override the
file's.  The token is never printed, not even in an error.  ``jetstream acl
hash-token`` makes the bcrypt hash an ACL file stores for a token.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NoReturn

from pyspark_jetstream.client import AckPolicy, Credentials, SyncClient
from pyspark_jetstream.protocol.acl import parse_acl
from pyspark_jetstream.protocol.errors import (
    InvalidArgumentError,
    JetStreamError,
    PermissionDeniedError,
    RequestTimeoutError,
    UnauthenticatedError,
    UnavailableError,
    UnknownStreamError,
)
from pyspark_jetstream.protocol.flight import PartitionInfo, StreamInfo
from pyspark_jetstream.protocol.schema import COMPRESSIONS
from pyspark_jetstream.protocol.streams import INTERNAL_PREFIX, StreamConfig, number_range
from pyspark_jetstream.protocol.subjects import subjects_overlap

BROKER_MODULES = ("zlib_ng", "kazoo", "prometheus_client")
"""What ``jetstream broker start`` needs beyond the client: the ``[broker]`` extra."""
MIN_TIMEOUT = 0.1
MAX_TIMEOUT = 3600.0
CONNECT_ATTEMPTS = 4
RECONNECT_WAIT = 2.0
"""The client tries NATS up to ``CONNECT_ATTEMPTS`` times, each up to ``--timeout``, this far
apart: a connection that takes longer than all of them hangs, and the command gives up on it."""
MAX_TOKEN_BYTES = 72
"""bcrypt uses the first 72 bytes of a password only: a longer token would be as weak as its head."""
FATAL_NATS_ERRORS = ("authorization violation", "certificate verify failed")
"""What NATS (or the TLS handshake) says when trying again cannot help: the command stops at once."""
CREDENTIALS_HINT = "give --user and --token (or $JETSTREAM_TOKEN), or --credentials FILE"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = _parser()
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
        return _hash_token(args)
    if args.command == "outbox":
        from pyspark_jetstream.outbox import cli as outbox_cli

        try:
            args.credentials_given = _credential_options(args)
            return outbox_cli.run(args)
        except JetStreamError as exc:
            _fail(str(exc))
            return 1
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.CRITICAL, format="jetstream: %(name)s: %(message)s"
    )
    credentials = Credentials()
    try:
        with _nats_errors(args.verbose) as nats_errors:
            try:
                credentials = Credentials.from_options(_credential_options(args))
                with _connect(args, credentials, nats_errors) as client:
                    args.run(client, args)
            except (UnavailableError, UnauthenticatedError, RequestTimeoutError) as exc:
                raise _explained(exc, args, credentials, nats_errors) from None
    except UnknownStreamError as exc:
        _fail(f"{exc}; 'jetstream stream list' shows the streams")
        return 1
    except JetStreamError as exc:
        _fail(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if args.verbose:
            raise
        # A bug or an unforeseen failure: still one line; --verbose shows the traceback.
        _fail(f"unexpected {type(exc).__name__}: {exc} (run with --verbose for details)")
        return 1
    return 0


def _fail(message: str) -> None:
    """Print ``message`` as the one line a failure writes to stderr."""
    print(f"jetstream: {' '.join(message.split())}", file=sys.stderr)


# ---- credentials ----------------------------------------------------------------------------


def _credential_options(args: argparse.Namespace) -> dict[str, str]:
    """The credentials given on the command line or in the environment, as options."""
    given = {
        "user": args.user,
        "token": args.token,
        "tls.ca": args.tls_ca,
        "tls.cert": args.tls_cert,
        "tls.key": args.tls_key,
        "credentialsFile": args.credentials,
    }
    return {name: value for name, value in given.items() if value}


@contextmanager
def _connect(
    args: argparse.Namespace, credentials: Credentials, nats_errors: list[str]
) -> Iterator[SyncClient]:
    """A client of the deployment, or the error that prevented one.

    The connection is made in a thread of its own so that a NATS server that
    never completes the handshake (a TLS certificate this machine does not
    trust makes nats-py retry without end) cannot hang the command, and so
    that a refusal no retry can change (``FATAL_NATS_ERRORS``) ends it at once.
    """
    made: list[SyncClient | Exception] = []

    def connect() -> None:
        try:
            made.append(
                SyncClient(
                    nats_urls=args.nats, broker=args.broker, timeout=args.timeout, credentials=credentials
                )
            )
        except Exception as exc:  # noqa: BLE001 - handed to the main thread, which raises it
            made.append(exc)

    thread = threading.Thread(target=connect, name="jetstream-connect", daemon=True)
    thread.start()
    started = time.monotonic()
    deadline = started + CONNECT_ATTEMPTS * (args.timeout + RECONNECT_WAIT)
    while not made and time.monotonic() < deadline:
        if any(fatal in e.lower() for e in nats_errors for fatal in FATAL_NATS_ERRORS):
            break  # nats-py would try again, and be refused again
        thread.join(0.05)
    if not made:
        waited = time.monotonic() - started
        raise UnavailableError(f"no connection to NATS at {args.nats} after {waited:.0f}s")
    if isinstance(made[0], Exception):
        raise made[0]
    with made[0] as client:
        yield client


class _Collect(logging.Handler):
    """Keeps the messages of what the client logs about NATS (its refusals, TLS failures)."""

    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


@contextmanager
def _nats_errors(verbose: bool) -> Iterator[list[str]]:
    """The client's logged warnings while the command runs (shown only with ``--verbose``)."""
    logger = logging.getLogger("pyspark_jetstream.client")
    collected: list[str] = []
    handler = _Collect(collected)
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    logger.propagate = verbose
    try:
        yield collected
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _explained(
    exc: JetStreamError, args: argparse.Namespace, credentials: Credentials, nats_errors: list[str]
) -> JetStreamError:
    """``exc`` with what NATS said and what to give, when credentials are the cause."""
    said = " ".join([*nats_errors, str(exc)]).lower()
    where = f"NATS at {args.nats}"
    if isinstance(exc, UnauthenticatedError):
        return UnauthenticatedError(f"{exc}: {CREDENTIALS_HINT}" if credentials.user is None else str(exc))
    if isinstance(exc, RequestTimeoutError):
        refused = re.search(r'permissions violation for publish to "([^"]+)"', said)
        if refused:
            who = f"user {credentials.user!r}" if credentials.user else "this client"
            return PermissionDeniedError(
                f"{where} refused to let {who} publish to {refused[1]!r}: "
                "it needs a 'write' grant on the stream"
            )
        return exc
    if "authorization violation" in said:
        if credentials.user is None:
            return UnauthenticatedError(f"{where} needs a user and token: {CREDENTIALS_HINT}")
        return UnauthenticatedError(f"{where} refused user {credentials.user!r}: wrong user or token")
    if "certificate verify failed" in said:
        if credentials.tls_ca is None:
            return UnavailableError(
                f"{where} uses TLS with a certificate this machine does not trust: give --tls-ca FILE "
                "(the CA that signed the brokers' certificates), or tls_ca in --credentials FILE"
            )
        return UnavailableError(
            f"{where} presents a certificate not signed by the CA in {credentials.tls_ca!r} (--tls-ca)"
        )
    if "tls" in said and credentials.tls_ca is None:
        return UnavailableError(f"{exc}; if the deployment uses TLS, give --tls-ca FILE")
    if args.broker and str(exc).startswith("cannot connect to NATS"):
        # The broker was given, so the user may not expect NATS to matter.
        return UnavailableError(
            f"{exc} (every command connects to NATS as well as to the broker at {args.broker}: "
            "give --nats URL or $JETSTREAM_NATS where NATS runs)"
        )
    return exc


def _print_nats_config(client: SyncClient, args: argparse.Namespace) -> None:
    """``jetstream acl nats-config``: the ``authorization`` block for nats-server."""
    path = args.acl_file
    try:
        with open(path, encoding="utf-8") as handle:
            acl = parse_acl(handle.read(), path)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read the ACL file {path!r}: {exc}") from None
    subjects = {
        info.config["name"]: StreamConfig.from_json(info.config).partition_subjects()
        for info in client.list_streams()
        if not info.config["name"].startswith(INTERNAL_PREFIX)
    }
    passwords = {name: u.token_bcrypt for name, u in acl.users.items() if u.token_bcrypt is not None}
    block = acl.nats_authorization(subjects, passwords)
    print(f"# from {path} and the {len(subjects)} stream(s) of the cluster; nats-server reloads it on SIGHUP")
    print(f"authorization: {json.dumps(block, indent=2)}")


def _hash_token(args: argparse.Namespace) -> int:
    """``jetstream acl hash-token``: a bcrypt hash of a token read from stdin, or of a new one."""
    if args.generate:
        token = secrets.token_urlsafe(32)
    elif sys.stdin.isatty():
        import getpass

        token = getpass.getpass("token: ")
    else:
        token = sys.stdin.readline().rstrip("\r\n")
    if not token:
        _fail(
            'no token read from stdin: pipe one in (printf %s "$TOKEN" | jetstream acl hash-token) '
            "or use --generate"
        )
        return 2
    if len(token.encode()) > MAX_TOKEN_BYTES:
        _fail(
            f"the token is longer than {MAX_TOKEN_BYTES} bytes and bcrypt checks only the first "
            f"{MAX_TOKEN_BYTES}: use a shorter one"
        )
        return 2
    try:
        import bcrypt
    except ImportError:
        _fail("hashing a token needs bcrypt, in the [broker] extra: pip install 'pyspark-jetstream[broker]'")
        return 2
    hashed = bcrypt.hashpw(token.encode(), bcrypt.gensalt(10)).decode("ascii")
    if args.generate:
        print(f'token = "{token}"  # for the principal\'s credentials file only')
        print(f'token_bcrypt = "{hashed}"  # for its [users.<name>] in the ACL')
    else:
        print(hashed)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (the usage itself is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` on one line and exit 2."""
        self.exit(2, f"jetstream: {message} (see '{self.prog} --help')\n")


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not MIN_TIMEOUT <= value <= MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(f"must be {number_range(MIN_TIMEOUT, MAX_TIMEOUT)}, got {text!r}")
    return value


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def _duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``12h``, ``7d`` or ``2w``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"must be seconds or a number with s, m, h, d or w, got {text!r}")
    return float(match.group(1)) * _DURATION_UNITS.get(match.group(2) or "s", 1)


def _size(text: str) -> int:
    """Bytes from ``4096``, ``512KiB``, ``64MB``, ``1GiB`` (KB/MB/GB are powers of 1000)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(
            f"must be bytes or a number with KB, MB, GB, TB, KiB, MiB, GiB or TiB, got {text!r}"
        )
    value = float(match.group(1)) * _SIZE_UNITS[match.group(2)]
    if value != int(value):
        raise argparse.ArgumentTypeError(f"must be a whole number of bytes, got {text!r}")
    return int(value)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jetstream", description="pyspark-jetstream command line")
    parser.add_argument(
        "--nats", default=os.environ.get("JETSTREAM_NATS", "nats://127.0.0.1:4222"), help="NATS URL"
    )
    parser.add_argument("--broker", default=os.environ.get("JETSTREAM_BROKER"), help="broker Flight address")
    parser.add_argument(
        "--timeout", type=_timeout, default=10.0, help="seconds to wait for answers (0.1 to 3600)"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show what the library logs, and tracebacks"
    )
    secured = parser.add_argument_group("credentials of a secured deployment")
    secured.add_argument(
        "--credentials",
        metavar="FILE",
        default=os.environ.get("JETSTREAM_CREDENTIALS"),
        help="TOML with user, token, tls_ca, tls_cert, tls_key (default $JETSTREAM_CREDENTIALS)",
    )
    secured.add_argument("--user", help="the principal to act as (with a token)")
    secured.add_argument(
        "--token",
        default=os.environ.get("JETSTREAM_TOKEN"),
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

    acl = commands.add_parser("acl", help="tools for the access control list")
    acl_commands = acl.add_subparsers(dest="acl_command", required=True)
    hash_token = acl_commands.add_parser(
        "hash-token", help="print the bcrypt hash of a token read from stdin, for an ACL's token_bcrypt"
    )
    hash_token.add_argument(
        "--generate", action="store_true", help="make a new random token and print it with its hash"
    )
    nats_config = acl_commands.add_parser(
        "nats-config",
        help="print a nats-server authorization block enforcing an ACL file for the streams that exist "
        "(for a NATS the brokers do not start themselves; run it again after creating streams)",
    )
    nats_config.add_argument("acl_file", help="the ACL file the brokers enforce")
    nats_config.set_defaults(run=_print_nats_config)

    from pyspark_jetstream.outbox.cli import add_commands as add_outbox_commands

    add_outbox_commands(commands)

    stream = commands.add_parser("stream", help="create, list, describe or delete streams")
    stream_commands = stream.add_subparsers(dest="stream_command", required=True)
    create = stream_commands.add_parser("create", help="create a stream (idempotent)")
    create.add_argument("name")
    create.add_argument("--subject", required=True, help="NATS subject; wildcards * and > allowed")
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
    create.add_argument("--retention-age", type=_duration, help="seconds, or 90s, 30m, 12h, 7d")
    create.add_argument("--retention-bytes", type=_size, help="bytes, or 512KiB, 64MB, 10GiB")
    create.add_argument("--retention-messages", type=int)
    create.add_argument("--compaction", action="store_true", help="keep the newest message per key")
    create.add_argument("--segment-bytes", type=_size, help="bytes, or 512KiB, 64MB, 1GiB")
    create.add_argument("--max-message-bytes", type=_size, help="bytes, or 512KiB, 1MiB")
    create.add_argument(
        "--duplicate-window",
        type=_duration,
        help="drop a repeated message id within this time: seconds, or 90s, 2m (default 120 s; 0: off)",
    )
    create.add_argument("--duplicate-max-ids", type=int, help="message ids remembered per partition")
    create.add_argument(
        "--compression", choices=COMPRESSIONS, default="none", help="codec for stored batches"
    )
    create.add_argument(
        "--no-ack-reply", action="store_true", help="do not ack plain messages on their reply subject"
    )
    create.set_defaults(run=_stream_create)
    listing = stream_commands.add_parser("list", help="list streams")
    listing.add_argument("--all", action="store_true", help="internal streams (__cursors) too")
    listing.add_argument("--json", action="store_true", help="one JSON object per stream")
    listing.set_defaults(run=_stream_list)
    describe = stream_commands.add_parser("describe", help="show a stream and its partitions")
    describe.add_argument("name")
    describe.set_defaults(run=_stream_describe)
    delete = stream_commands.add_parser("delete", help="delete a stream and its data")
    delete.add_argument("name")
    delete.set_defaults(run=lambda c, a: (c.delete_stream(a.name), print(f"deleted stream {a.name}")))

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

    cursor = commands.add_parser(
        "cursor", help="get, set, list, reset or delete consumers' positions (cursors)"
    )
    cursor_commands = cursor.add_subparsers(dest="cursor_command", required=True)
    get = cursor_commands.add_parser("get", help="a consumer's stored position on one partition")
    get.add_argument("consumer")
    get.add_argument("stream")
    get.add_argument("--partition", type=int, default=0)
    get.set_defaults(run=_cursor_get)
    put = cursor_commands.add_parser("set", help="store a consumer's position on one partition")
    put.add_argument("consumer")
    put.add_argument("stream")
    put.add_argument("offset", type=int)
    put.add_argument("--partition", type=int, default=0)
    put.set_defaults(run=_cursor_set)
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

    commands.add_parser("status", help="streams, partitions, cursors and lag").set_defaults(run=_status)
    commands.add_parser("health", help="problems, if any; exit 1 when there are some").set_defaults(
        run=_health
    )
    cluster = commands.add_parser("cluster", help="brokers, the controller, replicas and lag")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True)
    cluster_commands.add_parser(
        "status", help="every partition: leader, replicas, ISR, high watermark and each replica's lag"
    ).set_defaults(run=_cluster_status)
    cluster_commands.add_parser(
        "elect-leaders", help="lead each partition from its preferred replica again (after restarts)"
    ).set_defaults(run=_elect_leaders)
    return parser


def _stream_create(client: SyncClient, args: argparse.Namespace) -> None:
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
    info = client.create_stream(args.name, args.subject, **options)
    print(f"stream {args.name} on {args.subject} with {len(info.partitions)} partition(s)")
    mine = StreamConfig.from_json(info.config).partition_subjects()
    sharing = sorted(
        other.config["name"]
        for other in client.list_streams()
        if other.config["name"] != args.name
        and any(
            subjects_overlap(a, b)
            for a in mine
            for b in StreamConfig.from_json(other.config).partition_subjects()
        )
    )
    if sharing:
        print(
            f"note: stream(s) {', '.join(sharing)} also listen on subjects that overlap "
            f"{args.subject!r}: each stores its own copy of those messages (a publish that names "
            "its stream is acked by it alone)"
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
        ]
        for s in streams
    ]
    _table(["stream", "subject", "partitions", "messages"], rows)


def _stream_describe(client: SyncClient, args: argparse.Namespace) -> None:
    info = client.describe_stream(args.name)
    for key, value in info.config.items():
        print(f"{key:<20} {value}")
    print()
    _partition_table([info])


def _partition_table(streams: list[StreamInfo]) -> None:
    rows = [
        [
            s.config["name"],
            str(p.partition),
            p.leader,
            ",".join(p.isr),
            str(p.log_start_offset),
            str(p.log_end_offset),
            str(p.high_watermark),
        ]
        for s in streams
        for p in s.partitions
    ]
    _table(["stream", "partition", "leader", "isr", "log start", "log end", "high watermark"], rows)


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


def _version() -> str:
    try:
        return importlib.metadata.version("pyspark-jetstream")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _cursor_get(client: SyncClient, args: argparse.Namespace) -> None:
    offset = client.fetch_cursor(args.consumer, args.stream, args.partition)
    print("(none)" if offset is None else offset)


def _cursor_set(client: SyncClient, args: argparse.Namespace) -> None:
    client.set_cursor(args.consumer, args.stream, args.partition, args.offset)
    print(f"cursor {args.consumer} on {args.stream}/{args.partition} set to {args.offset}")


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
    _table(
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
    _table(
        ["CONSUMER", "STREAM", "PARTITION", "CURRENT", "NEW" + (" (dry run)" if args.dry_run else "")], rows
    )


def _status(client: SyncClient, args: argparse.Namespace) -> None:
    status = client.status()
    print(f"broker {status['broker_id']}  flight {status['flight']}  nats {', '.join(status['nats'])}")
    print()
    _partition_table([StreamInfo.from_json(s) for s in status["streams"]])
    print()
    _table(
        ["consumer", "stream", "partition", "offset", "lag"],
        [
            [c["consumer"], c["stream"], str(c["partition"]), str(c["offset"]), str(c["lag"])]
            for c in status["cursors"]
        ],
    )


def _health(client: SyncClient, args: argparse.Namespace) -> None:
    health = client.health()
    if health["ok"]:
        print("ok")
        return
    for problem in health["problems"]:
        print(problem)
    raise SystemExit(1)


def _cluster_status(client: SyncClient, args: argparse.Namespace) -> None:
    metadata = client.metadata()
    statuses = client.cluster_status()
    print(f"controller {metadata['controller'] or '(none)'}")
    _table(
        ["broker", "flight", "health"],
        [
            [b["broker_id"], b["flight"], _broker_health(statuses.get(b["broker_id"]))]
            for b in metadata["brokers"]
        ],
    )
    print()
    held = {
        (p["stream"], p["partition"], broker_id): p
        for broker_id, status in statuses.items()
        for p in status.get("partitions", [])
    }
    rows = []
    for stream in metadata["streams"]:
        name = stream["config"]["name"]
        for p in stream["partitions"]:
            leader = held.get((name, p["partition"], p["leader"]))
            ends = [_replica_end(held.get((name, p["partition"], r)), r, leader) for r in p["replicas"]]
            rows.append(
                [
                    name,
                    str(p["partition"]),
                    p["leader"] or "(none)",
                    str(p["leader_epoch"]),
                    ",".join(p["isr"]),
                    "?" if leader is None else str(leader["high_watermark"]),
                    "  ".join(ends),
                ]
            )
    _table(["stream", "partition", "leader", "epoch", "isr", "high watermark", "log end offsets"], rows)


def _broker_health(status: dict[str, Any] | None) -> str:
    if status is None:
        return "unreachable"
    if "error" in status:
        return f"unreachable: {status['error']}"
    health = status["health"]
    return "ok" if health["ok"] else "; ".join(health["problems"])


def _replica_end(mine: dict[str, Any] | None, replica: str, leader: dict[str, Any] | None) -> str:
    if mine is None:
        return f"{replica}=?"
    end = mine["log_end_offset"]
    lag = "" if leader is None else f" (lag {max(leader['log_end_offset'] - end, 0)})"
    return f"{replica}={end}{lag}"


def _elect_leaders(client: SyncClient, args: argparse.Namespace) -> None:
    moved = client.elect_preferred_leaders().get("moved", [])
    print("\n".join(moved) if moved else "every partition is led by its preferred replica already")


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    if not rows:
        print("(none)")


if __name__ == "__main__":
    sys.exit(main())
