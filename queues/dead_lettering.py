"""Dead-lettering: the messages a queue gives up on, routed to its dead-letter exchange.

A queue hands each message it gives up on (rejected, expired, past its delivery limit, pushed
out by overflow) to its :class:`DeadLetterer`, which puts a :class:`DeadLetter` in the server's
outbox when the queue has ``x-dead-letter-exchange``, or drops it. The registry's
:class:`DeadLetterRouter` empties the outbox, a bounded batch a call (what a queue that
dead-letters at once, x-message-ttl 0, feeds back waits for the next call): each copy carries the
death in its message annotations (``x-opt-deaths``) and goes to the queues the dead-letter
exchange routes it to, unless that closes a loop of automatic deaths (RabbitMQ 4's rule). A
persistent copy for a durable queue is logged by an explicit call to the store before the queue
takes it.

A message on its way to the dead-letter exchange keeps its place in its queue (its
:class:`Holder`), unsettled, and leaves only once its copies are stored, so its settlement is
logged after them. Each dead letter is routed on its own: one that fails (a step the door's
validation should have made impossible) stays where it was, with its expiry, neither delivered
nor dead-lettered again, and is recorded once in :attr:`DeadLetterRouter.failures` with its
queue and id for the gateway to log; the rest of the batch goes on.

A letter a consumer's outcome made (``rejected``, ``modified`` undeliverable, its delivery
limit) is work that consumer caused: :meth:`DeadLetterRouter.blame` charges it to the
consumer's :class:`Cause` (its link's share of its connection's dead-letter debt,
session/dead_letter_debt.py), one unit while its copies are not known and one per copy once a
full budget makes them wait, repaid when it leaves the outbox, as a publisher's routed copies
are (docs/bounds.md). Letters of expiry have no client cause, nor have the delivery-limit
letters of deliveries a consumer left unsettled as its link detached or its connection closed
(QueueType.detach): their cause is gone, so they are the memory budget's alone, like every
letter: copies only within its room, the rest waiting with their messages held in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, NamedTuple, Protocol

from sluicegate.queues.errors import NotFound
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD, HeldBytes
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock, Dispatch, QueueType
from sluicegate.queues.topology_log import TopologyLog
from sluicegate.wire.deaths import Death, record_death
from sluicegate.wire.errors import AmqpError
from sluicegate.wire.sections import head_size

# Dead-letter reasons, as RabbitMQ names them in x-death / x-opt-deaths.
REJECTED: Final = "rejected"
EXPIRED: Final = "expired"
DELIVERY_LIMIT: Final = "delivery_limit"
MAXLEN: Final = "maxlen"

# Dead letters one pass of the reactor routes: the rest wait for the next pass, after other
# clients' events. A pass does at most this many routings and record_death calls, whatever the
# topology or a queue that dead-letters what it takes at once (x-message-ttl 0) feeds back.
LETTERS_PER_PASS: Final = 512
# Copies one pass stores, its first letter's all the same (about 10 ms of work at 512): a
# letter makes one per queue its exchange routes to, so 512 letters into a fanout of 50 queues
# stored 25,600 copies in one pass, 0.4 s of a loaded machine's reactor (adversary seed 66005).
COPIES_PER_PASS: Final = 512
# Bytes of letters' sections before their bodies one pass takes, its first letter's all the
# same: routing a letter through a headers exchange decodes its application properties, and
# recording its death decodes and encodes its message annotations; a client's message may carry
# 64 KiB of each, and recording a death in 69 KB of annotations (4,000 entries) took 12.8 ms,
# so 512 such letters held the reactor for seconds (adversary seed 65825: a prober round of
# 2.08 s). 256 KiB is about 60 ms of it.
HEAD_BYTES_PER_PASS: Final = 256 * 1024
# Passes a letter that waits for the budget's room skips while the room stays under what its
# copies grew the count by when it was last weighed and the bindings, exchanges and queues are
# as many as they were, before it is weighed again all the same (its message may have left its
# queue meanwhile). Weighed at every pass, a letter of 100 KB of annotations had its death
# recorded again, 23-34 ms, at each pass for as long as the budget stayed full.
WAITING_PASSES: Final = 64


class Cause(Protocol):
    """Who a dead letter's work is charged to: a consumer link (session/dead_letter_debt.py)."""

    def borrow(self, units: int) -> bool:
        """Charge ``units``; True if its consumer's hold changes (the gateway applies it)."""

    def repay(self, units: int) -> bool:
        """Give ``units`` back; True if its consumer's hold changes."""


class Holder(Protocol):
    """Where a queue keeps the messages it gives up on (a classic queue's backlog)."""

    def remove(self, message: Message) -> None:
        """Drop a message given up on with nowhere to go."""

    def hold(self, message: Message) -> None:
        """Keep a message at its place, never delivered, until its dead-lettering ends."""

    def dead_lettered(self, message: Message) -> None:
        """Its copies are stored: it leaves (logged after them)."""

    def dead_letter_failed(self, message: Message) -> bool:
        """Its dead-lettering failed: it stays as it is; False if it is no longer there."""


class DeadLetter(NamedTuple):
    """A message a queue gave up on, for its dead-letter exchange (RabbitMQ's reasons)."""

    queue: str
    message: Message
    reason: str
    exchange: str
    routing_key: str | None
    # Where the message waits until its copies are stored; None for a publish the queue
    # refused (reject-publish-dlx), which was never in it.
    holder: Holder | None = None
    # A quorum queue's at-least-once dead-lettering: who takes back a letter some queue did not
    # take (or no queue did), to send it again, the message still held; None drops what no
    # queue takes (at-most-once).
    retry: Callable[[DeadLetter], None] | None = None
    # The queues that took it already, skipped when it is sent again.
    done: frozenset[str] = frozenset()
    # The queues an earlier group of its copies went to, taking or refusing them: a letter
    # whose copies do not all fit their channels' windows now goes in groups (Fits), and
    # waits at the head of the outbox between them, still held in its queue.
    passed: frozenset[str] = frozenset()
    # Who sent it, and the bytes it was counted at there until it is routed.
    sender: DeadLetterer | None = None
    size: int = 0
    # Whose outcome made it, and the units charged to them until it leaves the outbox.
    cause: Cause | None = None
    charged: int = 0

    def stored(self) -> None:
        """Its copies are stored (or it went nowhere): it leaves its queue."""
        if self.sender is not None:
            self.sender.routed(self)
        if self.holder is not None:
            self.holder.dead_lettered(self.message)

    def failed(self) -> bool:
        """Its dead-lettering failed: it stays in its queue; False when it is lost."""
        if self.sender is not None:
            self.sender.routed(self)
        return self.holder is not None and self.holder.dead_letter_failed(self.message)


class DeadLetterer:
    """One queue's side: where its dead letters go, and how many went or were dropped."""

    __slots__ = (
        "dead_lettered",
        "dropped",
        "exchange",
        "held",
        "holder",
        "outbox",
        "queue",
        "retry",
        "routing_key",
        "waiting_bytes",
    )

    def __init__(
        self,
        queue: str,
        exchange: str | None,
        routing_key: str | None,
        outbox: list[DeadLetter],
        holder: Holder,
        held: HeldBytes,
        retry: Callable[[DeadLetter], None] | None = None,
    ) -> None:
        self.queue = queue
        self.exchange = exchange
        self.routing_key = routing_key
        self.outbox = outbox
        self.holder = holder
        self.held = held
        # Set for at-least-once: who takes back what was not delivered (DeadLetter.retry).
        self.retry = retry
        self.dead_lettered = 0
        # Given up on with no dead-letter exchange to go to.
        self.dropped = 0
        # Bytes of its letters not routed yet: messages piling up on the way out of the queue,
        # which weigh its publishers as its ready messages do (docs/inbound-flow-control.md).
        self.waiting_bytes = 0

    def send(self, message: Message, reason: str, *, queued: bool = True) -> None:
        """Give up on ``message``: hand it to the dead-letter exchange, kept at its place until
        its copies are stored, or drop it when the queue has none. ``queued``: it is in the
        queue (False for a publish the queue refuses)."""
        exchange = self.exchange
        if exchange is None:
            self.dropped += 1
            if queued:
                self.holder.remove(message)
            return
        self.dead_lettered += 1
        size = message.read_size()
        self.waiting_bytes += size
        holder = None
        if queued:
            holder = self.holder
            holder.hold(message)
        else:
            # In no queue, so counted here while it waits for the budget's room (a plain
            # message as a copy of its payload, which other queues' copies may share).
            if type(message) is Message:
                self.held.take(message)
            else:
                self.held.total += size + MESSAGE_OVERHEAD
        self.outbox.append(
            DeadLetter(
                self.queue,
                message,
                reason,
                exchange,
                self.routing_key,
                holder,
                self.retry if queued else None,
                sender=self,
                size=size,
            )
        )

    def routed(self, letter: DeadLetter) -> None:
        """``letter`` left the outbox for good (stored, dropped or failed)."""
        self.waiting_bytes -= letter.size
        if letter.holder is None:
            if type(letter.message) is Message:
                self.held.let_go(letter.message)
            else:
                self.held.total -= letter.size + MESSAGE_OVERHEAD


def _growth(letter: DeadLetter, payload: bytes, copies: int) -> int:
    """What storing ``copies`` of the letter's ``payload`` and letting its message go grows
    the held bytes by (queues/held_bytes.py): the copies share the payload, which its death
    record made new bytes, counted once, each copy its overhead; the message, in its queue or
    counted by its sender, gives back what it counts alone (all of it, or its overhead when
    other copies share its payload: seed 65600's letters of fan-out copies, each counted as
    one overhead, grew the count by a whole payload), and nothing when at-least-once, as it
    may stay for the queues that refuse. An upper bound: a durable queue's logged copy may
    count less."""
    grown = len(payload) + copies * MESSAGE_OVERHEAD
    message = letter.message
    if letter.retry is not None:
        return grown
    share = message.share
    if share is not None and share.holders > 1:
        return grown - MESSAGE_OVERHEAD
    return grown - message.held - MESSAGE_OVERHEAD


# Where a message published to an exchange with a routing key goes (the exchange graph's route).
Route = Callable[[str, str, bytes], list[QueueType]]
# Whether a message to a queue goes through the log (the registry's rule for durable queues).
Persists = Callable[[QueueType, Message], bool]
# How many of a letter's queues, in order, take a copy of so many bytes now: one on another
# worker takes a window of them until its owner confirms (gateway/peers.py sets it;
# docs/workers.md).
Fits = Callable[[list[QueueType], int], int]


class _Wait(NamedTuple):
    """A dead letter whose ``copies`` the memory budget or the windows have no room for yet;
    ``letter`` is what waits when a first group of its copies went; ``needs``: the room its
    copies need (0: it waits for the windows)."""

    copies: int
    letter: DeadLetter | None = None
    needs: int = 0


class DeadLetterFailure(NamedTuple):
    """A dead letter that could not be routed: where it came from, which message, and why."""

    queue: str
    message: str
    error: str
    # False when it was not in its queue any more (purged, deleted) or never was (refused at
    # publish): it is lost.
    kept: bool


class DeadLetterRouter:
    """The registry's side: routes every pending dead letter to its exchange's queues."""

    def __init__(
        self,
        clock: Clock,
        route: Route,
        persists: Persists,
        store: TopologyLog | None,
        held: HeldBytes | None = None,
    ) -> None:
        self.clock = clock
        # What the queues hold: a pass's room is taken by what each letter grew it by in fact,
        # never less than its estimate, so that whatever its copies set off as they are stored
        # (a refused copy counted as its queue's letter, a drop-head queue's head given up)
        # the pass passes its room by one letter at most. None: the estimates only.
        self._held = held
        self._route = route
        self._persists = persists
        self._store = store
        # Dead letters every queue hands over, routed by :meth:`route_all`.
        self.outbox: list[DeadLetter] = []
        # Dead letters lost because their exchange was missing or routed them nowhere.
        self.dropped = 0
        # Whether the last call stopped at a letter the budget had no room for; the room its
        # copies needed then, and the calls skipped since (:data:`WAITING_PASSES`).
        self.waiting = False
        self._needs = 0
        self._skipped = 0
        self._topology: object = None
        # Bytes before their bodies of the letters the last call took (at most
        # HEAD_BYTES_PER_PASS and one letter's).
        self.head_bytes = 0
        # Copies the last call stored (at most COPIES_PER_PASS and one letter's).
        self.copies = 0
        # Dead letters that failed, for the gateway to log (it empties the list).
        self.failures: list[DeadLetterFailure] = []
        # Causes whose consumer's hold changed as their letters waited or left the outbox
        # (the gateway applies it and empties the list).
        self.toggled: list[Cause] = []
        # None: every queue takes a letter whenever the budget has room (a single process).
        self.fits: Fits | None = None

    def route_all(self, room: int | None = None, topology: object = None) -> list[Dispatch]:
        """Deliver pending dead letters to their dead-letter exchange's queues, a batch a call.

        Each copy carries the death in its annotations; a message that would loop back to a
        queue it already died in, with no rejection on the way, is dropped (RabbitMQ's rule).
        At most :data:`LETTERS_PER_PASS` letters are taken, and they stop once their copies
        reach :data:`COPIES_PER_PASS` or their heads :data:`HEAD_BYTES_PER_PASS`, or at
        the first whose copies would grow the bytes held past ``room`` (the memory budget's
        room; None: no limit; a letter to one queue grows it by its death record only): the
        rest, and the
        letters the copies make in turn (a queue that expires them at once), wait in the
        outbox for the next call, so one event never loops and a fan-out never grows the
        server past its budget. A letter that waits for room is weighed again once the room
        has grown to what it needed, the ``topology`` (what says the exchanges, bindings and
        queues changed) is not what it was, or after :data:`WAITING_PASSES` calls.
        """
        if (
            self.waiting
            and room is not None
            and room < self._needs
            and topology == self._topology
            and self._skipped < WAITING_PASSES
        ):
            self._skipped += 1
            return []
        self._skipped = self._needs = 0
        dispatches: list[Dispatch] = []
        self.waiting = False
        pending = self.outbox
        batch = pending[:LETTERS_PER_PASS]
        del pending[:LETTERS_PER_PASS]
        held = self._held
        self.copies = self.head_bytes = 0
        for taken, letter in enumerate(batch):
            if self.copies >= COPIES_PER_PASS or self.head_bytes >= HEAD_BYTES_PER_PASS:
                # Enough work for one pass: the rest go first at the next, in their order.
                pending[:0] = batch[taken:]
                break
            before = 0 if held is None else held.total
            try:
                left = self._deliver(letter, dispatches, room)
            except Exception as error:
                self._repay(letter)
                self._failed(letter, error)
                continue
            if isinstance(left, _Wait):
                # Back at the head of the outbox, in their order, until the budget has room;
                # the waiting letter's cause now owes one unit per copy (docs/bounds.md).
                waits = letter if left.letter is None else left.letter
                pending[:0] = [self._charge_copies(waits, left.copies), *batch[taken + 1 :]]
                self.waiting = True
                self._needs = left.needs
                self._topology = topology
                break
            self._repay(letter)
            grown, done = left
            if done is None:
                letter.stored()
            else:
                # At-least-once: still held in its queue, to be sent again; repaid already.
                assert letter.retry is not None
                letter.retry(letter._replace(done=done, passed=frozenset(), cause=None, charged=0))
            if room is not None:
                room -= grown if held is None else max(grown, held.total - before)
        return dispatches

    def blame(self, since: int, cause: Cause) -> bool:
        """Charge the letters put in the outbox from index ``since`` on to ``cause``, one unit
        each (a consumer's outcomes made them); True if its consumer's hold changes now."""
        pending = self.outbox
        count = len(pending) - since
        if count <= 0:
            return False
        for index in range(since, len(pending)):
            pending[index] = pending[index]._replace(cause=cause, charged=1)
        return cause.borrow(count)

    def _charge_copies(self, letter: DeadLetter, copies: int) -> DeadLetter:
        """A letter that waits for room owes one unit per copy it will make."""
        cause = letter.cause
        more = copies - letter.charged
        if cause is None or more <= 0:
            return letter
        if cause.borrow(more):
            self.toggled.append(cause)
        return letter._replace(charged=copies)

    def _repay(self, letter: DeadLetter) -> None:
        """The letter leaves the outbox: its cause gets back what it was charged."""
        cause = letter.cause
        if cause is not None and cause.repay(letter.charged):
            self.toggled.append(cause)

    def _failed(self, letter: DeadLetter, error: Exception) -> None:
        """The message stays in its queue, as it was; record why, once."""
        message = letter.message
        kept = letter.failed()
        if not kept:
            self.dropped += 1
        logged = getattr(message, "message_id", None)
        described = f"{letter.reason} message {message.seq}" + (
            "" if logged is None else f" (log id {logged})"
        )
        self.failures.append(DeadLetterFailure(letter.queue, described, repr(error), kept))

    def _deliver(
        self, letter: DeadLetter, dispatches: list[Dispatch], room: int | None
    ) -> tuple[int, frozenset[str] | None] | _Wait:
        """Store a copy in each queue the dead-letter exchange routes ``letter`` to.

        A message that cannot be decoded or annotated raises: it stays in its queue. A
        missing exchange, one that routes it nowhere, or a queue that refuses its copy drops it,
        as in RabbitMQ, unless the letter is at-least-once: then the queues that took it are
        returned, for it to be sent again to the others (None: delivered, or dropped), after
        the bytes by which the copies grow what the memory budget counts (the original leaves
        its queue once they are stored). Copies that would grow it past ``room`` are not made:
        :class:`_Wait`. Copies that do not fit their channels' windows (:data:`Fits`) are not
        made either: the ones before them go, and the letter waits for the rest with them
        recorded (``passed``), so that no queue gets a copy twice and none passes another
        letter's; once its last group went, it leaves as one letter would.
        """
        message = letter.message
        routing_key = letter.routing_key if letter.routing_key is not None else message.routing_key
        payload = message.read()
        self.head_bytes += head_size(payload)
        try:
            targets = self._route(letter.exchange, routing_key, payload)
        except NotFound:
            targets = []
        passed = letter.passed
        skipped = letter.done | passed if passed else letter.done
        targets = [q for q in targets if q.name not in skipped]
        if not targets and passed:
            return 0, self._ended(letter)
        if not targets:
            if letter.done:
                return 0, None
            if letter.retry is not None:
                return 0, letter.done
            self.dropped += 1
            return 0, None
        fits = self.fits
        if fits is not None and not fits(targets, len(payload)):
            # Not even its first copy fits before its death is recorded (which only adds
            # bytes): it waits without copying its payload, at every pass until one fits.
            return _Wait(len(targets))
        death = Death(
            letter.queue,
            letter.reason,
            message.exchange,
            (message.routing_key,),
            self.clock.now,
        )
        recorded = record_death(payload, death)
        payload = recorded.payload
        targets = [q for q in targets if q.name not in recorded.looped]
        if not targets and passed:
            return 0, self._ended(letter)
        if not targets:
            # A fully automatic loop: dropped, at-least-once or not (RabbitMQ's rule).
            self.dropped += 1
            return 0, None
        # Every copy to another worker's queue joins its channel's window, each weighed with
        # the copies before it (each weighed alone, a letter to ten remote queues took 3.9 MB
        # into a 1 MiB window, seed 65701's replay): the copies that fit go, the rest wait.
        count = len(targets) if fits is None else fits(targets, len(payload))
        if not count:
            return _Wait(len(targets))
        waiting = len(targets) - count
        # Until its last group goes, the message stays in its queue.
        grown = (
            len(payload) + count * MESSAGE_OVERHEAD if waiting else _growth(letter, payload, count)
        )
        if room is not None and grown > 0 and grown > room:
            return _Wait(len(targets), needs=grown)
        targets = targets[:count]
        done = set(letter.done)
        refused = False
        first = Message(
            payload,
            message.delivery_count,
            exchange=letter.exchange,
            routing_key=routing_key,
            header=message.read_header(),
        )
        # Copies first: a queue may change its copy (its x-message-ttl) when it stores it.
        copies = [first, *(first.copy() for _ in targets[1:])]
        self.copies += len(copies)
        for queue, copy in zip(targets, copies, strict=True):
            logged = self._log(queue, copy)
            try:
                dispatches.extend(queue.enqueue(logged))
            except AmqpError:
                if logged is not copy:
                    logged.discard()
                if letter.retry is None:
                    self.dropped += 1
                refused = True
                continue
            done.add(queue.name)
        if waiting:
            went = passed.union(queue.name for queue in targets)
            waits = letter._replace(done=frozenset(done), passed=went)
            return _Wait(waiting, waits)
        refused = refused or not passed <= done
        return grown, (frozenset(done) if refused and letter.retry is not None else None)

    def _ended(self, letter: DeadLetter) -> frozenset[str] | None:
        """An earlier group of the letter's copies was its last: None when it is done with,
        or, at least once with a queue that refused its copy, the queues that took it, for it
        to be sent again to the others."""
        if letter.retry is not None and not letter.passed <= letter.done:
            return letter.done
        return None

    def _log(self, queue: QueueType, copy: Message) -> Message:
        """The copy as ``queue`` stores it: logged when it is persistent and ``queue`` durable.

        The original is settled only once its copies are (:meth:`route_all`), and settlements
        wait in the store's buffer until the batch is taken, so the copy's enqueue record goes
        before the original's settlement: a crash can duplicate, never lose, the message.
        """
        store = self._store
        if store is None or not self._persists(queue, copy):
            return copy
        copy = queue.as_stored(copy)
        logged = store.enqueue(
            queue.name,
            copy.payload,
            self.clock.now,
            copy.expires,
            exchange=copy.exchange,
            routing_key=copy.routing_key,
            delivery_count=copy.delivery_count,
        )
        return logged
