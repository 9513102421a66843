"""A consumer's ranged ``modified`` DISPOSITION cannot grow the server past its budget (issue 31).

One DISPOSITION settling 3,000 deliveries with 100 KB of message annotations took RSS from 43
to 709 MiB under a 64 MiB budget that counted 2.7 MiB of it, and non-durable messages held every
publisher after the attacker left. Now annotations over ``max_message_annotations_size`` close
the consumer's link (``amqp:link:message-size-exceeded``) before anything grows, and smaller
ones are charged to the bytes queues hold: past the budget's resume mark the link is closed
with ``amqp:resource-limit-exceeded`` and the rest of its messages go back unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Final

import pytest
from integration.conftest import RunningServer
from proton import Message, symbol
from support.clients import consume, publish
from support.polling import wait_until
from support.raw_client import RawClient

_BUDGET: Final = 64 * 1024 * 1024
_DELIVERIES: Final = 2000
# Deliveries per DISPOSITION: 100 KB of copies each stay under what a 64 MiB budget has left.
_RANGE: Final = 500
# How long a DISPOSITION is given to be applied before the next (a pace, not a bound).
_APPLIED_S: Final = 3.0


def _budget(running: RunningServer) -> tuple[int, int, bool]:
    """Bytes the queues hold, the budget's resume mark, and whether it is blocked."""

    def read() -> tuple[int, int, bool]:
        budget = running.server.broker.publishing.budget
        return running.server.registry.held.total, budget.resume_at, budget.blocked

    return running.call(read)


def _modify_all(running: RunningServer, address: str, annotation_size: int) -> Any:
    """Take every delivery unsettled, settle them all with modified DISPOSITIONs carrying
    ``annotation_size`` characters of annotations; the error the link was detached with.

    One DISPOSITION of :data:`_RANGE` deliveries at a time, each once the last was applied:
    proton copies an outcome into each delivery of its range, and a range whose copies do not
    fit in the budget closes the connection before any of this is reached
    (test_disposition_bound.py)."""
    with RawClient.connect(running.host, running.port, max_frame_size=1024 * 1024) as client:
        client.begin()
        handle = client.attach("modifier", "receiver", source=address)
        client.wait_attach(handle)
        client.flow(handle, link_credit=_DELIVERIES)
        for _ in range(_DELIVERIES):
            assert client.next_message(timeout=30) is not None
        annotations: dict[symbol, object] = {symbol("x-why"): "v" * annotation_size}
        state = ("modified", False, False, annotations)
        for first in range(0, _DELIVERIES, _RANGE):
            client.disposition(first, first + _RANGE - 1, state=state)  # type: ignore[arg-type]
            with contextlib.suppress(TimeoutError):  # applied, and the link still attached
                return client.wait_for("detach", timeout=_APPLIED_S)["error"]
        return client.wait_for("detach", timeout=60)["error"]


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "non-durable"])
def test_annotations_over_the_limit_close_the_link_and_nothing_grows(
    make_server: Callable[..., RunningServer], durable: bool
) -> None:
    running = make_server(memory_budget=_BUDGET)
    address = "/queues/modified-big"
    messages = [Message(body=f"m{n}", durable=durable) for n in range(_DELIVERIES)]
    assert publish(running.url, address, messages=messages).outcomes == ["accepted"] * _DELIVERIES
    before, _, _ = _budget(running)
    error = _modify_all(running, address, 100_000)
    assert error["condition"] == "amqp:link:message-size-exceeded"
    assert "max_message_annotations_size 65536" in error["description"]
    wait_until(lambda: running.queue("modified-big").ready == _DELIVERIES)
    held, _, blocked = _budget(running)
    # Only the delivery-count the detach adds to each header (a few bytes), no annotations.
    assert held - before <= _DELIVERIES * 16
    assert not blocked
    back = consume(running.url, address, 3).messages
    assert all(symbol("x-why") not in (m.annotations or {}) for m in back)


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "non-durable"])
def test_annotations_are_charged_and_refused_at_the_budget_resume_mark(
    make_server: object, durable: bool
) -> None:
    """60 KB over 2,000 deliveries would be 120 MB: the messages that took them are charged,
    the outcome is refused before the resume mark, and a publisher is served after."""
    running: RunningServer = make_server(memory_budget=_BUDGET)  # type: ignore[operator]
    address = "/queues/modified-budget"
    messages = [Message(body=f"m{n}", durable=durable) for n in range(_DELIVERIES)]
    assert publish(running.url, address, messages=messages).outcomes == ["accepted"] * _DELIVERIES
    error = _modify_all(running, address, 60_000)
    assert error["condition"] == "amqp:resource-limit-exceeded"
    wait_until(lambda: running.queue("modified-budget").ready == _DELIVERIES)
    held, resume_at, blocked = _budget(running)
    # Most of the room was used, none past the resume mark: publishers are not held.
    assert resume_at // 2 < held <= resume_at
    assert not blocked
    assert (
        publish(running.url, "/queues/after", messages=[Message(body="p")] * 10).outcomes
        == ["accepted"] * 10
    )
    annotated = consume(running.url, address, 3).messages
    for message in annotated:
        assert message.annotations is not None
        assert len(str(message.annotations[symbol("x-why")])) == 60_000
