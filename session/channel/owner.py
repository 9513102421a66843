"""The owner's side of a channel: remote consumers of this worker's queues.

The queues see a remote consumer as any other consumer key (:class:`RemoteConsumer`); what they
dispatch to one becomes :class:`~.frames.Deliveries` frames instead of entries in a session's
``outgoing_pending``, and the one reply of every credit request follows its deliveries, as it
does locally. Every count crossing the channel goes through the consumer's
:class:`~.ends.QueueEnd` first.

The dead letters a remote consumer's outcomes make here are charged to its
:class:`RemoteLetters`, whose total crosses back as a :class:`~.frames.Letters` frame at the
flush: the consumer's worker charges it to the consumer's link, which its connection's
dead-letter debt holds as it holds a consumer of a local queue (session/dead_letter_debt.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Final, cast

from sluicegate.queues.dead_lettering import DeadLetterRouter
from sluicegate.queues.errors import QueueError
from sluicegate.queues.filters.filter_set import compile_filters
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.held_bytes import HeldBytes, hold_payload, release_payload
from sluicegate.queues.message import Message, send_all
from sluicegate.queues.queue_type import (
    Clock,
    ConsumerOptions,
    Dispatch,
    LockExpired,
    Outcome,
    QueueType,
)
from sluicegate.queues.stream import StreamQueue
from sluicegate.session.channel.codec import DELIVERY_ENTRY_SIZE, ChannelError
from sluicegate.session.channel.ends import QueueEnd
from sluicegate.session.channel.filter_sets import decode_filter_set
from sluicegate.session.channel.frames import (
    NO_BYTE_LIMIT,
    Answer,
    Attach,
    Attached,
    Credit,
    Deliveries,
    Detach,
    Error,
    Frame,
    GiveBack,
    Letters,
    Query,
    QueryOp,
    Settle,
    Settled,
    Short,
)
from sluicegate.session.channel.queries import counts_of, no_counts
from sluicegate.session.waiting import WAITING_DELIVERY_COST
from sluicegate.wire.errors import AmqpError
from sluicegate.wire.serial import SERIAL_MASK, serial_diff

OUTCOMES: Final = {
    Settled.ACCEPTED: Outcome.ACCEPTED,
    Settled.RELEASED: Outcome.RELEASED,
    Settled.REJECTED: Outcome.REJECTED,
    Settled.MODIFIED: Outcome.MODIFIED,
}
# The server's default largest message, until the gateway sets the channel's own.
DEFAULT_MAX_DELIVERIES_SIZE: Final = 8 * 1024 * 1024
# Finds a queue this worker owns by virtual host and name.
FindQueue = Callable[[str, str], QueueType | None]
# A client of another worker used a queue of this one (its x-expires countdown restarts).
UseQueue = Callable[[str, str], None]
# Management on another worker deletes a queue of this one: how many ready messages went.
DeleteQueue = Callable[[str, str], int]
# Management on another worker declares a queue this one owns (the declaration as a Topology
# change): whether it made the queue; an AmqpError refuses it.
DeclareQueue = Callable[[str, str, bytes], bool]
# The dead-letter router of a virtual host here, whose outbox a settlement's letters join.
FindRouter = Callable[[str], DeadLetterRouter | None]
# The outcomes that may make a dead letter (a rejection, a modified one: its delivery limit).
_LETTER_OUTCOMES: Final = frozenset({Settled.REJECTED, Settled.MODIFIED})


def _cost(message: Message) -> int:
    """What a delivery counts against its consumer's byte limit, as its session counts it."""
    return message.read_size() + WAITING_DELIVERY_COST


class RemoteLetters:
    """The letters a remote consumer's outcomes made here and not yet stored, in units
    (queues/dead_lettering.py charges them as it charges a local consumer's link).

    Nothing is held here: each change marks it in ``changed`` and :meth:`Owner.flush` reports
    the total to the consumer's worker, which holds the consumer's link. It lives as long as
    the letters charged to it, beyond the consumer's detach, so that every unit is repaid.
    """

    __slots__ = ("changed", "consumer", "owed")

    def __init__(self, consumer: int, changed: dict[int, RemoteLetters]) -> None:
        self.consumer = consumer
        self.changed = changed
        self.owed = 0

    def borrow(self, units: int) -> bool:
        """Charge ``units``; the hold is the consumer's worker's to apply: always False."""
        self.owed += units
        self.changed[self.consumer] = self
        return False

    def repay(self, units: int) -> bool:
        """Letters worth ``units`` left the outbox; always False, as :meth:`borrow`."""
        if units > self.owed:
            raise ValueError(f"repaying {units} units of a remote consumer's {self.owed}")
        self.owed -= units
        self.changed[self.consumer] = self
        return False


class Outbox:
    """What the owner's queues dispatch to its remote consumers outside a credit request (a
    publish, a settlement), gathered per consumer until :meth:`Owner.flush` frames each run.

    It stands where a local consumer's session stands (``route`` in session/outbound.py hands
    it the messages), so a dispatch finds its way without knowing where its consumer is.
    """

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: dict[RemoteConsumer, list[Message]] = {}

    def deliver(self, link: object, message: Message) -> None:
        """Keep ``message`` for the remote consumer ``link`` until the flush."""
        waiting = self.waiting.get(cast(RemoteConsumer, link))
        if waiting is None:
            self.waiting[cast(RemoteConsumer, link)] = [message]
        else:
            waiting.append(message)


class RemoteConsumer:
    """A consumer across the channel, as its queue knows it.

    ``recent`` keeps the last deliveries sent, and ``counts`` the delivery-count each took the
    consumer to (two deques, not one of pairs: a pair per delivery was an object the collector
    tracks, made for every message crossing, docs/workers.md): the session may hand them back
    unsent when the consumer detaches, or never have seen them (they crossed its DETACH), and
    either way they return as they were, as locally. The session holds at most one batch per
    consumer (``max_queue_credit``, four times that of small messages from another worker's
    queue: session/outbound.py), so its last two requests' credit covers a batch and the
    deliveries that crossed its next request (:meth:`Owner._keep`). ``session`` is the channel's
    :class:`Outbox` and ``detached`` says it is gone, as for a local consumer's link.
    """

    __slots__ = (
        "__weakref__",
        "asked",
        "byte_limit",
        "counts",
        "detached",
        "end",
        "held",
        "letters",
        "queue",
        "recent",
        "rewound",
        "sent_bytes",
        "session",
        "short",
        "vhost",
    )

    def __init__(
        self, end: QueueEnd, vhost: str, queue: QueueType, keep: int, session: Outbox
    ) -> None:
        self.end = end
        self.vhost = vhost
        self.queue = queue
        self.recent: deque[Message] = deque(maxlen=keep)
        self.counts: deque[int] = deque(maxlen=keep)
        # The credit of its last request, which :meth:`Owner._keep` sizes ``recent`` by.
        self.asked = 0
        self.session = session
        self.detached = False
        # What its outcomes' letters owe here, from its first settlement that made one.
        self.letters: RemoteLetters | None = None
        # The bytes sent it (each delivery's payload and WAITING_DELIVERY_COST) and the most
        # its last request lets it be sent (frames.Credit); what the queue gave it past that
        # waits here, in order, and ``short`` says its session was told (frames.Short).
        self.sent_bytes = 0
        self.byte_limit = NO_BYTE_LIMIT
        self.held: deque[Message] = deque()
        self.short = False
        # Deliveries the queue counted that went back to it unsent, beyond the credit of the
        # request that took them back: the queue's delivery-count is the consumer's plus these
        # and those held (serial arithmetic), which :meth:`Owner._credit` translates.
        self.rewound = 0


class Owner:
    """Frames from a channel's session side, applied to this worker's queues.

    ``recent_bytes`` is what the recent deliveries of pre-settled consumers hold: gone from
    their queues, kept only here, so the worker's memory budget counts them (docs/bounds.md).
    They hold their payload as one more copy would (queues/held_bytes.py's ``hold_payload``):
    counted once with the queues' count, by whichever holder came first and until the last
    goes, so only the sum of the two means anything (this one is below zero while it gives
    back payloads a queue counted first, and folded into the queues' count when the channel
    ends).
    ``left`` names the queues whose remote consumers detached since the gateway last took it:
    an auto-delete queue goes, and an x-expires countdown restarts, when its last consumer
    leaves, wherever that consumer was.
    """

    def __init__(
        self,
        find: FindQueue,
        max_queue_credit: int,
        used: UseQueue | None = None,
        *,
        delete: DeleteQueue | None = None,
        declare: DeclareQueue | None = None,
        views: ViewCache | None = None,
        clock: Clock | None = None,
        routers: FindRouter | None = None,
        held: HeldBytes | None = None,
    ) -> None:
        self.find = find
        self.used = used
        self.delete = delete
        self.declare = declare
        self.routers = routers
        # The queues' count of bytes held, which takes what is left of :attr:`recent_bytes`
        # when the channel ends (:meth:`close`).
        self.held = held
        # Remote consumers whose letters' units changed since the last flush, by id.
        self.changed: dict[int, RemoteLetters] = {}
        # What a remote consumer's filters decode messages through, and the time they read:
        # the worker's own, as for its local consumers.
        self.views = views if views is not None else ViewCache()
        self.clock = clock if clock is not None else Clock()
        # What every remote consumer's recent deliveries cover at least (RemoteConsumer).
        self.keep = 2 * max_queue_credit
        # The most payload bytes one DELIVERIES frame carries, with their table: the reader
        # takes a frame of the largest message and FRAME_OVERHEAD (the gateway sets it).
        self.max_deliveries_size = DEFAULT_MAX_DELIVERIES_SIZE
        self.consumers: dict[int, RemoteConsumer] = {}
        self.outbox = Outbox()
        self.recent_bytes = 0
        self.left: list[tuple[str, QueueType]] = []
        # This channel's consumers by queue: one entry per queue they consume from.
        self.attached: dict[QueueType, int] = {}

    def receive(self, frame: Frame) -> tuple[list[Frame], list[Dispatch]]:
        """Apply one frame; the frames to send back (the outbox's deliveries first, so that a
        reply never overtakes them) and the dispatches for this worker's own consumers (a
        settlement or a detach may hand a message to any consumer)."""
        sent = self.flush()
        if type(frame) is Credit:
            frames, local = self._credit(frame)
        elif type(frame) is Settle:
            frames, local = self._settle(frame)
        elif type(frame) is Attach:
            frames, local = self._attach(frame), []
        elif type(frame) is Detach:
            frames, local = self._detach(frame)
        elif type(frame) is GiveBack:
            frames, local = self._give_back(frame)
        elif type(frame) is Query:
            frames, local = [self._answer(frame)], []
        else:
            raise ChannelError(f"a {type(frame).__name__} frame sent to a queue's owner")
        return sent + frames, local

    def flush(self) -> list[Frame]:
        """The outbox's deliveries as frames, one per consumer still attached, then what each
        consumer whose letters changed owes now (one frame each, detached ones included)."""
        waiting = self.outbox.waiting
        frames: list[Frame] = []
        if waiting:
            for key, messages in waiting.items():
                if not key.detached:
                    frames.extend(self._deliveries(key, messages))
            waiting.clear()
        changed = self.changed
        if changed:
            frames.extend(Letters(letters.consumer, letters.owed) for letters in changed.values())
            changed.clear()
        return frames

    def consumers_of(self, queue: QueueType) -> int:
        """How many of this channel's consumers ``queue`` has."""
        return self.attached.get(queue, 0)

    def route(self, dispatches: list[Dispatch]) -> tuple[list[Frame], list[Dispatch]]:
        """Split a queue's dispatches: deliveries frames for this channel's consumers (one per
        run of one consumer's messages), the rest for the worker's sessions."""
        frames: list[Frame] = []
        local: list[Dispatch] = []
        run: list[Message] = []
        current: RemoteConsumer | None = None
        for key, message in dispatches:
            if type(key) is not RemoteConsumer or self.consumers.get(key.end.consumer) is not key:
                local.append((key, message))
                continue
            if key is not current:
                if current is not None:
                    frames.extend(self._deliveries(current, run))
                current, run = key, []
            run.append(message)
        if current is not None:
            frames.extend(self._deliveries(current, run))
        return frames, local

    def close(self) -> list[Dispatch]:
        """The channel ended: every remote consumer detaches, nothing it held sent on."""
        dispatches: list[Dispatch] = []
        for consumer in list(self.consumers):
            # The session's worker is gone and cannot say what reached its clients: all of it
            # counts as sent, so an at-most-once consumer's message is never delivered twice
            # and an unsettled one comes back as after a lost connection.
            seen = self.consumers[consumer].end.delivery_count
            dispatches.extend(self._detach(Detach(consumer, seen))[1])
        self.outbox.waiting.clear()
        if self.held is not None:
            # Every recent delivery is let go: what is left here is what payloads first
            # counted by their queues and given back here took below zero, which the queues'
            # count still holds. Folded into it, the two stay right once this owner is gone.
            self.held.total += self.recent_bytes
            self.recent_bytes = 0
        return dispatches

    # -- frames ---------------------------------------------------------------------------

    def _attach(self, frame: Attach) -> list[Frame]:
        if frame.consumer == 0 or frame.consumer in self.consumers:
            raise ChannelError(f"consumer {frame.consumer} attached twice")
        filters = decode_filter_set(frame.filters)
        queue = self.find(frame.vhost, frame.queue)
        if queue is None:
            return [
                Error(
                    frame.consumer,
                    "amqp:not-found",
                    f"no queue '{frame.queue}' in vhost '{frame.vhost}'",
                )
            ]
        try:
            # As a local attach compiles them (gateway/consumers.py), for the queue here.
            compiled = compile_filters(
                filters,
                self.views,
                self.clock,
                indexes_filter_values=isinstance(queue, StreamQueue),
            )
        except QueueError as error:
            return [Error(frame.consumer, error.condition, str(error))]
        key = RemoteConsumer(
            QueueEnd(frame.consumer, frame.ack_required),
            frame.vhost,
            queue,
            self.keep,
            self.outbox,
        )
        queue.attach(
            key,
            ack_required=frame.ack_required,
            options=ConsumerOptions(
                filter=compiled.filter,
                browse=frame.browse,
                priority=frame.priority,
                offset=filters.offset,
                stream_filter=compiled.stream_filter,
                views=self.views,
            ),
        )
        self.consumers[frame.consumer] = key
        self.attached[queue] = self.attached.get(queue, 0) + 1
        return [Attached(frame.consumer)]

    def _answer(self, frame: Query) -> Answer:
        """A question about a queue here, answered at once: its counts after what it asks."""
        made = 0
        if frame.op is QueryOp.DECLARE_EXCHANGE:
            if self.declare is None:
                raise ChannelError("an exchange declaration sent to a worker that judges none")
            try:
                made = int(self.declare(frame.vhost, frame.queue, frame.declaration))
            except AmqpError:
                return Answer(frame.query, False, 0, counts_of(no_counts(frame.queue)))
            return Answer(frame.query, True, made, counts_of(no_counts(frame.queue)))
        if frame.op is QueryOp.DECLARE:
            if self.declare is None:
                raise ChannelError("a declaration sent to an owner that declares no queue")
            try:
                made = int(self.declare(frame.vhost, frame.queue, frame.declaration))
            except AmqpError:
                # Refused as the asker would have refused it (it checked first): not found.
                return Answer(frame.query, False, 0, counts_of(no_counts(frame.queue)))
        queue = self.find(frame.vhost, frame.queue)
        if queue is None:
            return Answer(frame.query, False, 0, counts_of(no_counts(frame.queue)))
        purged = made
        if frame.op is QueryOp.DELETE:
            if self.delete is None:
                raise ChannelError("a deletion asked of an owner that deletes no queue")
            purged = self.delete(frame.vhost, frame.queue)
            return Answer(frame.query, True, purged, counts_of(no_counts(frame.queue)))
        if frame.op is QueryOp.PURGE:
            purged = queue.purge()
        elif frame.op is QueryOp.STAT and self.used is not None:
            self.used(frame.vhost, frame.queue)
        return Answer(frame.query, True, purged, counts_of(queue.statistics()))

    def _consumer(self, consumer: int) -> RemoteConsumer:
        key = self.consumers.get(consumer)
        if key is None:
            raise ChannelError(f"consumer {consumer} is not attached")
        return key

    def _credit(self, frame: Credit) -> tuple[list[Frame], list[Dispatch]]:
        """Serve a request within its credit and its byte limit.

        The queue counts what waits here, and what went back to it unsent, as delivered: it
        is asked from the consumer's count plus what was rewound, so that its credit leaves
        out what waits, and its reply is told as the consumer's.
        Held deliveries beyond the request's credit go back to the queue, the newest first,
        as never sent (``rewound``); a drain sends what fits and gives back the rest, their
        credit spent as a drain spends it (AMQP 1.0 §2.6.7)."""
        key = self._consumer(frame.consumer)
        end = key.end
        credit = end.granted(frame)
        key.byte_limit = frame.byte_limit
        key.short = False
        self._keep(key, frame.credit)
        held = key.held
        # Counted from the queue's delivery-count less what is held, its credit leaves out
        # what is held: the queue hands out only what the request's credit has room for.
        messages, reply = key.queue.credit(
            key, (frame.delivery_count + key.rewound) & SERIAL_MASK, frame.credit, frame.drain
        )
        # The owner finds its own queues only, and those answer at once.
        assert reply is not None
        frames: list[Frame] = []
        local: list[Dispatch] = []
        excess = len(held) - credit
        if excess > 0:
            key.rewound = (key.rewound + excess) & SERIAL_MASK
            self._take_back(key, excess, frames, local)
        if messages or held:
            frames.extend(self._deliveries(key, messages, short=not frame.drain))
        if frame.drain and held:
            self._take_back(key, len(held), frames, local)
        waiting = len(held)
        delivery_count = (reply.delivery_count - key.rewound - waiting) & SERIAL_MASK
        frames.append(
            end.reply(frame, delivery_count, reply.credit + waiting, reply.available + waiting)
        )
        return frames, local

    def _take_back(
        self, key: RemoteConsumer, count: int, frames: list[Frame], local: list[Dispatch]
    ) -> None:
        """The ``count`` newest held deliveries go back to their queue as never sent."""
        held = key.held
        unsent = [held.pop() for _ in range(count)]
        unsent.reverse()
        if not key.end.ack_required:
            self.recent_bytes -= sum(map(release_payload, unsent))
        more, mine = self.route(key.queue.give_back(key, unsent))
        frames.extend(more)
        local.extend(mine)

    def _settle(self, frame: Settle) -> tuple[list[Frame], list[Dispatch]]:
        key = self._consumer(frame.consumer)
        seqs = key.end.settled(frame)
        errors: list[Frame] = []
        router = None if self.routers is None else self.routers(key.vhost)
        since = 0 if router is None else len(router.outbox)
        try:
            dispatches = key.queue.settle(
                key,
                seqs,
                OUTCOMES[frame.outcome],
                frame.delivery_failed,
                undeliverable_here=frame.undeliverable_here,
                annotations=frame.annotations,
            )
        except LockExpired as error:
            dispatches = error.dispatches
            errors.append(Error(frame.consumer, error.condition, str(error)))
        finally:
            if frame.outcome in _LETTER_OUTCOMES and key.letters is None:
                # Its worker tracks it from this settlement on (remote.py): it hears of it
                # again at its detach at the latest.
                key.letters = RemoteLetters(frame.consumer, self.changed)
            if router is not None and len(router.outbox) > since and key.letters is not None:
                # The letters this settlement made, charged to the consumer as locally
                # (gateway/settling.py); reported at the flush.
                router.blame(since, key.letters)
        frames, local = self.route(dispatches)
        return errors + frames, local

    def _detach(self, frame: Detach) -> tuple[list[Frame], list[Dispatch]]:
        key = self.consumers.pop(frame.consumer, None)
        if key is None:
            return [], []
        wanted = set(frame.unsent)
        seen = frame.delivery_count
        unsent = [
            message
            for count, message in zip(key.counts, key.recent, strict=True)
            if message.seq in wanted or serial_diff(count, seen) > 0
        ]
        held = key.held
        if held:
            unsent.extend(held)
            if not key.end.ack_required:
                self.recent_bytes -= sum(map(release_payload, held))
            held.clear()
        key.detached = True
        if key.letters is not None:
            # The last word on what it owes after its last settlement, so that its worker
            # forgets it once nothing is owed (remote.py).
            self.changed[key.end.consumer] = key.letters
        if not key.end.ack_required:
            self.recent_bytes -= sum(map(release_payload, key.recent))
        key.recent.clear()
        key.counts.clear()
        dispatches = self.route(key.queue.detach(key, unsent))
        left = self.attached[key.queue] - 1
        if left:
            self.attached[key.queue] = left
        else:
            del self.attached[key.queue]
        self.left.append((key.vhost, key.queue))
        return dispatches

    def _give_back(self, frame: GiveBack) -> tuple[list[Frame], list[Dispatch]]:
        """Take back what a consumer's session never sent, the consumer staying: they are the
        last deliveries it was sent (the queue held no credit for it since), so its recent
        deliveries, which cover a batch and what crossed the next request, hold them."""
        key = self.consumers.get(frame.consumer)
        if key is None:
            return [], []
        wanted = set(frame.unsent)
        unsent = [message for message in key.recent if message.seq in wanted]
        return self.route(key.queue.give_back(key, unsent))

    def _keep(self, key: RemoteConsumer, credit: int) -> None:
        """Size ``key``'s recent deliveries for a request of ``credit``: its session holds at
        most what its last request let the queue send and the deliveries that crossed it on
        the one before, so the two requests' credit covers a detach, and never less than
        twice a local batch. A consumer of small messages asks another worker's queue for up
        to four local batches at once (session/outbound.py), one of large ones for a few, so
        each keeps what it may get back, not twice the largest batch of any size: the
        settled or pre-settled messages the deque still references hold their bytes."""
        keep = max(self.keep, key.asked + credit)
        key.asked = credit
        recent = key.recent
        if keep == recent.maxlen:
            return
        drop = len(recent) - keep
        if drop > 0 and not key.end.ack_required:
            self.recent_bytes -= sum(map(release_payload, islice(recent, drop)))
        key.recent = deque(recent, maxlen=keep)
        key.counts = deque(key.counts, maxlen=keep)

    def _deliveries(
        self, key: RemoteConsumer, messages: list[Message], *, short: bool = True
    ) -> list[Frame]:
        """What the queue gave a consumer, after what it held: those within its byte limit
        as DELIVERIES frames (:meth:`_send`), the rest held in order, and its session told
        once (``short``) what the next costs."""
        held = key.held
        if held:
            if not key.end.ack_required:
                self.recent_bytes += sum(map(hold_payload, messages))
            held.extend(messages)
            room = key.byte_limit - key.sent_bytes
            sending: list[Message] = []
            while held and (cost := _cost(held[0])) <= room:
                sending.append(held.popleft())
                room -= cost
            if sending and not key.end.ack_required:
                # No longer held: :meth:`_send` counts them as recent deliveries. Counted in
                # both, each held one stayed in the count for good once sent.
                self.recent_bytes -= sum(map(release_payload, sending))
        else:
            room = key.byte_limit - key.sent_bytes
            fitting = len(messages)
            if room < fitting * (self.max_deliveries_size + WAITING_DELIVERY_COST):
                # Sizes read only where the limit may stop the run.
                for index, message in enumerate(messages):
                    cost = _cost(message)
                    if cost > room:
                        fitting = index
                        break
                    room -= cost
            sending = messages if fitting == len(messages) else messages[:fitting]
            if fitting < len(messages):
                rest = messages[fitting:]
                if not key.end.ack_required:
                    self.recent_bytes += sum(map(hold_payload, rest))
                held.extend(rest)
        frames: list[Frame] = [*self._send(key, sending)] if sending else []
        if held and short and not key.short:
            key.short = True
            frames.append(Short(key.end.consumer, _cost(held[0])))
        return frames

    def _send(self, key: RemoteConsumer, messages: list[Message]) -> list[Deliveries]:
        """A run of one consumer's messages as DELIVERIES frames, each within
        :attr:`max_deliveries_size`: one frame of a credit's worth of large messages would be
        over what the other worker's reader takes, and end the channel."""
        end = key.end
        count = end.delivery_count
        sending = len(messages)
        end.sending(sending)
        # Read first: a stored message may let its body go once sent, and what it holds
        # after that is what stays charged.
        payloads = send_all(messages)
        recent = key.recent
        counts = key.counts
        # The counts each delivery took, in one pass (a run that wraps the serial numbers is
        # rare enough to take one at a time).
        if count + sending <= SERIAL_MASK:
            counts.extend(range(count + 1, count + sending + 1))
        else:
            counts.extend((count + step) & SERIAL_MASK for step in range(1, sending + 1))
        if end.ack_required:
            # Nothing charged: the queue holds them until settled.
            recent.extend(messages)
        else:
            for message in messages:
                if len(recent) == recent.maxlen:
                    self.recent_bytes -= release_payload(recent[0])
                self.recent_bytes += hold_payload(message)
                recent.append(message)
        consumer = end.consumer
        seqs = tuple([message.seq for message in messages])
        payload_bytes = sum(map(len, payloads))
        key.sent_bytes += payload_bytes + sending * WAITING_DELIVERY_COST
        limit = self.max_deliveries_size
        if payload_bytes + sending * DELIVERY_ENTRY_SIZE <= limit:
            # The common case: the run fits one frame.
            return [Deliveries(consumer, seqs, payloads)]
        frames: list[Deliveries] = []
        start = size = 0
        for index, payload in enumerate(payloads):
            cost = len(payload) + DELIVERY_ENTRY_SIZE
            if index > start and size + cost > limit:
                frames.append(Deliveries(consumer, seqs[start:index], payloads[start:index]))
                start, size = index, 0
            size += cost
        frames.append(Deliveries(consumer, seqs[start:], payloads[start:]))
        return frames
