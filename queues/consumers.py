"""A classic queue's consumers: each one's credit and unsettled deliveries, and whose turn it is.

Consumers with credit wait in a rotation by priority (``rabbitmq:priority``), highest first,
round robin within a priority. Browsing consumers (``distribution-mode = copy``) wait apart: each
of them gets its own copy of a message, so there is no turn to take. A single-active-consumer
queue (``x-single-active-consumer``) keeps one consumer active; the others wait their turn
without credit counting, and the longest waiting takes over when the active one leaves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from sluicegate.queues.backlog import Backlog
from sluicegate.queues.message import Message
from sluicegate.queues.ordering import Cursor
from sluicegate.queues.queue_type import ConsumerKey, ConsumerOptions, Dispatch, MessageFilter


class Consumer:
    """One consumer's side of the queue link: its credit and what it holds unsettled."""

    __slots__ = (
        "ack_required",
        "active",
        "browse",
        "credit",
        "cursor",
        "delivery_count",
        "filter",
        "key",
        "lost",
        "priority",
        "unacked",
        "unacked_bytes",
        "waiting",
    )

    def __init__(
        self, key: ConsumerKey, ack_required: bool, options: ConsumerOptions, cursor: Cursor
    ) -> None:
        self.key = key
        self.ack_required = ack_required and not options.browse
        self.filter: MessageFilter | None = options.filter
        self.browse = options.browse
        self.priority = options.priority
        self.delivery_count = 0
        self.credit = 0
        self.unacked: dict[int, Message] = {}
        # What its unacked messages hold (``Message.held``), kept as they come and go: summed
        # over them, a queue's statistics cost a pass over every unacked delivery, and the
        # budget weighs queues by them once a run of another worker's publishes while blocked
        # (gateway/peers.py), a publish request of the HTTP API reads them too.
        self.unacked_bytes = 0
        # True while the consumer sits in the queue's rotation of consumers with credit.
        self.waiting = False
        # False for a single-active-consumer queue's consumers that wait their turn.
        self.active = True
        # For filtered and browsing consumers: their own walk over the queue's messages, since
        # they skip what they do not match.
        self.cursor = cursor
        # Deliveries released by lock expiry, so that their late settlement gets an error.
        self.lost: dict[int, None] = {}

    @property
    def scans(self) -> bool:
        """True when the consumer does not take the queue's messages simply in order."""
        return self.filter is not None or self.browse


# Hands a message to a consumer (the queue's state change); returns it.
Give = Callable[["Consumer", Message], Message]
# The next message for a consumer, given to it; None if there is none for it.
Fetch = Callable[["Consumer"], Message | None]


class Consumers:
    """Every consumer of one queue, and the rotation of those waiting with credit."""

    __slots__ = (
        "behind",
        "browsing",
        "by_key",
        "deferred",
        "rotation",
        "single_active",
        "waiting",
    )

    def __init__(self, single_active: bool) -> None:
        self.single_active = single_active
        self.by_key: dict[ConsumerKey, Consumer] = {}
        # Consumers with credit by priority, highest first; round robin within a priority.
        self.rotation: list[tuple[int, deque[Consumer]]] = []
        # How many consumers wait in the rotation, and the browsers that wait: only those are
        # offered a new message (walking every browser per message, with credit or not, cost
        # O(browsers) a message).
        self.waiting = 0
        self.browsing: dict[Consumer, None] = {}
        # Browsers waiting with credit whose walk stopped on the queue's spent budget, or was
        # moved back (their session's unsent deliveries given back): the queue walks them on at
        # its next tick, since no new message is offered to a browser behind it.
        self.behind: dict[ConsumerKey, Consumer] = {}
        # A new message was left for a filtered consumer's walk (see offer): the queue must
        # walk again at its next tick.
        self.deferred = False

    def add(self, state: Consumer) -> None:
        """A consumer attached; on a single-active-consumer queue it waits if another is active."""
        if self.single_active and not state.browse:
            state.active = not any(c.active and not c.browse for c in self.by_key.values())
        self.by_key[state.key] = state

    def remove(self, key: ConsumerKey) -> Consumer | None:
        """A consumer detached: out of the rotation, with no credit left."""
        state = self.by_key.pop(key, None)
        if state is None:
            return None
        state.credit = 0
        self.leave(state)
        released = state.cursor.released
        if released is not None:
            released.leave(state.cursor)
        return state

    def join(self, state: Consumer) -> None:
        """The consumer has credit: it waits for messages in its priority's turn."""
        if state.waiting:
            return
        state.waiting = True
        if state.browse:
            self.browsing[state] = None
            return
        self.waiting += 1
        rotation = self.rotation
        for priority, group in rotation:
            if priority == state.priority:
                group.append(state)
                return
        rotation.append((state.priority, deque([state])))
        rotation.sort(key=lambda entry: -entry[0])

    def leave(self, state: Consumer) -> None:
        """The consumer has no credit (or is gone): out of the rotation."""
        if not state.waiting:
            return
        state.waiting = False
        if state.browse:
            del self.browsing[state]
            self.behind.pop(state.key, None)
            return
        self.waiting -= 1
        for priority, group in self.rotation:
            if priority == state.priority:
                group.remove(state)
                return

    def served(self, state: Consumer, group: deque[Consumer]) -> None:
        """A waiting consumer got a message: to the back of its group, or out if spent."""
        if state.credit > 0:
            group.append(state)
        else:
            state.waiting = False
            self.waiting -= 1

    def promote(self) -> None:
        """A single active consumer left: the longest-waiting other consumer takes over."""
        for state in self.by_key.values():
            if not state.browse:
                state.active = True
                if state.credit > 0:
                    self.join(state)
                return

    def offer(self, message: Message, give: Give) -> list[Dispatch]:
        """A new message: copies to waiting browsers, then the first waiting taker that wants it.

        A filter runs on the queue's read budget, as in a walk: with the budget spent, or a
        cursor behind the message (messages before it not read yet), the message is left for
        that consumer's walk at the queue's next tick (``deferred``; a browser goes ``behind``),
        so a publisher's burst costs filtered consumers a budget per tick, not an evaluation
        per message each.
        """
        dispatches: list[Dispatch] = []
        if self.browsing:
            for state in list(self.browsing):
                cursor = state.cursor
                accept = state.filter
                budget = cursor.budget
                if cursor.position != message.seq or (
                    accept is not None and budget is not None and budget.spent
                ):
                    self.behind[state.key] = state
                    self.deferred = True
                    continue
                cursor.position = message.seq + 1
                if accept is not None and not (
                    accept(message)
                    if budget is None
                    else budget.passes(accept, message, cursor.views)
                ):
                    continue
                dispatches.append((state.key, give(state, message)))
                if state.credit == 0:
                    self.leave(state)
        if not self.waiting:
            return dispatches
        for _, group in self.rotation:
            for index, state in enumerate(group):
                if state.filter is not None and not self._reads(state, message):
                    continue
                del group[index]
                give(state, message)
                self.served(state, group)
                dispatches.append((state.key, message))
                return dispatches
        return dispatches

    def _reads(self, state: Consumer, message: Message) -> bool:
        """Whether a filtered consumer's filter takes a new message, read now within the
        budget; False also when it is left for the consumer's walk."""
        cursor = state.cursor
        budget = cursor.budget
        accept = state.filter
        assert accept is not None
        if cursor.position != message.seq or (budget is not None and budget.spent):
            self.deferred = True
            return False
        cursor.position = message.seq + 1
        if budget is None:
            return accept(message)
        return budget.passes(accept, message, cursor.views)

    def dispatch(self, fetch: Fetch, backlog: Backlog) -> list[Dispatch]:
        """Hand ``backlog``'s ready messages to waiting consumers, one each in turn, by priority."""
        dispatches: list[Dispatch] = []
        for _, group in self.rotation:
            while group and backlog.ready:
                # One pass over the group: each consumer takes one message or leaves the turn.
                progressed = False
                for _ in range(len(group)):
                    state = group.popleft()
                    message = fetch(state)
                    if message is None:
                        group.append(state)
                        continue
                    dispatches.append((state.key, message))
                    progressed = True
                    self.served(state, group)
                if not progressed:
                    break
        return dispatches
