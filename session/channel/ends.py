"""Each remote consumer's credit on both sides of the channel, and the publishes awaiting a
confirm: where the bounds of the local session <- queue protocol are checked across it.

:class:`SessionEnd` is the consumer in the session's worker: at most one credit request in
flight, a later FLOW stashed (newest wins) until the reply comes, and never more deliveries
taken than the queue may send. :class:`QueueEnd` is the same consumer in the owner's worker:
it never lets the queue send more than the last request granted (AMQP 1.0 §2.6.7's
link-credit, computed from the request's delivery-count as the queue computes it), and a
settlement names no more deliveries than the consumer holds. A peer that breaks either gets
:class:`~.codec.ChannelError`, which ends the channel.
"""

from __future__ import annotations

from itertools import chain
from typing import Generic, TypeVar

from sluicegate.session.channel.codec import ChannelError
from sluicegate.session.channel.frames import Confirm, Credit, CreditReply, Settle, Settled
from sluicegate.wire.serial import SERIAL_MASK, link_credit_snd, serial_diff

T = TypeVar("T")


class SessionEnd:
    """A consumer of a remote queue, in the worker serving its client."""

    __slots__ = ("arrived", "consumer", "credit", "delivery_count", "in_flight", "stashed")

    def __init__(self, consumer: int) -> None:
        self.consumer = consumer
        # The bytes of every delivery that arrived, as the owner counts them against the
        # request's byte limit (frames.Credit).
        self.arrived = 0
        # The queue-side delivery-count as far as this worker has seen, and the credit the
        # queue may still spend from it.
        self.delivery_count = 0
        self.credit = 0
        self.in_flight = False
        self.stashed: tuple[int, bool, bool, int | None] | None = None

    def request(
        self, credit: int, drain: bool, echo: bool, delivery_count: int | None = None
    ) -> Credit | None:
        """Ask for ``credit`` counted from ``delivery_count``: the request to send, or None if
        one is in flight already (this one is stashed, replacing any stashed before).

        A session counts from the deliveries it has sent on (its ``queue_flow_ctl``), which
        lags the count seen here while deliveries wait in it: those count against the credit,
        as they do when the queue is local. Without it, the count seen.
        """
        if self.in_flight:
            self.stashed = (credit, drain, echo, delivery_count)
            return None
        seen = self.delivery_count
        counted = seen if delivery_count is None else delivery_count
        if serial_diff(counted, seen) > 0:
            raise ValueError(f"credit counted from {counted}, ahead of the {seen} seen")
        self.in_flight = True
        # Until the reply, deliveries the queue sent on the credit it held cross the request:
        # it counts them against the new credit (link-credit from this delivery-count), so what
        # may arrive from here is the larger of the two.
        self.credit = max(self.credit, link_credit_snd(counted, credit, seen))
        return Credit(self.consumer, counted, credit, drain, echo)

    def delivered(self, count: int, nbytes: int = 0) -> None:
        """``count`` deliveries worth ``nbytes`` arrived: within the credit, or the queue broke
        the protocol."""
        if count > self.credit:
            raise ChannelError(
                f"consumer {self.consumer}: {count} deliveries on a credit of {self.credit}"
            )
        self.credit -= count
        self.arrived += nbytes
        self.delivery_count = (self.delivery_count + count) & SERIAL_MASK

    def replied(self, reply: CreditReply) -> Credit | None:
        """The reply to the request in flight; the stashed request, if any, to send next.

        The queue's delivery-count is the truth from here on: a drain advances it by the
        credit left, never by more, and never backwards.
        """
        if not self.in_flight:
            raise ChannelError(f"consumer {self.consumer}: a credit reply with no request")
        advance = serial_diff(reply.delivery_count, self.delivery_count)
        if not 0 <= advance <= self.credit or reply.credit > self.credit - advance:
            raise ChannelError(
                f"consumer {self.consumer}: a reply at delivery-count {reply.delivery_count} "
                f"with credit {reply.credit}, from {self.delivery_count} with {self.credit}"
            )
        self.delivery_count = reply.delivery_count
        self.credit = reply.credit
        self.in_flight = False
        stashed = self.stashed
        if stashed is None:
            return None
        self.stashed = None
        return self.request(*stashed)


class QueueEnd:
    """A remote consumer of a queue, in the worker that owns the queue."""

    __slots__ = ("ack_required", "consumer", "credit", "delivery_count", "unsettled")

    def __init__(self, consumer: int, ack_required: bool) -> None:
        self.consumer = consumer
        self.ack_required = ack_required
        self.delivery_count = 0
        self.credit = 0
        # Deliveries sent that the consumer must still settle: what one settlement may name.
        self.unsettled = 0

    def granted(self, request: Credit) -> int:
        """A credit request arrived: the credit the queue may now spend (what it computes too)."""
        self.credit = link_credit_snd(request.delivery_count, request.credit, self.delivery_count)
        return self.credit

    def sending(self, count: int) -> None:
        """The queue hands ``count`` deliveries to the channel; more than granted is a bug in
        the owner, stopped here before the bytes leave."""
        if count > self.credit:
            raise ChannelError(
                f"consumer {self.consumer}: the queue would send {count} on a credit of "
                f"{self.credit}"
            )
        self.credit -= count
        self.delivery_count = (self.delivery_count + count) & SERIAL_MASK
        if self.ack_required:
            self.unsettled += count

    def reply(
        self, request: Credit, delivery_count: int, credit: int, available: int
    ) -> CreditReply:
        """The queue's reply to ``request`` after its deliveries: a drain spends the rest."""
        advance = serial_diff(delivery_count, self.delivery_count)
        if not 0 <= advance <= self.credit or credit > self.credit - advance:
            raise ChannelError(
                f"consumer {self.consumer}: the queue replies at delivery-count {delivery_count} "
                f"from {self.delivery_count} with credit {self.credit}"
            )
        self.delivery_count = delivery_count
        self.credit = credit
        return CreditReply(
            self.consumer, delivery_count, credit, available, request.drain, request.echo
        )

    def settled(self, settle: Settle) -> list[int]:
        """The sequence numbers a settlement names, expanded only once their count is known to
        be within what the consumer holds: a range cannot make the owner walk further."""
        total = sum(last - first + 1 for first, last in settle.ranges)
        if total > self.unsettled:
            raise ChannelError(
                f"consumer {self.consumer}: a settlement of {total} deliveries, "
                f"{self.unsettled} unsettled"
            )
        self.unsettled -= total
        return list(chain.from_iterable(range(first, last + 1) for first, last in settle.ranges))


class Publishes(Generic[T]):
    """A worker's publishes to queues other workers own, by id until each is confirmed.

    ``T`` is whatever the publish path renews credit through (a publisher's delivery): it is
    handed back only when the owner confirms, so a publisher's credit is renewed only once its
    message is stored. A confirm naming an id never sent ends the channel.
    """

    __slots__ = ("next_id", "unconfirmed")

    def __init__(self) -> None:
        self.next_id = 1
        self.unconfirmed: dict[int, T] = {}

    def sent(self, delivery: T) -> int:
        """Record a publish about to be sent; its id."""
        publish = self.next_id
        self.next_id += 1
        self.unconfirmed[publish] = delivery
        return publish

    def confirmed(self, confirm: Confirm) -> list[T]:
        """What ``confirm`` settles, in id order."""
        unconfirmed = self.unconfirmed
        ids = range(confirm.first, confirm.last + 1)
        # The length first: a range longer than what waits is refused without a walk.
        if len(ids) > len(unconfirmed) or any(publish not in unconfirmed for publish in ids):
            raise ChannelError(
                f"a confirm of {confirm.first}..{confirm.last}, not all sent and waiting"
            )
        return [unconfirmed.pop(publish) for publish in ids]

    def lost(self) -> list[T]:
        """The channel ended: every publish still waiting, for the publish path to refuse."""
        waiting = list(self.unconfirmed.values())
        self.unconfirmed.clear()
        return waiting


class Confirms:
    """The confirms an owner owes one channel until its flush, merged as they come: a run of
    consecutive ids of one outcome and no error is one :class:`Confirm`, so a flush's publishes
    stored in order cost one frame, however many there were. A refusal with an error is a
    frame of its own (its condition and description are for that message alone)."""

    __slots__ = ("first", "frames", "last", "outcome")

    def __init__(self) -> None:
        self.frames: list[Confirm] = []
        # The run being extended (first > last: none).
        self.first = 1
        self.last = 0
        self.outcome = Settled.ACCEPTED

    def add(
        self, publish: int, outcome: Settled, condition: str = "", description: str = ""
    ) -> None:
        """Publish ``publish`` is stored (or refused with ``condition``)."""
        if not condition and outcome is self.outcome and publish == self.last + 1:
            if self.first > self.last:
                self.first = publish
            self.last = publish
            return
        self._close()
        if condition:
            self.frames.append(Confirm(publish, publish, outcome, condition, description))
            # The next id may start a run, after this frame.
            self.first, self.last = publish + 1, publish
        else:
            self.first = self.last = publish
            self.outcome = outcome

    def accepted(self, first: int, last: int) -> None:
        """Publishes ``first`` to ``last`` are stored (none if ``first > last``): as many
        :meth:`add` calls, in one."""
        if first > last:
            return
        if self.outcome is Settled.ACCEPTED and first == self.last + 1:
            if self.first > self.last:
                self.first = first
            self.last = last
            return
        self._close()
        self.first, self.last = first, last
        self.outcome = Settled.ACCEPTED

    def refused(
        self, first: int, last: int, outcome: Settled, condition: str, description: str
    ) -> None:
        """Publishes ``first`` to ``last`` are refused alike: one frame for the run, as a
        refusal with an error is not merged with its neighbours."""
        self._close()
        self.frames.append(Confirm(first, last, outcome, condition, description))
        self.first, self.last = last + 1, last

    def take(self) -> list[Confirm]:
        """The frames owed, in order; none owed afterwards."""
        self._close()
        frames, self.frames = self.frames, []
        return frames

    def _close(self) -> None:
        if self.first <= self.last:
            self.frames.append(Confirm(self.first, self.last, self.outcome))
            # An empty run that a publish of the next id extends.
            self.first = self.last + 1
