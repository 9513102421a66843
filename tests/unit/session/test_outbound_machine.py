"""Session + ClassicQueue + Writer under random clients: the dual link's invariants (style §3.4).

The machine plays the client (FLOWs with any credit, drain and echo, sometimes with a stale
delivery-count as when a FLOW crosses transfers on the wire), the publishers (enqueue, routed to
the session), the network (the remote incoming window opens and closes; the writer drains some
bytes), the consumer's settlements and detaches, the dead letters its outcomes make and the
router stores (the connection's dead-letter debt, which holds the links that owe letters at its
limit), and the memory budget blocking and letting go (a pre-settled consumer's deliveries are
then asked for by bytes, session/waiting.py). After every step it checks the bounds the design
promises.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sluicegate.queues.classic import ClassicQueue
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import ConsumerKey, CreditReply, Dispatch, Outcome
from sluicegate.session.dead_letter_debt import DeadLetterDebt
from sluicegate.session.outbound import (
    Action,
    LinkFlow,
    Session,
    TransferPart,
    apply_hold,
    budget_flushed,
    resume,
    route,
)
from sluicegate.session.outgoing_link import OutgoingLink
from sluicegate.session.waiting import (
    IMPORT_BATCH,
    UNLIMITED_IMPORT_ROOM,
    WAITING_DELIVERY_COST,
    Waiting,
)
from sluicegate.wire.amqp_types import Described
from sluicegate.wire.encoding import encode
from sluicegate.wire.serial import serial_diff
from sluicegate.writer.writer import Writer

MAX_QUEUE_CREDIT = 8
MAX_FRAME_SIZE = 512  # 448 payload bytes per frame: messages of 1 to 4 frames
WRITER_CREDIT = 8
WRITER_MORE_AFTER = 4
# A few deliveries' worth: the connection's bound defers credit requests now and then.
WAITING_LIMIT = 3000
# A few rejections' worth of dead letters: the debt holds links now and then.
DEBT_LIMIT = 6


def blocked_batch(link: OutgoingLink) -> int:
    """The most a request of a link whose deliveries no queue counts asks for while the budget
    is blocked: IMPORT_BATCH bytes by its largest delivery, one before it was handed any."""
    return max(1, IMPORT_BATCH // link.largest) if link.largest else 1


class RecordingQueue(ClassicQueue):
    """Counts credit requests per consumer."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.requests: Counter[int] = Counter()
        self.requested: list[tuple[int, int, bool]] = []
        # The consumers' connection, whose blocked budget a request must respect.
        self.waiting: Waiting | None = None

    def credit(
        self, consumer: ConsumerKey, delivery_count: int, credit: int, drain: bool
    ) -> tuple[list[Message], CreditReply]:
        assert isinstance(consumer, OutgoingLink)
        self.requests[id(consumer)] += 1
        self.requested.append((id(consumer), credit, drain))
        waiting = self.waiting
        if consumer.uncounted and credit and waiting is not None and waiting.server.blocked:
            # New bytes into a blocked budget: only as another worker's deliveries are asked.
            assert waiting.may_import(), "asked with the connection holding unsent bytes"
            assert credit <= blocked_batch(consumer), f"{credit} asked for while blocked"
        messages, reply = super().credit(consumer, delivery_count, credit, drain)
        if consumer.held:
            # A held link's every request asks for nothing, and gets nothing.
            assert credit == 0
            assert messages == []
            assert reply.credit == 0
        return messages, reply

    def consumer_credit(self, link: OutgoingLink) -> int:
        """White box: the credit the queue holds for a consumer."""
        return self._consumers.by_key[link].credit

    def unacked_of(self, link: OutgoingLink) -> set[int]:
        """White box: what a consumer holds unsettled inside the queue."""
        return set(self._consumers.by_key[link].unacked)


class SpySession(Session):
    """Counts the credit replies the session has handled, per link."""

    def __init__(self, writer: Writer) -> None:
        super().__init__(
            writer,
            max_queue_credit=MAX_QUEUE_CREDIT,
            max_frame_size=MAX_FRAME_SIZE,
            remote_incoming_window=0,
            waiting=Waiting(WAITING_LIMIT),
        )
        self.replies: Counter[int] = Counter()

    def _credit_reply(self, link: OutgoingLink, reply: CreditReply, out: list[Action]) -> None:
        self.replies[id(link)] += 1
        super()._credit_reply(link, reply, out)


@dataclass
class ClientLink:
    """What the client knows of one of its receiving links, in unbounded integers."""

    link: OutgoingLink
    ack_required: bool
    # Transfers received plus delivery-count advances announced by drained FLOWs.
    consumed: int = 0
    # consumed as of the last FLOW received from the session (stale FLOWs go back to here).
    consumed_at_last_flow: int = 0
    # The highest delivery-count + link-credit any of the client's FLOWs granted.
    max_limit: int = 0
    latest_limit: int = 0
    latest_drain: bool = False
    latest_echo: bool = False
    # Set once the session answered the latest FLOW's drain or echo with a FLOW.
    answered: bool = True
    # Set when a drain completed and no newer FLOW came: nothing may be sent any more.
    closed: bool = False
    last_action: Action | None = None
    outstanding: set[int] = field(default_factory=set)


def _payload(i: int, size: int) -> bytes:
    return encode(Described(0x77, f"m{i}:" + "x" * size))


credit_values = st.one_of(
    st.integers(min_value=0, max_value=3),
    st.integers(min_value=4, max_value=40),
    st.just(2_000_000_000),
)


slots = st.integers(min_value=0, max_value=2)  # up to three consumer links at a time


class SessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = RecordingQueue("q")
        self.writer = Writer(initial_credit=WRITER_CREDIT, more_credit_after=WRITER_MORE_AFTER)
        self.session = SpySession(self.writer)
        self.queue.waiting = self.session.waiting
        self.clients: dict[int, ClientLink] = {}
        self.slots: list[OutgoingLink | None] = [None, None, None]
        self.next_handle = 0
        self.enqueued = 0
        self.archived = 0  # accepted or rejected by the client, or sent in settled mode
        self.archived_seqs: set[int] = set()
        # The message whose parts are on the wire, and where its next part must start.
        self.partial: tuple[OutgoingLink, Message, int] | None = None
        self.debt = DeadLetterDebt(DEBT_LIMIT)
        # What each link owes in dead letters, and the deliveries the queue may still hand a
        # held link: the credit it held when the link was held, which it is to take back.
        self.owed: Counter[int] = Counter()
        self.allowance: dict[int, int] = {}

    # -- helpers --

    def live(self) -> list[ClientLink]:
        return [c for c in self.clients.values() if not c.link.detached]

    def client_of(self, link: OutgoingLink) -> ClientLink:
        return self.clients[id(link)]

    def route(self, dispatches: list[Dispatch]) -> None:
        for key, _ in dispatches:
            assert isinstance(key, OutgoingLink)
            if key.held:
                self.allowance[id(key)] -= 1
                assert self.allowance[id(key)] >= 0, "a held link was handed a new delivery"
        touched = route(dispatches)
        assert touched <= {self.session}

    def apply_hold(self) -> None:
        """What the gateway does when a cause says the hold changed (gateway/sending.py)."""
        for held in self.debt.to_hold():
            self.allowance[id(held)] = self.queue.consumer_credit(held)
        assert apply_hold(self.debt) <= {self.session}
        for slot in self.slots:
            if slot is not None and not slot.held:
                self.allowance.pop(id(slot), None)

    def pending_deliveries(self, link: OutgoingLink) -> int:
        assert not link.detached
        count = sum(
            1 for entry_link, item in self.session.outgoing_pending
            if entry_link is link and isinstance(item, Message)
        )  # fmt: skip
        assert count == len(link.waiting)
        return count

    def resume(self) -> None:
        """What the gateway does after a pump or a detach: make the deferred credit requests
        once enough has left."""
        if self.session.waiting.resumable:
            assert resume(self.session.waiting) <= {self.session}

    def quiescent(self, client: ClientLink) -> bool:
        link = client.link
        return (
            not link.credit_req_in_flight
            and link.stashed_credit_req is None
            and self.pending_deliveries(link) == 0
        )

    # -- rules: links --

    @initialize(ack_required=st.booleans())
    def first_link(self, ack_required: bool) -> None:
        self.attach(0, ack_required)

    @rule(slot=slots, ack_required=st.booleans())
    def attach(self, slot: int, ack_required: bool) -> None:
        if self.slots[slot] is not None:
            return
        link = self.session.attach_link(self.next_handle, self.queue, ack_required=ack_required)
        self.next_handle += 1
        self.clients[id(link)] = ClientLink(link, ack_required)
        self.slots[slot] = link

    @rule(slot=slots, now=st.integers(min_value=0, max_value=3))
    def detach(self, slot: int, now: int) -> None:
        link = self.slots[slot]
        if link is None or now:  # detach one time in four: links live long enough to matter
            return
        self.slots[slot] = None
        client = self.client_of(link)
        client.outstanding.clear()  # the queue takes them back (counted as failed)
        self.route(self.session.detach_link(link))
        if self.partial is not None and self.partial[0] is link:
            self.partial = None  # its remaining frames will never come
        # Its entries stay in outgoing_pending until they come up, never to be sent.
        assert not link.waiting
        assert link.handle not in self.session.links
        self.resume()

    # -- rules: the client --

    @rule(
        slot=slots,
        credit=credit_values,
        drain=st.booleans(),
        echo=st.booleans(),
        stale=st.integers(min_value=0, max_value=3),
    )
    def client_flow(self, slot: int, credit: int, drain: bool, echo: bool, stale: int) -> None:
        link = self.slots[slot]
        if link is None:
            self.attach(slot, ack_required=stale % 2 == 0)
            link = self.slots[slot]
            assert link is not None
        client = self.client_of(link)
        # A FLOW may have crossed up to ``stale`` transfers on the wire (but not a FLOW).
        base = max(client.consumed - stale, client.consumed_at_last_flow)
        limit = base + credit
        client.max_limit = max(client.max_limit, limit)
        client.latest_limit = limit
        client.latest_drain = drain
        client.latest_echo = echo
        client.answered = not (drain or echo)
        client.closed = False
        requests_before = self.queue.requests[id(link)]
        in_flight = link.credit_req_in_flight
        waiting = self.session.waiting
        # A drain replaces a deferred request that the budget would not let go now, and is
        # answered at once.
        starved = drain and link in waiting.deferred and link.uncounted and not waiting.may_import()
        self.session.client_flow(link, base & 0xFFFFFFFF, credit, drain, echo)
        # Either exactly one credit request (deferred while the connection's waiting deliveries
        # are over its bound), or (while one is in flight) a stash.
        if in_flight and not starved:
            assert self.queue.requests[id(link)] == requests_before
            assert link.stashed_credit_req is not None
        elif link in waiting.deferred:
            assert self.queue.requests[id(link)] == requests_before
            assert waiting.paused or waiting in waiting.server.starved
        else:
            assert self.queue.requests[id(link)] == requests_before + 1

    @rule(
        slot=slots,
        data=st.data(),
        outcome=st.sampled_from(Outcome),
        delivery_failed=st.booleans(),
    )
    def settle(
        self, slot: int, data: st.DataObject, outcome: Outcome, delivery_failed: bool
    ) -> None:
        link = self.slots[slot]
        if link is None or not self.client_of(link).outstanding:
            return
        client = self.client_of(link)
        seqs = data.draw(st.lists(st.sampled_from(sorted(client.outstanding)), unique=True))
        delivery_failed = delivery_failed and outcome is Outcome.MODIFIED
        for seq in seqs:
            client.outstanding.discard(seq)
            if outcome in (Outcome.ACCEPTED, Outcome.REJECTED):
                self.archived += 1
                self.archived_seqs.add(seq)
        self.route(self.session.settle(link, seqs, outcome, delivery_failed))

    @rule(slot=slots, units=st.integers(min_value=1, max_value=4))
    def dead_letters(self, slot: int, units: int) -> None:
        """The link's outcomes made letters that wait (one unit each, or one per copy)."""
        link = self.slots[slot]
        if link is None:
            return
        self.owed[id(link)] += units
        if self.debt.cause(link).borrow(units):
            self.apply_hold()

    @rule(data=st.data())
    def letters_stored(self, data: st.DataObject) -> None:
        """The router stored some of a link's letters (the link may have detached since)."""
        owing = [cause for cause in self.debt.causes.values() if cause.owed]
        if not owing:
            return
        cause = data.draw(st.sampled_from(owing))
        units = data.draw(st.integers(min_value=1, max_value=cause.owed))
        self.owed[id(cause.link)] -= units
        if cause.repay(units):
            self.apply_hold()

    # -- rules: publishers and the network --

    @rule(count=st.integers(min_value=1, max_value=12), size=st.sampled_from([0, 10, 500, 1300]))
    def enqueue(self, count: int, size: int) -> None:
        for _ in range(count):
            self.route(self.queue.enqueue(Message(_payload(self.enqueued, size))))
            self.enqueued += 1

    @rule(blocked=st.booleans(), full=st.booleans())
    def budget(self, blocked: bool, full: bool) -> None:
        """The gateway's flush finds the memory budget blocked (its imports' part taken, or
        not) or not, and pumps what that touched, then resumes what may go on."""
        server = self.session.waiting.server
        touched = budget_flushed(server, blocked, blocked and full, UNLIMITED_IMPORT_ROOM)
        assert touched <= {self.session}
        self.resume()

    @rule(window=st.sampled_from([0, 1, 2, 5, 20, 1000, 1000]))
    def set_window(self, window: int) -> None:
        self.session.remote_incoming_window = window

    @rule(nbytes=st.one_of(st.none(), st.integers(min_value=0, max_value=3000)))
    def written(self, nbytes: int | None) -> None:
        """The socket took some bytes, or (None) everything proton had."""
        if nbytes is None:
            self.writer.caught_up(0)
        else:
            self.writer.written(nbytes)

    @rule()
    def send_pending(self) -> None:
        self._send_pending()

    @rule(writes=st.booleans())
    def pump(self, writes: bool) -> None:
        """Window wide open; send until nothing moves, the socket keeping up or (not) stalling."""
        self.session.remote_incoming_window = 1000
        for _ in range(100):
            if writes:
                self.writer.caught_up(0)
            if not self._send_pending():
                break

    def _send_pending(self) -> list[Action]:
        window = self.session.remote_incoming_window
        blocked = self.session.writer_credit.blocked
        writer_credit = self.session.writer_credit.credit
        frames_before = self.writer.statistics().frames_pending
        had_delivery = self.session.statistics().pending_deliveries > 0
        closed_before = {id(c.link) for c in self.live() if c.closed}
        out = self.session.send_pending()
        sent = [a for a in out if not isinstance(a, LinkFlow)]
        if window <= 0 or blocked:
            assert sent == [], "a transfer went out with the window closed or the writer blocked"
        elif had_delivery:
            assert sent, "a delivery could go out but send_pending sent nothing"
        # Never more frames than the window and the writer's credit both allow, even for a
        # message of several frames: the rest of it waits in the session, not inside proton.
        frames = self.writer.statistics().frames_pending - frames_before
        assert frames <= max(0, min(window, writer_credit)), f"{frames} frames handed over"
        for action in out:
            if isinstance(action, LinkFlow):
                # Other links' FLOWs may come between the frames of a message, not its own.
                if self.partial is not None:
                    assert self.partial[0] is not action.link, "a FLOW inside its own transfer"
                self.receive_flow(action)
                continue
            if isinstance(action, TransferPart):
                link, message = action.link, action.message
                if self.partial is None:
                    assert action.start == 0
                else:
                    assert self.partial == (link, message, action.start), "parts out of order"
                if action.end < len(message.payload):
                    self.partial = (link, message, action.end)
                    continue
                self.partial = None
            else:
                assert self.partial is None, "a transfer in the middle of another message"
                link, message = action
            assert id(link) not in closed_before, "a transfer after a completed drain"
            self.receive_transfer(link, message)
        # send_pending stops only when nothing is left or a delivery has to wait.
        pending = self.session.outgoing_pending
        if pending:
            _, head = pending[0]
            assert isinstance(head, Message)
            assert self.session.remote_incoming_window <= 0 or self.session.writer_credit.blocked
        # Mark the links whose drain completed: they must now stay silent.
        for client in self.live():
            if self.quiescent(client) and client.latest_drain:
                last = client.last_action
                assert isinstance(last, LinkFlow), f"drain ended without a FLOW: {last!r}"
                assert last.drain
                assert last.link_credit == 0
                assert last.delivery_count == client.link.client_flow_ctl.delivery_count
                client.closed = True
        self.resume()
        return out

    def receive_transfer(self, link: OutgoingLink, message: Message) -> None:
        assert not link.detached
        client = self.client_of(link)
        # Never beyond the credit the client granted (serial arithmetic, unbounded here).
        assert client.consumed < client.max_limit, "a transfer beyond every credit granted"
        client.consumed += 1
        client.last_action = (link, message)
        # Never twice to a client that still holds it, never after it was archived.
        assert message.seq not in self.archived_seqs
        for other in self.clients.values():
            assert message.seq not in other.outstanding
        if client.ack_required:
            client.outstanding.add(message.seq)
        else:
            self.archived += 1
            self.archived_seqs.add(message.seq)

    def receive_flow(self, flow: LinkFlow) -> None:
        link = flow.link
        assert not link.detached
        client = self.client_of(link)
        advance = serial_diff(flow.delivery_count, client.consumed & 0xFFFFFFFF)
        if flow.drain:
            assert flow.link_credit == 0
            assert advance >= 0
        else:
            # An echo reports the count as it is: the client has seen every transfer before it.
            assert advance == 0
        client.consumed += advance
        # A drain never advances the count past what the client granted.
        assert client.consumed <= max(client.max_limit, client.consumed - advance)
        client.consumed_at_last_flow = client.consumed
        client.last_action = flow
        client.answered = True

    # -- invariants --

    @invariant()
    def one_credit_request_in_flight(self) -> None:
        for client in self.live():
            link = client.link
            outstanding = self.queue.requests[id(link)] - self.session.replies[id(link)]
            assert outstanding in (0, 1), f"{outstanding} credit requests in flight"
            # A deferred request is in flight too, but has not reached the queue.
            deferred = link in self.session.waiting.deferred
            assert not (deferred and outstanding)
            assert link.credit_req_in_flight == (outstanding == 1 or deferred)

    @invariant()
    def queue_credit_bounded(self) -> None:
        for client in self.live():
            link = client.link
            assert 0 <= link.queue_flow_ctl.credit <= MAX_QUEUE_CREDIT
            assert self.pending_deliveries(link) <= MAX_QUEUE_CREDIT
            assert self.queue.consumer_credit(link) <= MAX_QUEUE_CREDIT
        assert all(0 <= c <= MAX_QUEUE_CREDIT for _, c, _ in self.queue.requested)

    @invariant()
    def client_view_matches_session(self) -> None:
        for client in self.live():
            ctl = client.link.client_flow_ctl
            assert client.consumed & 0xFFFFFFFF == ctl.delivery_count
            assert client.consumed <= max(client.max_limit, 0)
            if self.quiescent(client):
                # The latest FLOW holds exactly: what is left is what it granted.
                assert client.consumed + ctl.credit == max(client.latest_limit, client.consumed)
                # The queue holds exactly the credit the session thinks it does.
                assert self.queue.consumer_credit(client.link) == client.link.queue_flow_ctl.credit
                # No stall: credit left and messages ready means a request would be under way,
                # unless the link is held for its dead letters.
                if ctl.credit > 0 and not client.link.held:
                    assert self.queue.available == 0, "credit and ready messages, but idle"
                if client.latest_drain or client.latest_echo:
                    assert client.answered, "a drain or echo FLOW went unanswered"

    @invariant()
    def waiting_deliveries_charged(self) -> None:
        """Every delivery waiting is charged, exactly, to its connection; the server's count
        takes only what the held bytes do not count already (an unacked message's bytes, a
        pre-settled one's as a holder of its payload); a pause
        lasts only while they hold more than half the limit."""
        waiting = self.session.waiting
        waiting_now = [
            (link, item)
            for link, item in self.session.outgoing_pending
            if isinstance(item, Message) and not link.detached
        ]
        charged = sum(item.held + WAITING_DELIVERY_COST for _, item in waiting_now)
        # A pre-settled link's plain messages are counted as holders of their payload in the
        # held bytes (session/outbound.py ``_shared``), not again in the server's count.
        counted = sum(
            item.held
            for link, item in waiting_now
            if link.ack_required or (link.shares is not None and type(item) is Message)
        )
        assert self.session.pending_bytes == waiting.bytes == charged
        # The held bytes count each message once: in its queue, or waiting as a holder.
        queued = self.queue._backlog.messages.values()
        holders = [item for link, item in waiting_now if link.shares is not None]
        assert self.queue.held.total == sum(m.held + MESSAGE_OVERHEAD for m in (*queued, *holders))
        assert self.session.pending_server == waiting.server.total == charged - counted
        assert not waiting.resumable, "deferred credit requests with room for them"
        # A deferred request waits for the bytes to go back to half the limit, or, starved, for
        # the budget or the connection's unsent bytes; never for nothing.
        assert waiting.paused or not waiting.deferred or waiting in waiting.server.starved

    @invariant()
    def a_blocked_budget_is_asked_by_bytes(self) -> None:
        """While the budget is blocked, the queue holds for a pre-settled consumer (its
        deliveries may be bytes no queue counts) at most what a request may ask for then,
        once the reply to any request out came back: what it held when the budget blocked
        was taken back."""
        if not self.session.waiting.server.blocked:
            return
        for client in self.live():
            link = client.link
            if link.uncounted and not link.credit_req_in_flight and not link.held:
                assert self.queue.consumer_credit(link) <= blocked_batch(link)

    @invariant()
    def closed_links_stay_silent(self) -> None:
        for client in self.live():
            if client.closed:
                assert self.pending_deliveries(client.link) == 0
                assert self.queue.consumer_credit(client.link) == 0

    @invariant()
    def dead_letter_debt_holds_its_owers(self) -> None:
        """The debt is what the links owe; while it is held every live link owing letters is
        held and its queue, once the reply to any request out came back, holds no credit for
        it; once let go, no link is."""
        debt = self.debt
        assert debt.debt == sum(self.owed.values())
        assert all(cause.owed == self.owed[id(link)] for link, cause in debt.causes.items())
        for client in self.live():
            link = client.link
            cause = debt.causes.get(link)
            if not debt.held:
                assert not link.held
            elif cause is not None and cause.owed:
                assert link.held
            if link.held and not link.credit_req_in_flight:
                assert self.queue.consumer_credit(link) == 0
                assert link.queue_flow_ctl.credit == 0

    @invariant()
    def nothing_lost(self) -> None:
        stats = self.queue.statistics()
        # A detached link's entries stay until they come up; its messages went back.
        settled_buffered = sum(
            1 for link, item in self.session.outgoing_pending
            if isinstance(item, Message) and not link.ack_required and not link.detached
        )  # fmt: skip
        assert stats.published == self.enqueued
        assert stats.ready + stats.unacked + self.archived + settled_buffered == self.enqueued
        for client in self.live():
            if client.ack_required:
                assert client.outstanding <= self.queue.unacked_of(client.link)

    @invariant()
    def writer_ledger_consistent(self) -> None:
        stats = self.writer.statistics()
        credit = self.session.writer_credit
        assert stats.bytes_pending >= 0
        assert credit.credit >= 0, "the session overdrew its writer credit"
        assert credit.credit + credit.acked + stats.frames_pending == WRITER_CREDIT


SessionMachine.TestCase.settings = settings(stateful_step_count=50)
test_outbound_machine = SessionMachine.TestCase


def test_a_message_returned_then_sent_gives_back_what_it_was_charged() -> None:
    """A detach returns deliveries with a raised delivery-count, stamped as they are read, so
    their wire size outgrows their payload: sending them must give back the payload charged,
    not the wire size (found by the machine above once the stamp left the payload)."""
    state = SessionMachine()
    state.first_link(ack_required=False)
    state.client_flow(credit=14, drain=False, echo=False, slot=0, stale=0)
    state.enqueue(count=7, size=0)
    state.enqueue(count=8, size=0)
    state.client_flow(credit=2_000_000_000, drain=False, echo=False, slot=1, stale=0)
    state.pump(writes=True)
    state.detach(now=0, slot=1)
    state.waiting_deliveries_charged()
    state.send_pending()
    state.waiting_deliveries_charged()
    state.teardown()
