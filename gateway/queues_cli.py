"""``sluicegate queues list|declare|delete|purge``: the management API from the command line.

Each command is one request to the ``/management`` node at ``--url`` (default the embedded
default listener), so it works wherever an AMQP client may connect, against sluicegate or
RabbitMQ 4. A refused request prints one line with the status and the server's reason and exits
1; a server that cannot be reached exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from proton import ConnectionException, Timeout

from sluicegate.clients.management import ManagementClient, Reply, path_segment

DEFAULT_URL: Final = "amqp://127.0.0.1:5672"
_COLUMNS: Final = ("name", "type", "durable", "message_count", "consumer_count")


def add_parser(commands: Any) -> None:
    """Add the ``queues`` subcommand and its four actions."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "queues", help="list, declare, delete or purge queues over AMQP management"
    )
    parser.add_argument(
        "--url",
        default=DEFAULT_URL,
        help=f"the server (default {DEFAULT_URL}); amqp://USER:PASSWORD@HOST:PORT logs in with "
        "SASL PLAIN, amqps:// uses TLS",
    )
    parser.add_argument(
        "--vhost",
        default=None,
        help="the virtual host to act in (default: the server's default virtual host, /)",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="every queue with its counts")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    declare = actions.add_parser("declare", help="declare a queue (idempotent)")
    declare.add_argument("name")
    declare.add_argument("--type", default="classic", help="classic (default) or stream")
    declare.add_argument(
        "--durable", action=argparse.BooleanOptionalAction, default=True, help="(default: on)"
    )
    declare.add_argument("--exclusive", action="store_true")
    declare.add_argument("--auto-delete", action="store_true")
    declare.add_argument(
        "--argument",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a queue argument, e.g. x-max-length=1000 (integers and true/false are typed)",
    )
    for action, text in (("delete", "delete a queue"), ("purge", "drop a queue's ready messages")):
        actions.add_parser(action, help=text).add_argument("name")
    parser.set_defaults(run=run)


def _argument(raw: str) -> tuple[str, object]:
    key, equals, value = raw.partition("=")
    if not equals or not key:
        raise ValueError(f"--argument: expected KEY=VALUE, got {raw!r}")
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    try:
        return key, int(value)
    except ValueError:
        return key, value


def _request(args: argparse.Namespace) -> tuple[str, str, object]:
    """The method, path and body of the action."""
    if args.action == "list":
        return "GET", "/queues", None
    path = f"/queues/{path_segment(args.name)}"
    if args.action == "delete":
        return "DELETE", path, None
    if args.action == "purge":
        return "DELETE", f"{path}/messages", None
    arguments = dict(_argument(raw) for raw in args.argument)
    arguments["x-queue-type"] = args.type
    body = {
        "durable": args.durable,
        "exclusive": args.exclusive,
        "auto_delete": args.auto_delete,
        "arguments": arguments,
    }
    return "PUT", path, body


def _redacted(url: str) -> str:
    """The URL without its password, which must not end up in terminals and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _cell(value: object) -> str:
    """A value as text: AMQP's typed integers (ulong, uint) print as plain numbers."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(int(value))
    return str(value)


def _print(args: argparse.Namespace, reply: Reply) -> None:
    body = reply.body
    if args.action == "list":
        queues = body if isinstance(body, list) else []
        if args.json:
            print(json.dumps(queues, default=_cell, sort_keys=True))
            return
        rows = [[_cell(q.get(c, "")) for c in _COLUMNS] for q in queues if isinstance(q, dict)]
        headers = ["name", "type", "durable", "messages", "consumers"]
        widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=False)]
        for row in [headers, *rows]:
            cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            print("  ".join(cells).rstrip())
    elif args.action == "declare":
        created = "declared" if reply.status == 201 else "exists"
        print(f"{created}: {args.name}")
    elif isinstance(body, dict):
        print(f"{args.action}d {args.name}: {_cell(body.get('message_count', 0))} messages")


def run(args: argparse.Namespace) -> int:
    """Send the action's request; print the result, or one line saying why it failed."""
    try:
        method, path, body = _request(args)
    except ValueError as error:
        print(f"sluicegate: {error}", file=sys.stderr)
        return 2
    try:
        with ManagementClient(args.url, vhost=args.vhost) as client:
            reply = client.request(method, path, body)
    except (ConnectionException, Timeout, OSError) as error:
        shown = _redacted(args.url)
        reason = str(error).replace(args.url, shown)
        print(f"sluicegate: cannot reach {shown}: {reason}", file=sys.stderr)
        return 2
    if not reply.ok:
        print(f"sluicegate: {reply.status}: {reply.body}", file=sys.stderr)
        return 1
    _print(args, reply)
    return 0
