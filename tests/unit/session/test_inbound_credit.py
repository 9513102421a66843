"""Inbound flow control as pure objects: publisher link credit, accounts, the memory budget.

The examples pin RabbitMQ 4's rules (notes/rabbitmq-flow.md §6.1) and the Syndicate account's
marks; the state machine drives one connection's publishing links, fanning out to queues that
store their copies late (as a durable queue does after its fsync), consumers that take and settle
messages, and the budget checked after every batch, and checks the bounds after every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD, HeldBytes
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Outcome
from sluicegate.session.account import Account
from sluicegate.session.incoming_link import IncomingLink
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.wire.codec import Described, encode

# -- publisher link credit ---------------------------------------------------------------


def test_attach_grants_max_link_credit_unless_blocked() -> None:
    link = IncomingLink(170)
    assert link.attach() == 170
    assert link.statistics().credit == 170
    assert IncomingLink(170).attach(blocked=True) == 0


def test_credit_is_renewed_only_at_half() -> None:
    link = IncomingLink(170)
    link.attach()
    for _ in range(84):
        assert link.receive()
        link.confirm()
    assert link.credit == 86
    assert link.renew() == 0, "86 of 170 left: above half"
    assert link.receive()
    link.confirm()
    assert link.wants_credit
    assert link.renew() == 85
    assert link.credit == 170


def test_credit_follows_confirmations_not_receipt() -> None:
    link = IncomingLink(10)
    link.attach()
    for _ in range(5):
        assert link.receive()
    assert link.renew() == 5
    for _ in range(10):
        assert link.receive()
    stats = link.statistics()
    assert (stats.credit, stats.unconfirmed) == (0, 15)
    assert link.renew() == 0
    for _ in range(5):
        link.confirm()
    assert link.statistics().unconfirmed == 10
    assert link.renew() == 0, "unconfirmed must fall below max_link_credit"
    link.confirm()
    assert link.renew() == 10


def test_a_transfer_without_credit_is_refused() -> None:
    link = IncomingLink(2)
    link.attach()
    assert link.receive()
    assert link.receive()
    assert not link.receive()
    assert link.statistics().received == 2


def test_blocked_server_grants_nothing() -> None:
    link = IncomingLink(4)
    link.attach()
    for _ in range(4):
        link.receive()
        link.confirm()
    assert link.renew(blocked=True) == 0
    assert link.renew() == 4


def test_link_rejects_nonpositive_max() -> None:
    with pytest.raises(ValueError, match="positive"):
        IncomingLink(0)


# -- accounts ----------------------------------------------------------------------------


def test_fan_out_to_ten_queues_costs_ten() -> None:
    account = Account(limit=25)
    assert not account.borrow(10)
    assert not account.borrow(10)
    assert account.statistics().debt == 20
    assert account.borrow(10), "the third message crosses the limit: reads pause"
    assert account.statistics().paused
    for _ in range(17):
        assert not account.repay(1)
    assert account.repay(1), "back at resume_at (12): reads resume"
    stats = account.statistics()
    assert (stats.debt, stats.paused, stats.pauses, stats.borrowed) == (12, False, 1, 30)


def test_account_marks_are_validated() -> None:
    with pytest.raises(ValueError, match="positive"):
        Account(limit=0)
    with pytest.raises(ValueError, match="resume_at"):
        Account(limit=10, resume_at=10)
    account = Account(limit=4)
    with pytest.raises(ValueError, match="repaying"):
        account.repay(1)


# -- memory budget -----------------------------------------------------------------------


def test_budget_blocks_at_limit_and_resumes_at_low_water() -> None:
    budget = MemoryBudget(1000, resume_ratio=0.8)
    assert not budget.update(999)
    assert budget.update(1000)
    assert budget.blocked
    assert not budget.update(801)
    assert budget.blocked
    assert budget.update(800)
    stats = budget.statistics()
    assert (stats.used, stats.blocked, stats.blocks, stats.resume_at) == (800, False, 1, 800)


def test_budget_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="positive"):
        MemoryBudget(0)
    with pytest.raises(ValueError, match="ratio"):
        MemoryBudget(100, resume_ratio=1.0)


# -- held bytes --------------------------------------------------------------------------


def _payload(i: int, size: int) -> bytes:
    return encode(Described(0x77, f"m{i}:" + "x" * size))


def test_queues_count_the_bytes_they_hold() -> None:
    held = HeldBytes()
    first, second = ClassicQueue("a", held=held), ClassicQueue("b", held=held)
    messages = [Message(_payload(i, 100)) for i in range(3)]
    for message in messages:
        first.enqueue(message)
    second.enqueue(Message(_payload(9, 50)))

    def expected() -> int:
        sizes = [m.size for m in messages] + [len(_payload(9, 50))]
        return sum(sizes) + MESSAGE_OVERHEAD * len(sizes)

    assert held.total == expected()
    first.attach("c", ack_required=True)
    taken, _ = first.credit("c", 0, 2, False)
    first.settle("c", [taken[0].seq], Outcome.MODIFIED, True)
    assert messages[0].size > len(_payload(0, 100)), "the header now carries delivery-count"
    assert held.total == expected()
    first.settle("c", [taken[1].seq], Outcome.ACCEPTED, False)
    messages.pop(1)
    assert held.total == expected()
    first.purge()
    second.purge()
    assert held.total == 0


# -- the state machine -------------------------------------------------------------------

MAX_LINK_CREDIT = 6
ACCOUNT_LIMIT = 12
BUDGET = 4000
QUEUES = 3


@dataclass
class Publisher:
    """One publishing link: what the client was granted and where its messages go."""

    link: IncomingLink
    targets: list[int]
    client_credit: int = 0


@dataclass
class Copy:
    """A routed copy not yet stored."""

    publisher: int
    message: int
    queue: int
    size: int


@dataclass
class Received:
    """A received message and how many of its copies are not stored yet."""

    publisher: int
    copies: int


@dataclass
class Consumer:
    """A consumer of one queue."""

    delivery_count: int = 0
    unacked: list[int] = field(default_factory=list)


class InboundMachine(RuleBasedStateMachine):
    """One connection's publishers, late-storing queues, consumers and the server's budget."""

    @initialize(
        routes=st.lists(
            st.lists(st.integers(0, QUEUES - 1), min_size=1, max_size=QUEUES, unique=True),
            min_size=1,
            max_size=3,
        )
    )
    def start(self, routes: list[list[int]]) -> None:
        self.held = HeldBytes()
        self.queues = [ClassicQueue(f"q{i}", held=self.held) for i in range(QUEUES)]
        self.consumers = [Consumer() for _ in range(QUEUES)]
        for i, queue in enumerate(self.queues):
            queue.attach(i, ack_required=True)
        self.account = Account(ACCOUNT_LIMIT)
        self.budget = MemoryBudget(BUDGET)
        self.publishers = []
        for queues in routes:
            link = IncomingLink(MAX_LINK_CREDIT)
            self.publishers.append(Publisher(link, queues, link.attach()))
        self.received: dict[int, Received] = {}
        self.unstored: list[Copy] = []
        self.next_message = 0
        self.reads_paused = False

    @rule(data=st.data(), size=st.integers(0, 300))
    def transfer(self, data: st.DataObject, size: int) -> None:
        """The client sends on a link it has credit on, if the server still reads its socket."""
        ready = [i for i, p in enumerate(self.publishers) if p.client_credit > 0]
        if not ready or self.reads_paused:
            return
        index = data.draw(st.sampled_from(ready))
        publisher = self.publishers[index]
        publisher.client_credit -= 1
        assert publisher.link.receive()
        message = self.next_message
        self.next_message += 1
        self.received[message] = Received(index, len(publisher.targets))
        if self.account.borrow(len(publisher.targets)):
            self.reads_paused = True
        self.unstored.extend(Copy(index, message, q, size) for q in publisher.targets)

    @precondition(lambda self: self.unstored)
    @rule(data=st.data())
    def store(self, data: st.DataObject) -> None:
        """A queue stores one copy (late, as after an fsync): confirm it."""
        copy = self.unstored.pop(data.draw(st.integers(0, len(self.unstored) - 1)))
        self.queues[copy.queue].enqueue(Message(_payload(copy.message, copy.size)))
        if self.account.repay(1):
            self.reads_paused = False
        received = self.received[copy.message]
        received.copies -= 1
        if received.copies == 0:
            del self.received[copy.message]
            self.publishers[copy.publisher].link.confirm()

    @rule()
    def flush(self) -> None:
        """The end of an event batch: check the budget, renew credit where the rule allows."""
        self.budget.update(self.held.total)
        for publisher in self.publishers:
            grant = publisher.link.renew(self.budget.blocked)
            if self.budget.blocked:
                assert grant == 0
            publisher.client_credit += grant

    @rule(queue=st.integers(0, QUEUES - 1), credit=st.integers(1, 5))
    def consume(self, queue: int, credit: int) -> None:
        """A consumer takes up to ``credit`` messages."""
        consumer = self.consumers[queue]
        taken, reply = self.queues[queue].credit(queue, consumer.delivery_count, credit, True)
        consumer.delivery_count = reply.delivery_count
        consumer.unacked.extend(m.seq for m in taken)

    @rule(queue=st.integers(0, QUEUES - 1), outcome=st.sampled_from(list(Outcome)))
    def settle(self, queue: int, outcome: Outcome) -> None:
        """A consumer settles everything it holds."""
        consumer = self.consumers[queue]
        self.queues[queue].settle(queue, consumer.unacked, outcome, True)
        consumer.unacked.clear()

    @invariant()
    def credit_follows_confirmations(self) -> None:
        for publisher in self.publishers:
            link = publisher.link
            assert link.credit == publisher.client_credit >= 0
            assert link.credit + link.unconfirmed <= 2 * MAX_LINK_CREDIT - 1

    @invariant()
    def debt_is_the_copies_not_stored(self) -> None:
        assert self.account.debt == len(self.unstored)
        if self.account.paused:
            assert self.account.debt > self.account.resume_at
        else:
            assert self.account.debt < ACCOUNT_LIMIT
        assert self.account.debt < ACCOUNT_LIMIT + QUEUES

    @invariant()
    def held_bytes_are_what_queues_hold(self) -> None:
        assert self.held.total >= 0
        stats = [q.statistics() for q in self.queues]
        unacked = sum(s.unacked_bytes for s in stats)
        count = sum(s.ready + s.unacked for s in stats)
        ready = sum(s.ready_bytes for s in stats)
        assert self.held.total == ready + unacked + count * MESSAGE_OVERHEAD

    @invariant()
    def budget_state_matches_its_marks(self) -> None:
        budget = self.budget
        if budget.blocked:
            assert budget.used > budget.resume_at
        else:
            assert budget.used < budget.limit


InboundMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestInboundMachine = InboundMachine.TestCase
