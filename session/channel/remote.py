"""The session's side of a channel: queues another worker owns, as this worker's sessions and
publishers see them (docs/workers.md).

A :class:`RemoteQueue` is a queue type like any other to the session: it takes consumers,
credit requests and settlements, and hands them to its home worker's :class:`Remote` as frames.
It answers a credit request later, never at once: the deliveries, then the one reply, arrive on
the channel and join the session's ``outgoing_pending`` as a local queue's would. Every count
goes through the consumer's :class:`~.ends.SessionEnd`, so the bounds of the local protocol hold
across the channel: one request in flight, nothing beyond the credit granted. The dead letters
a consumer's outcomes make on the owner are reported back (:class:`~.frames.Letters`) and
charged to the consumer's link against its connection's dead-letter debt, as a local queue's
letters are (session/dead_letter_debt.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Final, cast

from sluicegate.queues.errors import (
    AccessRefused,
    NotFound,
    NotImplementedByServer,
    PreconditionFailed,
    QueueError,
    ResourceDeleted,
    ResourceLimitExceeded,
    ResourceLocked,
)
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD
from sluicegate.queues.message import Message, imported
from sluicegate.queues.queue_type import (
    DEFAULT_CONSUMER,
    ConsumerKey,
    ConsumerOptions,
    CreditReply,
    Dispatch,
    Outcome,
    QueueStatistics,
    QueueType,
)
from sluicegate.queues.storage import QueueStore
from sluicegate.session.channel import frames
from sluicegate.session.channel.codec import STAMP_SIZE
from sluicegate.session.channel.ends import Publishes, SessionEnd
from sluicegate.session.channel.filter_sets import encode_filter_set
from sluicegate.session.channel.frames import (
    Answer,
    Attach,
    Attached,
    Confirm,
    Credit,
    Deliveries,
    Detach,
    Error,
    Frame,
    GiveBack,
    Letters,
    Publish,
    QueryOp,
    Settle,
    Settled,
    Short,
    Stamp,
    ranges_of,
)
from sluicegate.session.channel.queries import (
    Asked,
    Questions,
    Reads,
    no_counts,
    statistics_of,
)
from sluicegate.session.dead_letter_debt import DeadLetterDebt
from sluicegate.session.inbound import Unconfirmed
from sluicegate.session.outgoing_link import OutgoingLink
from sluicegate.session.remote_publishers import NO_PUBLISHER
from sluicegate.session.waiting import WAITING_DELIVERY_COST
from sluicegate.wire.errors import AmqpError

# A consumer's connection's dead-letter debt, while its session lives (the gateway's).
DebtOf = Callable[[ConsumerKey], DeadLetterDebt | None]
# The outcomes that may make a dead letter (a rejection, a modified one: its delivery limit).
_LETTER_OUTCOMES: Final = frozenset({Settled.REJECTED, Settled.MODIFIED})

SETTLED: Final = {
    Outcome.ACCEPTED: Settled.ACCEPTED,
    Outcome.RELEASED: Settled.RELEASED,
    Outcome.REJECTED: Settled.REJECTED,
    Outcome.MODIFIED: Settled.MODIFIED,
}
OUTCOMES: Final = {settled: outcome for outcome, settled in SETTLED.items()}
# A filter set's bytes, until the gateway sets the channel's own limit (its largest message):
# the server's default largest message, 8 MiB, beyond any set a local ATTACH may carry
# (max_attach_data_size counts its termini twice: 4 MiB by default).
DEFAULT_MAX_FILTER_SET_SIZE: Final = 8 * 1024 * 1024
# The bytes of dead letters in flight to one owner until the gateway sets the window from its
# budget (gateway/peers.py): a quarter of the margin a 64 MiB budget on 2 workers leaves.
DEFAULT_LETTER_WINDOW: Final = 1024 * 1024
# The refusals an owner may send, by condition, so the publisher or consumer gets the same
# error class (and condition) as from a local queue.
_ERRORS: Final[dict[str, type[QueueError]]] = {
    error.condition: error
    for error in (
        AccessRefused,
        NotFound,
        NotImplementedByServer,
        PreconditionFailed,
        ResourceDeleted,
        ResourceLimitExceeded,
        ResourceLocked,
    )
}


def owner_error(condition: str, description: str) -> AmqpError:
    """The error an owner's refusal stands for (an unknown condition: an internal error)."""
    return _ERRORS.get(condition, AmqpError)(description)


@dataclass(slots=True)
class Owed:
    """A consumer's dead-letter units on the owner as last reported, and the debt they are
    charged to (its connection's, found when it settled)."""

    key: ConsumerKey
    debt: DeadLetterDebt
    units: int = 0


class WorkerDown(ResourceDeleted):
    """The queue's home worker is not serving (it is being restarted): attach again later."""


class Remote:
    """This worker's side of its channel to worker ``home``.

    ``outgoing`` collects the frames to send, in order; the gateway writes them at its flush.
    While the channel is down (``up`` false) nothing is sent: attaches, publishes and questions
    are refused at once, and the consumers the channel had were detached by :meth:`lost`.
    ``reads`` is the worker's management request being answered, shared by all its channels.
    """

    def __init__(
        self,
        home: int,
        reads: Reads | None = None,
        max_filter_set_size: int = DEFAULT_MAX_FILTER_SET_SIZE,
    ) -> None:
        self.home = home
        self.reads = reads if reads is not None else Reads()
        self.questions = Questions()
        self.up = False
        # The largest filter set a consumer's ATTACH carries: the channel's frames hold a
        # message as large as the server takes, so a set as large crosses too.
        self.max_filter_set_size = max_filter_set_size
        # The largest run of publishes one frame carries (payloads and stamps): the gateway
        # sets the server's largest message, so a frame never exceeds what a reader takes.
        self.max_publish_size = max_filter_set_size
        self.outgoing: list[Frame] = []
        # The PUBLISH frame publishes join while it is the last of ``outgoing``, and its bytes.
        self._run: Publish | None = None
        self._run_size = 0
        self.consumers: dict[int, tuple[ConsumerKey, SessionEnd]] = {}
        self.ids: dict[ConsumerKey, int] = {}
        self.next_consumer = 1
        # Publishers' deliveries (the publish path's tokens; None for a dead letter) by id.
        self.publishes: Publishes[object] = Publishes()
        # Dead letters sent and not confirmed yet: each one's bytes by publish id, and their
        # sum, kept within ``letter_window`` (:meth:`letter_fits`). A letter has no publisher
        # whose credit waits for its confirm, so without it a fan-out of letters would make
        # the owner park as many as the letters' queue holds (docs/workers.md).
        self.letter_sizes: dict[int, int] = {}
        self.letters_in_flight = 0
        self.letter_window = DEFAULT_LETTER_WINDOW
        # The most ``letters_in_flight`` has been: what tests hold against the window, in
        # bytes, whenever it was reached (docs/bounds.md).
        self.letters_peak = 0
        # Every message sent and not confirmed yet (letters and publishers' copies): each
        # one's bytes by publish id, and their sum, which this worker's memory budget counts
        # (gateway/peers.py ``Peers.held``). The owner parks them while its budget is blocked
        # and does not count them: counted here, they hold this worker's publishers as their
        # local messages would, so what an owner parks is bounded by the senders' budgets
        # (adversary seed 65401: uncounted, they took an owner to 3.6 times its limit).
        self.sent_sizes: dict[int, tuple[tuple[str, str], int]] = {}
        self.in_flight = 0
        # The same by queue, which weighs its publishers as a local queue's bytes would
        # (gateway/publishing.py): the ones to a queue its owner parks are held first.
        self.in_flight_to: dict[tuple[str, str], int] = {}
        # Finds a consumer's connection's dead-letter debt (gateway/peers.py sets it).
        self.debt_of: DebtOf = lambda key: None
        # Consumers that settled with an outcome that may make letters, while attached or
        # owing: what their owner said they owe.
        self.owed: dict[int, Owed] = {}

    # -- from the sessions ----------------------------------------------------------------

    def attach(self, key: ConsumerKey, attach: Attach) -> None:
        """Start consuming; ``attach.consumer`` is replaced by the id this channel gives."""
        consumer = self.next_consumer
        self.next_consumer += 1
        self.consumers[consumer] = (key, SessionEnd(consumer))
        self.ids[key] = consumer
        self.outgoing.append(
            Attach(
                consumer,
                attach.vhost,
                attach.queue,
                attach.ack_required,
                attach.browse,
                attach.priority,
                attach.filters,
            )
        )

    def credit(self, key: ConsumerKey, delivery_count: int, credit: int, drain: bool) -> None:
        """A session's credit request, sent unless one is in flight (then it is stashed)."""
        consumer = self.ids.get(key)
        if consumer is None:
            return
        end = self.consumers[consumer][1]
        request = end.request(credit, drain, False, delivery_count)
        if request is not None:
            self.outgoing.append(_limited(key, end, request))

    def settle(self, key: ConsumerKey, settle: Settle) -> None:
        """A consumer's settlement of deliveries, by ranges."""
        consumer = self.ids.get(key)
        if consumer is not None:
            if settle.outcome in _LETTER_OUTCOMES and consumer not in self.owed:
                debt = self.debt_of(key)
                if debt is not None:
                    self.owed[consumer] = Owed(key, debt)
            self.outgoing.append(
                Settle(
                    consumer,
                    settle.outcome,
                    settle.ranges,
                    settle.delivery_failed,
                    settle.undeliverable_here,
                    settle.annotations,
                )
            )

    def detach(self, key: ConsumerKey, unsent: Iterable[int]) -> None:
        """The consumer is gone; ``unsent`` are the sequence numbers its session never sent."""
        consumer = self.ids.pop(key, None)
        if consumer is None:
            return
        _, end = self.consumers.pop(consumer)
        self.outgoing.append(Detach(consumer, end.delivery_count, tuple(unsent)))

    def give_back(self, key: ConsumerKey, unsent: Iterable[int]) -> None:
        """The consumer's session hands back ``unsent``, staying attached (frames.GiveBack)."""
        consumer = self.ids.get(key)
        if consumer is not None:
            self.outgoing.append(GiveBack(consumer, tuple(unsent)))

    def publish(
        self,
        token: object,
        vhost: str,
        queue: str,
        exchange: str,
        routing_key: str,
        payload: bytes,
        stamp: Stamp,
        publisher: int = NO_PUBLISHER,
    ) -> bool:
        """Send a message to a queue there; False (nothing sent) while the channel is down.
        ``publisher`` numbers the link it was published on (``IncomingLink.serial``).

        It joins the last frame to send when that is a run to the same queue, exchange and
        routing key from the same publisher with room for it (at most :attr:`max_publish_size`
        bytes: a frame the owner's reader takes), so a flush's publishes cross as few frames.
        """
        if not self.up:
            return False
        publish = self.publishes.sent(token)
        if token is None:
            self.letter_sizes[publish] = len(payload)
            self.letters_in_flight += len(payload)
            if self.letters_in_flight > self.letters_peak:
                self.letters_peak = self.letters_in_flight
        held = len(payload) + MESSAGE_OVERHEAD
        to = (vhost, queue)
        self.sent_sizes[publish] = (to, held)
        self.in_flight += held
        self.in_flight_to[to] = self.in_flight_to.get(to, 0) + held
        outgoing = self.outgoing
        run = self._run
        size = len(payload) + STAMP_SIZE
        if (
            run is not None
            and outgoing
            and outgoing[-1] is run
            and run.queue == queue
            and run.routing_key == routing_key
            and run.exchange == exchange
            and run.vhost == vhost
            and run.letters == (token is None)
            and run.publisher == publisher
            and self._run_size + size <= self.max_publish_size
        ):
            run.payloads.append(payload)
            run.stamps.append(stamp)
            self._run_size += size
            return True
        run = self._run = Publish(
            publish,
            vhost,
            queue,
            exchange,
            routing_key,
            [payload],
            [stamp],
            token is None,
            publisher,
        )
        self._run_size = size
        outgoing.append(run)
        return True

    def ask(self, op: QueryOp, vhost: str, queue: str, declaration: bytes = b"") -> Asked:
        """Ask the owner about one of its queues (joining the same count if it is out)."""
        if not self.up:
            return Asked(f"queue '{queue}' lives on worker {self.home}, which is not serving")
        asked, query = self.questions.ask(op, vhost, queue, declaration)
        if query is not None:
            self.outgoing.append(query)
        return asked

    # -- from the owner -------------------------------------------------------------------

    def answered(self, frame: Answer) -> Asked:
        """The owner's answer to a question; one nobody asked ends the channel."""
        return self.questions.answered(frame)

    def delivered(self, frame: Deliveries) -> tuple[ConsumerKey, list[Message]] | None:
        """Deliveries for a consumer, as a local queue's batch for it: the consumer and its
        messages in order (its session takes them at once: ``Session.deliver_all``); None for
        a consumer detached since (the owner takes them back: frames.Detach)."""
        held = self.consumers.get(frame.consumer)
        if held is None:
            return None
        key, end = held
        count = len(frame.seqs)
        end.delivered(count, sum(map(len, frame.payloads)) + count * WAITING_DELIVERY_COST)
        return key, imported(frame.seqs, frame.payloads)

    def shorted(self, frame: Short) -> tuple[ConsumerKey, int] | None:
        """The owner holds back a consumer's deliveries past its byte limit: the consumer and
        what the next one costs (None for a consumer detached since)."""
        held = self.consumers.get(frame.consumer)
        return None if held is None else (held[0], frame.size)

    def replied(self, frame: frames.CreditReply) -> tuple[ConsumerKey, CreditReply] | None:
        """The reply to a consumer's request, for its session; the stashed request goes out."""
        held = self.consumers.get(frame.consumer)
        if held is None:
            return None
        key, end = held
        stashed = end.replied(frame)
        if stashed is not None:
            self.outgoing.append(_limited(key, end, stashed))
        return key, CreditReply(frame.delivery_count, frame.credit, frame.available, frame.drain)

    def letters(self, frame: Letters) -> DeadLetterDebt | None:
        """What a consumer owes on the owner now: the change is charged to its link; the debt
        whose hold changed, for the gateway to apply (None if none did).

        A consumer is tracked from its first such settlement until, detached, its owner says
        it owes nothing (the owner reports at its detach: owner.py); one whose debt was not
        found at that settlement is charged nothing.
        """
        owed = self.owed.get(frame.consumer)
        if owed is None:
            return None
        change = frame.owed - owed.units
        owed.units = frame.owed
        cause = owed.debt.cause(cast(OutgoingLink, owed.key))
        toggled = (
            cause.borrow(change) if change > 0 else cause.repay(-change) if change < 0 else False
        )
        if not owed.units and frame.consumer not in self.consumers:
            del self.owed[frame.consumer]
        return owed.debt if toggled else None

    def attached(self, frame: Attached) -> ConsumerKey | None:
        """The owner took a consumer: the key whose ATTACH its session answers now (None for
        one detached since)."""
        held = self.consumers.get(frame.consumer)
        return None if held is None else held[0]

    def refused(self, frame: Error) -> ConsumerKey | None:
        """The owner ended a consumer (its queue is gone, an attach it refused): the key to
        detach with the owner's error."""
        consumer = frame.consumer
        held = self.consumers.pop(consumer, None)
        if held is None:
            return None
        self.ids.pop(held[0], None)
        owed = self.owed.get(consumer)
        if owed is not None and not owed.units:
            # No Detach follows, so no last report: what it owes from here is not charged.
            del self.owed[consumer]
        return held[0]

    def confirmed(self, frame: Confirm) -> list[object]:
        """The publish tokens ``frame`` settles; the letters among them leave the window."""
        tokens = self.publishes.confirmed(frame)
        letters = self.letter_sizes
        sizes = self.sent_sizes
        by_queue = self.in_flight_to
        for publish in range(frame.first, frame.last + 1):
            sent = sizes.pop(publish, None)
            if sent is not None:
                to, held = sent
                self.in_flight -= held
                left = by_queue[to] - held
                if left:
                    by_queue[to] = left
                else:
                    del by_queue[to]
            if letters:
                self.letters_in_flight -= letters.pop(publish, 0)
        return tokens

    def letter_fits(self, size: int, planned: int = 0) -> bool:
        """Whether a dead letter's copy of ``size`` bytes may be sent now, after ``planned``
        bytes of copies about to go: within the window, or alone in it (a copy larger than
        the window still goes, one at a time)."""
        in_flight = self.letters_in_flight + planned
        return in_flight == 0 or in_flight + size <= self.letter_window

    # -- the channel ----------------------------------------------------------------------

    def opened(self) -> None:
        """A channel to the home worker serves (again)."""
        self.up = True

    def lost(self) -> tuple[list[ConsumerKey], list[object]]:
        """The channel ended: the consumers to detach and the publishes to release.

        The owner's worker died; its log keeps what it confirmed, and whatever it had not
        confirmed is released to the publisher, who may send it again.
        """
        self.up = False
        self.outgoing.clear()
        self.questions.lost(f"worker {self.home}, where the queue lives, ended")
        keys = [key for key, _ in self.consumers.values()]
        self.consumers.clear()
        self.ids.clear()
        self.letter_sizes.clear()
        self.letters_in_flight = 0
        self.sent_sizes.clear()
        self.in_flight = 0
        self.in_flight_to.clear()
        return keys, self.publishes.lost()

    def forgive(self) -> list[DeadLetterDebt]:
        """The channel ended: the letters its owner made for our consumers went with it, and
        what they owed is repaid; the debts whose hold changed."""
        toggled: dict[DeadLetterDebt, None] = {}
        for owed in self.owed.values():
            if owed.units and owed.debt.cause(cast(OutgoingLink, owed.key)).repay(owed.units):
                toggled[owed.debt] = None
        self.owed.clear()
        return list(toggled)


def _limited(key: ConsumerKey, end: SessionEnd, request: Credit) -> Credit:
    """``request`` with its byte limit (frames.Credit): what arrived and what the consumer's
    session reserved for what may still come, as it leaves (a stashed request's reservation
    may have changed since it was made)."""
    if type(key) is not OutgoingLink:
        return request
    return replace(request, byte_limit=end.arrived + key.reserved)


def letters_fitting(targets: Sequence[QueueType], size: int) -> int:
    """How many of ``targets``, in their order, may take a dead letter's copy of ``size``
    bytes now. A copy to another worker's queue joins its channel's window, so a letter to
    many of them goes in groups that fit the window (a copy larger than it alone), the rest
    waiting for the owner's confirms (docs/workers.md): sent all at once, a letter of 70 KB
    to 50 queues took its sender 3.5 MB past a 1 MiB window (adversary seed 69004)."""
    planned: dict[Remote, int] = {}
    for index, queue in enumerate(targets):
        if type(queue) is RemoteQueue:
            remote = queue.remote
            before = planned.get(remote, 0)
            if not remote.letter_fits(size, before):
                return index
            planned[remote] = before + size
    return len(targets)


class RemoteQueue:
    """A queue worker ``remote.home`` owns, as this worker's sessions and publishers see it.

    It holds no message: statistics are the owner's to report (:meth:`statistics` reads zeros,
    so that one scrape adds up), and it is never stored here. Management reads the owner's
    figures (:meth:`owner_statistics`) and purges through the owner, within a request
    (queries.py's ``Figures``).
    """

    # A session counts a delivery's bytes in the budget of its own worker: nothing here
    # counts them (session/outgoing_link.py).
    counts_unacked = False
    # Its deliveries and reply come a round trip after a credit request: the session asks
    # for the next batch before this one has left (session/outbound.py ``attach_link``).
    answers_later = True

    def __init__(self, name: str, vhost: str, remote: Remote) -> None:
        self.name = name
        self.vhost = vhost
        self.remote = remote

    def attach(
        self,
        consumer: ConsumerKey,
        *,
        ack_required: bool,
        options: ConsumerOptions = DEFAULT_CONSUMER,
    ) -> None:
        """Consume across the channel; refused while the home worker is down. The consumer's
        filter set and stream offset cross as it was read (``options.filter_set``), and the
        owner compiles them as a local attach would (docs/workers.md)."""
        if not self.remote.up:
            raise WorkerDown(
                f"queue '{self.name}' lives on worker {self.remote.home}, which is restarting"
            )
        filters = options.filter_set
        carried = (
            b"" if filters is None else encode_filter_set(filters, self.remote.max_filter_set_size)
        )
        self.remote.attach(
            consumer,
            Attach(
                0, self.vhost, self.name, ack_required, options.browse, options.priority, carried
            ),
        )

    def detach(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        self.remote.detach(consumer, [message.seq for message in unsent])
        return []

    def give_back(self, consumer: ConsumerKey, unsent: list[Message]) -> list[Dispatch]:
        self.remote.give_back(consumer, [message.seq for message in unsent])
        return []

    def credit(
        self, consumer: ConsumerKey, delivery_count: int, credit: int, drain: bool
    ) -> tuple[list[Message], CreditReply | None]:
        self.remote.credit(consumer, delivery_count, credit, drain)
        return [], None

    def enqueue(self, message: Message) -> list[Dispatch]:
        """A copy routed here by this worker outside a publisher's link (a dead letter): sent
        with nobody waiting for its confirm but the window (:meth:`Remote.letter_fits`), or
        refused while the home worker is down, so that the letter is dropped or, at least
        once, sent again, rather than lost unseen."""
        if not self.publish(None, message):
            raise WorkerDown(
                f"queue '{self.name}' lives on worker {self.remote.home}, which is restarting"
            )
        return []

    def publish(self, token: object, message: Message, publisher: int = NO_PUBLISHER) -> bool:
        """Send a publisher's copy; ``token`` comes back confirmed once the owner stored it.
        False while the home worker is down. A publisher's delivery names its link, which the
        owner charges what it stores to (session/remote_publishers.py); an HTTP publish names
        its client's ``publisher``, and a letter (no token) none."""
        if type(token) is Unconfirmed:
            publisher = token.link.serial
        return self.remote.publish(
            token,
            self.vhost,
            self.name,
            message.exchange,
            message.routing_key,
            message.read(),
            (message.expires, message.read_header(), message.delivery_count),
            publisher,
        )

    def settle(
        self,
        consumer: ConsumerKey,
        seqs: list[int],
        outcome: Outcome,
        delivery_failed: bool,
        *,
        undeliverable_here: bool = False,
        annotations: bytes | None = None,
    ) -> list[Dispatch]:
        self.remote.settle(
            consumer,
            Settle(
                0,
                SETTLED[outcome],
                ranges_of(seqs),
                delivery_failed,
                undeliverable_here,
                annotations,
            ),
        )
        return []

    def purge(self) -> int:
        """Purged by its owner: asked within a management request, whose next run reads the
        count the owner purged (0 until then, and outside a request)."""
        figures = self.remote.reads.current
        if figures is None:
            return 0
        key = (self.vhost, self.name, "purge")
        asked = figures.asked.get(key)
        if asked is None:
            figures.asked[key] = self.remote.ask(QueryOp.PURGE, self.vhost, self.name)
            return 0
        return 0 if asked.answer is None else asked.answer.purged

    def owner_statistics(self) -> QueueStatistics:
        """The owner's counts, as the management request being answered asked them (zeros
        until answered, and outside a request)."""
        figures = self.remote.reads.current
        if figures is None:
            return no_counts(self.name)
        key = (self.vhost, self.name, "counts")
        asked = figures.asked.get(key)
        if asked is None:
            figures.asked[key] = self.remote.ask(QueryOp.COUNTS, self.vhost, self.name)
        elif asked.answer is not None:
            return statistics_of(self.name, asked.answer.counts)
        return no_counts(self.name)

    def used(self) -> None:
        """A client used the queue here (redeclared it, read its stat): its owner restarts its
        x-expires countdown, as for a use there. Its answer is the request's counts."""
        figures = self.remote.reads.current
        key = (self.vhost, self.name, "counts")
        if figures is not None and key in figures.asked:
            return
        asked = self.remote.ask(QueryOp.STAT, self.vhost, self.name)
        if figures is not None:
            figures.asked[key] = asked

    def expire(self) -> list[Dispatch]:
        return []

    def next_deadline(self) -> int | None:
        return None

    def in_flight(self) -> int:
        """Bytes sent to it and not confirmed yet, which this worker's budget counts."""
        return self.remote.in_flight_to.get((self.vhost, self.name), 0)

    def statistics(self) -> QueueStatistics:
        """Zeros: the owner reports the queue's counts, and one scrape adds them up."""
        return no_counts(self.name)

    def attach_store(self, store: QueueStore) -> None:
        """Its messages are logged by its owner."""

    def restore(self, store: QueueStore) -> None:
        """Recovered by its owner."""

    def persists(self, message: Message) -> bool:
        return False

    def as_stored(self, message: Message) -> Message:
        return message


def management_statistics(queue: QueueType) -> QueueStatistics:
    """A queue's counts as management shows them: for a stand-in, its owner's (asked within the
    request being answered)."""
    return queue.owner_statistics() if type(queue) is RemoteQueue else queue.statistics()
