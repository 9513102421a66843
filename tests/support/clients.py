"""Fast proton reactor clients for tests: publish many messages, consume with chosen outcomes.

``BlockingConnection`` waits for each message's settlement in turn; these clients keep credit
busy and settle as they go, so 10,000-message tests take a second, not ten.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proton import Delivery, Event, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

from sluicegate.gateway.events import delivery_of, link_of

# How long a test client may wait without any progress before it gives up.
IDLE_TIMEOUT = 10.0


@dataclass
class Published:
    """What a publisher saw: one outcome per message, in sending order."""

    outcomes: list[str] = field(default_factory=list)


@dataclass
class Received:
    """What a consumer saw, in arrival order."""

    messages: list[Message] = field(default_factory=list)

    @property
    def bodies(self) -> list[object]:
        """The message bodies."""
        return [m.body for m in self.messages]


class _Publisher(MessagingHandler):
    def __init__(
        self,
        url: str,
        address: str,
        messages: list[Message],
        presettled: bool,
        max_frame: int,
        connect: Mapping[str, Any],
    ) -> None:
        super().__init__(auto_settle=True)
        self.url = url
        self.address = address
        self.messages = messages
        self.presettled = presettled
        self.max_frame = max_frame
        self.connect = connect
        self.sent = 0
        self.result = Published()
        self.outcomes: dict[int, str] = {}

    def on_start(self, event: Event) -> None:
        assert event.container is not None
        connection = event.container.connect(
            self.url, max_frame_size=self.max_frame or None, **self.connect
        )
        options = None
        if self.presettled:
            from proton.reactor import AtMostOnce

            options = AtMostOnce()
        event.container.create_sender(connection, self.address, options=options)

    def on_sendable(self, event: Event) -> None:
        sender = link_of(event)
        while sender.credit > 0 and self.sent < len(self.messages):
            delivery = sender.send(self.messages[self.sent])
            setattr(delivery, "index", self.sent)  # noqa: B010
            self.sent += 1
            if self.presettled:
                self.result.outcomes.append("presettled")
        if self.presettled and self.sent == len(self.messages):
            assert event.connection is not None
            event.connection.close()

    def _outcome(self, event: Event, outcome: str) -> None:
        self.outcomes[getattr(delivery_of(event), "index")] = outcome  # noqa: B009
        if len(self.outcomes) == len(self.messages):
            self.result.outcomes = [self.outcomes[i] for i in range(len(self.messages))]
            assert event.connection is not None
            event.connection.close()

    def on_accepted(self, event: Event) -> None:
        self._outcome(event, "accepted")

    def on_rejected(self, event: Event) -> None:
        self._outcome(event, "rejected")

    def on_released(self, event: Event) -> None:
        self._outcome(event, "released")


def publish(
    url: str,
    address: str,
    bodies: Sequence[bytes | str] | None = None,
    *,
    messages: list[Message] | None = None,
    presettled: bool = False,
    max_frame: int = 0,
    connect: Mapping[str, Any] | None = None,
) -> Published:
    """Send messages (or plain bodies) and wait for every outcome.

    ``connect`` goes to proton's ``Container.connect`` (``ssl_domain``, ``user``, ...).
    """
    batch = messages if messages is not None else [Message(body=b) for b in bodies or []]
    handler = _Publisher(url, address, batch, presettled, max_frame, connect or {})
    container = Container(handler)
    container.timeout = IDLE_TIMEOUT
    container.run()
    return handler.result


class _Consumer(MessagingHandler):
    def __init__(
        self,
        url: str,
        address: str,
        count: int,
        credit: int,
        settled: bool,
        decide: Callable[[Message, int], str],
        max_frame: int,
    ) -> None:
        # Credit is managed here: proton's FlowController tops up only on the *next* event.
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
        self.window = credit
        self.url = url
        self.address = address
        self.count = count
        self.settled = settled
        self.decide = decide
        self.max_frame = max_frame
        self.result = Received()

    def on_start(self, event: Event) -> None:
        assert event.container is not None
        connection = event.container.connect(self.url, max_frame_size=self.max_frame or None)
        options = None
        if self.settled:
            from proton.reactor import AtMostOnce

            options = AtMostOnce()
        receiver = event.container.create_receiver(connection, self.address, options=options)
        receiver.flow(self.window)
        if self.count == 0:
            connection.close()

    def on_message(self, event: Event) -> None:
        message = event.message
        assert message is not None
        delivery: Delivery = delivery_of(event)
        if len(self.result.messages) >= self.count:
            # Already in flight when the count was reached: back to the queue, untouched.
            if not self.settled:
                self.release(delivery, delivered=False)
            return
        self.result.messages.append(message)
        if not self.settled:
            outcome = self.decide(message, len(self.result.messages) - 1)
            if outcome == "accept":
                self.accept(delivery)
            elif outcome == "release":
                self.release(delivery, delivered=False)
            elif outcome == "modify":
                # proton's release(delivered=True) leaves delivery-failed unset.
                delivery.local.failed = True
                delivery.update(Delivery.MODIFIED)
                delivery.settle()
            elif outcome == "reject":
                self.reject(delivery)
        if len(self.result.messages) >= self.count:
            assert event.connection is not None
            event.connection.close()
            return
        link = link_of(event)
        deficit = self.window - link.credit
        if deficit >= max(1, self.window // 2):
            link.flow(deficit)


def consume(
    url: str,
    address: str,
    count: int,
    *,
    credit: int = 500,
    settled: bool = False,
    decide: Callable[[Message, int], str] = lambda message, index: "accept",
    max_frame: int = 0,
) -> Received:
    """Receive ``count`` messages, settling each as ``decide`` says (accept by default)."""
    handler = _Consumer(url, address, count, credit, settled, decide, max_frame)
    container = Container(handler)
    container.timeout = IDLE_TIMEOUT
    container.run()
    return handler.result


class _Holding(MessagingHandler):
    """Collects deliveries unsettled and grants no credit of its own (``prefetch=0``)."""

    def __init__(self) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.incoming: deque[tuple[Message, Delivery]] = deque()

    def on_message(self, event: Event) -> None:
        self.incoming.append((event.message, delivery_of(event)))


class Holder:
    """A blocking consumer that holds what it takes and grants exactly ``credit``.

    Proton's own ``create_receiver(credit=n)`` grants ``n`` twice (once as the Fetcher's
    prefetch window, once in ``BlockingReceiver``) and tops the window up on every delivery,
    so how many messages it holds depends on timing; a test that counts what a consumer holds
    uses this instead.
    """

    def __init__(self, connection: BlockingConnection, address: str, credit: int) -> None:
        self.connection = connection
        self._handler = _Holding()
        self.receiver = connection.create_receiver(address, credit=credit, handler=self._handler)
        self.taken: deque[Delivery] = deque()

    def take(self, count: int, timeout: float = IDLE_TIMEOUT) -> list[Message]:
        """The next ``count`` messages, once they arrived; their deliveries stay unsettled."""
        incoming = self._handler.incoming
        self.connection.wait(lambda: len(incoming) >= count, timeout=timeout)
        taken = [incoming.popleft() for _ in range(count)]
        self.taken.extend(delivery for _, delivery in taken)
        return [message for message, _ in taken]

    def accept(self) -> None:
        """Accept and settle every message taken and not settled yet."""
        while self.taken:
            delivery = self.taken.popleft()
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
