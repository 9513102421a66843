"""A classic queue's messages in publication order: resident by sequence number, the tail in pages.

Resident messages live in ``messages``, a dict by sequence number, so any message is found in
O(1) and an archived one leaves at once, whatever order consumers settle in: the dict holds only
live messages, even behind one that a consumer holds for hours. Archiving leaves a gap in the
sequence; :meth:`Backlog.scavenge` moves ``low`` (a lower bound of live sequence numbers) over
the gaps lazily, each gap once, so every message costs amortised O(1) however long the queue.

It also keeps the count of ready (available) messages and their bytes, and the server's count
of bytes held, as messages come and go.

A message given up on with a dead-letter exchange to go to stays at its place until its copies
are stored (:meth:`Backlog.hold`, then :meth:`Backlog.dead_lettered`): never cleared from its
queue, or from the log, before its copies exist; if its dead-lettering fails it stays there
(:meth:`Backlog.dead_letter_failed`).

A durable queue's ready backlog beyond ``resident_ready`` waits in pages at the tail
(:mod:`queues.paging`), outside the sequence: a walk that reaches the end of the resident
messages pages the head page in (:meth:`Backlog.page_in`), its messages taking the next
sequence numbers.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from sluicegate.queues.dead_lettering import DELIVERY_LIMIT
from sluicegate.queues.deadlines import Deadlines
from sluicegate.queues.filters.budget import ReadBudget
from sluicegate.queues.filters.view import ViewCache
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD, HeldBytes
from sluicegate.queues.message import (
    ACQUIRED,
    AVAILABLE,
    DEAD_LETTER_FAILED,
    DEAD_LETTERING,
    Message,
)
from sluicegate.queues.paging import RESIDENT_READY, Page, Pager
from sluicegate.queues.queue_type import MessageFilter


class Backlog:
    """Every message one classic queue holds, ready or acquired, and its pages."""

    __slots__ = (
        "deadlines",
        "expire",
        "held",
        "low",
        "messages",
        "next_seq",
        "paged",
        "pager",
        "pages",
        "ready",
        "ready_bytes",
        "resident_ready",
        "stranded",
    )

    def __init__(
        self,
        held: HeldBytes,
        deadlines: Deadlines,
        expire: weakref.WeakMethod[Callable[[Message], None]],
    ) -> None:
        self.held = held
        self.deadlines = deadlines
        # What the queue does with a message found dead (counts it, dead-letters it): a method
        # of the queue, held weakly, since the queue holds this backlog and a reference back
        # made every deleted queue a cycle, kept with what it held until a collection.
        self.expire = expire
        self.messages: dict[int, Message] = {}
        deadlines.messages = self.messages
        self.low = 0
        self.next_seq = 0
        # Set for a durable queue: ready messages beyond ``resident_ready`` go to pages.
        self.pager: Pager | None = None
        self.resident_ready = RESIDENT_READY
        self.pages: deque[Page] = deque()
        # Messages in the pages.
        self.paged = 0
        # Available messages, resident or paged, and their bytes on the wire.
        self.ready = 0
        self.ready_bytes = 0
        # Messages whose dead-lettering failed, held at their place.
        self.stranded = 0

    def collect(
        self,
        seqs: Iterable[int],
        now: int,
        limit: int,
        taken: list[Message],
        accept: MessageFilter | None = None,
        browse: bool = False,
        budget: ReadBudget | None = None,
        views: ViewCache | None = None,
    ) -> int | None:
        """Append to ``taken`` the messages ``seqs`` name that a consumer may take, until it
        holds ``limit``: return the sequence number after the one that filled it (or after the
        last one read when ``budget`` is spent), or None when ``seqs`` ran out first.

        Every walk over the queue's messages goes through here: it skips what is no longer
        available (taken, settled, gone) and expires what it finds dead, so a message past its
        expiry is never delivered, even before the timer runs. A browser (``browse``) also sees
        what other consumers hold; a filtered consumer takes only what it ``accept``s, its
        filter's work charged to ``budget`` (queues.filters.budget), and so is each step over
        what the walk does not take: a gap behind a message held unacked is every settled
        message since, which every new walk met.
        """
        messages = self.messages
        count = len(taken)
        for seq in seqs:
            message = messages.get(seq)
            if message is not None:
                state = message.state
                if state == AVAILABLE or (browse and state == ACQUIRED):
                    expires = message.expires
                    if expires is not None and expires <= now:
                        if state == AVAILABLE:
                            expire = self.expire()
                            assert expire is not None  # its queue holds this backlog
                            expire(message)
                    elif (
                        accept is None
                        or (budget is None and accept(message))
                        or (budget is not None and budget.passes(accept, message, views))
                    ):
                        taken.append(message)
                        count += 1
                        if count >= limit:
                            return seq + 1
                        continue
            if budget is not None:
                # A step over what it does not take: a gap settled messages left, another
                # consumer's, the dead, the unmatched (after its evaluation's cost).
                budget.units -= 1
                if budget.units <= 0:
                    return seq + 1
        return None

    def available(self, seq: int) -> bool:
        """Whether the message numbered ``seq`` is resident and available."""
        message = self.messages.get(seq)
        return message is not None and message.state == AVAILABLE

    def append(self, message: Message) -> None:
        """A new message: it takes the next sequence number."""
        message.seq = seq = self.next_seq
        self.next_seq = seq + 1
        self.messages[seq] = message
        self.ready += 1
        self.ready_bytes += message.read_size()
        # HeldBytes.take inlined: every message published passes here.
        share = message.share
        if share is None or not share.holders:
            self.held.total += message.held + MESSAGE_OVERHEAD
        else:
            self.held.total += MESSAGE_OVERHEAD
        if share is not None:
            share.holders += 1

    def archive(self, message: Message, *, sending: bool = False) -> None:
        """A delivered message is settled (``sending``: before it is sent): it leaves."""
        self.held.let_go(message)
        message.archive(sending=sending)
        del self.messages[message.seq]

    def remove(self, message: Message) -> None:
        """Take a message given up on out of the queue: ready (expired, dropped) or rejected."""
        if message.state == AVAILABLE:
            self.ready -= 1
            self.ready_bytes -= message.read_size()
        message.discard()
        del self.messages[message.seq]
        self.held.let_go(message)

    def hold(self, message: Message) -> None:
        """A message given up on goes to the dead-letter exchange: it is no longer ready, and
        stays at its place, unsettled, until :meth:`dead_lettered` or :meth:`dead_letter_failed`."""
        assert self.messages.get(message.seq) is message, "only a queued message is held"
        if message.state == AVAILABLE:
            self.ready -= 1
            self.ready_bytes -= message.read_size()
        message.state = DEAD_LETTERING

    def dead_lettered(self, message: Message) -> None:
        """Its copies are stored (or its dead-letter exchange routed it nowhere): it leaves,
        its settlement logged after its copies'. A message purged meanwhile is gone already."""
        if message.state == DEAD_LETTERING:
            message.discard()
            del self.messages[message.seq]
            self.held.let_go(message)

    def dead_letter_failed(self, message: Message) -> bool:
        """Its dead-lettering failed: it stays where it is, as it is; False if it is gone."""
        if message.state != DEAD_LETTERING:
            return False
        message.state = DEAD_LETTER_FAILED
        self.stranded += 1
        return True

    def reinstate(self, message: Message) -> None:
        """Put back a message archived when it was handed out, its session never sent it."""
        self.messages[message.seq] = message
        self.low = min(self.low, message.seq)
        self.held.take(message)

    def count_failures(
        self, messages: list[Message], limit: int | None, give_up: Callable[[Message, str], None]
    ) -> None:
        """Count a failed delivery on each message; those past ``limit`` are given up on.

        Runs after the messages are back in the queue, so that a header that cannot be
        re-encoded loses nothing: that message keeps its old count, the others get theirs.
        """
        error: Exception | None = None
        rewrite = self.held.rewrite
        for message in messages:
            size = message.read_size()
            try:
                rewrite(message, message.count_failed_delivery)
            except Exception as exc:
                error = error or exc
                continue
            self.ready_bytes += message.read_size() - size
            if limit is not None and message.delivery_count > limit:
                give_up(message, DELIVERY_LIMIT)
        if error is not None:
            raise error

    def scavenge(self) -> int:
        """Move ``low`` over the gaps archived messages left at the front of the sequence."""
        messages = self.messages
        low = self.low
        end = self.next_seq
        while low < end and low not in messages:
            low += 1
        self.low = low
        return low

    # -- pages ----------------------------------------------------------------------------

    def page_out(self, pager: Pager, message: Message) -> None:
        """Append a ready message to the tail pages instead of the resident messages."""
        pages = self.pages
        tail = pages[-1] if pages else None
        before = tail.held if tail is not None else 0
        page = pager.append(tail, message)
        if page is None:
            assert tail is not None
            self.held.total += tail.held - before
        else:
            pages.append(page)
            self.held.total += page.held
            if len(pages) == 1 and page.head_deadline(self.deadlines.ttl) is not None:
                self.deadlines.join()
        self.paged += 1
        self.ready += 1
        self.ready_bytes += message.read_size()

    def add_pages(self, pages: Sequence[Page]) -> int:
        """Append pages a restart found in the log: how many messages they hold."""
        count = 0
        for page in pages:
            self.pages.append(page)
            count += page.count
            self.ready_bytes += page.ready_bytes
            self.held.total += page.held
        self.paged += count
        self.ready += count
        return count

    def page_in(self) -> Sequence[Message]:
        """Give the head page's messages the next sequence numbers: they become resident."""
        page = self.pages.popleft()
        deadlines = self.deadlines
        messages = page.take(deadlines.ttl)
        self.paged -= len(messages)
        seq = self.next_seq
        resident = self.messages
        for message in messages:
            message.seq = seq
            resident[seq] = message
            expires = message.expires
            if expires is not None:
                deadlines.watch(message, expires)
            seq += 1
        self.next_seq = seq
        # The page counted itself (queues/paging.py); its messages count as resident ones.
        self.held.total -= page.held
        self.held.take_all(messages)
        return messages

    def drop_expired_pages(self, now: int) -> int:
        """Drop the head pages every message of which is past x-message-ttl, unread; how many.

        For a queue without a dead-letter exchange: nothing needs their bodies.
        """
        dropped = 0
        pages = self.pages
        ttl = self.deadlines.ttl
        while pages:
            deadline = pages[0].tail_deadline(ttl)
            if deadline is None or deadline > now:
                break
            page = pages.popleft()
            page.drop()
            dropped += page.count
            self.paged -= page.count
            self.ready -= page.count
            self.ready_bytes -= page.ready_bytes
            self.held.total -= page.held
        return dropped

    def head_deadline(self) -> int | None:
        """When the head page's first message expires, if the queue has pages and it does."""
        return self.pages[0].head_deadline(self.deadlines.ttl) if self.pages else None

    def purge(self) -> int:
        """Drop every message no consumer holds, resident or paged: how many were available or
        held after their dead-lettering failed (one on its way to its dead-letter exchange
        goes on, its copies are made)."""
        count = self.ready + self.stranded
        messages = self.messages
        freed = 0
        dropped = [message for message in messages.values() if message.state != ACQUIRED]
        self.held.let_go_all(dropped)
        for message in dropped:
            message.discard()
            del messages[message.seq]
        for page in self.pages:
            page.drop()
            freed += page.held
        self.pages.clear()
        self.paged = 0
        self.stranded = 0
        self.held.total -= freed
        self.ready = 0
        self.ready_bytes = 0
        return count
