"""The HTTP API's publish to a queue another worker owns (docs/http-api.md, "Publishing over
HTTP"): worker 0 serves the API, the copy crosses the channel, and the reply waits for the
owner's confirm as an AMQP publisher's settlement does. One server of two workers serves the
module; each test uses queues of its own, and the one that stops the owner comes last."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.polling import wait_until
from support.ports import free_port
from support.process import serving
from support.workers import children, homed_on, worker_of

# The API's listener bounds for the module's server: few connections, so that the publishes
# left waiting for a stopped owner reach the cap; a short deadline, so that they give up soon.
MAX_CONNECTIONS = 4
REQUEST_TIMEOUT = 2.0
# The publishes one test makes to a durable queue on the other worker, each read back at once.
PUBLISHES = 20
# The deadline of the server whose owner is killed: far beyond the channel's end being seen.
LONG_TIMEOUT = 60.0


@dataclass(frozen=True)
class Workers:
    """A server of two workers: worker pids by index and the HTTP API's port (worker 0's)."""

    pids: list[int]
    http: int


@contextlib.contextmanager
def _serving(data_dir: Path, timeout: float) -> Iterator[Workers]:
    http = free_port()
    options = ("--workers", "2", "--worker-handover", "false", "--data-dir", str(data_dir))
    listens = ("--metrics-listen", "off", "--http-api-listen", f"127.0.0.1:{http}")
    bounds = (
        "--http-max-connections",
        str(MAX_CONNECTIONS),
        "--http-request-timeout",
        str(timeout),
    )
    with serving(*options, *listens, *bounds) as (process, _):
        yield Workers(sorted(children(process.pid), key=worker_of), http)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    with _serving(tmp_path_factory.mktemp("workers"), REQUEST_TIMEOUT) as served:
        yield served


def _http(workers: Workers, path: str, method: str = "GET", body: object = None) -> object:
    """The HTTP API's JSON answer (the status of a PUT); an error status raises HTTPError."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{workers.http}/api{path}",
        method=method,
        data=data,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        if method == "PUT":
            return response.status
        return json.loads(response.read())


def _declare(workers: Workers, queue: str, body: object) -> None:
    """Declare ``queue`` on worker 0's API: at once, since a server serves holding its channels
    (gateway/supervisor.py)."""
    assert _http(workers, f"/queues/%2F/{queue}", "PUT", body) == 201


def _publish(workers: Workers, queue: str, payload: str) -> object:
    body = {
        "routing_key": queue,
        "payload": payload,
        "properties": {"delivery_mode": 2},
    }
    return _http(workers, "/exchanges/%2F/amq.default/publish", "POST", body)


def _refusal(workers: Workers, queue: str) -> tuple[int, str]:
    """The status and reason of a publish that must be refused."""
    with pytest.raises(urllib.error.HTTPError) as refused:
        _publish(workers, queue, "refused")
    error = refused.value
    reason = json.loads(error.read())["reason"]
    error.close()
    return error.code, reason


def _messages(workers: Workers, queue: str) -> int:
    shown = _http(workers, f"/queues/%2F/{queue}")
    assert isinstance(shown, dict)
    count = shown["messages"]
    assert isinstance(count, int)
    return count


def test_the_reply_comes_once_the_owner_stored_the_copy(workers: Workers) -> None:
    """Each publish to a durable queue on worker 1 is answered after the owner logged it: the
    owner counts it when the next request asks, every time."""
    queue = homed_on(1, 2, "http-stored")
    _declare(workers, queue, {"durable": True})
    for n in range(1, PUBLISHES + 1):
        assert _publish(workers, queue, f"m{n}") == {"routed": True}
        assert _messages(workers, queue) == n


def test_a_copy_the_owner_refuses_is_not_routed(workers: Workers) -> None:
    """A full queue with ``x-overflow = reject-publish`` on worker 1 refuses the second
    message: the reply says so, as the same queue on worker 0 would."""
    queue = homed_on(1, 2, "http-full")
    arguments = {"x-max-length": 1, "x-overflow": "reject-publish"}
    _declare(workers, queue, {"arguments": arguments})
    assert _publish(workers, queue, "first") == {"routed": True}
    assert _publish(workers, queue, "second") == {"routed": False}
    assert _messages(workers, queue) == 1


def test_a_stopped_owner_gets_503_and_the_waiting_publishes_are_capped(
    workers: Workers,
) -> None:
    """With worker 1 stopped (SIGSTOP) its confirms do not come: each publish is answered 503
    at the API's deadline, and once as many wait as the listener takes connections the next
    is refused at once. The owner resumed, it stores them and publishing goes on."""
    queue = homed_on(1, 2, "http-stopped")
    _declare(workers, queue, {"durable": True})
    owner = workers.pids[1]
    os.kill(owner, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(MAX_CONNECTIONS) as pool:
            answers = list(pool.map(lambda _: _refusal(workers, queue), range(MAX_CONNECTIONS)))
        assert answers == [(503, f"no answer within {REQUEST_TIMEOUT:g} s")] * MAX_CONNECTIONS
        # Their connections are closed; the publishes they made still wait, and are counted.
        status, reason = _refusal(workers, queue)
        assert (status, reason) == (
            503,
            f"{MAX_CONNECTIONS} publishes wait for their queues to store them",
        )
    finally:
        os.kill(owner, signal.SIGCONT)

    def routed() -> bool:
        try:
            return _publish(workers, queue, "after") == {"routed": True}
        except urllib.error.HTTPError as error:
            error.close()
            return False

    wait_until(routed, timeout=30)
    # The publishes that timed out were stored all the same, as a released publisher's may be.
    assert _messages(workers, queue) == MAX_CONNECTIONS + 1


@pytest.mark.slow
def test_an_owner_that_ends_while_the_reply_waits_gets_503(tmp_path: Path) -> None:
    """Worker 1 stopped, a publish to its queue waits; killed, its channel ends and the reply
    is 503 at once, not at the deadline. Restarted by the supervisor, it takes publishes again
    (503 "not serving" until it does)."""
    with _serving(tmp_path, LONG_TIMEOUT) as served:
        queue = homed_on(1, 2, "http-killed")
        _declare(served, queue, {"durable": True})
        owner = served.pids[1]
        os.kill(owner, signal.SIGSTOP)
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_refusal, served, queue)
            # The publish reaches worker 0 and crosses (or not yet: either way it is refused).
            time.sleep(0.5)
            os.kill(owner, signal.SIGKILL)
            status, reason = waiting.result(timeout=LONG_TIMEOUT / 2)
        assert status == 503
        assert "worker 1" in reason

        def routed() -> bool:
            try:
                return _publish(served, queue, "after") == {"routed": True}
            except urllib.error.HTTPError as error:
                error.close()
                return False

        wait_until(routed, timeout=30)
