"""The ``jetstream`` commands that are plain pass-throughs of an admin action, derived from its
declaration (:class:`~pyspark_jetstream.client.admin.AdminActions`, each action's ``command``):
its arguments become the command's, the action is called with them, and what it ``says`` of the
result is printed.  Each command group adds its share where its help lists it.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from pyspark_jetstream.client import SyncClient
from pyspark_jetstream.client.admin import AdminActions
from pyspark_jetstream.client.admin_faces import AdminAction, Command, actions_of


def add_declared_commands(group_commands: Any, group: str) -> None:
    """Add group ``group``'s declared commands to its subparsers ``group_commands``, in the table's order."""
    for action in actions_of(AdminActions):
        command = action.command
        if command is None or command.group != group:
            continue
        parser = group_commands.add_parser(command.name, help=command.help)
        for argument in command.arguments:
            if argument.name.startswith("-"):
                parser.add_argument(
                    argument.name, type=argument.type, default=argument.default, help=argument.help
                )
            else:
                parser.add_argument(argument.name, type=argument.type, help=argument.help)
        parser.set_defaults(run=functools.partial(_run, action, command))


def _run(
    action: AdminAction[..., Any], command: Command, client: SyncClient, args: argparse.Namespace
) -> None:
    values = {argument.keyword: getattr(args, argument.keyword) for argument in command.arguments}
    print(command.says(action.__get__(client)(**values), values))
