"""Background proton clients for flow-control tests: an unthrottled publisher, a slow consumer.

Each runs its own reactor in a thread and exposes plain counters the test reads while it runs.
Message bodies carry their index (8 ASCII digits first), so a consumer can prove it received
every accepted message exactly once. The publisher streams pre-encoded bytes and the consumer
reads raw bytes, so the clients stay faster than the server and never hide its limits.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Final

from proton import Delivery, Endpoint, Event, Link, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from sluicegate.gateway.events import delivery_of, link_of

# How often the clients look at their stop flag and sample their credit.
TICK: Final = 0.02
INDEX_DIGITS: Final = 8


def _template(body_size: int, durable: bool) -> tuple[bytes, bytes]:
    """The encoding of a message with a ``body_size`` data section, split around the index."""
    encoded = Message(body=b"\0" * body_size, durable=durable).encode()
    prefix = encoded[: len(encoded) - body_size]
    return prefix, b"." * (body_size - INDEX_DIGITS)


def message_index(payload: bytes, body_size: int) -> int:
    """The index a flood message carries (its body ends the encoding)."""
    return int(payload[len(payload) - body_size :][:INDEX_DIGITS])


@dataclass
class LinkCounts:
    """What one publishing link has seen."""

    address: str
    sent: int = 0
    accepted: list[int] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)
    credit: int = 0


class _FloodHandler(MessagingHandler):
    def __init__(self, flood: Flood) -> None:
        super().__init__(prefetch=0, auto_settle=False)
        self.flood = flood
        self.links: dict[Link, LinkCounts] = {}

    def on_start(self, event: Event) -> None:
        flood = self.flood
        container = event.container
        assert container is not None
        self.connection = container.connect(flood.url)
        session = self.connection.session()
        session.open()
        for counts in flood.links:
            sender = session.sender(f"flood-{counts.address}")
            sender.target.address = counts.address
            sender.open()
            self.links[sender] = counts
        container.schedule(TICK, self)

    def on_sendable(self, event: Event) -> None:
        self._send(link_of(event))

    def _send(self, sender: Link) -> None:
        flood = self.flood
        counts = self.links[sender]
        while sender.credit > 0 and not flood.stopping.is_set():
            index = flood.next_index
            flood.next_index += 1
            delivery = sender.delivery(str(index))
            setattr(delivery, "index", index)  # noqa: B010
            sender.stream(flood.prefix + b"%08d" % index + flood.padding)
            sender.advance()
            counts.sent += 1
            flood.outstanding += 1
        counts.credit = sender.credit

    def on_delivery(self, event: Event) -> None:
        delivery: Delivery = delivery_of(event)
        if not delivery.remote_state:
            return
        counts = self.links[delivery.link]
        index: int = getattr(delivery, "index")  # noqa: B009
        state = delivery.remote_state
        if state == Delivery.ACCEPTED:
            counts.accepted.append(index)
        else:
            condition = delivery.remote.condition
            counts.refused.append((index, condition.name if condition else str(state)))
        delivery.settle()
        self.flood.outstanding -= 1

    def on_timer_task(self, event: Event) -> None:
        flood = self.flood
        now = time.monotonic()
        blocked = all(s.credit <= 0 for s in self.links)
        if blocked and flood.last_tick and not flood.stopping.is_set():
            flood.blocked_time += now - flood.last_tick
        flood.last_tick = now
        for sender, counts in self.links.items():
            counts.credit = sender.credit
            if sender.state & Endpoint.LOCAL_ACTIVE:
                self._send(sender)
        gone = flood.error is not None or bool(self.connection.state & Endpoint.REMOTE_CLOSED)
        if flood.stopping.is_set() and (flood.outstanding == 0 or gone):
            # Every outcome came, or never will (the server went): the reactor ends.
            self.connection.close()
            return
        container = event.container
        assert container is not None
        container.schedule(TICK, self)

    def on_transport_error(self, event: Event) -> None:
        transport = event.transport
        assert transport is not None
        self.flood.error = str(transport.condition)


class Flood(threading.Thread):
    """Publish unsettled messages on one link per address as fast as credit allows."""

    def __init__(
        self, url: str, addresses: list[str], body_size: int = 1000, durable: bool = False
    ) -> None:
        super().__init__(name="flood", daemon=True)
        if body_size < INDEX_DIGITS:
            raise ValueError(f"body_size must be at least {INDEX_DIGITS}")
        self.url = url
        self.body_size = body_size
        self.prefix, self.padding = _template(body_size, durable)
        self.links = [LinkCounts(address) for address in addresses]
        self.next_index = 0
        self.outstanding = 0
        self.blocked_time = 0.0
        self.last_tick = 0.0
        self.error: str | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        """The publisher's reactor."""
        container = Container(_FloodHandler(self))
        container.run()

    @property
    def sent(self) -> int:
        """Messages sent on every link."""
        return sum(c.sent for c in self.links)

    @property
    def accepted(self) -> list[int]:
        """Indices of every message the server accepted."""
        return [i for c in self.links for i in c.accepted]

    def stop(self, timeout: float = 60.0) -> None:
        """Stop sending, wait for every outstanding outcome, close."""
        self.stopping.set()
        self.join(timeout)
        assert not self.is_alive(), f"publisher still waits for {self.outstanding} outcomes"


class _SlowHandler(MessagingHandler):
    def __init__(self, consumer: SlowConsumer) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        self.consumer = consumer

    def on_start(self, event: Event) -> None:
        consumer = self.consumer
        container = event.container
        assert container is not None
        self.connection = container.connect(consumer.url)
        self.receiver = container.create_receiver(self.connection, consumer.address)
        self.receiver.flow(consumer.credit)
        container.schedule(TICK, self)

    def on_delivery(self, event: Event) -> None:
        delivery: Delivery = delivery_of(event)
        if delivery.partial:
            return
        consumer = self.consumer
        link = link_of(event)
        payload = link.recv(delivery.pending) or b""
        link.advance()
        consumer.received.append(message_index(payload, consumer.body_size))
        if not consumer.settles:
            return
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        rate = consumer.rate
        if rate:
            # A slow application: the reactor (and so the socket) is not read meanwhile.
            consumer.due = max(consumer.due, time.monotonic()) + 1.0 / rate
            pause = consumer.due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        if link.credit <= consumer.credit // 2:
            link.flow(consumer.credit - link.credit)

    def on_timer_task(self, event: Event) -> None:
        if self.consumer.stopping.is_set():
            self.connection.close()
            return
        container = event.container
        assert container is not None
        container.schedule(TICK, self)


class SlowConsumer(threading.Thread):
    """Consume with large credit, accepting each message, at most ``rate`` per second; with
    ``settles`` False, a hoarder: it takes what its first credit allows and never settles."""

    def __init__(
        self,
        url: str,
        address: str,
        body_size: int,
        credit: int,
        rate: float | None,
        settles: bool = True,
    ) -> None:
        super().__init__(name="slow-consumer", daemon=True)
        self.url = url
        self.address = address
        self.body_size = body_size
        self.credit = credit
        # Messages per second; None reads as fast as the server sends.
        self.rate = rate
        self.settles = settles
        self.due = 0.0
        self.received: list[int] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        """The consumer's reactor."""
        Container(_SlowHandler(self)).run()

    def stop(self, timeout: float = 30.0) -> None:
        """Close the connection; whatever it had not settled goes back to the queue."""
        self.stopping.set()
        self.join(timeout)
        assert not self.is_alive(), "the consumer did not stop"
