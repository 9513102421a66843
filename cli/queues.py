"""``sluicegate queues list|declare|delete|purge``: the management API from the command line.

Each command is one request to the ``/management`` node at ``--url`` (default the embedded
default listener), so it works wherever an AMQP client may connect, against sluicegate or
RabbitMQ 4. ``list`` asks for pages of :data:`PAGE_SIZE` queues and prints each as it comes, so
a server with a hundred thousand queues is listed in constant memory, a page at a time. A
refused request prints one line with the status and the server's reason and exits 1; a server
that cannot be reached exits 2.
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
_HEADERS: Final = ("name", "type", "durable", "messages", "consumers")
# The largest page the server gives (RabbitMQ's HTTP API's limit too).
PAGE_SIZE: Final = 500


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
    """The method, path and body of the action (``list``: of its first page)."""
    if args.action == "list":
        return "GET", _page(1), None
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


def _page(number: int) -> str:
    return f"/queues?page={number}&page_size={PAGE_SIZE}"


def _print_page(
    args: argparse.Namespace, page: int, queues: list[object], widths: list[int]
) -> None:
    """One page of the listing: JSON array elements, or table rows aligned as the first page."""
    maps = [queue for queue in queues if isinstance(queue, dict)]
    if args.json:
        for index, queue in enumerate(maps):
            separator = "[" if page == 1 and index == 0 else ","
            print(separator + json.dumps(queue, default=_cell, sort_keys=True))
        return
    rows = [[_cell(queue.get(column, "")) for column in _COLUMNS] for queue in maps]
    if page == 1:
        widths[:] = [max(map(len, column)) for column in zip(_HEADERS, *rows, strict=False)]
        rows.insert(0, list(_HEADERS))
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())


def _list(args: argparse.Namespace, client: ManagementClient, first: Reply) -> Reply:
    """Print page after page; the refusal that stopped the listing, or the last page's reply."""
    reply, page, widths = first, 1, list(map(len, _HEADERS))
    while True:
        body = reply.body if isinstance(reply.body, dict) else {}
        items = body.get("items")
        _print_page(args, page, items if isinstance(items, list) else [], widths)
        page_count = body.get("page_count")
        if not isinstance(page_count, int) or page >= page_count:
            break
        page += 1
        reply = client.request("GET", _page(page))
        if not reply.ok:
            return reply
    if args.json:
        print("[]" if page == 1 and not body.get("items") else "]")
    return reply


def _print(args: argparse.Namespace, reply: Reply) -> None:
    body = reply.body
    if args.action == "declare":
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
            if reply.ok and args.action == "list":
                reply = _list(args, client, reply)
    except (ConnectionException, Timeout, OSError) as error:
        shown = _redacted(args.url)
        reason = str(error).replace(args.url, shown)
        if args.vhost is not None and isinstance(error, ConnectionException):
            # RabbitMQ's way, which the server follows: a connection into a virtual host that
            # does not exist, or that its user may not enter, is closed without a word.
            reason += (
                f" (the server closes a connection into a virtual host it lacks or the user may "
                f"not enter: does virtual host '{args.vhost}' exist?)"
            )
        print(f"sluicegate: cannot reach {shown}: {reason}", file=sys.stderr)
        return 2
    if not reply.ok:
        print(f"sluicegate: {reply.status}: {reply.body}", file=sys.stderr)
        return 1
    if args.action != "list":
        _print(args, reply)
    return 0
