"""``sluicegate queues``: the management API from the command line, as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

from integration.conftest import RunningServer
from support.clients import publish

from gateway.auth import hash_password, parse_users

# Generous: the machine running the tests may be loaded.
TIMEOUT = 60


def queues(server: RunningServer, *args: str, url: str | None = None) -> tuple[int, str, str]:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "queues", "--url", url or server.url, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    return result.returncode, result.stdout, result.stderr


def test_declare_list_purge_delete(server: RunningServer) -> None:
    name = "cli/orders ä"
    assert queues(server, "declare", name, "--argument", "x-max-length=100") == (
        0,
        f"declared: {name}\n",
        "",
    )
    assert queues(server, "declare", name, "--argument", "x-max-length=100")[:2] == (
        0,
        f"exists: {name}\n",
    )
    assert server.call(lambda: server.server.registry.settings(name)).arguments.max_length == 100
    publish(server.url, "/queues/cli%2Forders%20%C3%A4", ["a", "b", "c"])

    status, out, _ = queues(server, "list", "--json")
    assert status == 0
    listed = {q["name"]: q for q in json.loads(out)}
    assert listed[name]["message_count"] == 3
    assert listed[name]["arguments"] == {"x-max-length": 100, "x-queue-type": "classic"}
    status, out, _ = queues(server, "list")
    assert status == 0
    assert out.splitlines()[0].split() == ["name", "type", "durable", "messages", "consumers"]
    # Other tests' queues share the server: find this one's row.
    row = next(line for line in out.splitlines() if line.startswith(f"{name} "))
    assert row[len(name) :].split() == ["classic", "True", "3", "0"]

    assert queues(server, "purge", name) == (0, f"purged {name}: 3 messages\n", "")
    assert queues(server, "delete", name) == (0, f"deleted {name}: 0 messages\n", "")
    assert server.call(lambda: server.server.registry.get(name)) is None


def test_refusals_are_one_line_and_exit_1(server: RunningServer) -> None:
    queues(server, "declare", "cli-conflict", "--argument", "x-max-length=1")
    status, out, err = queues(server, "declare", "cli-conflict")
    assert (status, out) == (1, "")
    assert err.startswith("sluicegate: 409: inequivalent arg 'x-max-length'")
    assert len(err.splitlines()) == 1
    status, _, err = queues(server, "purge", "cli-missing")
    assert (status, err) == (1, "sluicegate: 404: no queue 'cli-missing'\n")
    status, _, err = queues(server, "declare", "bad", "--argument", "novalue")
    assert (status, err) == (2, "sluicegate: --argument: expected KEY=VALUE, got 'novalue'\n")


def test_an_unreachable_server_exits_2(server: RunningServer) -> None:
    status, _, err = queues(server, "list", url="amqp://127.0.0.1:1")
    assert status == 2
    assert err.startswith("sluicegate: cannot reach amqp://127.0.0.1:1")
    assert len(err.splitlines()) == 1


def test_plain_login_and_permissions(make_server: Callable[..., RunningServer]) -> None:
    """Credentials in the URL log in with PLAIN; each request is checked against the user."""
    users = parse_users(
        {
            "ops": {
                "password_hash": hash_password("secret pw"),
                "configure": "^app-",
                "write": ".*",
                "read": ".*",
            }
        }
    )
    running = make_server(users=users, anonymous_login="off")
    url = f"amqp://ops:secret%20pw@127.0.0.1:{running.port}"
    assert queues(running, "declare", "app-orders", url=url) == (0, "declared: app-orders\n", "")
    status, _, err = queues(running, "declare", "other", url=url)
    assert (status, err) == (1, "sluicegate: 403: access refused: configure on queue 'other'\n")
    wrong = f"amqp://ops:wrong@127.0.0.1:{running.port}"
    status, _, err = queues(running, "list", url=wrong)
    assert status == 2
    assert "unauthorized-access" in err
    assert "wrong" not in err
