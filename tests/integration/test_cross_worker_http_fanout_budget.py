"""An HTTP publish whose copies cross to another worker is charged to worker 0's budget for
every copy, as they will count there until the owner confirms them (docs/bounds.md, issue 31).

Worker 0 serves the API. A copy it sends another worker counts in its budget, whole, until
the owner confirms it (``Remote.in_flight``); the API's check counted the payload once, as
for copies that share it here, so each publish to a fanout of many queues of the other worker
added many times what it was checked for. Here the owner is stopped, so that nothing crosses
back and what crossed stays counted: before, worker 0's count went past its ceiling; now the
publish that would take it past its limit is refused (503) and nothing of it is sent.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from support.ports import free_port
from support.process import serving
from support.workers import children, worker_of

from sluicegate.queues.queue_homes import proposed_home

MiB: Final = 1024 * 1024
# Worker 0's share of a 16 MiB budget over two, and its ceiling: the limit and an eighth.
LIMIT: Final = 8 * MiB
CEILING: Final = LIMIT + LIMIT // 8
# Queues of worker 1 bound to the fanout, and each publish's payload: 60 copies of 60 KB
# cross for each publish, 3.6 MB, while the check counted 60 KB.
WIDTH: Final = 60
PAYLOAD: Final = "h" * 60_000
# The API's deadline for a reply: the publishes that were accepted wait for confirms that do
# not come while the owner is stopped, and are answered 503 at it.
REQUEST_TIMEOUT: Final = 1.0
# Publishes made: one more than the budget ever took before.
PUBLISHES: Final = 4


@dataclass(frozen=True)
class Served:
    """A server of two workers: worker pids by index and the HTTP API's port (worker 0's)."""

    pids: list[int]
    http: int


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    http = free_port()
    options = ("--workers", "2", "--data-dir", str(tmp_path), "--memory-budget", "16MiB")
    listens = ("--metrics-listen", "off", "--http-api-listen", f"127.0.0.1:{http}")
    deadline = ("--http-request-timeout", str(REQUEST_TIMEOUT))
    with serving(*options, *listens, *deadline) as (process, _):
        yield Served(sorted(children(process.pid), key=worker_of), http)


def _http(served: Served, path: str, method: str, body: object) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{served.http}/api{path}",
        method=method,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.close()
        return int(error.code)


def _worker_0_used(served: Served) -> int:
    """Worker 0's own count, as its console shows it (the API is served there)."""
    url = f"http://127.0.0.1:{served.http}/api/sluicegate/budget"
    with urllib.request.urlopen(url, timeout=20) as page:
        used = json.loads(page.read())["used"]
    assert isinstance(used, int)
    return used


@pytest.mark.slow
def test_an_http_fanout_to_another_workers_queues_is_charged_for_every_copy(
    served: Served,
) -> None:
    names = (f"hf-{n}" for n in range(10 * WIDTH))
    queues = [name for name in names if proposed_home("/", name, 2) == 1][:WIDTH]
    assert _http(served, "/exchanges/%2F/hf-fan", "PUT", {"type": "fanout"}) in (201, 204)
    for queue in queues:
        assert _http(served, f"/queues/%2F/{queue}", "PUT", {}) in (201, 204)
        assert _http(served, f"/bindings/%2F/e/hf-fan/q/{queue}", "POST", {}) in (201, 204)
    owner = served.pids[1]
    os.kill(owner, signal.SIGSTOP)
    try:
        body = {"routing_key": "", "payload": PAYLOAD}
        # Each is answered 503: at the deadline once accepted (its confirms do not come), at
        # once when the budget has no room for it. Before, three were accepted: 10.9 MB.
        answers = [
            _http(served, "/exchanges/%2F/hf-fan/publish", "POST", body) for _ in range(PUBLISHES)
        ]
        used = _worker_0_used(served)
    finally:
        os.kill(owner, signal.SIGCONT)
    assert answers == [503] * PUBLISHES
    assert used <= LIMIT < CEILING
