"""Where a published message goes: its link's queue, an exchange's bindings, or its ``to``.

A publisher's target is resolved once, at attach: a queue (the common case, one dict-free path
per message), an exchange with a fixed routing key or the message's subject as key
(RabbitMQ 4's ``/exchanges/NAME[/KEY]``), or the null target, where each message's ``to``
names its destination. Each message's envelope (header and the few properties routing and
expiry need) is read here, never its body; a malformed header is refused before anything stores
the message. Unroutable messages are ``released`` (a ``to`` naming no queue too, as in RabbitMQ),
or ``rejected`` when their exchange says so (``x-unroutable = reject``): never silently lost. A
message to a link's exchange deleted since is released and the link detached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sluicegate.queues.errors import (
    AccessRefused,
    NotFound,
    PreconditionFailed,
    ResourceLimitExceeded,
)
from sluicegate.queues.exchanges import Unroutable
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Outcome, QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.wire.addresses import ExchangeAddress, QueueAddress, parse_target
from sluicegate.wire.annotations import routing_annotations
from sluicegate.wire.envelope import Envelope, read_envelope
from sluicegate.wire.errors import AmqpError, DecodeError

# Application properties are what filters decode, once per message: this bounds the work one
# message can cost the reactor (a few milliseconds at most) and the memory of its decoded view.
# Azure Service Bus caps a message's properties at the same 64 KiB; headers rarely need 1 KiB.
DEFAULT_MAX_APPLICATION_PROPERTIES_SIZE: Final = 64 * 1024
# Message annotations are decoded at publish (x-cc), by dead-lettering and by streams, and a
# consumer's ``modified`` outcome adds them to every message of a range: the same bound as
# application properties; RabbitMQ's own annotations take a few hundred bytes.
DEFAULT_MAX_MESSAGE_ANNOTATIONS_SIZE: Final = 64 * 1024
# Each ``x-cc`` routing key is routed like the message's own: the bound keeps one publish
# from costing more than a few hundred routings (RabbitMQ's clients name a handful).
DEFAULT_MAX_CC_KEYS: Final = 256

_NO_QUEUES: Final[list[QueueType]] = []


class SectionTooLarge(AmqpError):
    """A message whose application-properties or message-annotations exceed their limit."""

    condition = "amqp:link:message-size-exceeded"


@dataclass(frozen=True, slots=True)
class PublishTarget:
    """A publisher link's target, resolved at attach."""

    # The queue of a queue address; None for an exchange or the null target.
    queue: QueueType | None = None
    # The exchange of an exchange address; None for the null target.
    exchange: str | None = None
    # The routing key fixed by the address; None when the subject gives it.
    routing_key: str | None = None


@dataclass(slots=True)
class Routed:
    """A routing decision: the queues and the message to store, or why there are none."""

    queues: list[QueueType]
    message: Message | None
    outcome: Outcome = Outcome.ACCEPTED
    # Why the message was refused, for its disposition (the shell makes proton's condition).
    error: AmqpError | None = None
    # The link's own exchange is gone: the link is detached with ``error`` (RabbitMQ's).
    detach: bool = False


def _message(
    payload: bytes | memoryview,
    envelope: Envelope,
    expires: int | None,
    exchange: str,
    routing_key: str,
) -> Message:
    """The message to store, with RabbitMQ's ``x-exchange``/``x-routing-key`` annotations.

    RabbitMQ's AMQP 1.0 clients rely on every delivery carrying the section; it is spliced in
    where the envelope found it belongs, unless the publisher sent one.
    """
    annotations_at = envelope.annotations_at
    if annotations_at is None:
        stored = bytes(payload)
    else:
        section = routing_annotations(exchange, routing_key)
        # One copy into the stored bytes, whatever the message's size (slices of a view).
        stored = b"".join((payload[:annotations_at], section, payload[annotations_at:]))
    header = envelope.header
    return Message(
        stored,
        header.delivery_count,
        expires=expires,
        exchange=exchange,
        routing_key=routing_key,
        header=header,
    )


def _rejected(error: AmqpError) -> Routed:
    return Routed(_NO_QUEUES, None, Outcome.REJECTED, error)


class Router:
    """Routes published messages through one virtual host's queues and exchanges."""

    def __init__(
        self,
        registry: QueueRegistry,
        max_application_properties_size: int = DEFAULT_MAX_APPLICATION_PROPERTIES_SIZE,
        max_message_annotations_size: int = DEFAULT_MAX_MESSAGE_ANNOTATIONS_SIZE,
        max_cc_keys: int = DEFAULT_MAX_CC_KEYS,
        *,
        declares: bool = True,
    ) -> None:
        self.registry = registry
        self.max_application_properties_size = max_application_properties_size
        self.max_message_annotations_size = max_message_annotations_size
        self.max_cc_keys = max_cc_keys
        # A publisher attaching to a missing queue declares it (``attach_declares_queues``).
        self.declares = declares

    def resolve(self, address: str | None) -> PublishTarget:
        """The target a publisher attaches to; raises for an exchange that does not exist."""
        if not address:
            return PublishTarget()
        parsed = parse_target(address)
        if isinstance(parsed, QueueAddress):
            return PublishTarget(queue=self.registry.declare(parsed.queue, create=self.declares))
        self._publishable(parsed.exchange)
        return PublishTarget(exchange=parsed.exchange, routing_key=parsed.routing_key)

    def _publishable(self, exchange: str) -> None:
        """Raise unless clients may publish to ``exchange`` (it exists and is not internal)."""
        if self.registry.exchange(exchange).settings.internal:
            raise AccessRefused(f"exchange '{exchange}' is internal: clients cannot publish to it")

    def route(self, target: PublishTarget, payload: bytes | memoryview) -> Routed:
        """Read a message's envelope and decide where it goes."""
        try:
            envelope = read_envelope(
                payload, self.max_application_properties_size, self.max_message_annotations_size
            )
        except DecodeError as error:
            # The same class, so the same condition, with what was being read said first.
            return _rejected(type(error)(f"malformed message: {error}"))
        limit = self.max_application_properties_size
        if envelope.application_properties_size > limit:
            return _rejected(
                SectionTooLarge(
                    f"application-properties of {envelope.application_properties_size} bytes "
                    f"exceed max_application_properties_size {limit}"
                )
            )
        limit = self.max_message_annotations_size
        if envelope.message_annotations_size > limit:
            return _rejected(
                SectionTooLarge(
                    f"message-annotations of {envelope.message_annotations_size} bytes exceed "
                    f"max_message_annotations_size {limit}"
                )
            )
        if len(envelope.cc) > self.max_cc_keys:
            return _rejected(
                ResourceLimitExceeded(
                    f"'x-cc' names {len(envelope.cc)} distinct routing keys, more than "
                    f"max_cc_keys {self.max_cc_keys}"
                )
            )
        expires = envelope.expires(self.registry.clock.now)
        queue = target.queue
        if queue is not None:
            message = _message(payload, envelope, expires, "", queue.name)
            if envelope.cc:
                return self._with_cc([queue], "", envelope.cc, payload, message)
            return Routed([queue], message)
        exchange = target.exchange
        routing_key = target.routing_key
        if exchange is None:
            # The null target: the message's ``to`` says where it goes (RabbitMQ 4).
            if envelope.to is None:
                return _rejected(
                    PreconditionFailed("a message sent to the null target needs a 'to' address")
                )
            try:
                address = parse_target(envelope.to)
            except AmqpError as error:
                return _rejected(error)
            if isinstance(address, QueueAddress):
                found = self.registry.get(address.queue)
                if found is None:
                    # RabbitMQ routes it through the default exchange to no queue: released.
                    return Routed(_NO_QUEUES, None, Outcome.RELEASED)
                message = _message(payload, envelope, expires, "", address.queue)
                return self._with_cc([found], "", envelope.cc, payload, message)
            assert isinstance(address, ExchangeAddress)
            exchange, routing_key = address.exchange, address.routing_key
            try:
                self._publishable(exchange)
            except AmqpError as error:
                return _rejected(error)
        if routing_key is None:
            routing_key = envelope.subject or ""
        try:
            queues = self.registry.route(exchange, routing_key, payload)
        except NotFound as error:
            if target.exchange is None:
                return _rejected(error)
            # The exchange the link attached to was deleted since: as RabbitMQ, the message is
            # released and the link detached with amqp:not-found.
            return Routed(_NO_QUEUES, None, Outcome.RELEASED, error, detach=True)
        except AmqpError as error:
            return _rejected(error)
        message = _message(payload, envelope, expires, exchange, routing_key)
        if envelope.cc:
            routed = self._with_cc(queues, exchange, envelope.cc, payload, message)
            if routed.message is None:
                return routed
            queues = routed.queues
        if not queues:
            return self._unroutable(exchange, routing_key)
        return Routed(queues, message)

    def _with_cc(
        self,
        queues: list[QueueType],
        exchange: str,
        cc: tuple[str, ...],
        payload: bytes | memoryview,
        message: Message,
    ) -> Routed:
        """Add the queues the ``x-cc`` routing keys reach through ``exchange``, each once.

        RabbitMQ 4.1: a publisher names more routing keys in the ``x-cc`` message annotation,
        for the exchange its address names (the default exchange for a queue address).
        """
        reached = {id(queue): queue for queue in queues}
        try:
            for queue in self.registry.route_keys(exchange, cc, payload):
                reached.setdefault(id(queue), queue)
        except AmqpError as error:
            return _rejected(error)
        return Routed(list(reached.values()), message)

    def _unroutable(self, exchange: str, routing_key: str) -> Routed:
        found = self.registry.exchange(exchange)
        if found.settings.unroutable is Unroutable.REJECT:
            return _rejected(
                NotFound(f"exchange '{exchange}' routes routing key '{routing_key}' to no queue")
            )
        return Routed(_NO_QUEUES, None, Outcome.RELEASED)
