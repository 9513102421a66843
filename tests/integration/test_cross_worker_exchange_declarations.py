"""Exchange declarations on two workers judged by one (docs/workers.md, "Declarations are
judged by the owner"): two declarations of one exchange at once with different types or flags
end with one exchange on every worker, the second declarer refused with precondition-failed
(409 over AMQP management, 400 over HTTP), as RabbitMQ answers on one node. One server of two
workers serves the module; each test uses exchanges of its own."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from support.ports import free_port
from support.process import serving
from support.workers import children, connection_on, homed_on, worker_of

from sluicegate.clients.management import ManagementClient, Reply

# Rounds of the race, alternating the worker that judges the exchange: each may go either way.
ROUNDS = 4
# Pairs of declarations that differ: by type, by durability, by auto-delete.
CONFLICTS: tuple[tuple[dict[str, object], dict[str, object]], ...] = (
    ({"type": "fanout"}, {"type": "direct"}),
    ({"type": "topic", "durable": True}, {"type": "topic", "durable": False}),
    ({"type": "direct", "auto_delete": False}, {"type": "direct", "auto_delete": True}),
    ({"type": "headers"}, {"type": "fanout"}),
)


@dataclass(frozen=True)
class Workers:
    """A server of two workers: its AMQP port, worker pids by index, the HTTP API's port."""

    port: int
    pids: list[int]
    http: int

    def management(self, worker: int) -> ManagementClient:
        url = f"amqp://127.0.0.1:{self.port}"
        return connection_on(
            self.port,
            self.pids,
            self.pids[worker],
            lambda: ManagementClient(url),
            ManagementClient.close,
        )


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    http = free_port()
    data_dir = tmp_path_factory.mktemp("workers")
    options = ("--workers", "2", "--worker-handover", "false", "--data-dir", str(data_dir))
    listens = ("--metrics-listen", "off", "--http-api-listen", f"127.0.0.1:{http}")
    with serving(*options, *listens) as (process, port):
        served = Workers(port, sorted(children(process.pid), key=worker_of), http)
        # Served, each worker holds its channel to the other: a declaration judged there
        # is answered at once (gateway/supervisor.py).
        assert _http_put(served, "/queues/%2F/" + homed_on(1, 2, "up"), {})[0] == 201
        yield served


def _shown(client: ManagementClient, exchange: str) -> dict[str, object]:
    reply = client.request("GET", f"/exchanges/{exchange}")
    assert reply.status == 200, reply
    assert isinstance(reply.body, dict)
    return {key: reply.body[key] for key in ("type", "durable", "auto_delete")}


def _declare_at_once(
    workers: Workers,
    clients: tuple[ManagementClient, ManagementClient],
    exchange: str,
    bodies: tuple[dict[str, object], dict[str, object]],
) -> list[Reply]:
    """Each worker is sent its declaration while both are stopped, then both are let go
    together, so that neither has heard of the other's when it reads its own."""
    replies: list[Reply | None] = [None, None]

    def declare(index: int) -> None:
        replies[index] = clients[index].request("PUT", f"/exchanges/{exchange}", bodies[index])

    threads = [threading.Thread(target=declare, args=(index,)) for index in (0, 1)]
    for pid in workers.pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        for thread in threads:
            thread.start()
        # Time for the requests to reach the workers' sockets; if they have not, the two
        # declarations cross less tightly, and what the test checks still holds.
        time.sleep(0.2)
    finally:
        for pid in workers.pids:
            os.kill(pid, signal.SIGCONT)
    for thread in threads:
        thread.join()
    return [reply for reply in replies if reply is not None]


def test_two_workers_declaring_one_exchange_differently_at_once_keep_one(
    workers: Workers,
) -> None:
    with workers.management(0) as zero, workers.management(1) as one:
        for round_ in range(ROUNDS):
            bodies = CONFLICTS[round_]
            exchange = homed_on(round_ % 2, 2, f"raced-exchange-{round_}")
            replies = _declare_at_once(workers, (zero, one), exchange, bodies)
            statuses = [reply.status for reply in replies]
            assert sorted(statuses) == [204, 409], replies
            refused = replies[statuses.index(409)]
            assert isinstance(refused.body, str)
            assert "inequivalent" in refused.body or "precondition" in refused.body.lower()
            won = bodies[statuses.index(204)]
            wanted = {
                "type": won["type"],
                "durable": won.get("durable", True),
                "auto_delete": won.get("auto_delete", False),
            }
            assert _shown(zero, exchange) == wanted
            assert _shown(one, exchange) == wanted
            assert zero.request("DELETE", f"/exchanges/{exchange}").status == 204


def _http_put(workers: Workers, path: str, body: object) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{workers.http}/api{path}",
        method="PUT",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, ""
    except urllib.error.HTTPError as error:
        reason = json.loads(error.read())["reason"]
        error.close()
        return error.code, str(reason)


def test_a_declaration_judged_on_the_other_worker_refuses_a_different_one_everywhere(
    workers: Workers,
) -> None:
    """An exchange worker 0 judges, declared through worker 1; then another type through the
    HTTP API (worker 0) is 400, and other flags through worker 1 are 409; the same again 204."""
    exchange = homed_on(0, 2, "judged-exchange")
    with workers.management(1) as one:
        assert one.request("PUT", f"/exchanges/{exchange}", {"type": "topic"}).status == 204
        status, reason = _http_put(workers, f"/exchanges/%2F/{exchange}", {"type": "direct"})
        assert status == 400, reason
        assert _http_put(workers, f"/exchanges/%2F/{exchange}", {"type": "topic"})[0] == 204
        refused = one.request("PUT", f"/exchanges/{exchange}", {"type": "topic", "durable": False})
        assert refused.status == 409, refused
        assert one.request("PUT", f"/exchanges/{exchange}", {"type": "topic"}).status == 204
        assert _shown(one, exchange) == {"type": "topic", "durable": True, "auto_delete": False}
