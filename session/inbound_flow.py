"""The server-wide half of inbound flow control, free of IO: the memory budget's holds.

Every publishing connection (its per-connection state is session/inbound.py's ``Inbound``)
is weighed against the server's memory budget here. At the end of every batch of events
:class:`InboundFlow` **flushes**: it takes the bytes held, decides who waits while the budget
is exhausted (docs/inbound-flow-control.md), and renews the credit of links that may have more,
each grant cut to what the budget's headroom backs. Bytes read from a publishing connection are
charged at once, so one pass of the reactor over many connections cannot overshoot the budget
by more than one read. Every method returns what the gateway must do; the gateway only
applies it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeAlias

from sluicegate.queues.queue_type import QueueType
from sluicegate.session.incoming_link import IncomingLink
from sluicegate.session.memory_budget import DEFAULT_RESUME_RATIO, MemoryBudget
from sluicegate.session.outgoing_link import OutgoingLink
from sluicegate.session.remote_publishers import RemotePublishers
from sluicegate.session.unsettled import UNSETTLED_DELIVERY_COST, Unsettled

# While blocked, the holds are decided again once the bytes held moved by this share of the
# margin above the limit: a publisher not yet weighed (a fresh link) adds at most a sixteenth of
# the margin before it is, and the weighing stays O(1) per event averaged over what moved.
RECLASSIFY_SHARE: Final = 16
# Near the publishers' ceiling the holds are decided again as the bytes move by a sixteenth of
# the room left, but never for less than this share of the margin (16 KiB of a 4 MiB one): the
# room a publisher may still grow in shrinks with it, and weighing at every event would cost
# every flush a pass over the links. A publisher is never held for growing by less.
RECLASSIFY_FLOOR: Final = 256
# A publisher holds the budget only if its queues hold at least this share of an even split of
# the margin among the publishers that weigh anything: a quarter, so that a few publishers
# piling up bytes are all holders, while one whose queue keeps a few messages is not made a
# holder because nobody else publishing weighs anything (bytes left by publishers gone). Of
# the margin, not the limit: the margin is what a publisher not held may fill, and a floor
# above it let one publisher fill it to the ceiling unheld (adversary seeds 64000, 64001).
HOLDER_SHARE: Final = 0.25


def queue_weight(queue: QueueType) -> int:
    """What ``queue`` weighs when the budget picks who holds it: bytes ready, held unsettled by
    consumers (one that takes everything and never settles keeps its queue empty), and given up
    on, waiting for the budget's room to be dead-lettered (a queue that overflows into a
    fan-out stays empty while its letters wait)."""
    statistics = queue.statistics()
    return statistics.ready_bytes + statistics.unacked_bytes + statistics.dead_lettering_bytes


class PublishingConnection(Protocol):
    """What the budget reads and decides of one publishing connection (session/inbound.py's
    ``Inbound``): named here so that the server-wide half does not import the per-connection
    one."""

    # The gateway's record of the connection, for the actions it is named in.
    owner: object
    links: set[IncomingLink]
    # Bytes of its deliveries still arriving.
    unfinished: int
    # Whether the budget holds its reads.
    budget_paused: bool

    def give_up(self, link: IncomingLink) -> object:
        """Release the delivery arriving on ``link``: what it charged is forgotten."""


@dataclass(frozen=True, slots=True)
class InboundLimits:
    """The per-link and per-connection limits a publisher must keep."""

    max_link_credit: int
    max_message_size: int
    # Bytes of unfinished (multi-frame) deliveries one connection may have at once.
    max_unfinished_size: int
    # Bytes of unfinished deliveries all connections may have together; None: only the budget.
    max_unfinished_total: int | None = None
    # Seconds the oldest of them may make no progress while they are at that cap; 0: forever.
    unfinished_timeout: float = 0.0
    # The most one read of a socket brings: the oldest arriving delivery, read while blocked
    # until its part of the margin is taken, may pass it by that much and is kept.
    read_size: int = 0


@dataclass(frozen=True, slots=True)
class Hold:
    """Stop reading these connections: the server's unfinished deliveries are at their cap."""

    connections: list[PublishingConnection]


@dataclass(frozen=True, slots=True)
class Release:
    """Settle the delivery ``released`` and store nothing; the link goes on (AMQP 1.0 §3.4.4).

    A delivery that begins while the server's unfinished bytes are at their cap: holding it
    would hold what its first read brought, once per connection; released, the client may send
    it again later.
    """


RELEASE: Final = Release()
# The bytes held by the queues a link publishes to (the gateway knows its targets).
Weigh: TypeAlias = Callable[[IncomingLink], int]


@dataclass(slots=True)
class Flushed:
    """What a flush asks of the gateway: FLOWs to send, connections to stop or start reading."""

    grants: list[tuple[IncomingLink, int]] = field(default_factory=list)
    pause: list[PublishingConnection] = field(default_factory=list)
    resume: list[PublishingConnection] = field(default_factory=list)
    # Connections to close: their delivery, the oldest, made no progress within the timeout.
    close: list[PublishingConnection] = field(default_factory=list)
    # Links whose arriving delivery is given up (settled ``released``, its bytes dropped):
    # deliveries still arriving beyond their part of a blocked budget's margin.
    release: list[IncomingLink] = field(default_factory=list)
    # Consumer links to hold, and to let go, for the deliveries they took unsettled while the
    # budget is blocked (session/unsettled.py).
    hold_consumers: list[OutgoingLink] = field(default_factory=list)
    let_go_consumers: list[OutgoingLink] = field(default_factory=list)


class InboundFlow:
    """Every connection's publishers against the server's memory budget.

    While the budget is exhausted (used at or above its limit, until it is back at its low-water
    mark), the links publishing to the queues that hold the budget are *held*: a link is held
    when the bytes its queues hold are at least half the mean over all publishing links (the
    gateway weighs them). Held links get no new credit, and a connection that still has credit
    on a held link, or a delivery arriving, is not read. Every other publisher keeps its credit
    renewals, backed by the margin above the limit up to ``ceiling``; at the ceiling no
    publishing connection is read at all.

    Bytes of deliveries still arriving are bytes no consumer can drain, so they have a cap of
    their own, ``max_unfinished_total``, below the budget: from the moment they reach it until
    they are back at 80 % of it, every connection with a delivery arriving is held, so that they
    cannot take the budget's room from the publishers whose messages are consumed.

    Whatever the case, the connection whose unfinished delivery is the oldest is always read, so
    that multi-frame messages finish and the budget cannot be locked up by deliveries that wait
    for each other. Connections without publishing links are never held: consumers keep
    consuming, which is what brings the bytes down.
    """

    def __init__(self, budget: MemoryBudget, limits: InboundLimits) -> None:
        self.budget = budget
        self.limits = limits
        self.connections: set[PublishingConnection] = set()
        # Connections with a delivery arriving, oldest first (a dict keeps insertion order).
        self.arriving: dict[PublishingConnection, None] = {}
        # Links whose credit fell to half: renewed at the next flush.
        self.renewals: set[IncomingLink] = set()
        # Other workers' links, as what they store here while blocked is charged to them
        # (session/remote_publishers.py): weighed with this worker's own.
        self.remote = RemotePublishers()
        # The consumers' unsettled deliveries (the gateway's, shared with every session): the
        # links that took more while blocked are weighed with the publishers that grew.
        self.unsettled = Unsettled()
        # How many times the holds were decided or let go: what another worker's parked
        # publishes may be stored by changes only then (gateway/peers.py).
        self.decisions = 0
        # This worker's links whose publishes another worker gave back, by that worker: they
        # get no credit until it stores a publish of this worker's again, or their channel
        # ends. Given back and granted again at once, a publisher to a queue of a worker
        # blocked for good would send, and be given back, for as long as it likes.
        self.owner_full: dict[int, set[IncomingLink]] = {}
        # The unfinished bytes reached max_unfinished_total and are not back at 80 % of it.
        self.unfinished_full = False
        total = limits.max_unfinished_total
        self._unfinished_resume = None if total is None else int(total * DEFAULT_RESUME_RATIO)
        # Bytes read since the last flush from connections with a delivery arriving.
        self._unfinished_reading = 0
        # While the cap is reached: the oldest arriving connection, its unfinished bytes, and
        # since when they have not changed (its deadline is unfinished_timeout from then).
        self.watched: PublishingConnection | None = None
        self._watched_bytes = 0
        self._watched_since = 0.0
        # The holds were decided for the bytes held at this figure (None: to be decided).
        self._classified_at: int | None = None
        # They were decided with the bytes held at or above the publishers' ceiling, and this
        # much left below it.
        self._over_ceiling = False
        self._room = 0
        # The budget is blocked and deliveries still arriving have no room left in their part
        # of its margin, or the oldest, finished, would take the publishers to their ceiling:
        # the oldest arriving delivery is no longer read either (session/memory_budget.py).
        self._past_part = False
        self._oldest: PublishingConnection | None = None

    def join(self, publisher: PublishingConnection) -> None:
        """A connection's inbound state, from its first publishing link on."""
        self.connections.add(publisher)

    def leave(self, publisher: PublishingConnection) -> None:
        """The connection ended: nothing of it is held or watched any more."""
        self.connections.discard(publisher)
        if self.watched is publisher:
            self.watched = None

    def given_back(self, peer: int, link: IncomingLink) -> None:
        """Worker ``peer`` gave a publish of ``link`` back, its budget blocked
        (gateway/peers.py's parked window): the link waits for it."""
        if link.owner_full is None:
            link.owner_full = peer
            self.owner_full.setdefault(peer, set()).add(link)

    def owner_stored(self, peer: int) -> None:
        """Worker ``peer`` stored a publish of this worker's again, or its channel ended: the
        links that waited for it may have credit."""
        links = self.owner_full.pop(peer, None)
        if links is None:
            return
        for link in links:
            link.owner_full = None
            if link.wants_credit:
                self.renewals.add(link)

    def forget(self, link: IncomingLink) -> None:
        """The link is gone: no worker's wait names it."""
        peer = link.owner_full
        if peer is not None:
            waiting = self.owner_full[peer]
            waiting.discard(link)
            if not waiting:
                del self.owner_full[peer]
            link.owner_full = None

    def charge_read(self, inbound: PublishingConnection, nbytes: int) -> list[PublishingConnection]:
        """Bytes were read from ``inbound``'s socket: connections whose reads pause now.

        Only connections with publishing links are charged; the charge stands until the next
        flush counts what the bytes became. The first read that exhausts the budget, or reaches
        its ceiling, pauses every publishing connection but the oldest arriving one until the
        flush decides; the first read that takes the unfinished bytes to their cap pauses every
        connection with a delivery arriving but the oldest.
        """
        if not inbound.links:
            return []
        budget = self.budget
        budget.reading += nbytes
        hold = False
        if inbound.unfinished:
            self._unfinished_reading += nbytes
            total = self.limits.max_unfinished_total
            if (
                total is not None
                and not self.unfinished_full
                and budget.unfinished + self._unfinished_reading >= total
            ):
                self.unfinished_full = hold = True
        if budget.blocked:
            if not self._over_ceiling and budget.publishers_full(budget.current):
                self._over_ceiling = hold = True
            if (
                not self._past_part
                and inbound.unfinished
                and (
                    self._unfinished_reading >= budget.unfinished_room()
                    or (
                        inbound is next(iter(self.arriving), None)
                        and self._finishes_past_ceiling(inbound)
                    )
                )
            ):
                self._past_part = hold = True
        elif budget.current >= budget.limit:
            budget.block()
            self._classified_at = None
            hold = True
        return self._hold().pause if hold else []

    def fits(self, copies: int) -> bool:
        """Whether a fan-out's further copies, ``copies`` bytes beyond the payload its read
        charged, stay below the publishers' ceiling with what is held and read now."""
        budget = self.budget
        return budget.publishing_level(budget.current) + copies < budget.publishing_ceiling

    def unfinished_charged(
        self, inbound: PublishingConnection, begins: bool
    ) -> Hold | Release | None:
        """A delivery of ``inbound`` grew (``begins``: it is new): apply the unfinished cap.

        Reaching the cap holds every connection with a delivery arriving but the oldest; past
        it, a delivery that begins is released and one that goes on holds its connection.
        """
        total = self.limits.max_unfinished_total
        if total is None:
            return None
        if not self.unfinished_full:
            if self.budget.unfinished < total:
                return None
            self.unfinished_full = True
            return Hold(self._hold().pause)
        if begins:
            return RELEASE
        if inbound.budget_paused or inbound is next(iter(self.arriving)):
            return None
        inbound.budget_paused = True
        return Hold([inbound])

    def flush(self, queued: int, outbound: int, weigh: Weigh, now: float = 0.0) -> Flushed | None:
        """The end of a batch of events: take the bytes held, decide holds, renew credit, and
        close the oldest arriving connection if it held the cap without progress too long."""
        budget = self.budget
        was_blocked = budget.blocked
        budget.update(queued + outbound + budget.unfinished)
        self.unsettled.blocked = budget.blocked
        self._unfinished_reading = 0
        moved = False
        resume = self._unfinished_resume
        if self.unfinished_full and resume is not None and budget.unfinished <= resume:
            self.unfinished_full = False
            moved = True
        released: list[IncomingLink] = []
        if budget.blocked and budget.unfinished > budget.unfinished_part:
            released = self._give_up()
            moved = moved or bool(released)
        oldest = next(iter(self.arriving), None)
        past_part = budget.blocked and (
            budget.unfinished_room() <= 0
            or (oldest is not None and self._finishes_past_ceiling(oldest))
        )
        if past_part != self._past_part:
            self._past_part = past_part
            moved = True
        out: Flushed | None = None
        decided = self.decisions
        if budget.blocked:
            classified = self._classified_at
            if (
                classified is None
                or not was_blocked
                or budget.publishers_full(budget.used) != self._over_ceiling
                or abs(budget.used - classified) * RECLASSIFY_SHARE
                >= max(min(self._room, budget.margin), budget.margin // RECLASSIFY_FLOOR)
            ):
                out = self._classify(weigh)
        elif was_blocked:
            out = self._release()
        if out is None:
            if moved:
                out = self._hold()
            elif oldest is not self._oldest and (budget.blocked or self.unfinished_full):
                out = self._hold_turn(self._oldest, oldest)
        if released:
            assert out is not None
            out.release = released
        unsettled = self.unsettled
        if unsettled.reached or unsettled.settled:
            if out is None:
                out = Flushed()
            # Held by a delivery since the last flush: what their queues hold is taken back.
            out.hold_consumers.extend(unsettled.reached)
            unsettled.reached.clear()
            under = unsettled.back_under()
            # Decided now, every held consumer was looked at already.
            if decided == self.decisions:
                out.let_go_consumers.extend(under)
        self._oldest = oldest
        if self._overdue(oldest, now):
            assert oldest is not None
            if out is None:
                out = Flushed()
            out.close.append(oldest)
        renewals = self.renewals
        if renewals:
            if out is None:
                out = Flushed()
            self._renew(out.grants)
        return out

    # -- internals ------------------------------------------------------------------------

    def _give_up(self) -> list[IncomingLink]:
        """Release deliveries still arriving, the newest first, until what the rest hold fits
        in their part of the blocked budget's margin (session/memory_budget.py): bytes grown
        below the limit, before it blocked, that no consumer can drain, and that would
        otherwise take the publishers' part. Each was settled nothing yet, so its client may
        send it again (AMQP 1.0 §3.4.4); the oldest goes last, and only if it holds more than
        its part and one read (read while blocked, it stops within that), or more than its
        part with the publishers' part full: what it holds past its part weighs on theirs, and
        a delivery that never finished, 131 KB past its part, kept every publisher of its
        worker waiting at their ceiling, the prober too (adversary seed 65912)."""
        budget = self.budget
        part = budget.unfinished_part
        before = budget.unfinished
        released: list[IncomingLink] = []
        arriving = list(self.arriving)
        oldest = arriving[0]
        allowance = 0 if budget.publishers_full(budget.used) else self.limits.read_size
        for inbound in reversed(arriving):
            kept = part + allowance if inbound is oldest else part
            for link in [link for link in inbound.links if link.unfinished]:
                if budget.unfinished > kept:
                    inbound.give_up(link)
                    released.append(link)
        # Their bytes are dropped now: the count goes down with them.
        budget.used -= before - budget.unfinished
        return released

    def _finishes_past_ceiling(self, oldest: PublishingConnection) -> bool:
        """Whether the oldest arriving delivery, finished, would take the blocked budget's
        publishers to their ceiling: its bytes leave the part kept for deliveries still
        arriving for its queues. Read on to its end, a 300 KB delivery to a fanout landed
        339 KB past the ceiling beside queues nobody read, where every publisher waited for
        good, the prober too (adversary seed 65945)."""
        budget = self.budget
        level = budget.publishing_level(budget.current)
        return level + oldest.unfinished >= budget.publishing_ceiling

    def _overdue(self, oldest: PublishingConnection | None, now: float) -> bool:
        """Whether ``oldest`` has kept the unfinished cap full without a byte for the timeout.

        Checked at flushes, which others' traffic brings: a deadline that passes while nobody
        else does anything hurts nobody until they do.
        """
        timeout = self.limits.unfinished_timeout
        if not (timeout and self.unfinished_full and oldest is not None):
            self.watched = None
            return False
        if oldest is not self.watched or oldest.unfinished != self._watched_bytes:
            self.watched = oldest
            self._watched_bytes = oldest.unfinished
            self._watched_since = now
            return False
        if now - self._watched_since < timeout:
            return False
        self.watched = None
        return True

    def _classify(self, weigh: Weigh) -> Flushed:
        """Decide again which links and connections the exhausted budget holds.

        A holder weighs at least half the mean of the positive weights and at least
        :data:`HOLDER_SHARE` of an even share of the margin: when the bytes are held by nobody
        publishing now, the one small publisher left would otherwise be its own mean, and held.
        A link whose queues grew since the budget blocked by :data:`HOLDER_SHARE` of an even
        share of the publishers' part among the links that grew is a holder too: beside a
        large holder, a publisher piling up in queues nobody reads stayed under half the mean
        and took the whole part, where every publisher waits (adversary seeds 65702, 66100);
        of the links that fill the part, one is held before a quarter of it is taken. Other
        workers' links are weighed alike by what they stored here (session/remote_publishers.py),
        and share the part with this worker's.
        """
        budget = self.budget
        self.decisions += 1
        self._classified_at = budget.used
        self._over_ceiling = budget.publishers_full(budget.used)
        self._room = max(0, budget.publishing_ceiling - budget.publishing_level(budget.used))
        links = [link for inbound in self.connections for link in inbound.links]
        weights = [weigh(link) for link in links]
        remote = list(self.remote.publishers.values())
        # Each queue read once a decision, however many records stored into it: read per
        # record, a fan-out's queues were read once for each link of it.
        read: dict[QueueType, int] = {}

        def weight_of(queue: QueueType) -> int:
            weight = read.get(queue)
            if weight is None:
                weight = read[queue] = queue_weight(queue)
            return weight

        remote_weights = [sum(map(weight_of, publisher.queues)) for publisher in remote]
        # The mean and the floor are this worker's links' only: another worker's link weighs
        # every copy of its fan-out whole (they share no payload here), and in the mean it
        # could raise it past the links holding this worker's own queues, letting them go.
        positive = [weight for weight in weights if weight > 0]
        mean = sum(positive) / len(positive) if positive else 0.0
        floor = budget.margin * HOLDER_SHARE / len(positive) if positive else 0.0
        grown = []
        for link, weight in zip(links, weights, strict=True):
            if link.weight_at_block is None:
                link.weight_at_block = weight
            grown.append(weight - link.weight_at_block)
        remote_grown = {
            publisher: weight - publisher.weight_at_block
            for publisher, weight in zip(remote, remote_weights, strict=True)
        }
        unsettled = self.unsettled
        consumers_grown = unsettled.grown()
        # Another worker's links count only if they stored since the holds were last decided
        # (session/remote_publishers.py): one gone there takes no more.
        growing = (
            sum(1 for growth in grown if growth > 0)
            + sum(
                1 for publisher, growth in remote_grown.items() if growth > 0 and publisher.stored
            )
            + sum(1 for growth in consumers_grown.values() if growth > 0)
        )
        # What each publisher growing in the publishers' part may take of the room left in it
        # before it is held, but never less than the weighing's own step: a light publisher
        # whose queue holds a message or two as it is weighed near the ceiling would otherwise
        # be held, and weighed again only once the bytes move by that step.
        share = max(self._room * HOLDER_SHARE / max(growing, 1), budget.margin / RECLASSIFY_FLOOR)

        def holds(weight: int, growth: int) -> bool:
            return (mean > 0 and 2 * weight >= mean and weight >= floor) or (
                growth > 0 and growth >= share
            )

        still_growing = 0
        for link, weight, growth in zip(links, weights, grown, strict=True):
            was_held = link.held
            link.held = holds(weight, growth)
            if was_held and not link.held and link.wants_credit:
                self.renewals.add(link)
            still_growing += growth > 0 and not link.held
        for publisher, weight in zip(remote, remote_weights, strict=True):
            publisher.held = holds(weight, remote_grown[publisher])
        self.remote.decided(remote_grown, still_growing)
        # A consumer's share in deliveries, each costing what it does beyond its message, and
        # what all may ask for until the next decision.
        unsettled.share = max(1, int(share) // UNSETTLED_DELIVERY_COST)
        unsettled.room = int(self._room * HOLDER_SHARE) // UNSETTLED_DELIVERY_COST
        out = self._hold()
        for consumer, growth in consumers_grown.items():
            held = growth >= unsettled.share
            if held != consumer.unsettled_held:
                (out.hold_consumers if held else out.let_go_consumers).append(consumer)
        return out

    def _release(self) -> Flushed:
        """The budget is back under its low-water mark: nobody is held for it any more."""
        self.decisions += 1
        self._classified_at = None
        self._over_ceiling = False
        self.remote.clear()
        for inbound in self.connections:
            for link in inbound.links:
                link.held = False
                link.weight_at_block = None
                if link.wants_credit:
                    self.renewals.add(link)
        out = self._hold()
        out.let_go_consumers = self.unsettled.let_go()
        return out

    def _holds(self, inbound: PublishingConnection) -> bool:
        """Whether the budget or the cap on unfinished bytes keeps ``inbound`` unread."""
        if inbound.unfinished and self.unfinished_full:
            return True
        if not self.budget.blocked:
            return False
        return (
            self._classified_at is None
            or self._over_ceiling
            or inbound.unfinished > 0
            or any(link.held and link.credit > 0 for link in inbound.links)
        )

    def _hold(self) -> Flushed:
        """Hold the publishing connections :meth:`_holds` names, but the oldest arriving until
        deliveries still arriving fill their part of the blocked budget's margin: read at any
        height, its delivery (up to the largest message) took the budget past its ceiling,
        where every publisher waits (seed 65501), and read up to half way through the margin,
        it left a consumer of another worker's queue no room (seeds 65800, 65802). Held from
        there, it is read again once its part has room; bytes still arriving are capped at
        most at the limit (``max_unfinished_total``), and the oldest that holds that cap
        without progress is closed at its deadline whatever holds it, so they cannot keep it
        there alone."""
        out = Flushed()
        oldest = None if self._past_part else next(iter(self.arriving), None)
        for inbound in self.connections:
            self._decide(inbound, oldest, out)
        return out

    def _hold_turn(
        self, previous: PublishingConnection | None, oldest: PublishingConnection | None
    ) -> Flushed:
        """Only the oldest arriving delivery changed: decided again are the connection whose
        delivery was the oldest and the one whose is now, the others' holds are as they were.
        Decided again over every link, with every queue weighed, a connection sending
        multi-frame deliveries of two frames each made each frame a pass over them all."""
        out = Flushed()
        kept = None if self._past_part else oldest
        for inbound in (previous, oldest):
            if inbound is not None and inbound in self.connections:
                self._decide(inbound, kept, out)
        return out

    def _decide(
        self, inbound: PublishingConnection, oldest: PublishingConnection | None, out: Flushed
    ) -> None:
        """Hold or let go ``inbound`` as :meth:`_holds` says, but ``oldest``."""
        hold = bool(inbound.links) and inbound is not oldest and self._holds(inbound)
        if hold != inbound.budget_paused:
            inbound.budget_paused = hold
            (out.pause if hold else out.resume).append(inbound)

    def _renew(self, grants: list[tuple[IncomingLink, int]]) -> None:
        """Renew what the rule allows, each grant backed by the budget's headroom.

        Once the headroom is spent the links left wait in ``renewals`` for a later flush: a
        renewal is asked for only as credit falls or a hold ends, so one dropped for want of
        headroom left its link without credit, however far the bytes fell, until the budget
        next resumed, or for good if it never blocked (adversary seed 65600: the prober,
        holding nothing, waited to publish for good with the budget under its publishers'
        ceiling). A grant of one to a link whose largest message is more than the headroom
        spends it for every link after it in the same flush."""
        budget = self.budget
        blocked = budget.blocked
        current = budget.current
        headroom = (
            budget.publishing_ceiling - budget.publishing_level(current)
            if blocked
            else budget.limit - current
        )
        renewals = self.renewals
        while renewals and headroom > 0:
            link = renewals.pop()
            if blocked and link.held:
                continue  # renewed when the budget lets it go
            grant = link.renew(headroom=headroom)
            if grant:
                grants.append((link, grant))
                headroom -= grant * link.largest
