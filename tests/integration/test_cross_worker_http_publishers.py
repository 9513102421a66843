"""Each HTTP connection publishing through worker 0's API is a publisher of its own where its
copies are stored (issue 31, session/remote_publishers.py).

Worker 1's limit is held by a queue nobody reads, its AMQP publisher held. A heavy HTTP client
then publishes to a fanout of 30 queues of worker 1, until worker 1 holds it for what its
copies stored there and its publishes park (answered 503 at the API's deadline). A light
HTTP client on another connection then publishes one small message to a queue of worker 1.
Before, every HTTP publish was charged to one publisher, the API: the light client's publish
parked with the heavy one's and was answered 503. Now it is stored and answered at once.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from proton import Message, Timeout
from support.polling import wait_until
from support.ports import free_port
from support.process import serving
from support.workers import (
    blocking_on,
    children,
    drained,
    homed_on,
    own_sample,
    send_until_held,
    worker_of,
)

# 32 MiB over two workers: each worker's limit is 16 MiB.
BUDGET: Final = "32MiB"
FILL: Final = b"f" * 100_000
# The fanout's queues on worker 1, and the heavy client's publishes to it: 10 KB each, 300 KB
# of copies a publish, each queue far under a holder's floor, as in
# test_cross_worker_fanout_holder.py.
FAN: Final = 30
FANNED: Final = 20
BODY: Final = "c" * 10_000
# The API's deadline: a parked publish is answered 503 at it.
REQUEST_TIMEOUT: Final = 3.0
# Worker 0's publishes of FILL that pass the 512 KiB window worker 1 keeps parked for it.
WINDOW_FILLERS: Final = 10
# An HTTP publish larger than what the window's five kept fillers leave of it (about 23 KB),
# within the API's 64 KiB body.
GIVEN_BACK_BODY: Final = 50_000


@dataclass(frozen=True)
class Served:
    """Two workers: the AMQP port, the workers' pids by index, the API's port, the data."""

    port: int
    pids: list[int]
    http: int
    data_dir: Path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    http_port = free_port()
    options = ("--workers", "2", "--worker-handover", "false", "--data-dir", str(tmp_path))
    listens = (
        "--memory-budget",
        BUDGET,
        "--metrics-listen",
        f"127.0.0.1:{free_port()}",
        "--http-api-listen",
        f"127.0.0.1:{http_port}",
        "--http-request-timeout",
        str(REQUEST_TIMEOUT),
    )
    with serving(*options, *listens) as (process, port):
        pids = sorted(children(process.pid), key=worker_of)
        yield Served(port, pids, http_port, tmp_path)


def _blocked(served: Served) -> bool:
    """Whether worker 1's own budget is blocked."""
    return own_sample(served.data_dir, 1, "sluicegate_memory_budget_blocked") == 1


def _answer(
    client: http.client.HTTPConnection, method: str, path: str, body: object
) -> tuple[int, str]:
    """One request on the client's own connection (kept alive): its status and body."""
    client.request(method, f"/api{path}", json.dumps(body), {"Content-Type": "application/json"})
    response = client.getresponse()
    return response.status, response.read().decode()


def _request(client: http.client.HTTPConnection, method: str, path: str, body: object) -> int:
    """One request on the client's own connection: its status."""
    return _answer(client, method, path, body)[0]


@pytest.mark.slow
def test_a_heavy_http_client_is_held_and_a_light_one_beside_it_is_not(served: Served) -> None:
    full, probed = homed_on(1, 2, "http-full"), homed_on(1, 2, "http-probe")
    fan = [homed_on(1, 2, f"http-fan{n}") for n in range(FAN)]
    setup = http.client.HTTPConnection("127.0.0.1", served.http, timeout=30)
    assert _request(setup, "PUT", "/exchanges/%2F/http-fan", {"type": "fanout"}) in (201, 204)
    for name in (full, probed, *fan):
        assert _request(setup, "PUT", f"/queues/%2F/{name}", {}) in (201, 204)
    for name in fan:
        assert _request(setup, "POST", f"/bindings/%2F/e/http-fan/q/{name}", {}) in (201, 204)
    setup.close()
    filler = blocking_on(served.port, served.pids, served.pids[1])
    # Opened once worker 1 is blocked: the API closes a connection idle for its deadline.
    heavy = light = None
    try:
        assert send_until_held(filler.create_sender(f"/queues/{full}"), FILL) > 0
        wait_until(lambda: _blocked(served), timeout=30)
        heavy = http.client.HTTPConnection("127.0.0.1", served.http, timeout=30)
        fanned = {"properties": {}, "routing_key": "", "payload": BODY}
        answers = []
        for _ in range(FANNED):
            answers.append(_request(heavy, "POST", "/exchanges/%2F/http-fan/publish", fanned))
            if answers[-1] != 200:
                break
        # Held for what its copies stored on worker 1: its next publish parked.
        assert answers[-1] == 503, answers
        assert _blocked(served)
        # Before: parked with the heavy client's publishes, as one publisher, and 503.
        light = http.client.HTTPConnection("127.0.0.1", served.http, timeout=30)
        publish = {"properties": {}, "routing_key": probed, "payload": "while blocked"}
        assert _request(light, "POST", "/exchanges/%2F/amq.default/publish", publish) == 200
        # Drained, worker 1 lets go and the filler's connection is read again.
        consumer = blocking_on(served.port, served.pids, served.pids[1])
        assert drained(consumer, full, 50) > 0
        consumer.close()
    finally:
        for client in (heavy, light):
            if client is not None:
                with contextlib.suppress(OSError):
                    client.close()
        # Held unread if the test failed before the drain: its CLOSE is never answered.
        with contextlib.suppress(Timeout):
            filler.close()


@pytest.mark.slow
def test_an_http_publish_given_back_by_a_blocked_worker_is_answered_503_at_once(
    served: Served,
) -> None:
    """What worker 1 does not keep parked of worker 0's publishes it gives back (gateway/
    peers.py's ``_give_back``): an HTTP publish whose copy came back so is answered 503 saying
    why, before the API's deadline, not 200 with ``routed: false``."""
    full = homed_on(1, 2, "http-given-full")
    setup = http.client.HTTPConnection("127.0.0.1", served.http, timeout=30)
    assert _request(setup, "PUT", f"/queues/%2F/{full}", {}) in (201, 204)
    setup.close()
    filler = blocking_on(served.port, served.pids, served.pids[1])
    far = blocking_on(served.port, served.pids, served.pids[0])
    client = None
    try:
        assert send_until_held(filler.create_sender(f"/queues/{full}"), FILL) > 0
        wait_until(lambda: _blocked(served), timeout=30)
        # Worker 0's publishes to the full queue fill the window worker 1 keeps parked.
        sender = far.create_sender(f"/queues/{full}")
        for _ in range(WINDOW_FILLERS):
            sender.link.send(Message(body=FILL))
        given_back = "sluicegate_memory_budget_channel_given_back_total"
        deadline = time.monotonic() + 30
        while own_sample(served.data_dir, 1, given_back) == 0 and time.monotonic() < deadline:
            with contextlib.suppress(Timeout):
                far.wait(lambda: False, timeout=0.5)  # a blocking client writes only so
        assert own_sample(served.data_dir, 1, given_back) > 0
        client = http.client.HTTPConnection("127.0.0.1", served.http, timeout=30)
        publish = {"properties": {}, "routing_key": full, "payload": "g" * GIVEN_BACK_BODY}
        began = time.monotonic()
        status, reason = _answer(client, "POST", "/exchanges/%2F/amq.default/publish", publish)
        assert status == 503, reason
        assert "memory budget is blocked" in reason
        assert time.monotonic() - began < REQUEST_TIMEOUT
        consumer = blocking_on(served.port, served.pids, served.pids[1])
        assert drained(consumer, full, 50) > 0
        consumer.close()
    finally:
        if client is not None:
            with contextlib.suppress(OSError):
                client.close()
        for connection in (filler, far):
            with contextlib.suppress(Timeout):
                connection.close()
