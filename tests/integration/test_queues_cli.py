"""``sluicegate queues``: the management API from the command line, against a real server."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Callable

import pytest
from integration.conftest import RunningServer
from support.clients import publish

from sluicegate.cli.main import main
from sluicegate.gateway.rules.auth import hash_password, parse_users
from sluicegate.gateway.rules.vhosts import parse_vhosts

# Generous: the machine running the tests may be loaded.
TIMEOUT = 60


def queues(
    capsys: pytest.CaptureFixture[str], server: RunningServer, *args: str, url: str | None = None
) -> tuple[int, str, str]:
    """Run ``sluicegate queues`` in this process (each subprocess costs a second of imports)."""
    status = main(["queues", "--url", url or server.url, *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_declare_list_purge_delete(
    capsys: pytest.CaptureFixture[str], server: RunningServer
) -> None:
    name = "cli/orders ä"
    assert queues(capsys, server, "declare", name, "--argument", "x-max-length=100") == (
        0,
        f"declared: {name}\n",
        "",
    )
    assert queues(capsys, server, "declare", name, "--argument", "x-max-length=100")[:2] == (
        0,
        f"exists: {name}\n",
    )
    assert server.call(lambda: server.server.registry.settings(name)).arguments.max_length == 100
    publish(server.url, "/queues/cli%2Forders%20%C3%A4", ["a", "b", "c"])

    status, out, _ = queues(capsys, server, "list", "--json")
    assert status == 0
    listed = {q["name"]: q for q in json.loads(out)}
    assert listed[name]["message_count"] == 3
    assert listed[name]["arguments"] == {"x-max-length": 100, "x-queue-type": "classic"}
    status, out, _ = queues(capsys, server, "list")
    assert status == 0
    assert out.splitlines()[0].split() == ["name", "type", "durable", "messages", "consumers"]
    # Other tests' queues share the server: find this one's row.
    row = next(line for line in out.splitlines() if line.startswith(f"{name} "))
    assert row[len(name) :].split() == ["classic", "True", "3", "0"]

    assert queues(capsys, server, "purge", name) == (0, f"purged {name}: 3 messages\n", "")
    assert queues(capsys, server, "delete", name) == (0, f"deleted {name}: 0 messages\n", "")
    assert server.call(lambda: server.server.registry.get(name)) is None


def test_refusals_are_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], server: RunningServer
) -> None:
    queues(capsys, server, "declare", "cli-conflict", "--argument", "x-max-length=1")
    status, out, err = queues(capsys, server, "declare", "cli-conflict")
    assert (status, out) == (1, "")
    assert err.startswith("sluicegate: 409: inequivalent arg 'x-max-length'")
    assert len(err.splitlines()) == 1
    status, _, err = queues(capsys, server, "purge", "cli-missing")
    assert (status, err) == (1, "sluicegate: 404: no queue 'cli-missing'\n")
    status, _, err = queues(capsys, server, "declare", "bad", "--argument", "novalue")
    assert (status, err) == (2, "sluicegate: --argument: expected KEY=VALUE, got 'novalue'\n")


@pytest.mark.slow
def test_the_command_as_a_subprocess() -> None:
    """The real entry point, once: an unreachable server is one line and exit status 2."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluicegate.cli.main",
            "queues",
            "--url",
            "amqp://127.0.0.1:1",
            "list",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    status, err = result.returncode, result.stderr
    assert status == 2
    assert err.startswith("sluicegate: cannot reach amqp://127.0.0.1:1")
    assert len(err.splitlines()) == 1


def test_plain_login_and_permissions(
    capsys: pytest.CaptureFixture[str], make_server: Callable[..., RunningServer]
) -> None:
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
    assert queues(capsys, running, "declare", "app-orders", url=url) == (
        0,
        "declared: app-orders\n",
        "",
    )
    status, _, err = queues(capsys, running, "declare", "other", url=url)
    assert (status, err) == (1, "sluicegate: 403: access refused: configure on queue 'other'\n")
    wrong = f"amqp://ops:wrong@127.0.0.1:{running.port}"
    status, _, err = queues(capsys, running, "list", url=wrong)
    assert status == 2
    assert "unauthorized-access" in err
    assert "wrong" not in err


def test_declare_a_stream(capsys: pytest.CaptureFixture[str], server: RunningServer) -> None:
    assert queues(capsys, server, "declare", "cli-stream", "--type", "stream")[0] == 0
    status, out, _ = queues(capsys, server, "list", "--json")
    assert status == 0
    assert {q["name"]: q["type"] for q in json.loads(out)}["cli-stream"] == "stream"
    assert queues(capsys, server, "delete", "cli-stream")[0] == 0


def test_vhost_chooses_the_virtual_host(
    capsys: pytest.CaptureFixture[str], make_server: Callable[..., RunningServer]
) -> None:
    running = make_server(vhosts=parse_vhosts({"tenant": {}}))
    assert queues(capsys, running, "--vhost", "tenant", "declare", "cli-vhost")[0] == 0
    status, out, _ = queues(capsys, running, "--vhost", "tenant", "list", "--json")
    assert status == 0
    assert [(q["name"], q["vhost"]) for q in json.loads(out)] == [("cli-vhost", "tenant")]
    assert json.loads(queues(capsys, running, "list", "--json")[1]) == []
    status, _, err = queues(capsys, running, "--vhost", "nowhere", "list")
    assert status == 2
    assert "virtual host 'nowhere' exist?" in err


def _declare_many(running: RunningServer, names: list[str]) -> None:
    """Declare queues straight in the registry, a few thousand per reactor call."""
    registry = running.server.registry

    def declare(chunk: list[str]) -> None:
        for name in chunk:
            registry.declare_queue(name, durable=False)

    for start in range(0, len(names), 5000):
        running.call(functools.partial(declare, names[start : start + 5000]))


@pytest.mark.slow
def test_list_streams_thousands_of_queues_page_by_page(
    capsys: pytest.CaptureFixture[str], make_server: Callable[..., RunningServer]
) -> None:
    """Past 2,500 queues the one-reply listing failed to encode (issue 17 §7)."""
    running = make_server()
    names = [f"many-{n:05d}" for n in range(3000)]
    _declare_many(running, names)
    status, out, err = queues(capsys, running, "list", "--json")
    assert (status, err) == (0, "")
    assert [q["name"] for q in json.loads(out)] == names
    status, out, _ = queues(capsys, running, "list")
    lines = out.splitlines()
    assert (status, len(lines)) == (0, 1 + 3000)
    assert lines[1].split() == ["many-00000", "classic", "False", "0", "0"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_list_a_hundred_thousand_queues(
    capsys: pytest.CaptureFixture[str], make_server: Callable[..., RunningServer]
) -> None:
    running = make_server()
    names = [f"q{n:06d}" for n in range(100_000)]
    _declare_many(running, names)
    status, out, err = queues(capsys, running, "list")
    assert (status, err) == (0, "")
    rows = out.splitlines()[1:]
    assert len(rows) == 100_000
    assert rows[-1].split()[0] == "q099999"
