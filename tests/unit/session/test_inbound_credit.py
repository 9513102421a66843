"""Inbound flow control as pure objects: publisher link credit, accounts, the memory budget.

The examples pin RabbitMQ 4's rules and the Syndicate account's marks, then the inbound
session's (session/inbound.py): unfinished deliveries charged frame by frame and capped,
outcome precedence, renewals backed by the budget, who waits while it is exhausted. The state
machine drives the real inbound session of two connections whose publishing links fan out to
queues that store their copies late (as a durable queue does after its fsync), with consumers
that take and settle messages and a flush after any step, and checks the bounds after each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support.examples import examples

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.errors import ResourceLimitExceeded
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD, HeldBytes
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Outcome
from sluicegate.session.account import Account
from sluicegate.session.inbound import (
    DROP,
    RESUME,
    SETTLE,
    CloseConnection,
    CloseLink,
    Inbound,
    Unconfirmed,
)
from sluicegate.session.inbound_flow import (
    RELEASE,
    Flushed,
    Hold,
    InboundFlow,
    InboundLimits,
    PublishingConnection,
)
from sluicegate.session.incoming_link import IncomingLink
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.session.outgoing_link import LinkOwner, OutgoingLink
from sluicegate.session.unsettled import UNSETTLED_DELIVERY_COST, Unsettled
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode

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
        # What is held is the payload as published: a raised delivery-count is stamped on the
        # bytes sent, not kept.
        sizes = [len(m.payload) for m in messages] + [len(_payload(9, 50))]
        return sum(sizes) + MESSAGE_OVERHEAD * len(sizes)

    assert held.total == expected()
    first.attach("c", ack_required=True)
    taken, _ = first.credit("c", 0, 2, False)
    first.settle("c", [taken[0].seq], Outcome.MODIFIED, True)
    assert messages[0].read_size() > len(_payload(0, 100)), "the header now carries delivery-count"
    assert held.total == expected()
    first.settle("c", [taken[1].seq], Outcome.ACCEPTED, False)
    messages.pop(1)
    assert held.total == expected()
    first.purge()
    second.purge()
    assert held.total == 0


# -- the inbound session: one connection's transfers -------------------------------------

LIMITS = InboundLimits(max_link_credit=4, max_message_size=1000, max_unfinished_size=1500)


def _flow(budget: int = 10_000) -> InboundFlow:
    return InboundFlow(MemoryBudget(budget), LIMITS)


def _nothing(link: IncomingLink) -> int:
    return 0


def test_a_delivery_takes_its_credit_with_its_first_frame_and_is_charged_as_it_arrives() -> None:
    flow = _flow()
    inbound = Inbound(flow, Account())
    link = inbound.attach()
    assert link.credit == 4
    assert inbound.frame(link, 300) is None
    assert inbound.frame(link, 700) is None
    assert (link.credit, link.unfinished, inbound.unfinished, flow.budget.unfinished) == (
        3,
        700,
        700,
        700,
    )
    assert list(flow.arriving) == [inbound]
    assert inbound.receive(link, 900, aborted=False) is None
    assert (link.credit, link.unfinished, flow.budget.unfinished, link.largest) == (3, 0, 0, 900)
    assert not flow.arriving


def test_unfinished_bytes_are_capped_per_delivery_and_per_connection() -> None:
    flow = _flow()
    inbound = Inbound(flow, Account())
    first = inbound.attach()
    second = inbound.attach()
    refusal = inbound.frame(first, 1001)
    assert isinstance(refusal, CloseLink)
    assert refusal.error.condition == "amqp:link:message-size-exceeded"
    assert (first.unfinished, flow.budget.unfinished) == (0, 0)
    third = inbound.attach()
    assert inbound.frame(second, 900) is None
    refusal = inbound.frame(third, 601)
    assert isinstance(refusal, CloseConnection)
    assert refusal.error.condition == "amqp:resource-limit-exceeded"
    inbound.release()
    assert flow.budget.unfinished == 0
    assert not flow.arriving
    assert inbound not in flow.connections


TOTAL_LIMITS = InboundLimits(
    max_link_credit=4, max_message_size=1000, max_unfinished_size=1500, max_unfinished_total=2000
)


def test_unfinished_bytes_of_all_connections_are_capped_the_oldest_read_the_new_released() -> None:
    flow = InboundFlow(MemoryBudget(10_000), TOTAL_LIMITS)
    inbounds = [Inbound(flow, Account()) for _ in range(4)]
    links = [inbound.attach() for inbound in inbounds]
    assert inbounds[0].frame(links[0], 900) is None
    assert inbounds[1].frame(links[1], 900) is None
    # The third delivery takes the bytes to the cap: every arriving connection but the oldest
    # is held, at once.
    held = inbounds[2].frame(links[2], 800)
    assert isinstance(held, Hold)
    assert set(held.connections) == {inbounds[1], inbounds[2]}
    assert [inbound.paused for inbound in inbounds] == [False, True, True, False]
    # A delivery that begins past the cap is released: it holds nothing, its credit is used.
    assert inbounds[3].frame(links[3], 500) is RELEASE
    assert (links[3].unfinished, links[3].unconfirmed, links[3].credit) == (0, 0, 3)
    assert not links[3].arriving
    assert flow.budget.unfinished == 2600
    # The oldest goes on and ends; the next oldest is read, the others are still held.
    assert inbounds[0].frame(links[0], 1000) is None
    assert inbounds[0].receive(links[0], 1000, aborted=False) is None
    out = flow.flush(0, 0, _nothing)
    assert out is not None
    assert out.resume == [inbounds[1]]
    assert [inbound.paused for inbound in inbounds] == [False, False, True, False]
    # Back at 80 % of the cap, nobody is held for it.
    inbounds[1].release()
    out = flow.flush(0, 0, _nothing)
    assert out is not None
    assert out.resume == [inbounds[2]]
    assert not flow.unfinished_full
    assert inbounds[3].frame(links[3], 500) is None


def _closed(out: Flushed | None) -> list[PublishingConnection]:
    return [] if out is None else out.close


def test_the_oldest_delivery_that_keeps_the_cap_full_without_progress_is_closed() -> None:
    limits = InboundLimits(4, 1000, 1500, max_unfinished_total=1000, unfinished_timeout=60.0)
    flow = InboundFlow(MemoryBudget(10_000), limits)
    stuck, slow, other = (Inbound(flow, Account()) for _ in range(3))
    links = [inbound.attach() for inbound in (stuck, slow, other)]
    assert stuck.frame(links[0], 600) is None
    assert isinstance(slow.frame(links[1], 500), Hold)
    assert _closed(flow.flush(0, 0, _nothing, now=100.0)) == []
    assert _closed(flow.flush(0, 0, _nothing, now=159.0)) == []
    # A byte more restarts its time; others' traffic does not.
    assert stuck.frame(links[0], 601) is None
    assert other.frame(links[2], 10) is RELEASE
    assert _closed(flow.flush(0, 0, _nothing, now=159.5)) == []
    assert _closed(flow.flush(0, 0, _nothing, now=219.0)) == []
    assert _closed(flow.flush(0, 0, _nothing, now=219.5)) == [stuck]
    # Closed, it leaves nothing; the next oldest is read and watched from now.
    stuck.release()
    assert flow.watched is None
    out = flow.flush(0, 0, _nothing, now=220.0)
    assert out is not None
    assert out.resume == [slow]
    assert out.close == []


def test_reads_of_arriving_connections_are_charged_to_the_cap_as_they_are_read() -> None:
    flow = InboundFlow(MemoryBudget(10_000), TOTAL_LIMITS)
    inbounds = [Inbound(flow, Account()) for _ in range(3)]
    links = [inbound.attach() for inbound in inbounds]
    for inbound, link in zip(inbounds, links, strict=True):
        assert inbound.frame(link, 500) is None
    assert flow.charge_read(inbounds[1], 400) == []
    # This read reaches the cap before proton's events are handled: both held at once.
    assert set(flow.charge_read(inbounds[2], 100)) == {inbounds[1], inbounds[2]}
    assert flow.unfinished_full


def test_the_read_that_reaches_the_ceiling_holds_every_publisher_at_once() -> None:
    budget = MemoryBudget(8000)
    flow = InboundFlow(budget, LIMITS)
    inbounds = [Inbound(flow, Account()) for _ in range(3)]
    for inbound in inbounds:
        inbound.attach()
    assert set(flow.charge_read(inbounds[0], 8000)) == set(inbounds)
    flow.flush(8000, 0, _nothing)
    # Blocked below the ceiling: publishers whose queues do not hold the budget are read.
    assert not any(inbound.paused for inbound in inbounds)
    assert set(flow.charge_read(inbounds[1], budget.ceiling - 8000)) == set(inbounds)


def test_a_transfer_without_credit_closes_its_link_even_mid_delivery() -> None:
    flow = _flow()
    inbound = Inbound(flow, Account())
    link = inbound.attach()
    for _ in range(4):
        assert inbound.receive(link, 10, aborted=False) is None
    refusal = inbound.frame(link, 10)
    assert isinstance(refusal, CloseLink)
    assert refusal.error.condition == "amqp:link:transfer-limit-exceeded"
    assert flow.budget.unfinished == 0


def test_an_aborted_delivery_used_its_credit_and_is_dropped() -> None:
    flow = _flow()
    inbound = Inbound(flow, Account())
    link = inbound.attach()
    assert inbound.frame(link, 500) is None
    assert inbound.receive(link, 600, aborted=True) is DROP
    assert (link.credit, link.unconfirmed, link.unfinished) == (3, 0, 0)


def test_the_last_copy_settles_and_a_rejection_wins() -> None:
    flow = _flow()
    inbound = Inbound(flow, Account(limit=3))
    link = inbound.attach()
    assert inbound.receive(link, 10, aborted=False) is None
    pending, pause = inbound.route(link, "token", 3, 10)
    assert pause, "three copies reach the account's limit of 3"
    assert pending.token == "token"
    rejected = ResourceLimitExceeded("full")
    assert inbound.confirm(pending, Outcome.REJECTED, rejected) == 0
    assert inbound.confirm(pending, Outcome.RELEASED, None) == RESUME
    assert inbound.confirm(pending) == SETTLE
    assert (pending.outcome, pending.error) == (Outcome.REJECTED, rejected)
    assert link.unconfirmed == 0


def test_renewals_are_backed_by_the_budgets_headroom() -> None:
    flow = _flow(budget=10_000)
    inbound = Inbound(flow, Account())
    link = inbound.attach()
    for _ in range(4):
        assert inbound.receive(link, 900, aborted=False) is None
        pending, _ = inbound.route(link, None, 1, 900)
        inbound.confirm(pending)
    out = flow.flush(7_300, 0, _nothing)
    assert out is not None
    # 2,700 bytes of headroom back three messages of the 900 bytes this link sends.
    assert out.grants == [(link, 3)]


def test_a_renewal_is_backed_for_every_copy_its_messages_make() -> None:
    """Adversary seed 64101: each queue a message is routed to counts its copy in the budget,
    so a publisher to a fanout of 50 queues, its credit sized by one copy, took the budget
    past its ceiling and every publisher waited. The copies share the payload, counted once
    (queues/held_bytes.py): a credit costs the size and each further copy's overhead."""
    flow = _flow(budget=100_000)
    inbound = Inbound(flow, Account())
    link = inbound.attach()
    for _ in range(4):
        assert inbound.receive(link, 100, aborted=False) is None
        pending, _ = inbound.route(link, None, 50, 100)
        for _ in range(50):
            inbound.confirm(pending)
    cost = 100 + 49 * MESSAGE_OVERHEAD
    assert link.largest == cost
    out = flow.flush(100_000 - 3 * cost - cost // 2, 0, _nothing)
    assert out is not None
    # Three and a half messages' worth of headroom backs three messages of 50 copies.
    assert out.grants == [(link, 3)]


def test_a_renewal_is_backed_for_the_payload_of_every_copy_sent_to_another_worker() -> None:
    """A copy stored by another worker is counted whole by the publisher's worker until the
    owner confirms it (``Remote.in_flight``): the copies sharing the payload here count it
    once, each sent away counts it again, and a fan-out wholly elsewhere counts it once per
    copy. Backed for the shared payload alone, a renewal to a fanout of 50 queues of another
    worker let a publisher send 50 payloads a credit."""
    flow = _flow(budget=200_000)
    inbound = Inbound(flow, Account())
    link = inbound.attach()
    assert inbound.receive(link, 1_000, aborted=False) is None
    inbound.route(link, None, 50, 1_000, whole=40)
    assert link.largest == 1_000 + 49 * MESSAGE_OVERHEAD + 40 * 1_000
    assert inbound.receive(link, 1_000, aborted=False) is None
    inbound.route(link, None, 50, 1_000, whole=50)
    cost = 50 * 1_000 + 49 * MESSAGE_OVERHEAD
    assert link.largest == cost
    for _ in range(2):
        assert inbound.receive(link, 1_000, aborted=False) is None
        pending, _ = inbound.route(link, None, 1, 1_000)
        inbound.confirm(pending)
    out = flow.flush(200_000 - cost - cost // 2, 0, _nothing)
    assert out is not None
    # Backed for the shared payload (19,816 bytes), the same headroom granted all 4.
    assert out.grants == [(link, 1)], "one and a half such messages' headroom backs one"


def test_a_renewal_without_headroom_waits_for_room_instead_of_being_dropped() -> None:
    """Adversary seed 65600: the prober, holding nothing, waited to publish for good with the
    budget blocked under its publishers' ceiling. A renewal is asked for only as credit falls
    or a hold ends; one popped while the headroom was spent was dropped, and the link had no
    credit until the budget next resumed."""
    flow = _flow(budget=10_000)
    budget = flow.budget
    flow.flush(budget.publishing_ceiling, 0, _nothing)
    assert budget.blocked
    prober = Inbound(flow, Account()).attach()
    assert prober.credit == 0, "attached while blocked"
    out = flow.flush(budget.publishing_ceiling, 0, _nothing)
    assert out is None or not out.grants, "no headroom: nothing granted yet"
    # Consumers take the bytes back under the publishers' ceiling, not yet to the low-water
    # mark: the prober, which holds nothing, gets its credit from the margin.
    out = flow.flush(budget.limit + 100, 0, _nothing)
    assert budget.blocked
    assert out is not None
    assert out.grants == [(prober, LIMITS.max_link_credit)]


def test_while_blocked_the_publishers_to_the_full_queues_wait_and_the_others_go_on() -> None:
    flow = _flow(budget=10_000)
    greedy = Inbound(flow, Account())
    modest = Inbound(flow, Account())
    hoarder = greedy.attach()
    prober = modest.attach()
    weights = {hoarder: 10_000, prober: 0}
    out = flow.flush(10_000, 0, weights.__getitem__)
    assert flow.budget.blocked
    assert out is not None
    assert out.pause == [greedy]
    assert (hoarder.held, prober.held) == (True, False)
    assert greedy.paused
    assert not modest.paused
    # The prober spends its credit and gets more from the margin above the limit.
    for _ in range(4):
        assert modest.receive(prober, 100, aborted=False) is None
        pending, _ = modest.route(prober, None, 1, 100)
        modest.confirm(pending)
    out = flow.flush(10_000, 0, weights.__getitem__)
    assert out is not None
    assert out.grants == [(prober, 4)]
    # At the ceiling nobody publishing is read; below the low-water mark nobody waits.
    out = flow.flush(flow.budget.ceiling, 0, weights.__getitem__)
    assert out is not None
    assert out.pause == [modest]
    out = flow.flush(flow.budget.resume_at, 0, weights.__getitem__)
    assert out is not None
    assert sorted(map(id, out.resume)) == sorted(map(id, [greedy, modest]))
    assert not hoarder.held


def test_a_small_publisher_is_no_holder_when_the_bytes_are_held_by_nobody_publishing() -> None:
    """Adversary seed 61024: the budget full of bytes no publisher weighs for (a publisher gone,
    its queue unconsumed), the prober's own small queue was the only positive weight, its own
    mean, and it was held. A holder weighs at least a quarter of an even share of the margin."""
    flow = _flow(budget=10_000)
    modest = Inbound(flow, Account())
    prober = modest.attach()
    weights = {prober: 300}
    out = flow.flush(10_000, 0, weights.__getitem__)
    assert flow.budget.blocked
    assert not prober.held
    assert out is None or modest not in out.pause
    assert not modest.paused
    # Two publishers each piling up a quarter of an even share or more are both holders.
    other = Inbound(flow, Account())
    piler = other.attach()
    weights = {prober: 1_300, piler: 1_300}
    flow.flush(flow.budget.limit + flow.budget.limit // 8, 0, weights.__getitem__)
    flow.flush(flow.budget.limit, 0, weights.__getitem__)
    assert (prober.held, piler.held) == (True, True)


def test_one_publisher_piling_up_in_the_margin_is_a_holder_before_it_reaches_the_ceiling() -> None:
    """Adversary seeds 64000 and 64001: the budget full of letters in queues nobody consumes, a
    fresh publisher's queue took 7 MB of the 8 MiB margin and it was no holder, since the floor
    was a quarter of the limit (16 MiB); at the ceiling every publisher waited for good. The
    floor is a share of the margin, and the holds are weighed again each sixteenth of it."""
    flow = _flow(budget=10_000)
    margin = flow.budget.margin
    assert margin == 1_250
    modest = Inbound(flow, Account())
    prober = modest.attach()
    greedy = Inbound(flow, Account())
    weights = {prober: 40}
    flow.flush(10_000, 0, weights.__getitem__)
    assert flow.budget.blocked
    assert not prober.held
    piler = greedy.attach()
    # It fills a third of the margin, moving the bytes held by more than a sixteenth of it.
    weights[piler] = margin // 3
    flow.flush(10_000 + margin // 3, 0, weights.__getitem__)
    assert piler.held, "a publisher whose queue took a third of the margin holds the budget"
    assert not prober.held
    assert flow.budget.current < flow.budget.ceiling


def test_a_publisher_piling_up_beside_a_large_holder_is_held_before_its_part_is_taken() -> None:
    """Adversary seeds 65702 and 66100: the limit held by a large publisher's queue nobody
    reads, a second publisher piling up in the margin stayed under half the mean weight and
    took the publishers' whole part, where every publisher waits. It grew since the budget
    blocked, and what grew by a quarter of the part is a holder."""
    flow = _flow(budget=10_000)
    budget = flow.budget
    part = budget.publishing_ceiling - budget.limit
    large, modest, second = (
        Inbound(flow, Account()),
        Inbound(flow, Account()),
        Inbound(flow, Account()),
    )
    holder, prober, piler = large.attach(), modest.attach(), second.attach()
    weights = {holder: 10_000, prober: 40, piler: 0}
    flow.flush(10_000, 0, weights.__getitem__)
    assert budget.blocked
    assert (holder.held, piler.held) == (True, False)
    # A third of the part, far under half the mean (the holder's 10,000 weighs it).
    weights[piler] = part // 3
    flow.flush(10_000 + part // 3, 0, weights.__getitem__)
    assert piler.held, "what grew in the publishers' part by a quarter of it holds the budget"
    assert not prober.held
    assert not budget.publishers_full(budget.current)


def test_publishers_piling_up_in_turn_are_held_at_a_share_of_the_room_left() -> None:
    """Adversary seed 65800: publishers came one after another, each piling up in a queue
    nobody reads until the budget held it, and went. Each was held at a quarter of the whole
    part, whatever earlier ones left in it, so three of them took the part to its ceiling,
    where every publisher waits. A publisher's share is of the room left, so each takes less
    as the part fills."""
    limit = 32 * 1024 * 1024
    flow = _flow(budget=limit)
    budget = flow.budget
    large = Inbound(flow, Account())
    holder = large.attach()
    weights = {holder: limit}
    flow.flush(limit, 0, weights.__getitem__)
    assert budget.blocked
    assert holder.held
    stored = 0
    for _ in range(8):
        inbound = Inbound(flow, Account())
        piler = inbound.attach()
        weights[piler] = 0
        flow.flush(limit + stored, 0, weights.__getitem__)
        # A socket read's worth between two flushes.
        while not piler.held and not budget.publishers_full(budget.used):
            weights[piler] += 8_000
            stored += 8_000
            flow.flush(limit + stored, 0, weights.__getitem__)
        inbound.detach(piler)
        del weights[piler]
        flow.leave(inbound)
    assert not budget.publishers_full(budget.used)


def test_a_read_that_exhausts_the_budget_pauses_publishers_but_the_oldest_arriving() -> None:
    flow = _flow(budget=10_000)
    first = Inbound(flow, Account())
    second = Inbound(flow, Account())
    consumer = Inbound(flow, Account())
    one = first.attach()
    two = second.attach()
    assert second.frame(two, 500) is None
    assert first.frame(one, 500) is None
    assert flow.charge_read(consumer, 20_000) == [], "a consumer's reads are never charged"
    assert flow.charge_read(first, 6_000) == []
    paused = flow.charge_read(first, 4_000)
    assert paused == [first], "the second's delivery is the oldest arriving: it goes on"
    assert flow.budget.blocked


# One socket read of the two tests below: small beside a 10,000-byte budget's margin.
CHUNK = 50


def _read_in_chunks() -> InboundFlow:
    """A 10,000-byte budget whose publishers' connections are read :data:`CHUNK` at a time."""
    return InboundFlow(
        MemoryBudget(10_000),
        InboundLimits(
            max_link_credit=4, max_message_size=2_000, max_unfinished_size=4_000, read_size=CHUNK
        ),
    )


def test_the_oldest_arriving_delivery_stops_at_its_part_of_the_margin_below_the_ceiling() -> None:
    """Adversary seed 65501: the budget blocked by queues nobody consumes and nobody held, a
    publisher began a 6 MB delivery and, as the oldest arriving, was read on through the 8 MiB
    margin and past the ceiling, where every publisher waits. It now stops at the part of the
    margin kept for deliveries still arriving: its bytes land below the ceiling, and a polite
    publisher goes on in its own part (session/memory_budget.py)."""
    flow = _read_in_chunks()
    budget = flow.budget
    assert (budget.unfinished_part, budget.publishing_ceiling) == (156, 11_094)
    polite, attacker = Inbound(flow, Account()), Inbound(flow, Account())
    prober, slow = polite.attach(), attacker.attach()
    queued = budget.limit + 100
    flow.flush(queued, 0, _nothing)
    assert budget.blocked
    received, highest = 0, 0
    # The delivery is larger than the whole margin; its connection is read while not held.
    while received < 2_000 and not attacker.paused:
        flow.charge_read(attacker, CHUNK)
        highest = max(highest, budget.current)
        received += CHUNK
        assert attacker.frame(slow, received) is None
        flow.flush(queued, 0, _nothing)
        highest = max(highest, budget.used)
    assert attacker.paused
    assert budget.unfinished == received <= budget.unfinished_part + CHUNK, "kept, not released"
    assert highest <= queued + budget.unfinished_part + CHUNK, "one read past its part at most"
    assert not polite.paused, "the polite publisher is read on"
    flow.charge_read(polite, 100)
    assert not polite.paused
    # Consumers bring the bytes back under the low-water mark: it is read again.
    out = flow.flush(budget.resume_at - received, 0, _nothing)
    assert out is not None
    assert attacker in out.resume
    assert not prober.held


def test_the_oldest_delivery_past_its_part_goes_back_once_the_publishers_part_is_full() -> None:
    """Adversary seed 65912: the oldest delivery arriving, begun before the budget blocked,
    was kept past its part by less than a read, as it may be, and what it held past it took
    the publishers' part to its ceiling beside queues nobody read: every publisher waited, the
    prober too, for as long as it stayed unfinished. With their part full, it goes back."""
    flow = _read_in_chunks()
    budget = flow.budget
    polite, attacker = Inbound(flow, Account()), Inbound(flow, Account())
    polite.attach()
    slow = attacker.attach()
    flow.flush(budget.limit // 2, 0, _nothing)
    received = 0
    while received <= budget.unfinished_part:
        flow.charge_read(attacker, CHUNK)
        received += CHUNK
        assert attacker.frame(slow, received) is None
    assert received <= budget.unfinished_part + CHUNK, "within what the oldest may keep"
    # Queues nobody reads fill up to just under the publishers' ceiling less that excess.
    queued = budget.publishing_ceiling - (received - budget.unfinished_part) // 2
    out = flow.flush(queued, 0, _nothing)
    assert budget.blocked
    assert out is not None
    assert out.release == [slow], "past its part with the publishers' part full: given up"
    assert budget.unfinished == 0
    assert not budget.publishers_full(budget.used)
    flow.charge_read(polite, 10)
    assert not polite.paused


def test_the_oldest_delivery_stops_where_it_would_finish_at_the_publishers_ceiling() -> None:
    """Adversary seed 65945: queues nobody read held the blocked budget just under its
    publishers' ceiling, and the oldest delivery arriving, within its part of the margin, was
    read to its end: its 300 KB went to a fanout's queues and took the publishers 339 KB past
    their ceiling, where every publisher waited for good, the prober too. It now stops where,
    finished, it would reach the ceiling; a polite publisher is read on."""
    flow = _read_in_chunks()
    budget = flow.budget
    polite, attacker = Inbound(flow, Account()), Inbound(flow, Account())
    polite.attach()
    slow = attacker.attach()
    room = 2 * CHUNK
    queued = budget.publishing_ceiling - room
    flow.flush(queued, 0, _nothing)
    assert budget.blocked
    assert budget.unfinished_part > room + CHUNK, "its part alone would let it finish"
    received = 0
    while received < room + CHUNK and not attacker.paused:
        flow.charge_read(attacker, CHUNK)
        received += CHUNK
        assert attacker.frame(slow, received) is None
        flow.flush(queued, 0, _nothing)
    assert attacker.paused
    assert received == room, "stopped at the read that would finish it at the ceiling"
    assert not budget.publishers_full(budget.used)
    assert not polite.paused
    flow.charge_read(polite, 10)
    assert not polite.paused


def test_a_turn_of_the_oldest_arriving_delivery_decides_again_only_the_two_connections() -> None:
    """A connection sending deliveries of two frames each made the oldest arriving change at
    every frame, and each change decided every hold again, every link and its queues weighed:
    a pass over them all per frame. Now only the connections whose delivery was and is the
    oldest are decided again."""
    flow = _read_in_chunks()
    budget = flow.budget
    first, second = Inbound(flow, Account()), Inbound(flow, Account())
    one, two = first.attach(), second.attach()
    others = [Inbound(flow, Account()) for _ in range(50)]
    for other in others:
        other.attach()
    weighed: list[IncomingLink] = []

    def weigh(link: IncomingLink) -> int:
        weighed.append(link)
        return 0

    queued = budget.limit + 100
    flow.flush(queued, 0, weigh)
    assert budget.blocked
    flow.charge_read(first, CHUNK)
    assert first.frame(one, CHUNK) is None
    flow.flush(queued, 0, weigh)
    decisions, weighed_before = flow.decisions, len(weighed)
    # Six turns: within the credit each link was granted before the budget blocked (4).
    for turn in range(6):
        sender, receiver = (first, one) if turn % 2 == 0 else (second, two)
        waiting, link = (second, two) if turn % 2 == 0 else (first, one)
        flow.charge_read(waiting, CHUNK)
        assert waiting.frame(link, CHUNK) is None
        flow.charge_read(sender, 10)
        assert sender.receive(receiver, CHUNK + 10, False) is None
        flow.flush(queued, 0, weigh)
        assert next(iter(flow.arriving)) is waiting
        assert not waiting.paused, "the oldest arriving is read"
    assert (flow.decisions, len(weighed)) == (decisions, weighed_before)
    assert not any(other.paused for other in others)


# -- the state machine -------------------------------------------------------------------

MAX_LINK_CREDIT = 6
ACCOUNT_LIMIT = 12
BUDGET = 4000
QUEUES = 3
# Two connections of up to 600 unfinished bytes each against a server-wide 250: reached often.
MACHINE_LIMITS = InboundLimits(
    MAX_LINK_CREDIT, max_message_size=400, max_unfinished_size=600, max_unfinished_total=250
)


@dataclass
class Publisher:
    """One publishing link: its connection, what the client was granted, where it publishes."""

    connection: int
    link: IncomingLink
    targets: list[int]
    client_credit: int = 0
    # Bytes so far of a delivery the client is sending in frames; None: none begun.
    sending: int | None = None
    closed: bool = False


@dataclass
class Copy:
    """A routed copy not yet stored."""

    pending: Unconfirmed
    queue: int
    size: int


@dataclass
class Consumer:
    """A consumer of one queue."""

    delivery_count: int = 0
    unacked: list[int] = field(default_factory=list)


class InboundMachine(RuleBasedStateMachine):
    """Two connections' publishers, late-storing queues, consumers and the server's budget,
    all through the real inbound session (session/inbound.py)."""

    @initialize(
        routes=st.lists(
            st.tuples(
                st.integers(0, 1),
                st.lists(st.integers(0, QUEUES - 1), min_size=1, max_size=QUEUES, unique=True),
            ),
            min_size=1,
            max_size=4,
        )
    )
    def start(self, routes: list[tuple[int, list[int]]]) -> None:
        self.held = HeldBytes()
        self.queues = [ClassicQueue(f"q{i}", held=self.held) for i in range(QUEUES)]
        self.consumers = [Consumer() for _ in range(QUEUES)]
        for i, queue in enumerate(self.queues):
            queue.attach(i, ack_required=True)
        self.flow = InboundFlow(MemoryBudget(BUDGET), MACHINE_LIMITS)
        self.connections = [Inbound(self.flow, Account(ACCOUNT_LIMIT)) for _ in range(2)]
        self.publishers: list[Publisher] = []
        for connection, queues in routes:
            link = self.connections[connection].attach()
            credit = link.credit
            self.publishers.append(Publisher(connection, link, queues, credit))
        self.unstored: list[Copy] = []
        self.next_message = 0

    def _weigh(self, link: IncomingLink) -> int:
        publisher = next(p for p in self.publishers if p.link is link)
        return sum(self.queues[q].statistics().ready_bytes for q in publisher.targets)

    def _ready(self) -> list[int]:
        return [
            i
            for i, p in enumerate(self.publishers)
            if not p.closed
            and not self.connections[p.connection].paused
            and (p.sending is not None or p.client_credit > 0)
        ]

    @rule(data=st.data(), size=st.integers(0, 300), frames=st.integers(1, 3))
    def transfer(self, data: st.DataObject, size: int, frames: int) -> None:
        """A client sends a delivery in ``frames`` frames, or the next frame of one it began."""
        ready = self._ready()
        if not ready:
            return
        publisher = self.publishers[data.draw(st.sampled_from(ready))]
        inbound = self.connections[publisher.connection]
        link = publisher.link
        if publisher.sending is None:
            publisher.client_credit -= 1
            publisher.sending = 0
        if frames > 1:
            begins = publisher.sending == 0
            publisher.sending += size // frames
            refusal = inbound.frame(link, publisher.sending)
            if isinstance(refusal, Hold):
                assert self.flow.unfinished_full
                assert all(held.budget_paused for held in refusal.connections)
            elif refusal is RELEASE:
                assert begins, "only a delivery that begins past the cap is released"
                assert self.flow.unfinished_full
                publisher.sending = None
            elif refusal is not None:
                self._refused(publisher, refusal)
            return
        total = publisher.sending + size
        publisher.sending = None
        refusal = inbound.receive(link, total, aborted=False)
        if refusal is not None:
            self._refused(publisher, refusal)
            return
        message = self.next_message
        self.next_message += 1
        pending, pause = inbound.route(link, message, len(publisher.targets), total)
        assert pause == inbound.account.paused or not pause
        self.unstored.extend(Copy(pending, q, total) for q in publisher.targets)

    def _refused(self, publisher: Publisher, refusal: object) -> None:
        inbound = self.connections[publisher.connection]
        if isinstance(refusal, CloseConnection):
            assert inbound.unfinished > MACHINE_LIMITS.max_unfinished_size
            for other in self.publishers:
                if other.connection == publisher.connection:
                    other.closed = True
            inbound.release()
            return
        assert isinstance(refusal, CloseLink)
        assert refusal.error.condition == "amqp:link:message-size-exceeded"
        publisher.closed = True
        inbound.detach(publisher.link)

    @precondition(lambda self: self.unstored)
    @rule(data=st.data())
    def store(self, data: st.DataObject) -> None:
        """A queue stores one copy (late, as after an fsync): confirm it."""
        copy = self.unstored.pop(data.draw(st.integers(0, len(self.unstored) - 1)))
        payload = _payload(copy.pending.token, copy.size)  # type: ignore[arg-type]
        self.queues[copy.queue].enqueue(Message(payload))
        inbound = copy.pending.inbound
        steps = inbound.confirm(copy.pending)
        if steps & RESUME:
            assert not inbound.paused
        assert bool(steps & SETTLE) == (copy.pending.copies == 0)

    @rule()
    def flush(self) -> None:
        """The end of an event batch: budget, holds, renewals, as the gateway applies them."""
        was_blocked = self.flow.budget.blocked
        out = self.flow.flush(self.held.total, 0, self._weigh)
        if out is None:
            return
        blocked = self.flow.budget.blocked
        for link in out.release:
            # Given up beyond their part of the margin: the rest of its frames are dropped.
            assert blocked
            publisher = next(p for p in self.publishers if p.link is link)
            assert publisher.sending is not None
            publisher.sending = None
        for link, grant in out.grants:
            assert grant > 0
            assert not (blocked and link.held), "a held link got credit"
            publisher = next(p for p in self.publishers if p.link is link)
            publisher.client_credit += grant
        for inbound in out.pause:
            assert inbound.budget_paused
            assert blocked or was_blocked or self.flow.unfinished_full
        for inbound in out.resume:
            assert not inbound.budget_paused
        oldest = next(iter(self.flow.arriving), None)
        budget = self.flow.budget
        # Read unless its part is taken or, finished, it would take the publishers to their
        # ceiling (adversary seed 65945).
        if oldest is not None and not (
            blocked
            and (
                budget.unfinished_room() <= 0
                or budget.publishing_level(budget.current) + oldest.unfinished
                >= budget.publishing_ceiling
            )
        ):
            assert not oldest.budget_paused, "the oldest arriving must be read"

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
            if publisher.closed:
                continue
            link = publisher.link
            assert link.credit == publisher.client_credit >= 0
            assert link.credit + link.unconfirmed <= 2 * MAX_LINK_CREDIT - 1

    @invariant()
    def debt_is_the_copies_not_stored(self) -> None:
        for inbound in self.connections:
            debt = sum(1 for copy in self.unstored if copy.pending.inbound is inbound)
            account = inbound.account
            assert account.debt == debt
            if account.paused:
                assert account.debt > account.resume_at
            else:
                assert account.debt < ACCOUNT_LIMIT
            assert account.debt < ACCOUNT_LIMIT + QUEUES

    @invariant()
    def unfinished_bytes_are_charged_once(self) -> None:
        total = 0
        for inbound in self.connections:
            assert inbound.unfinished == sum(link.unfinished for link in inbound.links)
            assert inbound.unfinished <= MACHINE_LIMITS.max_unfinished_size
            total += inbound.unfinished
        assert self.flow.budget.unfinished == total
        # Past the server-wide cap only the oldest arriving connection's deliveries grow.
        limits = MACHINE_LIMITS
        assert limits.max_unfinished_total is not None
        assert total <= limits.max_unfinished_total + limits.max_unfinished_size
        assert list(self.flow.arriving) == [
            inbound for inbound in self.flow.arriving if inbound.unfinished
        ]

    @invariant()
    def only_publishers_wait_for_the_budget_and_only_while_it_is_exhausted(self) -> None:
        flow = self.flow
        for inbound in self.connections:
            if inbound.budget_paused:
                assert flow.budget.blocked or (flow.unfinished_full and inbound.unfinished)
                assert inbound.links

    @invariant()
    def held_bytes_are_what_queues_hold(self) -> None:
        stats = [q.statistics() for q in self.queues]
        unacked = sum(s.unacked_bytes for s in stats)
        count = sum(s.ready + s.unacked for s in stats)
        ready = sum(s.ready_bytes for s in stats)
        # The held bytes count payloads as published; the wire bytes add the delivery-count
        # a failure raised, stamped as they are sent (16 bytes at most: a header of its own).
        held = self.held.total - count * MESSAGE_OVERHEAD
        assert ready + unacked - 16 * count <= held <= ready + unacked

    @invariant()
    def no_link_is_left_without_credit_and_without_a_renewal(self) -> None:
        """A link with no credit and nothing that would ask a renewal for it (a confirmation,
        a hold ending) waits for one: adversary seed 65600's prober waited for good."""
        for publisher in self.publishers:
            link = publisher.link
            if publisher.closed or link.credit or link.unconfirmed or link.held:
                continue
            assert link.arriving or link in self.flow.renewals

    @invariant()
    def budget_state_matches_its_marks(self) -> None:
        budget = self.flow.budget
        if budget.blocked:
            assert budget.used > budget.resume_at
        else:
            assert budget.used < budget.limit


InboundMachine.TestCase.settings = settings(
    max_examples=examples(150), stateful_step_count=60, deadline=None
)
TestInboundMachine = InboundMachine.TestCase


def test_a_held_connection_whose_last_publisher_detaches_is_read_again() -> None:
    flow = _flow(budget=1_000)
    inbound = Inbound(flow, Account())
    link = inbound.attach()
    out = flow.flush(1_000, 0, lambda _: 1_000)
    assert out is not None
    assert out.pause == [inbound]
    assert inbound.detach(link), "only a consumer now: the budget holds consumers never"
    assert not inbound.paused


def test_a_link_whose_publish_another_worker_gave_back_waits_until_that_worker_stores_again() -> (
    None
):
    """Another worker blocked for good gives back what it does not keep parked
    (gateway/peers.py's ``_give_back``): granted again at once, its publisher would send, and be
    given back, for as long as it liked. It waits, until that worker stores a publish of this
    worker's again; a link of its connection that sent elsewhere does not."""
    flow = _flow()
    inbound = Inbound(flow, Account())
    far, near = inbound.attach(), inbound.attach()
    for link in (far, near):
        for _ in range(3):
            assert inbound.receive(link, 100, aborted=False) is None
            pending, _ = inbound.route(link, None, 1, 100)
            if link is far:
                flow.given_back(1, link)
                inbound.confirm(pending, Outcome.RELEASED, ResourceLimitExceeded("blocked"))
            else:
                inbound.confirm(pending)
    out = flow.flush(1_000, 0, _nothing)
    assert out is not None
    assert out.grants == [(near, 3)], "the link given back waits"
    flow.owner_stored(0)
    assert flow.flush(1_000, 0, _nothing) is None, "another worker stored: it still waits"
    flow.owner_stored(1)
    out = flow.flush(1_000, 0, _nothing)
    assert out is not None
    assert out.grants == [(far, 3)]
    assert flow.owner_full == {}


def test_a_link_that_waits_for_another_worker_leaves_nothing_when_it_detaches() -> None:
    flow = _flow()
    inbound = Inbound(flow, Account())
    link = inbound.attach()
    inbound.given_back(1, link)
    inbound.given_back(1, link)
    assert flow.owner_full == {1: {link}}
    inbound.release()
    assert flow.owner_full == {}
    assert link.owner_full is None


def test_a_publish_given_back_after_its_link_detached_makes_nobody_wait() -> None:
    """Adversary seed 65800: a copy in flight was given back after its link detached; the
    link was recorded as waiting, and granted credit with its record gone once the owner
    stored again (an internal error at the flush)."""
    flow = _flow()
    inbound = Inbound(flow, Account())
    link = inbound.attach()
    assert inbound.receive(link, 100, aborted=False) is None
    pending, _ = inbound.route(link, None, 1, 100)
    inbound.detach(link)
    inbound.given_back(1, link)
    inbound.confirm(pending, Outcome.RELEASED, ResourceLimitExceeded("blocked"))
    assert flow.owner_full == {}
    flow.owner_stored(1)
    assert link not in flow.renewals


def _took_unsettled(unsettled: Unsettled, link: OutgoingLink, count: int) -> None:
    """What a session does as ``count`` deliveries of ``link`` leave it unsettled."""
    if unsettled.blocked:
        unsettled.since.setdefault(link, link.unsettled)
    link.unsettled += count
    unsettled.count += count


def _settled(unsettled: Unsettled, link: OutgoingLink, count: int) -> None:
    """What a session does as the client settles ``count`` of ``link``'s deliveries."""
    link.unsettled -= count
    unsettled.count -= count
    if link.unsettled_held:
        unsettled.settled[link] = None


def _apply(unsettled: Unsettled, out: Flushed | None) -> tuple[list[int], list[int]]:
    """The holds a flush decided, applied as the sessions do: the handles held and let go."""
    assert out is not None
    for link in out.hold_consumers:
        unsettled.hold(link)
    for link in out.let_go_consumers:
        unsettled.release(link)
    return [link.handle for link in out.hold_consumers], [
        link.handle for link in out.let_go_consumers
    ]


def test_consumers_that_take_deliveries_unsettled_while_blocked_are_held_by_their_growth() -> None:
    """Each unsettled delivery costs UNSETTLED_DELIVERY_COST beyond its message; a consumer
    settling nothing took a blocked budget's publishers past their ceiling, where every
    publisher waits. Its growth since the block is weighed with the publishers' that grew:
    held past its share, let go once it settled back under it, or the budget lets go."""
    budget = MemoryBudget(1_000_000)
    flow = InboundFlow(budget, LIMITS)
    unsettled = flow.unsettled
    queue = ClassicQueue("q")
    hoarder, settler = (OutgoingLink(cast(LinkOwner, None), n, queue, True) for n in (1, 2))
    _took_unsettled(unsettled, settler, 3)
    flow.flush(1_000_000, 0, _nothing)
    assert budget.blocked
    assert unsettled.blocked
    assert unsettled.since == {}
    _took_unsettled(unsettled, hoarder, 100)
    _took_unsettled(unsettled, settler, 1)
    grown = 101 * UNSETTLED_DELIVERY_COST
    # A quarter of the room left below the publishers' ceiling, shared by the two grown, is
    # 14 deliveries each, and a quarter of it all the requests may ask for until the next
    # decision.
    assert _apply(unsettled, flow.flush(1_000_000 + grown, 0, _nothing)) == ([1], [])
    assert (unsettled.share, unsettled.room) == (14, 28)
    # A request asks for what is left of both; a link granted none is held at once.
    assert unsettled.grant(settler, 256) == 13
    fresh = [OutgoingLink(cast(LinkOwner, None), n, queue, True) for n in (3, 4, 5)]
    assert [unsettled.grant(link, 256) for link in fresh] == [14, 1, 1]
    assert unsettled.room == 0
    # With the room spent, a link holding no more than when the budget blocked still gets one
    # (consumers settling as they go drain the queues); one that grew is held.
    unsettled.since[fresh[2]] = 0
    fresh[2].unsettled = 1
    assert unsettled.grant(fresh[2], 256) == 0
    assert fresh[2].unsettled_held
    assert fresh[2].held
    assert unsettled.reached == {fresh[2]: None}
    unsettled.forget(fresh[2])
    # The hoarder settles what it took: let go at the next flush, though the bytes it finds
    # did not move for the holds to be decided again.
    decisions = flow.decisions
    _settled(unsettled, hoarder, 100)
    out = flow.flush(1_000_000 + grown, 0, _nothing)
    assert flow.decisions == decisions
    assert _apply(unsettled, out) == ([], [1])
    assert unsettled.held == {}
    # Held again for taking more, while the settler, which settled, is not; every hold ends
    # as the budget lets go.
    _settled(unsettled, settler, 1)
    _took_unsettled(unsettled, hoarder, 200)
    out = flow.flush(1_000_000 + 201 * UNSETTLED_DELIVERY_COST, 0, _nothing)
    assert _apply(unsettled, out) == ([1], [])
    assert _apply(unsettled, flow.flush(budget.resume_at, 0, _nothing)) == ([], [1])
    assert (unsettled.blocked, unsettled.since, unsettled.held, unsettled.settled) == (
        False, {}, {}, {},
    )  # fmt: skip


def test_a_fan_outs_copies_fit_only_below_the_publishers_ceiling() -> None:
    """What gateway/publishing.py asks before it makes a fan-out's copies: with what is held
    and what was read since the last flush, do they stay below the publishers' ceiling."""
    budget = MemoryBudget(100_000)
    flow = InboundFlow(budget, LIMITS)
    flow.flush(90_000, 0, _nothing)
    room = budget.publishing_ceiling - 90_000
    assert flow.fits(room - 1)
    assert not flow.fits(room)
    inbound = Inbound(flow, Account())
    inbound.attach()
    flow.charge_read(inbound, 1_000)
    assert not flow.fits(room - 1)
    assert flow.fits(room - 1_001)
