"""Other workers' publishers as the worker that owns their queues charges them: free of IO.

A publish that crosses the channel (docs/workers.md) names the link it was published on, on the
worker it came from (``frames.Publish.publisher``). While the memory budget is blocked, the
owner charges what those publishes store here to that link, as it charges its own publishers
(session/inbound_flow.py): the queues it stored into, weighed against what they weighed when it
first stored into each since the block. Weighed per queue only, a publisher whose fan-out's
copies went to many queues on another worker, each far under a holder's floor, was held by no
one, and filled the owner's publishers' part until every publisher there waited, the light
ones among them (adversary seeds 66102, 66103). A held one's publishes are parked, and stored
once it is not held (gateway/peers.py), so that the amplification waits, never the bystander.

While blocked, the owner stores nothing of theirs unweighed: each run is admitted
(:meth:`RemotePublishers.admit`) only if its publisher's growth with it stays within a quarter
of the publishers' part left, shared among the publishers growing in it. Weighed only at the
flush that follows, a fresh link each time took a quarter of the whole part and a sixteenth
more before it was held, and five links, each gone or held in turn, filled the part to its
ceiling (adversary seed 65800: 4.5 MB of other workers' publishes stored past a worker's
limit, nobody held). Admitted so, a run takes at most a quarter of the room it finds, so
however many links come and go, their runs never take the last of it.
"""

from __future__ import annotations

from collections.abc import Callable

from sluicegate.queues.queue_type import QueueType

# The most a publisher's growth may take of the publishers' part left, shared among those that
# grow in it: the holder rule's share (session/inbound_flow.py's HOLDER_SHARE), so that a
# run takes at most a quarter of the room it finds, and the room left never ends.
ADMITTED_SHARE = 0.25
# A publish that names no publisher: a dead letter (parked while blocked whatever it weighs).
NO_PUBLISHER = 0
# The numbers that name publishers, unique in a worker for its life: its links take the even
# ones (session/incoming_link.py, on the reactor thread), the HTTP API's clients the odd ones,
# one per HTTP connection (gateway/http/publish_api.py, on the HTTP thread), so that the two
# threads share no counter. Charged to the API as one publisher, a light HTTP client was held
# with a heavy one; weighed per queue only, an HTTP client's copies to light queues of a
# blocked worker held nobody (adversary seed 66103's replay).
FIRST_LINK = 2
FIRST_HTTP_CLIENT = 1
PUBLISHER_STEP = 2


class RemotePublisher:
    """One link on another worker, as the copies it stored here since the budget blocked."""

    __slots__ = ("counted", "held", "queues", "stored", "weight_at_block")

    def __init__(self) -> None:
        # The queues it stored into since the budget blocked, and what each weighed just before
        # its first copy there: their sum is what it is weighed against.
        self.queues: dict[QueueType, int] = {}
        self.weight_at_block = 0
        # Its publishes park until it is not (gateway/peers.py).
        self.held = False
        # Whether it stored since the holds were last decided: one that did not (its link may
        # be gone: its worker does not say) shares no room with those that do; and whether it
        # is among those that share it now (``RemotePublishers.growing``).
        self.stored = False
        self.counted = False

    def storing(self, queue: QueueType, weight: int) -> None:
        """A run of its publishes is stored into ``queue``, which weighs ``weight`` before it."""
        if queue not in self.queues:
            self.queues[queue] = weight
            self.weight_at_block += weight

    def growth(self, weigh: Callable[[QueueType], int]) -> int:
        """What its queues grew by since it first stored into each."""
        return sum(weigh(queue) for queue in self.queues) - self.weight_at_block


class RemotePublishers:
    """The links of other workers that stored copies here while the budget is blocked."""

    __slots__ = ("growing", "publishers")

    def __init__(self) -> None:
        # By the worker they are on and their number there.
        self.publishers: dict[tuple[int, int], RemotePublisher] = {}
        # The publishers sharing the room left (:meth:`admit`): as the holds were last decided
        # (session/inbound_flow.py), this worker's links and other workers' that grew and are
        # not held, the latter only if they stored since the decision before; and the ones
        # that stored since.
        self.growing = 0

    def storing(self, peer: int, publisher: int, queue: QueueType, weight: int) -> None:
        """Worker ``peer``'s link ``publisher`` stores into ``queue`` while blocked."""
        if publisher == NO_PUBLISHER:
            return
        key = (peer, publisher)
        found = self.publishers.get(key)
        if found is None:
            found = self.publishers[key] = RemotePublisher()
        found.storing(queue, weight)

    def admit(
        self,
        peer: int,
        publisher: int,
        queue: QueueType,
        nbytes: int,
        room: int,
        floor: int,
        weigh: Callable[[QueueType], int],
        grown: dict[tuple[int, int], int],
    ) -> bool:
        """Whether worker ``peer``'s link ``publisher`` may store a run of ``nbytes`` into
        ``queue`` while blocked, with ``room`` left in the publishers' part: its growth with the
        run within :data:`ADMITTED_SHARE` of the room, shared among the publishers growing (it
        among them). Charged if so; if not, the run waits and is weighed again at the next
        flush, with the room then left (held for it, a light link whose run came as the room
        was short waited until the holds were decided again, which only a move of the bytes
        brings).

        A publisher that has not grown since the block (new here, or its queues read back to
        what they weighed) may grow by ``floor`` (the least the holds weigh, a share of the
        margin) where its share is less, within a quarter of the room: shared among some 40
        publishers growing, a quarter of 12.7 KB of room was some 80 bytes, under the prober's
        one message, which waited for good while those growing stood under their shares
        (adversary seed 65965). One that grew is kept to its share, so the light publishers
        piling up in queues nobody reads do not take the room from one whose queue is read.
        No run takes more than a quarter of the room, whatever the publisher grew by: one
        whose queues were read below their weight at the block took the rest of it.

        ``grown``: what each publisher grew by, weighed at its first run of one walk of the
        parked and added to as its runs are admitted: weighed at each run, a link whose copies
        went to a thousand queues (``x-cc``) read its queues' statistics a thousand times for
        its thousand runs, a million reads in one walk.
        """
        key = (peer, publisher)
        found = self.publishers.get(key)
        if found is not None and found.held:
            return False
        counted = found is not None and found.counted
        if found is None:
            before = 0
        elif key in grown:
            before = grown[key]
        else:
            before = grown[key] = found.growth(weigh)
        quarter = room * ADMITTED_SHARE
        if nbytes > quarter:
            return False
        growth = before + nbytes
        growing = self.growing if counted else self.growing + 1
        share = quarter / growing
        if before <= 0:
            share = max(share, min(quarter, floor))
        if growth > share:
            return False
        grown[key] = growth
        if not counted:
            self.growing += 1
        self.storing(peer, publisher, queue, weigh(queue))
        stored = self.publishers[peer, publisher]
        stored.stored = stored.counted = True
        return True

    def held(self, peer: int, publisher: int) -> bool:
        """Whether worker ``peer``'s link ``publisher`` is held: its publishes park."""
        found = self.publishers.get((peer, publisher))
        return found is not None and found.held

    def forget(self, peer: int) -> None:
        """The channel to ``peer`` ended: its links' publishes go unconfirmed."""
        for key in [key for key in self.publishers if key[0] == peer]:
            del self.publishers[key]

    def queue_deleted(self, queue: QueueType) -> None:
        """``queue`` was deleted: no record keeps it (nor, through it, the queue), a link's
        weight at the block loses what it counted for it, and a link that stored only there
        is forgotten. Kept until the budget let go, a client deleting the queues it filled
        left a record per queue, weighed, until then."""
        publishers = self.publishers
        for key, publisher in list(publishers.items()):
            weight = publisher.queues.pop(queue, None)
            if weight is None:
                continue
            publisher.weight_at_block -= weight
            if not publisher.queues:
                del publishers[key]

    def decided(self, grown: dict[RemotePublisher, int], growing_here: int) -> None:
        """The holds were decided again (session/inbound_flow.py), with ``grown``: by how much
        each record's queues grew, and ``growing_here`` of this worker's links growing and not
        held.

        Those not held whose queues weigh no more than they did when each was first stored
        into are forgotten: weighed from now if they store again, they are held no later, and
        the records of links that come and go on another worker during a long block are as
        many as the links whose copies are still held.

        The room is shared from now among the publishers that may still take of it: not held,
        grown, and for another worker's, stored since the decision before. Counted whatever
        they did, records of links long gone on the other worker (it does not say) and held
        ones cut every share, and a light link's run of one message did not fit its share
        of the room left: the prober's publish waited for good (adversary seed 65870: 87
        records, 3 held, 164 KB of room).
        """
        sharing = growing_here
        for key, publisher in list(self.publishers.items()):
            growth = grown.get(publisher, 0)
            if not publisher.held and growth <= 0:
                del self.publishers[key]
                continue
            publisher.counted = publisher.stored and not publisher.held
            publisher.stored = False
            sharing += publisher.counted
        self.growing = sharing

    def clear(self) -> None:
        """The budget let go: nobody is held, and what is stored from now is not charged."""
        self.publishers.clear()
        self.growing = 0
