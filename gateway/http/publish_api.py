"""RabbitMQ's ``POST /api/exchanges/{vhost}/{name}/publish``: a test message from HTTP.

The message takes the path an AMQP transfer takes once it is read (gateway/publishing.py): the
vhost's router (gateway/rules/routing.py) reads its envelope and picks the queues, each queue stores
its copy and hands it to a waiting consumer, a persistent copy to a durable queue goes through
the log, and the reply waits for the fsync that covers it, as a publisher's settlement does.
A copy routed to a queue another worker owns (docs/workers.md) crosses the channel as a
publisher's does, and the reply waits for the owner's confirm as a publisher's settlement does.
What differs is only what the HTTP request can do that a link cannot: it is refused up front
rather than held, since an HTTP reply cannot wait for credit. Over the memory budget it gets
503 and nothing is stored; over ``max_message_size`` 413; without *write* on the exchange 403;
while a queue's owner is down, or while as many publishes wait for their confirms as the
listener takes connections (``http_max_connections``), 503.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from itertools import count
from typing import Final, cast

from proton import Message as ProtonMessage

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.http.loops_api import ApiError
from sluicegate.gateway.http.reactor_calls import ReactorCalls
from sluicegate.gateway.publishing import Publishing
from sluicegate.gateway.rules.auth import User
from sluicegate.gateway.rules.routing import PublishTarget
from sluicegate.gateway.rules.vhost_log import logged_name
from sluicegate.queues.errors import NotFound, ResourceLimitExceeded
from sluicegate.queues.held_bytes import MESSAGE_OVERHEAD, copies_cost
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Outcome, QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.channel.remote import Remote, RemoteQueue
from sluicegate.session.inbound import Unconfirmed
from sluicegate.session.remote_publishers import FIRST_HTTP_CLIENT, PUBLISHER_STEP
from sluicegate.wire.errors import AmqpError

# RabbitMQ's HTTP name of the default exchange (the empty name).
DEFAULT_EXCHANGE: Final = "amq.default"
# RabbitMQ's basic properties and the AMQP 1.0 message fields they become (as RabbitMQ 4 maps
# an AMQP 0.9.1 publish); ``headers``, ``delivery_mode``, ``priority`` and ``expiration`` are
# mapped apart.
_STRING_PROPERTIES: Final = {
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "correlation_id": "correlation_id",
    "message_id": "id",
    "reply_to": "reply_to",
    "type": "subject",
}
# The header values that map to AMQP 1.0 application-properties as they are.
_SIMPLE: Final = (str, int, float, bool)
# AMQP's long: the widest integer a header value may be.
_LONG: Final = 2**63
# The numbers that name HTTP clients to the workers that store their copies, on the HTTP thread
# (session/remote_publishers.py).
_client_numbers = count(FIRST_HTTP_CLIENT, PUBLISHER_STEP)


class _Confirmation:
    """The HTTP request's stand-in for a publisher's delivery while its copies are stored.

    The log and the channel confirm it as they confirm a publisher's
    (``gateway.confirming.confirm`` calls ``pending.inbound.confirm``): it is its own
    ``inbound``, counts its copies down and then completes ``done`` with whether any copy was
    stored, or with a 503 when a copy was released because its owner's worker ended (its
    channel is down by then: ``Remote.lost``) or gave it back for its blocked memory budget
    (gateway/peers.py), and calls ``finished`` on the reactor whether or not anybody still
    awaits ``done``.
    """

    __slots__ = ("copies", "done", "finished", "full", "homes", "inbound", "lost", "stored")

    def __init__(self, copies: int, homes: list[Remote], finished: Callable[[], None]) -> None:
        self.copies = copies
        self.stored = 0
        self.inbound = self
        # The channels its remote copies crossed: one down when a copy comes back released
        # means the owner ended, not that its queue was gone.
        self.homes = homes
        self.lost: Remote | None = None
        # Why an owner gave a copy back: its budget was blocked.
        self.full: ResourceLimitExceeded | None = None
        self.finished = finished
        self.done: Future[bool] = Future()

    def confirm(
        self,
        pending: object,
        outcome: Outcome = Outcome.ACCEPTED,
        error: AmqpError | None = None,
    ) -> int:
        """One copy stored (or refused); no steps for the publish path to take."""
        if outcome is Outcome.ACCEPTED:
            self.stored += 1
        elif outcome is Outcome.RELEASED and isinstance(error, ResourceLimitExceeded):
            self.full = error
        elif outcome is Outcome.RELEASED and self.lost is None:
            self.lost = next((home for home in self.homes if not home.up), None)
        self.copies -= 1
        if self.copies == 0:
            self.finished()
            lost = self.lost
            try:
                if lost is not None:
                    self.done.set_exception(
                        ApiError(503, f"worker {lost.home}, where a queue lives, ended")
                    )
                elif self.full is not None:
                    self.done.set_exception(ApiError(503, str(self.full)))
                else:
                    self.done.set_result(self.stored > 0)
            except InvalidStateError:
                pass  # cancelled: the request timed out or its connection closed
        return 0


class PublishApi:
    """Publishes one message per request, on the reactor, and awaits its confirmation."""

    def __init__(self, broker: Broker, calls: ReactorCalls, timeout: float) -> None:
        self._broker = broker
        self._calls = calls
        self._timeout = timeout
        # Publishes whose copies are not all confirmed yet, counted on the reactor: at most
        # ``http_max_connections`` (docs/bounds.md), whether their requests still wait or not.
        self.unconfirmed = 0
        # Each open HTTP connection that published, and the number that names it as a
        # publisher to the other workers (session/remote_publishers.py), on the HTTP thread:
        # at most the listener's open connections, each gone as its connection closes.
        self.clients: dict[object, int] = {}

    def closed(self, client: object) -> None:
        """The HTTP connection ``client`` closed: it publishes no more."""
        self.clients.pop(client, None)

    async def publish(
        self, user: User, vhost: str, exchange: str, body: object, client: object, open_: bool
    ) -> bool:
        """Whether the message was routed to (and stored by) some queue; raises ApiError.
        ``client`` is the HTTP connection it came on (``open_`` while it is), which names its
        publisher: each client is weighed alone where its copies are stored."""
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        routing_key = body.get("routing_key")
        if not isinstance(routing_key, str):
            raise ApiError(400, "routing_key must be a string")
        payload = encode(body)
        name = "" if exchange == DEFAULT_EXCHANGE else exchange
        publisher = self.clients.get(client)
        if publisher is None:
            publisher = next(_client_numbers)
            if open_:
                # Closed already, it would never be told to forget it (:meth:`closed`).
                self.clients[client] = publisher
        confirmation = await self._calls.call(
            lambda: self._store(user, vhost, name, routing_key, payload, publisher), self._timeout
        )
        if confirmation is None:
            return False
        # The log's fsync, or the owner's confirm, completes it on the reactor; the listener's
        # deadline bounds the wait (503), and a closed connection cancels it.
        return await asyncio.wrap_future(confirmation.done)

    def _store(
        self,
        user: User,
        vhost_name: str,
        exchange: str,
        routing_key: str,
        payload: bytes,
        publisher: int,
    ) -> _Confirmation | None:
        """On the reactor: check, route and store; None when routed to no queue."""
        broker = self._broker
        vhost = broker.tenancy.vhosts.get(vhost_name)
        if vhost is None:
            raise ApiError(404, f"no vhost '{vhost_name}'")
        permissions = user.permissions(vhost_name)
        if permissions is None:
            raise ApiError(401, f"user '{user.name}' has no access to vhost '{vhost_name}'")
        shown = exchange or DEFAULT_EXCHANGE
        if not permissions.allows("write", exchange):
            raise ApiError(403, f"user '{user.name}' may not write to exchange '{shown}'")
        cap = broker.config.http_max_connections
        if self.unconfirmed >= cap:
            raise ApiError(503, f"{cap} publishes wait for their queues to store them")
        limit = broker.config.max_message_size
        if len(payload) > limit:
            raise ApiError(413, f"message of {len(payload)} bytes over max_message_size {limit}")
        publishing = broker.publishing
        budget = publishing.budget
        if budget.blocked:
            raise ApiError(503, "the server's memory budget is full: publishing is paused")
        registry = vhost.registry
        if exchange:
            try:
                if registry.exchange(exchange).settings.internal:
                    raise ApiError(403, f"exchange '{exchange}' is internal")
            except NotFound:
                raise ApiError(404, f"no exchange '{exchange}' in vhost '{vhost_name}'") from None
            target = PublishTarget(exchange=exchange, routing_key=routing_key)
        else:
            queue = registry.get(routing_key)
            if queue is None:
                return None
            target = PublishTarget(queue=queue)
        routed = vhost.router.route(target, payload)
        queues = routed.queues
        if not queues:
            return None
        message = routed.message
        assert message is not None
        # The queues' live count too, in case the budget was not updated since the last store.
        held = max(budget.current, publishing.registry.held.total)
        cost = _cost(len(payload), queues)
        if held + cost > budget.limit:
            raise ApiError(503, "the server's memory budget is full: publishing is paused")
        durability = publishing.durability
        if (
            durability is not None
            and durability.failing
            and any(registry.persists(queue, message) for queue in queues)
        ):
            raise ApiError(503, "the log cannot be written: persistent publishing is paused")
        homes: list[Remote] = []
        for queue in queues:
            if type(queue) is RemoteQueue:
                remote = queue.remote
                if not remote.up:
                    raise ApiError(
                        503, f"queue '{queue.name}' lives on worker {remote.home}, not serving"
                    )
                homes.append(remote)
        # Charged now, as bytes read are: the copies that cross count in the budget only at
        # its next update, and the next publish of this pass must see them.
        budget.reading += cost
        self.unconfirmed += 1
        confirmation = _Confirmation(len(queues), homes, self._finished)
        # gateway.confirming.confirm reads ``pending.inbound``: the confirmation is its own.
        pending = cast(Unconfirmed, confirmation)
        copies = [message, *(message.copy() for _ in queues[1:])]
        reached = 0
        try:
            for queue, copy in zip(queues, copies, strict=True):
                _store_copy(publishing, registry, vhost.name, queue, copy, confirmation, publisher)
                reached += 1
        except Exception:
            # An internal error (answered 500) must not keep the publish counted against the
            # cap for ever: the copy it failed on and those it did not reach count as refused
            # (a confirm that still comes for the failed one finds the count already down).
            for _ in range(len(queues) - reached):
                confirmation.confirm(pending, Outcome.REJECTED)
            raise
        return confirmation

    def _finished(self) -> None:
        self.unconfirmed -= 1


def _cost(size: int, queues: list[QueueType]) -> int:
    """What storing a message of ``size`` bytes in ``queues`` adds to this worker's budget.

    The copies stored here share the payload, counted once (queues/held_bytes.py); a copy
    crossing to another worker is counted whole here until its owner confirms it
    (``Remote.in_flight``, docs/bounds.md), so a fan-out to N queues of another worker costs
    N payloads. Counted once, three publishes of 60 KB to a fanout of 60 queues there took a
    worker's count to 10.9 MB against its 9.4 MB ceiling while their owner had not confirmed
    them (``test_cross_worker_http_fanout_budget.py``)."""
    remote = sum(1 for queue in queues if type(queue) is RemoteQueue)
    return size + MESSAGE_OVERHEAD + copies_cost(size, len(queues), remote)


def _store_copy(
    publishing: Publishing,
    registry: QueueRegistry,
    vhost: str,
    queue: QueueType,
    copy: Message,
    confirmation: _Confirmation,
    publisher: int,
) -> None:
    """One copy to its queue: across the channel, named by its client's ``publisher``,
    through the log, or stored at once."""
    pending = cast(Unconfirmed, confirmation)
    if type(queue) is RemoteQueue:
        # Stored by the worker that owns it; confirmed when it says so (its channel is up:
        # checked before any copy, in this same job).
        queue.publish(pending, copy, publisher)
        return
    durability = publishing.durability
    if durability is not None and registry.persists(queue, copy):
        stored = durability.persist(logged_name(vhost, queue.name), queue.as_stored(copy), pending)
        try:
            dispatches = queue.enqueue(stored)
        except AmqpError:
            durability.withdraw(stored)
            confirmation.confirm(pending, Outcome.REJECTED)
            return
    else:
        try:
            dispatches = queue.enqueue(copy)
        except AmqpError:
            confirmation.confirm(pending, Outcome.REJECTED)
            return
        confirmation.confirm(pending)
    if dispatches:
        publishing.dispatch(dispatches)


def encode(body: Mapping[str, object]) -> bytes:
    """The AMQP 1.0 message a RabbitMQ publish request describes; ApiError for bad fields."""
    payload = body.get("payload")
    if not isinstance(payload, str):
        raise ApiError(400, "payload must be a string")
    encoding = body.get("payload_encoding", "string")
    if encoding == "string":
        data = payload.encode()
    elif encoding == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise ApiError(400, "payload is not base64") from None
    else:
        raise ApiError(400, "payload_encoding must be 'string' or 'base64'")
    properties = body.get("properties", {})
    if not isinstance(properties, dict):
        raise ApiError(400, "properties must be a JSON object")
    headers = properties.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(value, _SIMPLE) and not (isinstance(value, int) and abs(value) >= _LONG)
        for value in headers.values()
    ):
        raise ApiError(400, "headers must map names to strings, numbers or booleans")
    message = ProtonMessage(body=data, inferred=True, properties=dict(headers) or None)
    for key, field in _STRING_PROPERTIES.items():
        value = properties.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise ApiError(400, f"property {key} must be a string")
            setattr(message, field, value)
    message.durable = properties.get("delivery_mode") == 2
    priority = properties.get("priority")
    if priority is not None:
        if not (isinstance(priority, int) and 0 <= priority <= 255):
            raise ApiError(400, "property priority must be 0 to 255")
        message.priority = priority
    expiration = properties.get("expiration")
    if expiration is not None:
        if not (isinstance(expiration, str) and expiration.isdigit() and len(expiration) < 11):
            raise ApiError(400, "property expiration must be a string of milliseconds")
        message.ttl = int(expiration) / 1000
    encoded: bytes = message.encode()
    return encoded
