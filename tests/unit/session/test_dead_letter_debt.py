"""A connection's dead-letter debt holds the consumer links that owe letters, example by example
(session/dead_letter_debt.py; the random interleavings are in test_outbound_machine.py).

A real session, writer and classic queues in memory: the "rejecter" link consumes ``q1``, whose
letters are charged to it; the "dead-letter reader" link consumes ``q2`` and owes nothing.
"""

from __future__ import annotations

import pytest

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Dispatch
from sluicegate.session.dead_letter_debt import DeadLetterDebt
from sluicegate.session.outbound import LinkFlow, Session, apply_hold, route
from sluicegate.session.outgoing_link import OutgoingLink
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode
from sluicegate.writer.writer import Writer

LIMIT = 4


def _message(index: int) -> Message:
    return Message(encode(Described(0x77, f"m{index}")))


def _queue_credit(queue: ClassicQueue, link: OutgoingLink) -> int:
    """White box: the credit the queue holds for a consumer."""
    return queue._consumers.by_key[link].credit


class Harness:
    def __init__(self) -> None:
        self.session = Session(Writer(), remote_incoming_window=1_000_000)
        self.debt = DeadLetterDebt(LIMIT)
        self.q1 = ClassicQueue("q1")
        self.q2 = ClassicQueue("q2")
        self.rejecter = self.session.attach_link(0, self.q1, ack_required=True)
        self.reader = self.session.attach_link(1, self.q2, ack_required=True)
        self.sent = 0

    def grant(self, link: OutgoingLink, credit: int, *, drain: bool = False) -> None:
        client = link.client_flow_ctl
        self.session.client_flow(link, client.delivery_count, credit, drain, False)

    def route(self, dispatches: list[Dispatch]) -> None:
        route(dispatches)

    def pump(self) -> list[object]:
        out: list[object] = list(self.session.send_pending())
        self.sent += sum(1 for action in out if not isinstance(action, LinkFlow))
        return out

    def charge(self, link: OutgoingLink, units: int) -> None:
        if self.debt.cause(link).borrow(units):
            apply_hold(self.debt)

    def repay(self, link: OutgoingLink, units: int) -> None:
        if self.debt.cause(link).repay(units):
            apply_hold(self.debt)


def test_only_the_links_that_owe_letters_are_held_and_all_go_on_at_half_the_limit() -> None:
    h = Harness()
    for index in range(10):
        h.route(h.q1.enqueue(_message(index)))
    h.grant(h.rejecter, 20)
    h.grant(h.reader, 20)
    h.pump()
    assert h.sent == 10
    h.charge(h.rejecter, LIMIT - 1)
    assert not h.rejecter.held
    # At the limit the rejecter is held: its queue's credit (10 left) is taken back at once.
    h.charge(h.rejecter, 1)
    assert (h.debt.held, h.rejecter.held, h.reader.held) == (True, True, False)
    h.pump()
    assert _queue_credit(h.q1, h.rejecter) == 0
    assert _queue_credit(h.q2, h.reader) == 20
    # New messages stay in q1; the reader, which owes nothing, is served on.
    for index in range(10, 15):
        h.route(h.q1.enqueue(_message(index)))
        h.route(h.q2.enqueue(_message(index)))
    h.pump()
    assert h.q1.available == 5
    assert h.q2.available == 0
    assert h.sent == 15
    # A link that makes letters while the connection is over its limit is held too.
    h.charge(h.reader, 1)
    assert h.reader.held
    assert h.debt.statistics().owing_links == 2
    # Back above half the limit nothing changes; at half, every held link asks again.
    h.repay(h.rejecter, 2)
    assert h.debt.held
    h.repay(h.rejecter, 1)
    assert (h.debt.held, h.rejecter.held, h.reader.held) == (False, False, False)
    h.pump()
    assert h.q1.available == 0
    assert h.sent == 20
    # Links that owe nothing any more are forgotten.
    h.repay(h.rejecter, 1)
    assert list(h.debt.causes) == [h.reader]


def test_a_drain_while_held_is_answered_after_what_waits_for_the_link() -> None:
    h = Harness()
    for index in range(6):
        h.route(h.q1.enqueue(_message(index)))
    h.grant(h.rejecter, 50)
    h.pump()
    # The window closes; 4 more come on the queue's credit and wait in the session when the
    # hold begins, which takes the queue's credit (40) back.
    h.session.remote_incoming_window = 0
    for index in range(6, 10):
        h.route(h.q1.enqueue(_message(index)))
    h.charge(h.rejecter, LIMIT)
    assert h.rejecter.held
    h.pump()
    assert _queue_credit(h.q1, h.rejecter) == 0
    for index in range(10, 13):
        h.route(h.q1.enqueue(_message(index)))
    # The client drains 50 from the 6 it has seen.
    h.session.remote_incoming_window = 1_000
    h.session.client_flow(h.rejecter, 6, 50, True, False)
    out = h.pump()
    # What was handed to the session before the hold goes out, then the drained FLOW: the
    # credit the client gave is used up (delivery-count advanced), nothing more handed out.
    transfers = [action for action in out if not isinstance(action, LinkFlow)]
    flows = [action for action in out if isinstance(action, LinkFlow)]
    assert len(transfers) == 4
    assert len(flows) == 1
    assert (flows[0].drain, flows[0].link_credit) == (True, 0)
    assert flows[0].delivery_count == 56
    assert h.q1.available == 3
    assert not h.rejecter.credit_req_in_flight


def test_a_link_held_with_a_request_out_gives_its_queue_credit_back_at_the_reply() -> None:
    h = Harness()
    for index in range(3):
        h.route(h.q1.enqueue(_message(index)))
    h.session.remote_incoming_window = 0
    h.grant(h.rejecter, 20)
    # The queue holds 17 credit, and its reply waits behind the 3 deliveries: the hold can
    # make no request before it (one in flight), so the queue's credit still hands out.
    assert h.rejecter.credit_req_in_flight
    h.charge(h.rejecter, LIMIT)
    h.route(h.q1.enqueue(_message(3)))
    assert _queue_credit(h.q1, h.rejecter) == 16
    # Once the reply is handled, the credit is taken back: nothing more is handed out.
    h.session.remote_incoming_window = 1_000
    h.pump()
    assert h.sent == 4
    assert h.rejecter.statistics().credit_req_in_flight is False
    assert _queue_credit(h.q1, h.rejecter) == 0
    for index in range(4, 7):
        h.route(h.q1.enqueue(_message(index)))
    h.pump()
    assert h.sent == 4
    assert h.q1.available == 3


def test_a_detached_link_is_forgotten_once_its_letters_are_stored() -> None:
    h = Harness()
    h.grant(h.rejecter, 5)
    h.charge(h.rejecter, LIMIT)
    h.route(h.session.detach_link(h.rejecter))
    h.charge(h.reader, 1)
    h.repay(h.rejecter, LIMIT)
    assert not h.debt.held
    assert list(h.debt.causes) == [h.reader]
    with pytest.raises(ValueError, match="repaying 2 units"):
        h.debt.cause(h.reader).repay(2)
