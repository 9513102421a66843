"""``sluicegate passwd``: print the stored form of a password for a ``[users.NAME]`` table."""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from sluicegate.gateway.rules.auth import hash_password


def add_parser(commands: Any) -> None:
    """Add the ``passwd`` subcommand."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "passwd", help="hash a password for the config file's [users.NAME] password_hash"
    )
    parser.add_argument(
        "--stdin", action="store_true", help="read the password from standard input (scripts)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Read a password (twice on a terminal) and print ``password_hash = "scrypt$..."``."""
    if args.stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("sluicegate: the passwords differ", file=sys.stderr)
            return 2
    if not password:
        print("sluicegate: empty password", file=sys.stderr)
        return 2
    print(f'password_hash = "{hash_password(password)}"')
    return 0
