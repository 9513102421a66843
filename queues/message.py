"""A message as the server holds it: the publisher's encoded bytes and the fields it acts on."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from sluicegate.wire.annotations import merge_annotations
from sluicegate.wire.redelivery_counts import with_redelivery_counts
from sluicegate.wire.sections import Header, read_header, with_delivery_count

if TYPE_CHECKING:
    from sluicegate.queues.filters.view import FilterView

# A message's state within its queue (the seed's acquire/release/archive model).
AVAILABLE: Final = 0
ACQUIRED: Final = 1
ARCHIVED: Final = 2
# Given up on and handed to the queue's dead-letter exchange: it keeps its place, its expiry and
# its record in the log, and is never delivered, until its copies are stored (then archived).
DEAD_LETTERING: Final = 3
# Its dead-lettering failed: it keeps its place and is neither delivered nor dead-lettered again
# until its queue is purged or deleted; a restart recovers it from the log as it was.
DEAD_LETTER_FAILED: Final = 4
# Returned by a ``modified`` outcome that asked for a later delivery time (a quorum queue's
# delayed retry, queues/delayed_returns.py): in its queue, never delivered before that time.
DELAYED: Final = 5


class Share:
    """The copies of one message that share its payload and are counted in the held bytes
    (queues/held_bytes.py): the first of them to be counted charges the payload's bytes, the
    last to let go refunds them, so a fan-out's payload counts once (issue 31)."""

    __slots__ = ("holders",)

    def __init__(self, holders: int) -> None:
        self.holders = holders


class Message:
    """One enqueued message; ``seq`` orders it within its queue and tags its deliveries.

    ``payload`` is the publisher's bytes, re-encoded only when a consumer's ``modified``
    annotations are merged in; :meth:`read` is what goes on the wire: the header's
    delivery-count (AMQP 1.0 §3.2.1) raised by failed deliveries, and a quorum queue's
    redelivery counts once it came back (``counts``), stamped on it as it is read, as a stored
    message's are. A return never gives the message bytes of its own, so a fan-out's copies
    coming back unsettled keep sharing their payload and grow nothing the memory budget counts
    (issue 31's seed 65600, docs/bounds.md). ``expires`` is an absolute
    time in milliseconds since the epoch (the unit of AMQP's ``absolute-expiry-time``),
    ``None`` for never. ``exchange`` and ``routing_key`` say how it was published, for
    dead-lettering by routing key. ``view`` holds what filters decoded of it
    (queues.filters.view).
    """

    __slots__ = (
        "_header",
        "counts",
        "delivery_count",
        "exchange",
        "expires",
        "lock_deadline",
        "payload",
        "priority",
        "returned",
        "routing_key",
        "seq",
        "share",
        "stamped",
        "state",
        "view",
    )

    def __init__(
        self,
        payload: bytes,
        delivery_count: int = 0,
        seq: int = 0,
        *,
        expires: int | None = None,
        exchange: str = "",
        routing_key: str = "",
        header: Header | None = None,
    ) -> None:
        self.payload = payload
        # The header as the publish path read it; decoded when first asked for otherwise.
        self._header = header
        self.delivery_count = delivery_count
        # The delivery-count ``payload``'s header carries; :meth:`read` stamps a later one.
        self.stamped = delivery_count
        # Whether :meth:`read` stamps ``returned`` as a quorum queue's redelivery counts.
        self.counts = False
        self.seq = seq
        self.state = AVAILABLE
        self.expires = expires
        self.exchange = exchange
        self.routing_key = routing_key
        self.lock_deadline = 0
        # Set by a priority queue from the header when it takes the message.
        self.priority = 0
        # Times it came back to its queue unsettled (released, modified, its consumer gone):
        # what a quorum queue's delivery limit counts, as RabbitMQ 4's acquired count.
        self.returned = 0
        self.view: FilterView | None = None
        # The copies sharing its payload (:meth:`copy`); None for a message alone with it, the
        # common case, which the held bytes count in full at no extra cost.
        self.share: Share | None = None

    def read_header(self) -> Header:
        """The header fields as published, read once (the live count is ``delivery_count``).
        A method, not a property: a stored message recovered from the log reads its body to
        know (queues/log/stored.py)."""
        header = self._header
        if header is None:
            header = self._header = read_header(self.read())
        return header

    def read_size(self) -> int:
        """Bytes the message occupies on the wire. A method, not a property: a stored message
        annotated by a consumer reads its body to know (queues/log/stored.py)."""
        if self.delivery_count == self.stamped and not self.counts:
            return len(self.payload)
        return len(self.read())

    @property
    def held(self) -> int:
        """Bytes of the message kept in memory (a stored message's body may be on disk only)."""
        return len(self.payload)

    def copy(self, *, counted: bool = False) -> Message:
        """The same message for another queue: shares the bytes, not the queue's state.

        A plain message's copies join its :class:`Share`, made now if it has none: ``counted``
        says whether this one is in the held bytes already (a browser's copy of a queued
        message), so that it stands as the share's one holder, whose charge is the same.
        """
        plain = type(self) is Message
        copy = Message(
            self.payload if plain else self.read(),
            self.delivery_count,
            expires=self.expires,
            exchange=self.exchange,
            routing_key=self.routing_key,
            header=self._header,
        )
        if plain:
            copy.stamped = self.stamped
            copy.counts = self.counts
            copy.returned = self.returned
            share = self.share
            if share is None:
                share = self.share = Share(1 if counted else 0)
            copy.share = share
        return copy

    def read(self) -> bytes:
        """The bytes to send: a stored message reads them from the log (a read, maybe a disk's);
        a plain one's payload, stamped with what its returns changed since."""
        payload = self.payload
        if self.delivery_count != self.stamped:
            payload = with_delivery_count(payload, self.delivery_count)
        if self.counts:
            payload = with_redelivery_counts(payload, self.returned)
        return payload

    def send(self) -> bytes:
        """The bytes to send now, as one whole delivery: :meth:`read`, after which a stored
        message's body need not stay in memory."""
        return self.read()

    def acquire(self) -> None:
        """Handed to a consumer that settles it later (a stored message logs it)."""
        self.state = ACQUIRED

    def archive(self, *, sending: bool = False) -> None:
        """Settled and gone (a stored message logs it); ``sending``: still to be sent, so a
        stored message keeps its body until it is."""
        self.state = ARCHIVED

    def release(self) -> None:
        """Back in its queue, available (a stored message logs it)."""
        self.state = AVAILABLE

    def discard(self) -> None:
        """Archive a message nobody will receive (purged, expired, dropped, paged and purged)."""
        self.state = ARCHIVED

    def count_failed_delivery(self) -> None:
        """Record one more failed delivery attempt in the header the next consumer sees,
        stamped as it is read: the payload, perhaps shared, stays as it is.

        The new header is built once before anything changes, so a header that cannot be
        re-encoded raises and leaves the message as it was.
        """
        with_delivery_count(self.payload, self.delivery_count + 1)
        self.delivery_count += 1

    def annotate(self, additions: bytes) -> None:
        """Merge the encoded map ``additions`` into the message annotations (a consumer's
        ``modified`` outcome); raises ``DecodeError``, changing nothing, if either is bad."""
        self.payload = merge_annotations(self.read(), additions)
        self.stamped = self.delivery_count
        self.counts = False
        self.share = None
        self.view = None


class Imported(Message):
    """A delivery from another worker's queue, as the consumer's worker holds it on its way to
    the client: its bytes and sequence number, nothing else of its own.

    Its queue lives on the other worker, which counts its returns, its state and its stamps;
    here it is only sent and, by its ``seq``, settled or handed back, so every other field is
    the class's own constant and cannot be written. Made by :func:`imported` without an
    ``__init__`` call: setting a :class:`Message`'s fifteen fields was most of what a crossing
    consumer's worker spent per message beyond a local consumer's (docs/workers.md).
    """

    __slots__ = ()

    _header = None
    delivery_count = 0
    stamped = 0
    counts = False
    state = AVAILABLE
    expires = None
    exchange = ""
    routing_key = ""
    lock_deadline = 0
    priority = 0
    returned = 0
    view = None
    share = None


def imported(seqs: Iterable[int], payloads: Iterable[bytes]) -> list[Message]:
    """One :class:`Imported` per delivery, in order: allocated at C level, its two fields set."""
    made: list[Message] = []
    new = object.__new__
    for seq, payload in zip(seqs, payloads, strict=True):
        message = new(Imported)
        message.payload = payload
        message.seq = seq
        made.append(message)
    return made


def send_all(messages: Iterable[Message]) -> tuple[bytes, ...]:
    """:meth:`Message.send` of each, in order, without a call for a plain message whose bytes
    are its payload (nothing stamped on them since), as gateway/sending.py reads them."""
    return tuple(
        [
            message.payload
            if type(message) is Message
            and message.delivery_count == message.stamped
            and not message.counts
            else message.send()
            for message in messages
        ]
    )
