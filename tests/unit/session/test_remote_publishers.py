"""Other workers' publishers charged by the worker that owns their queues (issue 31, adversary
seeds 66102 and 66103; session/remote_publishers.py): what their publishes store here while
the memory budget is blocked is weighed by the holder rule this worker's own publishers are
weighed by, so that a fan-out's copies to many light queues hold their publisher, not the
light ones beside it."""

from __future__ import annotations

import pytest

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.held_bytes import HeldBytes
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import QueueStatistics, QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.account import Account
from sluicegate.session.channel.frames import Publish
from sluicegate.session.channel.remote import Remote, RemoteQueue
from sluicegate.session.inbound import Inbound
from sluicegate.session.inbound_flow import (
    RECLASSIFY_FLOOR,
    InboundFlow,
    InboundLimits,
    queue_weight,
)
from sluicegate.session.incoming_link import IncomingLink
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.session.remote_publishers import (
    FIRST_HTTP_CLIENT,
    FIRST_LINK,
    NO_PUBLISHER,
    PUBLISHER_STEP,
)

# Large enough that a message's overhead in its queue is small beside the copies' bytes.
LIMIT = 10_000_000
LIMITS = InboundLimits(max_link_credit=4, max_message_size=1000, max_unfinished_size=1500)
# The fan-out's queues on this worker, and the other worker's link numbers.
FANOUT = 20
PEER = 1
FANNING, PROBING = 7, 8


def _store(queue: ClassicQueue, size: int) -> None:
    queue.enqueue(Message(b"x" * size))


# No link of this worker's publishes: only the other worker's are weighed.
NOBODY: dict[IncomingLink, int] = {}


def _blocked() -> tuple[MemoryBudget, InboundFlow, HeldBytes]:
    """A budget blocked at its limit by bytes no publisher holds, and what counts the queues."""
    budget = MemoryBudget(LIMIT)
    flow = InboundFlow(budget, LIMITS)
    flow.flush(LIMIT, 0, NOBODY.__getitem__)
    assert budget.blocked
    return budget, flow, HeldBytes()


def test_a_fan_out_to_many_light_queues_holds_its_publisher_not_the_light_ones() -> None:
    """Seeds 66102 and 66103: the limit held by a queue nobody reads, another worker's fan-out
    copies went to 50 queues here, each far under a holder's floor; weighed per queue, nobody
    was held, they took the publishers' whole part, and the prober's publishes parked at the
    ceiling. Charged to the link behind them, they hold it once it grew by a quarter of the
    part, while another worker's light publisher and this worker's own go on."""
    budget = MemoryBudget(LIMIT)
    budget.keep_for_letters(1)
    flow = InboundFlow(budget, LIMITS)
    held = HeldBytes()
    large, modest = Inbound(flow, Account()), Inbound(flow, Account())
    holder, prober = large.attach(), modest.attach()
    weights = {holder: LIMIT, prober: 0}
    flow.flush(LIMIT, 0, weights.__getitem__)
    assert budget.blocked
    assert (holder.held, prober.held) == (True, False)
    part = budget.publishing_ceiling - budget.limit
    fanout = [ClassicQueue(f"fan{i}", held=held) for i in range(FANOUT)]
    probed = ClassicQueue("probed", held=held)
    # A third of the part, each queue's share of it far under a holder's floor.
    each = part // 3 // FANOUT
    assert each < budget.margin * 0.25 / 3
    for queue in fanout:
        flow.remote.storing(PEER, FANNING, queue, queue_weight(queue))
        _store(queue, each)
    # The other worker's prober: its queue is read as it fills.
    flow.remote.storing(PEER, PROBING, probed, queue_weight(probed))
    flow.flush(LIMIT + held.total, 0, weights.__getitem__)
    assert flow.remote.held(PEER, FANNING), "a fan-out's copies are charged to their publisher"
    assert not flow.remote.held(PEER, PROBING)
    assert not prober.held
    assert not budget.publishers_full(budget.current)
    # Once the budget lets go, nobody is held and nothing is charged any more.
    flow.flush(budget.resume_at, 0, weights.__getitem__)
    assert not flow.budget.blocked
    assert not flow.remote.held(PEER, FANNING)
    assert flow.remote.publishers == {}


def test_a_publisher_whose_queues_are_drained_is_let_go_and_forgotten() -> None:
    """A held link whose queues weigh no more than they did is weighed again from its next
    store: the records of links that come and go on another worker during a long block are as
    many as those whose copies are still held here."""
    budget, flow, held = _blocked()
    queue = ClassicQueue("fan", held=held)
    flow.remote.storing(PEER, FANNING, queue, 0)
    _store(queue, budget.margin // 2)
    flow.flush(LIMIT + held.total, 0, NOBODY.__getitem__)
    assert flow.remote.held(PEER, FANNING)
    queue.purge()
    flow.flush(LIMIT - budget.margin, 0, NOBODY.__getitem__)
    assert budget.blocked
    assert not flow.remote.held(PEER, FANNING)
    assert flow.remote.publishers == {}


def test_what_names_no_publisher_is_not_charged_and_a_channel_that_ends_is_forgotten() -> None:
    flow = InboundFlow(MemoryBudget(LIMIT), LIMITS)
    queue = ClassicQueue("q", held=HeldBytes())
    flow.remote.storing(PEER, NO_PUBLISHER, queue, 0)
    assert flow.remote.publishers == {}
    flow.remote.storing(PEER, FANNING, queue, 0)
    flow.remote.storing(PEER + 1, FANNING, queue, 0)
    flow.remote.forget(PEER)
    assert list(flow.remote.publishers) == [(PEER + 1, FANNING)]


def test_a_deleted_queue_leaves_the_records_at_once() -> None:
    """A link's records kept the queues it stored into until the budget let go, deleted ones
    too, weighed and referenced: a client deleting the queues it filled while blocked left
    them there. The registry tells of every deletion; a link that stored only into deleted
    queues is forgotten, one that stored elsewhere too is weighed by what is left."""
    flow = InboundFlow(MemoryBudget(LIMIT), LIMITS)
    registry = QueueRegistry()
    registry.gone = flow.remote.queue_deleted
    kept, gone, other = (registry.declare_queue(name) for name in ("kept", "gone", "other"))
    flow.remote.storing(PEER, FANNING, kept, 100)
    flow.remote.storing(PEER, FANNING, gone, 20)
    flow.remote.storing(PEER, PROBING, other, 7)
    registry.delete_queue("gone")
    registry.delete_queue("other")
    assert list(flow.remote.publishers) == [(PEER, FANNING)]
    fanning = flow.remote.publishers[(PEER, FANNING)]
    assert list(fanning.queues) == [kept]
    assert fanning.weight_at_block == 100
    # A queue no link stored into changes nothing.
    registry.declare_queue("unused")
    registry.delete_queue("unused")
    assert list(flow.remote.publishers) == [(PEER, FANNING)]


def test_a_publishers_copies_cross_named_by_its_link_in_runs_of_their_own() -> None:
    """The owner charges a run to the link it names, so two links' publishes to one queue do
    not share a run; a letter names none, and an HTTP publish its client, never a link's
    number: charged to the HTTP API as one publisher, a light HTTP client was held with a
    heavy one."""
    flow = InboundFlow(MemoryBudget(LIMIT), LIMITS)
    first, second = Inbound(flow, Account()), Inbound(flow, Account())
    one, two = first.attach(), second.attach()
    assert one.serial != two.serial
    remote = Remote(PEER)
    remote.opened()
    queue = RemoteQueue("sink", "/", remote)
    for inbound, link in ((first, one), (first, one), (second, two)):
        assert inbound.receive(link, 10, aborted=False) is None
        pending, _ = inbound.route(link, None, 1, 10)
        assert queue.publish(pending, Message(b"z" * 10))
    queue.enqueue(Message(b"y" * 10))
    # Two HTTP clients' publishes, each named by its own number (gateway/http/publish_api.py).
    light, heavy = FIRST_HTTP_CLIENT, FIRST_HTTP_CLIENT + PUBLISHER_STEP
    assert queue.publish(object(), Message(b"h" * 10), light)
    assert queue.publish(object(), Message(b"h" * 10), heavy)
    runs = [(f.publisher, len(f.payloads)) for f in remote.outgoing if isinstance(f, Publish)]
    assert runs == [
        (one.serial, 2),
        (two.serial, 1),
        (NO_PUBLISHER, 1),
        (light, 1),
        (heavy, 1),
    ]
    assert {one.serial % PUBLISHER_STEP, two.serial % PUBLISHER_STEP} == {0}
    assert light % PUBLISHER_STEP == heavy % PUBLISHER_STEP == 1


def test_links_in_turn_never_take_the_last_of_the_part_and_a_light_one_goes_on() -> None:
    """Seed 65800: other workers' links came one after another, each piling up in a queue
    nobody reads until it was held, each weighed only at the flush after its stores and held at
    a share of the whole part: a few of them took a worker's publishers' part to its ceiling,
    where every publisher waits. Admitted run by run within its share of the part left, each
    takes at most a quarter of what it finds, and a light publisher's run still fits after
    hundreds of them."""
    budget = MemoryBudget(LIMIT)
    budget.keep_for_letters(1)
    flow = InboundFlow(budget, LIMITS)
    held = HeldBytes()
    large = Inbound(flow, Account())
    holder = large.attach()
    weights = {holder: LIMIT}
    flow.flush(LIMIT, 0, weights.__getitem__)
    assert budget.blocked
    probed = ClassicQueue("probed", held=held)
    run = 8_000
    least = budget.margin // RECLASSIFY_FLOOR

    def room() -> int:
        return budget.publishing_ceiling - budget.publishing_level(budget.used)

    for link in range(PROBING + 1, PROBING + 301):
        pile = ClassicQueue(f"pile{link}", held=held)
        while flow.remote.admit(PEER, link, pile, run, room(), least, queue_weight, {}):
            _store(pile, run)
            flow.flush(LIMIT + held.total, 0, weights.__getitem__)
        assert room() > 0
        # The other worker's prober: one small message, consumed at once.
        assert flow.remote.admit(PEER, PROBING, probed, 500, room(), least, queue_weight, {})
    assert not budget.publishers_full(budget.used)


def test_a_publisher_not_grown_takes_the_least_the_holds_weigh_among_many_growing() -> None:
    """Seed 65965: a worker blocked 12.7 KB under its publishers' ceiling, some 40 of the other
    worker's links growing in queues nobody reads, each stood under its share; a quarter of the
    room shared among them was some 80 bytes, under the prober's one message, which waited
    for good. A publisher that has not grown may take the holds' least, within a quarter of
    the room; the ones that grew stay within their shares, so the room does not go to them."""
    budget, flow, held = _blocked()
    room = 12_700
    least = budget.margin // RECLASSIFY_FLOOR
    assert least > room // 4
    piles = [ClassicQueue(f"pile{i}", held=held) for i in range(40)]
    for number, pile in enumerate(piles):
        assert flow.remote.admit(PEER, 100 + 2 * number, pile, 70, room, least, queue_weight, {})
        _store(pile, 70)
    assert flow.remote.growing == len(piles)
    # A second run of one that grew: past its share (a 41st of the quarter), refused.
    grown: dict[tuple[int, int], int] = {}
    assert not flow.remote.admit(PEER, 100, piles[0], 70, room, least, queue_weight, grown)
    probed = ClassicQueue("probed", held=held)
    # The prober's message: past a 41st of the quarter, within the quarter.
    assert room // 4 // 41 < 300 < room // 4
    assert flow.remote.admit(PEER, PROBING, probed, 300, room, least, queue_weight, grown)
    # Never more than a quarter of the room in one run, whatever the publisher grew by.
    past = room // 4 + 1
    assert not flow.remote.admit(PEER, FANNING, probed, past, room, least, queue_weight, {})
    # Consumed, its queue is back to its weight at the block: it may take the least again.
    _store(probed, 300)
    probed.purge()
    assert flow.remote.admit(PEER, PROBING, probed, 300, room, least, queue_weight, {})


def test_a_run_past_its_share_of_the_room_left_is_not_admitted() -> None:
    budget = MemoryBudget(LIMIT)
    flow = InboundFlow(budget, LIMITS)
    queue = ClassicQueue("q", held=HeldBytes())
    # Alone, a publisher may grow by a quarter of the room; a second shares it. A run refused
    # holds nobody: it is weighed again with the room the next flush finds.
    assert not flow.remote.admit(PEER, FANNING, queue, 1001, 4000, 0, queue_weight, {})
    assert not flow.remote.held(PEER, FANNING)
    assert flow.remote.admit(PEER, PROBING, queue, 1000, 4000, 0, queue_weight, {})
    assert not flow.remote.admit(PEER + 1, PROBING, queue, 600, 4000, 0, queue_weight, {})
    assert flow.remote.admit(PEER + 1, PROBING, queue, 600, 8000, 0, queue_weight, {})


def test_only_the_publishers_that_stored_since_the_holds_were_decided_share_the_room() -> None:
    """Seed 65870: during a long block, 87 records of another worker's links, most of them
    gone there (it does not say), each grown a little and not held, cut every share of the
    room to a 87th: the prober's publish of one message never fit its share of 164 KB left,
    and waited for good. Those that store nothing between two decisions share nothing."""
    budget, flow, held = _blocked()
    gone = [ClassicQueue(f"light{i}", held=held) for i in range(80)]
    for number, queue in enumerate(gone):
        room = budget.publishing_ceiling - budget.publishing_level(LIMIT + held.total)
        assert flow.remote.admit(PEER, 100 + 2 * number, queue, 2_000, room, 0, queue_weight, {})
        _store(queue, 2_000)
    assert flow.remote.growing == len(gone)
    # The holds are decided again: every link grew under a holder's floor, none is held.
    flow.flush(LIMIT + held.total, 0, NOBODY.__getitem__)
    assert not any(publisher.held for publisher in flow.remote.publishers.values())
    assert len(flow.remote.publishers) == len(gone)
    assert flow.remote.growing == len(gone), "they stored since the decision before"
    # Other bytes move (a consumer's writer, by an eighth of the margin: past the sixteenth
    # that decides the holds again, session/inbound_flow.py's RECLASSIFY_SHARE); none of them
    # stored meanwhile (their links are gone on the other worker).
    moved = budget.margin // 8
    flow.flush(LIMIT + held.total, moved, NOBODY.__getitem__)
    assert len(flow.remote.publishers) == len(gone)
    assert flow.remote.growing == 0
    room = budget.publishing_ceiling - budget.publishing_level(budget.used)
    # A run whose share among the 81 would be too small: room / 4 / 81 < size <= room / 4.
    size = room // 100
    probed = ClassicQueue("probed", held=held)
    assert flow.remote.admit(PEER, PROBING, probed, size, room, 0, queue_weight, {})
    assert flow.remote.growing == 1
    # One of the gone links' numbers storing again shares the room from then on, once.
    assert flow.remote.admit(PEER, 100, gone[0], 10, room, 0, queue_weight, {})
    assert flow.remote.admit(PEER, 100, gone[0], 10, room, 0, queue_weight, {})
    assert flow.remote.growing == 2
    _store(probed, size)
    _store(gone[0], 20)
    # Those that stored since the decision before share the room after the next one too.
    flow.flush(LIMIT + held.total, 0, NOBODY.__getitem__)
    assert flow.remote.growing == 2


def test_a_walk_weighs_a_publishers_queues_once_however_many_of_its_runs_it_admits() -> None:
    """A link whose copies went to a thousand queues here (``x-cc``) has a run parked for
    each: weighed at each run, one walk of the parked read its queues' statistics a million
    times. Weighed at its first run of the walk, its growth goes on with what is admitted."""
    budget, flow, held = _blocked()
    queues = [ClassicQueue(f"cc{i}", held=held) for i in range(200)]
    room = budget.publishing_ceiling - budget.publishing_level(budget.used)
    for queue in queues[:100]:
        assert flow.remote.admit(PEER, FANNING, queue, 10, room, 0, queue_weight, {})
        _store(queue, 10)
    weighed: list[QueueType] = []

    def weigh(queue: QueueType) -> int:
        weighed.append(queue)
        return queue_weight(queue)

    grown: dict[tuple[int, int], int] = {}
    growth = flow.remote.publishers[PEER, FANNING].growth(queue_weight)
    for queue in queues[100:]:
        assert flow.remote.admit(PEER, FANNING, queue, 10, room, 0, weigh, grown)
    # Its hundred queues weighed once for the walk, then each new queue as it is first stored.
    assert len(weighed) == 100 + 100
    assert grown[PEER, FANNING] == growth + 100 * 10


def test_a_decision_reads_each_queue_once_however_many_records_stored_into_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The links of another worker's fan-out each store into its queues here: read once per
    record, a decision read each queue's statistics once for each link of the fan-out."""
    budget, flow, held = _blocked()
    queues = [ClassicQueue(f"fan{i}", held=held) for i in range(FANOUT)]
    links = range(FIRST_LINK, FIRST_LINK + 30 * PUBLISHER_STEP, PUBLISHER_STEP)
    for link in links:
        for queue in queues:
            flow.remote.storing(PEER, link, queue, queue_weight(queue))
    for queue in queues:
        _store(queue, budget.margin // 4 // FANOUT)
    reads: list[str] = []
    statistics = ClassicQueue.statistics

    def counted(queue: ClassicQueue) -> QueueStatistics:
        reads.append(queue.name)
        return statistics(queue)

    monkeypatch.setattr(ClassicQueue, "statistics", counted)
    decisions = flow.decisions
    flow.flush(LIMIT + held.total, 0, NOBODY.__getitem__)
    assert flow.decisions == decisions + 1
    assert sorted(reads) == sorted(queue.name for queue in queues)
    assert all(flow.remote.held(PEER, link) for link in links)
