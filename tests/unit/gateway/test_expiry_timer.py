"""The expiry timer outlives a failure in one of its runs, and is armed once at a time.

A real proton container drives it. Before issue 31 a failure in one run (RecursionError from
an auto-delete cascade of x-expires) left it disarmed: no TTL, x-expires or consumer timeout
ran again until a restart.
"""

from __future__ import annotations

import time

import pytest
from proton import Event, Handler
from proton.reactor import Container

from sluicegate.gateway.expiry import ExpiryTimer
from sluicegate.queues.queue_type import Dispatch
from sluicegate.queues.registry import QueueRegistry


class _FailingOnce(QueueRegistry):
    """A registry whose first expiry run fails, as a bug in one queue's expiry would."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def expire(self) -> list[Dispatch]:
        self.runs += 1
        if self.runs == 1:
            raise RuntimeError("a bug in one run")
        return super().expire()


class _Stop(Handler):
    def __init__(self, timer: ExpiryTimer) -> None:
        super().__init__()
        self.timer = timer

    def on_timer_task(self, event: Event) -> None:
        self.timer.stop()


# Long enough that a loaded machine still runs the timer a few times: in 0.5 s it ran once or
# twice at load 8 to 13.
WINDOW_S = 2.0


@pytest.mark.alone  # counts the timer's runs in WINDOW_S: docs/testing.md
def test_a_run_that_fails_is_logged_and_the_timer_goes_on() -> None:
    registry = _FailingOnce()
    timer = ExpiryTimer([registry], lambda dispatches: None, lambda registry, name: None)
    container = Container()
    container.timeout = 0.01
    container.start()
    timer.start(container)
    container.schedule(WINDOW_S, _Stop(timer))
    # soon() twice, as flushes with dead letters left over do: still one task armed.
    timer.soon()
    timer.soon()
    deadline = time.monotonic() + 10
    while container.process() and time.monotonic() < deadline:
        pass
    # 2 s at one run every 50 ms: about forty, never one (the failure stopping it) nor twice
    # as many (a second task armed by soon()).
    assert 3 <= registry.runs <= 52
