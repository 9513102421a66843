"""What other workers may still send on the credit this worker granted is reserved in its
memory budget before it comes, within the room the budget leaves, and taken back beyond it
(session/waiting.py, docs/bounds.md): the pure session and channel ends, with frames crossing
when the test says, and the gateway's flush played by ``budget_flushed``."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.message import Message
from sluicegate.session.channel.frames import Credit, CreditReply, Deliveries, Frame, Short
from sluicegate.session.channel.owner import Owner
from sluicegate.session.channel.remote import Remote, RemoteQueue
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.session.outbound import Session, budget_flushed, route
from sluicegate.session.outgoing_link import OutgoingLink
from sluicegate.session.waiting import (
    IMPORT_BATCH,
    MIN_SLACK,
    SIZE_SLACK,
    UNLIMITED_IMPORT_ROOM,
    WAITING_DELIVERY_COST,
    Waiting,
    WaitingBytes,
    import_unit,
)
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode as amqp
from sluicegate.writer.writer import Writer

BATCH = 16
BODY = "x" * 1000


# How many times longer a ``large`` step's message is: a link's largest delivery grows by it.
LARGE = 40


def body(queue: int, n: int, scale: int = 1) -> bytes:
    return amqp(Described(0x77, f"{queue}:{n:04}{BODY * scale}"))


# What one delivery of these makes a session count as it arrives (every body is as long).
ONE_DELIVERY = len(body(0, 0)) + WAITING_DELIVERY_COST


class Worker:
    """Worker A's connections, one consumer link each on a queue of worker B, the server's
    waiting bytes shared; ``others`` stands for everything else A's budget counts."""

    def __init__(self, links: int, cap: int, ack_required: bool = False) -> None:
        self.server = WaitingBytes()
        self.cap = cap
        self.others = 0
        # What the last flush left the imports and what they held then: the room they have
        # until the next (others growing meanwhile weigh from then on).
        self.flushed_cap = cap
        self.queues = [ClassicQueue(f"q{n}") for n in range(links)]
        self.remote = Remote(1)
        self.remote.opened()
        self.owner = Owner(lambda vhost, name: self.queues[int(name[1:])], BATCH)
        self.sessions: list[Session] = []
        self.links: list[OutgoingLink] = []
        self.received: list[list[bytes]] = [[] for _ in range(links)]
        self.published = [0] * links
        self.bodies: list[list[bytes]] = [[] for _ in range(links)]
        self.down: list[Frame] = []
        for n in range(links):
            session = Session(
                Writer(),
                remote_incoming_window=0,
                max_queue_credit=BATCH,
                waiting=Waiting(server=self.server),
            )
            link = session.attach_link(
                0, RemoteQueue(f"q{n}", "/", self.remote), ack_required=ack_required
            )
            self.sessions.append(session)
            self.links.append(link)
        self.up()

    def publish(self, queue: int, count: int, scale: int = 1) -> None:
        start = self.published[queue]
        for n in range(start, start + count):
            payload = body(queue, n, scale)
            self.bodies[queue].append(payload)
            route(self.queues[queue].enqueue(Message(payload)))
        self.published[queue] += count

    def up(self) -> None:
        """The session side's frames reach the owner, whose answers start back."""
        frames, self.remote.outgoing = self.remote.outgoing, []
        for frame in frames:
            back, local = self.owner.receive(frame)
            route(local)
            self.down.extend(back)
        self.down.extend(self.owner.flush())

    def arrive(self) -> None:
        """The owner's frames reach the sessions."""
        frames, self.down = self.down, []
        for frame in frames:
            if type(frame) is Deliveries:
                delivered = self.remote.delivered(frame)
                if delivered is not None:
                    link, session = self._session(delivered[0])
                    session.deliver_all(link, delivered[1])
            elif type(frame) is CreditReply:
                replied = self.remote.replied(frame)
                if replied is not None:
                    link, session = self._session(replied[0])
                    session.credit_replied(link, replied[1])
            elif type(frame) is Short:
                shorted = self.remote.shorted(frame)
                if shorted is not None:
                    link, session = self._session(shorted[0])
                    session.shorted(link, shorted[1])

    def _session(self, key: object) -> tuple[OutgoingLink, Session]:
        """A consumer the channel names, and its session."""
        assert isinstance(key, OutgoingLink)
        return key, self.sessions[self.links.index(key)]

    def read(self, consumer: int, window: int) -> None:
        """Consumer ``consumer``'s client lets ``window`` transfers go."""
        session = self.sessions[consumer]
        session.remote_incoming_window = window
        for action in session.send_pending():
            if type(action) is tuple:
                self.received[consumer].append(action[1].read())
        session.writer.caught_up(0)

    def step(self, kind: str, a: int, b: int) -> bool:
        """Play one of the steps the two Hypothesis tests share; False for any other."""
        if kind == "publish":
            self.publish(a, b)
        elif kind == "large":
            self.publish(a, 1, LARGE)
        elif kind == "up":
            self.up()
        elif kind == "arrive":
            self.arrive()
        elif kind == "read":
            self.read(a, b)
        else:
            return False
        return True

    def flush_blocked(self, room: int) -> None:
        """A flush of a blocked budget whose imports' part has ``room`` left (full at none)."""
        server = self.server
        budget_flushed(server, True, room <= 0, server.reserved + room)

    def flush(self) -> None:
        """The gateway's flush: what the budget leaves to imports (``MemoryBudget.import_room``,
        here with ``cap`` for its half way) once everything else is counted."""
        self.flushed_cap = self.cap - self.others
        room = self.flushed_cap - self.server.total
        budget_flushed(self.server, False, False, room)

    def asked(self) -> list[int]:
        """The credit each request about to cross asks for."""
        return [frame.credit for frame in self.remote.outgoing if type(frame) is Credit]

    def level(self) -> int:
        """What imports make A count: deliveries waiting and what may still come."""
        return self.server.total + self.server.reserved

    def may_still_send(self, consumer: int) -> int:
        """The credit B may still spend on the link, as A's end of the channel sees it."""
        return self.remote.consumers[consumer + 1][1].credit

    def quiesce(self) -> None:
        for _ in range(200):
            self.flush()
            self.up()
            self.arrive()
            for consumer in range(len(self.links)):
                self.read(consumer, 1 << 20)
            if not (self.remote.outgoing or self.down):
                return
        raise AssertionError("still busy")


def taking_back(link: OutgoingLink) -> bool:
    """Whether the link's request out asks its queue for no credit."""
    return link.credit_req_in_flight and link.queue_flow_ctl.credit == 0


def check(worker: Worker) -> None:
    server = worker.server
    assert server.reserved == sum(link.reserved for link in worker.links)
    assert set(server.reserving) == {link for link in worker.links if link.reserved}
    for consumer, link in enumerate(worker.links):
        # Every byte B may still send on the credit granted is reserved here, but for a link
        # sent nothing yet, asked for its one delivery with what room was left
        # (session/waiting.py): an estimate, as its batch's size was; and for credit worth
        # more than the room when its reply came, reserved as the room and being taken back.
        owed = worker.may_still_send(consumer) * import_unit(link)
        if owed > link.reserved and not taking_back(link):
            assert not link.largest
            assert link.reserved
            assert worker.may_still_send(consumer) == 1


STEP = st.one_of(
    st.tuples(st.just("publish"), st.integers(0, 3), st.integers(1, 12)),
    st.tuples(st.just("large"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("up"), st.just(0), st.just(0)),
    st.tuples(st.just("arrive"), st.just(0), st.just(0)),
    st.tuples(st.just("read"), st.integers(0, 3), st.integers(0, 8)),
    st.tuples(st.just("others"), st.integers(0, 6), st.just(0)),
    st.tuples(st.just("flush"), st.just(0), st.just(0)),
)

# Found by Hypothesis: with the room at one byte, a link sent nothing yet is asked one delivery
# (1,270 bytes) reserved as that byte.
FRESH_LINK_STEPS = [
    ("arrive", 0, 0),
    ("up", 0, 0),
    ("arrive", 0, 0),
    ("publish", 1, 1),
    ("up", 0, 0),
    ("arrive", 0, 0),
]

# Found by Hypothesis: a 40 KB delivery after 1 KB ones on credit the queue kept, reserved in
# the smaller unit less each delivery's cost, left nothing reserved for the four still to come.
LARGER_DELIVERY_STEPS = [
    ("arrive", 0, 0),
    ("publish", 2, 1),
    ("up", 0, 0),
    ("arrive", 0, 0),
    ("up", 0, 0),
    ("large", 2, 0),
]


@settings(max_examples=100, deadline=None)
@given(st.lists(STEP, max_size=60), st.integers(IMPORT_BATCH, 3 * IMPORT_BATCH))
@example(FRESH_LINK_STEPS, 2 * (IMPORT_BATCH + WAITING_DELIVERY_COST) + 1)
@example(LARGER_DELIVERY_STEPS, IMPORT_BATCH + 7_876)
def test_what_may_still_come_is_reserved_within_the_room_and_everything_arrives_once(
    steps: list[tuple[str, int, int]], cap: int
) -> None:
    worker = Worker(4, cap)
    for link, session in zip(worker.links, worker.sessions, strict=True):
        session.client_flow(link, 0, 10_000, False, False)
    worker.flush()
    worker.up()
    for kind, a, b in steps:
        before = worker.level()
        reserved_before = worker.server.reserved
        # A link sent nothing yet asks for its one delivery with what room is left, however
        # small (session/waiting.py): that delivery may pass the room by its own size. Credit
        # worth more than the room when its reply came is reserved as the room while it is
        # taken back: what the queue sends on it meanwhile passes the room too.
        estimated = sum(
            ONE_DELIVERY - link.reserved
            for link in worker.links
            if 0 < link.reserved < ONE_DELIVERY and not link.largest
        ) + sum(
            max(0, worker.may_still_send(consumer) * import_unit(link) - link.reserved)
            for consumer, link in enumerate(worker.links)
            if taking_back(link)
        )
        if worker.step(kind, a, b):
            pass
        elif kind == "others":
            # Something else took (or gave back) part of the budget.
            worker.others = a * IMPORT_BATCH // 4
        else:
            worker.flush()
        check(worker)
        # What may still come is reserved within the room the last flush left, whatever the
        # deliveries' sizes: credit kept in small units, reserved in the largest delivery's,
        # counted 81.9 MB on a 32 MB worker (adversary seed 65809).
        assert worker.server.reserved <= max(reserved_before, worker.server.import_room)
        # Imports never take the count past the room the last flush left; over it (others
        # grew), they only give back. Whatever the deliveries' sizes: the owner sends no more
        # than the request's byte limit, and holds back the rest (session/channel/owner.py).
        assert worker.level() <= max(before, worker.flushed_cap) + estimated
    # The budget lets go: everything published arrives, once, in order.
    worker.others = 0
    worker.cap = UNLIMITED_IMPORT_ROOM
    worker.quiesce()
    for consumer, received in enumerate(worker.received):
        assert received == worker.bodies[consumer]
    # What is still reserved is the credit the empty queues keep, and only that.
    check(worker)
    assert worker.server.total == 0


def test_credit_granted_before_the_budget_filled_is_taken_back_and_resumed_when_it_lets_go() -> (
    None
):
    worker = Worker(4, UNLIMITED_IMPORT_ROOM)
    for consumer, (link, session) in enumerate(zip(worker.links, worker.sessions, strict=True)):
        worker.publish(consumer, 1)
        session.client_flow(link, 0, 10_000, False, False)
    # Each link is sent one delivery, which the client reads: its size is known, and the
    # next request asks for a batch of it (counted from before that delivery), which the
    # empty queue keeps as credit.
    worker.quiesce()
    unit = import_unit(worker.links[0])
    assert [link.reserved for link in worker.links] == [(BATCH - 1) * unit] * 4
    # The budget fills with other bytes: no room for any of it.
    worker.others = worker.cap = 10 * unit
    worker.flush()
    assert worker.asked() == [0] * 4
    worker.up()
    worker.arrive()
    assert worker.server.reserved == 0
    # Now the queues fill: nothing crosses, nothing is asked for.
    for consumer in range(4):
        worker.publish(consumer, 40)
    for _ in range(3):
        worker.flush()
        worker.up()
        worker.arrive()
    assert worker.server.total == 0
    assert worker.remote.outgoing == []
    assert len(worker.server.starved) == 4
    # Room for two links' batches: two of the starved connections ask, and no more.
    worker.others = 0
    worker.cap = 2 * BATCH * unit
    worker.flush()
    assert worker.asked() == [BATCH, BATCH]
    assert worker.level() <= worker.cap
    # The budget lets go: every message arrives once.
    worker.cap = UNLIMITED_IMPORT_ROOM
    worker.quiesce()
    for consumer, received in enumerate(worker.received):
        assert received == [body(consumer, n) for n in range(41)]


def test_the_budgets_import_room_is_the_imports_part_less_what_imports_hold() -> None:
    """Blocked, other workers' deliveries take their own part of the margin, whatever else
    holds the rest of it (adversary seeds 65800 and 65802: deliveries still arriving took the
    budget past the half way imports stopped at, and a consumer of another worker's queue got
    nothing while that worker sat idle)."""
    budget = MemoryBudget(32 * 1024 * 1024)
    budget.keep_for_letters(1)
    part = budget.imports_part
    # Below the limit, what is left to it and the part: ``used`` counts the imports already.
    budget.imported = 17_000_000
    budget.update(20_000_000)
    assert budget.import_room(16_000_000) == 16_000_000 + budget.limit + part - 20_000_000
    budget.imported = 0
    # The limit held by queues nobody reads, and the unfinished deliveries' whole part taken.
    budget.unfinished = budget.unfinished_part
    budget.update(budget.limit + budget.unfinished_part)
    assert budget.blocked
    assert budget.import_room(0) == part
    # 600 reserved and 400 more waiting in sessions: what is left of the part is the room.
    budget.imported = 1000
    budget.update(budget.limit + budget.unfinished_part + 1000)
    assert budget.import_room(600) == 600 + part - 1000
    # The publishers' level past its ceiling (bytes moved out of another part) takes it back.
    budget.update(budget.publishing_ceiling + budget.unfinished_part + 1000 + 5000)
    assert budget.import_room(600) == 600 + part - 1000 - 5000


def test_a_delivery_is_reserved_as_its_links_largest_with_slack_and_a_batch_before_any() -> None:
    worker = Worker(1, UNLIMITED_IMPORT_ROOM)
    link = worker.links[0]
    assert import_unit(link) == IMPORT_BATCH + WAITING_DELIVERY_COST
    worker.publish(0, 1)
    worker.sessions[0].client_flow(link, 0, 10, False, False)
    assert link.reserved == import_unit(link)
    worker.quiesce()
    # Its largest and the slack for sizes that vary a little (session/waiting.py).
    largest = link.largest
    assert (
        import_unit(link) == largest + max(largest // SIZE_SLACK, MIN_SLACK) + WAITING_DELIVERY_COST
    )


@pytest.mark.parametrize("echo", [False, True])
def test_credit_kept_worth_more_than_the_room_once_a_larger_delivery_came_is_taken_back(
    echo: bool,
) -> None:
    """Adversary seed 65809: a request asked for credit in the link's small deliveries; a
    larger one crossed before its reply, and the credit the reply said the queue kept,
    reserved in the larger one, counted 81.9 MB on a 32 MB worker for a moment: every
    publisher there waited, and another worker's publish to a light queue was given back.
    It is reserved as the room left, and taken back (once out of the way, for a reply the
    client asked an echo of)."""
    worker = Worker(1, UNLIMITED_IMPORT_ROOM)
    link, session = worker.links[0], worker.sessions[0]
    worker.publish(0, 1)
    session.client_flow(link, 0, 10_000, False, False)
    worker.quiesce()
    small = import_unit(link)
    worker.cap = 4 * BATCH * small
    worker.flush()
    # Twelve small deliveries, read: the next request asks a batch in the small ones...
    worker.publish(0, 12)
    worker.up()
    worker.arrive()
    worker.read(0, 1 << 20)
    if echo:
        # ... or, once that one is answered, the client's FLOW asking an echo does.
        worker.up()
        worker.arrive()
        session.client_flow(link, link.client_flow_ctl.delivery_count, 10_000, False, True)
    assert worker.asked() == [BATCH]
    # A larger delivery crosses before its reply.
    worker.publish(0, 1, LARGE)
    worker.up()
    worker.arrive()
    assert import_unit(link) > LARGE * small // 2
    assert worker.server.reserved <= worker.server.import_room
    if echo:
        # The echo follows the delivery out.
        assert worker.asked() == []
        worker.read(0, 1 << 20)
    assert worker.asked() == [0]
    # Everything still arrives, once, in order.
    worker.cap = UNLIMITED_IMPORT_ROOM
    worker.quiesce()
    assert worker.received[0] == worker.bodies[0]


def test_a_link_sent_nothing_yet_asks_for_one_delivery_while_any_room_is_left() -> None:
    """Adversary seed 66100: another link's batch left the imports' part less than a whole
    batch, the reservation of a link sent nothing yet, so the prober's consumer on every
    renewed connection asked nothing for good. It now asks for its one delivery, reserved as
    the room left: one estimate at a time, as a delivery larger than any before."""
    cap = IMPORT_BATCH + WAITING_DELIVERY_COST + IMPORT_BATCH // 2
    worker = Worker(2, cap)
    first, fresh = worker.links
    worker.sessions[0].client_flow(first, 0, 10, False, False)
    assert first.reserved == import_unit(first)
    worker.flush()
    worker.sessions[1].client_flow(fresh, 0, 10, False, False)
    assert 0 < fresh.reserved < import_unit(fresh)
    assert worker.server.reserved <= cap
    worker.publish(1, 1)
    worker.quiesce()
    assert worker.received[1] == [body(1, 0)]


def test_publishes_parked_on_another_worker_weigh_on_the_letters_part_within_it() -> None:
    """What this worker's publishes leave parked on another worker, within that owner's window
    (gateway/peers.py's ``_give_back``), is weighed with its letters in their part: an owner
    blocked for good confirms none of it, and weighed on the publishers' part it kept a worker
    10 KB past its publishers' ceiling, every publisher there waiting (adversary seed 71000).
    Together with the letters, only what passes the part weighs on the publishers."""
    budget = MemoryBudget(32 * 1024 * 1024)
    budget.keep_for_letters(1)
    part = budget.letters
    level = budget.publishing_ceiling - 1
    budget.update(level)
    assert budget.publishing_level(level) == level
    budget.parked_sent = part // 2
    assert budget.publishing_level(level) == level - part // 2
    budget.letters_sent = part
    assert budget.publishing_level(level) == level - part, "no more than the part"
    assert not budget.publishers_full(level + part // 2)


def stalled(link: OutgoingLink) -> bool:
    """Whether the link gave back what it held and waits for its client (read afresh)."""
    return link.stalled


@settings(max_examples=20, deadline=None)
@given(st.booleans(), st.integers(0, 4))
def test_a_consumer_whose_client_reads_nothing_gives_back_what_it_holds_to_one_that_waits(
    ack_required: bool, read_before: int
) -> None:
    """Adversary seeds 66103 and 65800: consumers of another worker's queues whose clients
    read nothing held the whole imports' part while the budget stayed blocked, and a polite
    consumer of a queue across waited for as long. Now what such a consumer holds unsent
    goes back to its queue, once its queue holds no credit for it, and it asks for no more
    while its client reads nothing: the polite one is served, and nothing is lost or
    duplicated, pre-settled or not."""
    worker = Worker(2, UNLIMITED_IMPORT_ROOM, ack_required)
    stuck, polite = worker.links
    stuck_session, polite_session = worker.sessions
    worker.publish(0, 60)
    stuck_session.client_flow(stuck, 0, 1000, False, False)
    for _ in range(3):
        worker.flush()
        worker.up()
        worker.arrive()
    # Its client read a few, then closed its window: a batch waits in its session.
    worker.read(0, read_before)
    stuck_session.remote_incoming_window = 0
    assert stuck.waiting
    assert worker.server.imported
    # The budget blocks with the imports' part full of what the stuck one holds.
    worker.flush_blocked(0)
    worker.publish(1, 2)
    polite_session.client_flow(polite, 0, 100, False, False)
    assert worker.asked() == []
    assert polite_session.waiting in worker.server.starved
    # The next flush looks at who holds the part: the stuck link is taken back...
    worker.flush_blocked(0)
    assert stalled(stuck)
    for _ in range(3):
        worker.up()
        worker.arrive()
    # ... and what it held unsent went back to its queue, charged nowhere here.
    assert not stuck.waiting
    assert worker.server.imported == 0
    assert stuck_session.pending_imported == 0
    # The room it left goes to the one that waited, not back to the stuck one.
    worker.flush_blocked(IMPORT_BATCH)
    for _ in range(3):
        worker.up()
        worker.arrive()
        worker.read(1, 1 << 20)
        worker.flush_blocked(IMPORT_BATCH)
    assert worker.received[1] == [body(1, 0), body(1, 1)]
    assert not stuck.waiting
    assert stuck not in worker.server.holding
    # Its client reads again once the budget lets go: every message arrives once, in order.
    worker.cap = UNLIMITED_IMPORT_ROOM
    worker.flush()
    assert not stalled(stuck)
    worker.quiesce()
    assert worker.received[0] == [body(0, n) for n in range(60)]
    assert worker.server.total == 0


def test_a_stalled_consumer_asks_again_once_its_client_opens_its_window() -> None:
    worker = Worker(2, UNLIMITED_IMPORT_ROOM)
    stuck, polite = worker.links
    stuck_session, polite_session = worker.sessions
    worker.publish(0, 30)
    stuck_session.client_flow(stuck, 0, 1000, False, False)
    worker.flush()
    worker.up()
    worker.arrive()
    assert stuck.waiting
    worker.flush_blocked(0)
    polite_session.client_flow(polite, 0, 10, False, False)
    worker.flush_blocked(0)
    for _ in range(3):
        worker.up()
        worker.arrive()
    assert stalled(stuck)
    assert not stuck.waiting
    # Still blocked, its window closed: a pump asks for nothing.
    worker.read(0, 0)
    assert worker.asked() == []
    # Its client opens its window: it asks again, within the room the budget leaves.
    worker.flush_blocked(IMPORT_BATCH)
    worker.read(0, 1 << 20)
    assert not stalled(stuck)
    assert worker.asked()
    for _ in range(4):
        worker.flush_blocked(IMPORT_BATCH)
        worker.up()
        worker.arrive()
        worker.read(0, 1 << 20)
    assert worker.received[0] == [body(0, n) for n in range(len(worker.received[0]))]
    assert worker.received[0]


def test_credit_waiting_on_empty_queues_is_lent_to_a_consumer_with_messages_and_goes_quiet() -> (
    None
):
    """Consumers waiting with credit on empty queues across hold reservations, not bytes: a
    fresh link's is a whole batch, so two of them took the imports' part and a consumer of a
    queue with messages got none while the budget stayed blocked
    (``test_margin_parts.py``). Now their credit is taken back when another waits, and they
    ask again behind it; and since lending makes no one else lend, the channel goes quiet
    rather than passing the part round for ever."""
    worker = Worker(4, UNLIMITED_IMPORT_ROOM)
    *idle, wanting = worker.links
    part = 2 * import_unit(idle[0])
    worker.flush_blocked(part)
    for link, session in zip(worker.links[:3], worker.sessions[:3], strict=True):
        session.client_flow(link, 0, 100, False, False)
    for _ in range(3):
        worker.flush_blocked(part - worker.server.reserved)
        worker.up()
        worker.arrive()
    assert worker.server.reserved >= part
    assert sum(1 for link in idle if link.reserved) == 2
    worker.publish(3, 3)
    worker.sessions[3].client_flow(wanting, 0, 10, False, False)
    # Lent as far as the waiting one needs: a fresh link asks for its one delivery within any
    # room, so one idle link lends, not every one.
    worker.flush_blocked(part - worker.server.reserved)
    assert sum(1 for link in idle if link.preempted) == 1
    rounds = 0
    while len(worker.received[3]) < 3:
        rounds += 1
        assert rounds < 20, "the consumer with messages was never served"
        worker.flush_blocked(part - worker.server.reserved)
        worker.up()
        worker.arrive()
        worker.read(3, 1 << 20)
    assert worker.received[3] == [body(3, n) for n in range(3)]
    # Nothing new happens: within a few passes no frame crosses any more.
    for _ in range(6):
        worker.flush_blocked(part - worker.server.reserved)
        worker.up()
        worker.arrive()
    worker.flush_blocked(part - worker.server.reserved)
    assert worker.remote.outgoing == []
    assert worker.server.reserved <= part
    # The budget lets go: the idle ones still get what is published for them, once.
    worker.publish(0, 2)
    worker.cap = UNLIMITED_IMPORT_ROOM
    worker.flush()
    worker.quiesce()
    assert worker.received[0] == [body(0, 0), body(0, 1)]


RECLAIM_STEP = st.one_of(
    st.tuples(st.just("publish"), st.integers(0, 3), st.integers(1, 12)),
    st.tuples(st.just("large"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("up"), st.just(0), st.just(0)),
    st.tuples(st.just("arrive"), st.just(0), st.just(0)),
    st.tuples(st.just("read"), st.integers(0, 3), st.integers(0, 8)),
    st.tuples(st.just("close"), st.integers(0, 3), st.just(0)),
    st.tuples(st.just("credit"), st.integers(0, 3), st.integers(0, 40)),
    st.tuples(st.just("flush"), st.just(0), st.just(0)),
    st.tuples(st.just("blocked"), st.integers(0, 3), st.just(0)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(RECLAIM_STEP, min_size=30, max_size=80), st.booleans())
def test_whatever_is_given_back_or_lent_every_message_arrives_once_in_order(
    steps: list[tuple[str, int, int]], ack_required: bool
) -> None:
    """Clients that close their windows, grant and take back credit, while the budget blocks
    and lets go: what stalled links give back and idle links lend never loses, duplicates or
    reorders a message, and the counts stay true (``reclaim`` in session/outbound.py)."""
    worker = Worker(4, UNLIMITED_IMPORT_ROOM, ack_required)
    # Every queue has messages, and every link a batch on its way or waiting.
    for consumer, (link, session) in enumerate(zip(worker.links, worker.sessions, strict=True)):
        worker.publish(consumer, 20)
        session.client_flow(link, 0, 10, False, False)
    worker.up()
    worker.arrive()
    for kind, a, b in steps:
        if worker.step(kind, a, b):
            pass
        elif kind == "close":
            worker.sessions[a].remote_incoming_window = 0
        elif kind == "credit":
            # The client's credit limit moves on from what it was sent (AMQP 1.0 §2.6.7).
            link = worker.links[a]
            worker.sessions[a].client_flow(
                link, link.client_flow_ctl.delivery_count, b, False, False
            )
        elif kind == "flush":
            worker.flush()
        else:
            worker.flush_blocked(a * import_unit(worker.links[0]) - worker.server.reserved)
        server = worker.server
        assert server.imported == sum(s.pending_imported for s in worker.sessions)
        assert set(server.holding) <= {link for link in worker.links if link.waiting}
        for link in worker.links:
            if link.stalled:
                assert link.held
                assert len(link.waiting) <= 1 or link.credit_req_in_flight
    # The budget lets go and every client reads with credit: each message arrives once.
    for link, session in zip(worker.links, worker.sessions, strict=True):
        session.client_flow(link, link.client_flow_ctl.delivery_count, 10_000, False, False)
    worker.cap = UNLIMITED_IMPORT_ROOM
    worker.quiesce()
    for consumer, received in enumerate(worker.received):
        assert received == worker.bodies[consumer]
    assert worker.server.total == 0
    assert not worker.server.stalled
