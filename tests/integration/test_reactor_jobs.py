"""Jobs the HTTP listeners run on the reactor (``Server.submit_in_turns``) whose requests give
up: a request that times out or whose connection closes cancels its job's future
(gateway/http/reactor_calls.py, aiohttp's ``handler_cancellation``).

Adversary seed 69502 (docs/adversary.md): a job's result set on a future its request had
cancelled raised ``InvalidStateError`` on the reactor, logged as an internal error, and the
calls queued behind it in the same wake-up waited for the next one. A real server in this
process, its reactor held by a first job while the test cancels a second.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Generator
from typing import Final

import pytest
from integration.conftest import RunningServer

WAIT_S: Final = 10.0


def _once(function: Callable[[], object]) -> Generator[None, None, object]:
    yield from ()
    return function()


def _held(gate: threading.Event, ran: list[str]) -> Generator[None, None, str]:
    """A job of two turns whose first waits for ``gate``, holding the reactor."""
    ran.append("first turn")
    gate.wait(WAIT_S)
    yield
    ran.append("second turn")
    return "done"


def test_a_job_cancelled_before_the_reactor_takes_it_is_not_run_and_logs_nothing(
    make_server: Callable[..., RunningServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = make_server().server
    gate = threading.Event()
    ran: list[str] = []
    holding = server.submit_in_turns(_held(gate, ran))
    behind = server.submit_in_turns(_once(lambda: ran.append("cancelled job")))
    with caplog.at_level(logging.ERROR, logger="sluicegate"):
        assert behind.cancel()
        gate.set()
        assert holding.result(WAIT_S) == "done"
        assert server.call(lambda: "after", WAIT_S) == "after"
    assert ran == ["first turn", "second turn"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_running_job_cannot_be_cancelled_and_is_done_whole(
    make_server: Callable[..., RunningServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = make_server().server
    gate = threading.Event()
    ran: list[str] = []
    with caplog.at_level(logging.ERROR, logger="sluicegate"):
        running = server.submit_in_turns(_held(gate, ran))
        while not ran:
            gate.wait(0.01)
        assert not running.cancel()
        gate.set()
        assert running.result(WAIT_S) == "done"
    assert ran == ["first turn", "second turn"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
