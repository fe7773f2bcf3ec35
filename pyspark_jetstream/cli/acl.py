"""``jetstream acl``: hash a token for an ACL file; a nats-server authorization block for an ACL."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from typing import Any

from pyspark_jetstream.cli.common import fail
from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.protocol.acl import parse_acl
from pyspark_jetstream.protocol.errors import InvalidArgumentError
from pyspark_jetstream.protocol.streams import INTERNAL_PREFIX, StreamConfig

MAX_TOKEN_BYTES = 72
"""bcrypt uses the first 72 bytes of a password only: a longer token would be as weak as its head."""


def add_commands(commands: Any) -> None:
    """``acl hash-token`` and ``acl nats-config``."""
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


def hash_token(args: argparse.Namespace) -> int:
    """``jetstream acl hash-token``: a bcrypt hash of a token read from stdin, or of a new one."""
    if args.generate:
        token = secrets.token_urlsafe(32)
    elif sys.stdin.isatty():
        import getpass

        token = getpass.getpass("token: ")
    else:
        token = sys.stdin.readline().rstrip("\r\n")
    if not token:
        fail(
            'no token read from stdin: pipe one in (printf %s "$TOKEN" | jetstream acl hash-token) '
            "or use --generate"
        )
        return 2
    if len(token.encode()) > MAX_TOKEN_BYTES:
        fail(
            f"the token is longer than {MAX_TOKEN_BYTES} bytes and bcrypt checks only the first "
            f"{MAX_TOKEN_BYTES}: use a shorter one"
        )
        return 2
    try:
        import bcrypt
    except ImportError:
        fail("hashing a token needs bcrypt, in the [broker] extra: pip install 'pyspark-jetstream[broker]'")
        return 2
    hashed = bcrypt.hashpw(token.encode(), bcrypt.gensalt(10)).decode("ascii")
    if args.generate:
        print(f'token = "{token}"  # for the principal\'s credentials file only')
        print(f'token_bcrypt = "{hashed}"  # for its [users.<name>] in the ACL')
    else:
        print(hashed)
    return 0
