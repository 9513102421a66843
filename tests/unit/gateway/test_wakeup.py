"""A call the reactor runs for another thread that raises is an internal error of that call
alone (issue 31: an internal error in one request is not fatal to what comes after it)."""

from __future__ import annotations

import logging

import pytest

from sluicegate.gateway.wakeup import Wakeup


def _fail() -> None:
    raise RuntimeError("a bug in one call")


def test_a_raising_call_is_logged_and_the_calls_after_it_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wakeup = Wakeup()
    ran: list[str] = []
    try:
        wakeup.call_soon(lambda: ran.append("before"))
        wakeup.call_soon(_fail)
        wakeup.call_soon(lambda: ran.append("after"))
        with caplog.at_level(logging.ERROR, logger="sluicegate"):
            wakeup.on_selectable_readable(None)  # type: ignore[arg-type]
        # Before, the call behind the raising one stayed queued with the pipe drained.
        assert ran == ["before", "after"]
        (record,) = caplog.records
        assert "internal error" in record.getMessage()
        assert record.exc_info is not None
        # The wake-ups that follow run as before.
        wakeup.call_soon(lambda: ran.append("next"))
        wakeup.on_selectable_readable(None)  # type: ignore[arg-type]
        assert ran == ["before", "after", "next"]
    finally:
        wakeup.close()
