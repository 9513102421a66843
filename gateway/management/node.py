"""The ``/management`` node: RabbitMQ 4's HTTP-over-AMQP link pair, carried over proton.

A client attaches a pair of links with one name to ``/management``: its sender carries requests
(method in ``subject``, path in ``to``, body in amqp-value), its receiver gets one reply per
request, in order, with the status code in ``subject`` and the request's message-id as
correlation-id. Each link gets this object as its proton handler (flow and detach events come
here); transfers reach it from the broker, as the reactor hands every delivery to the broker.
Management is not a hot path: requests and replies are decoded and encoded with proton's
``Message``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias, cast

from proton import (
    Condition,
    Delivery,
    Event,
    Handler,
    Link,
    Message,
    Receiver,
    Sender,
)

from sluicegate.gateway.events import link_of
from sluicegate.gateway.limits import link_detached
from sluicegate.gateway.management.encoding import AMQP_VALUE, encode_value
from sluicegate.gateway.management.router import (
    NOBODY,
    Caller,
    Request,
    Response,
    Router,
)
from sluicegate.gateway.state import ConnectionState, SessionState
from sluicegate.queues.queue_type import QueueType
from sluicegate.queues.registry import QueueRegistry

ADDRESS: Final = "/management"
# RabbitMQ grants 8 credits on the request link and tops up once 4 are left. Here the 8 also
# count replies still waiting for the client's reply credit, so a client that sends requests
# and never takes the replies gets no more credit: what a pair holds stays bounded.
REQUEST_CREDIT: Final = 8
REQUEST_CREDIT_LOW: Final = REQUEST_CREDIT // 2
# Requests are small maps; a bigger one is refused rather than buffered.
MAX_REQUEST_SIZE: Final = 1024 * 1024
# What proton's Message accepts as a body.
Body: TypeAlias = "bytes | str | dict[Any, Any] | list[Any] | int | float | None"
_HTTP_RESPONSE: Final = {"http:response": "1.1"}


class Pair:
    """One client's link pair: the request receiver, the reply sender, replies not yet sent."""

    __slots__ = ("__weakref__", "caller", "replies", "requests", "router", "sender", "tag")

    def __init__(self, caller: Caller, router: Router) -> None:
        self.caller = caller
        # The router of the connection's virtual host.
        self.router = router
        self.requests: Receiver | None = None
        self.sender: Sender | None = None
        self.replies: deque[bytes] = deque()
        self.tag = 0


def _pairs(link: Link) -> dict[str, Pair]:
    """The session's pairs by link name, kept in the gateway's record of the session."""
    session: SessionState = link.session.sg
    return session.management_pairs


def encode_reply(response: Response, correlation_id: object) -> bytes:
    """A reply as RabbitMQ sends it: subject, correlation-id, ``http:response``, amqp-value."""
    message = Message(
        subject=str(response.status),
        correlation_id=correlation_id,
        properties=_HTTP_RESPONSE,
        inferred=False,
    )
    head: bytes = message.encode()
    # The body may be a listing of thousands of maps (gateway/management/encoding.py). A reply
    # without one (204) carries amqp-value null, as RabbitMQ's does.
    return head + AMQP_VALUE + encode_value(response.body)


def management_caller(connection: ConnectionState) -> Caller:
    """The caller a connection's requests run as: its user's permissions in its virtual host."""
    permissions = connection.permissions
    return Caller(connection, permissions if permissions is not None else NOBODY)


class ManagementNode(Handler):
    """Serves every ``/management`` link pair of a server, each in its virtual host.

    ``routers`` has each virtual host's router by its registry; ``on_queue_deleted`` is told
    of every queue a request deletes, with its registry.
    """

    def __init__(
        self,
        routers: Mapping[QueueRegistry, Router],
        on_queue_deleted: Callable[[QueueRegistry, str], None],
    ) -> None:
        super().__init__()
        self.routers = routers
        self._on_queue_deleted = on_queue_deleted
        # Exclusive queues by the connection that declared them: deleted when it closes.
        self._exclusive: dict[object, set[tuple[QueueRegistry, str]]] = {}

    @staticmethod
    def is_management(link: Link) -> bool:
        """True for either half of a management pair."""
        terminus = link.remote_source if link.is_sender else link.remote_target
        return terminus.address == ADDRESS

    def attach(self, link: Link, caller: Caller, registry: QueueRegistry) -> None:
        """Open one half of a pair; the broker has echoed both termini already.

        ``caller`` is the connection (owner of its exclusive queues) and its user's permissions,
        checked per request rather than at attach: every user may talk to the node.
        ``registry`` is the connection's virtual host's.
        """
        pairs = _pairs(link)
        pair = pairs.get(link.name)
        if pair is None:
            pair = pairs[link.name] = Pair(caller, self.routers[registry])
        link.handler = self
        link.sg = pair
        link.open()
        if link.is_sender:
            pair.sender = cast(Sender, link)
            self._send(pair)
        else:
            pair.requests = cast(Receiver, link)
            link.flow(REQUEST_CREDIT)

    # -- proton events on the pair's links (this object is their handler) -------------------

    def on_request(self, link: Link, delivery: Delivery) -> None:
        """A transfer on a request link: answer it, or hold the answer until reply credit.

        The reactor hands every delivery to the broker directly (gateway/reactor.py), which
        passes those of links it does not serve here.
        """
        pair = getattr(link, "sg", None)
        if not isinstance(pair, Pair):
            return
        if delivery.partial:
            if delivery.pending > MAX_REQUEST_SIZE:
                self._refuse(link, delivery, "amqp:link:message-size-exceeded", "request too big")
            return
        payload = link.recv(delivery.pending) or b""
        link.advance()
        if not delivery.settled:
            delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        message = Message()
        try:
            message.decode(payload)
        except Exception as error:
            self._refuse(link, None, "amqp:decode-error", f"cannot decode the request: {error}")
            return
        response = self.handle(message, pair.caller, pair.router)
        pair.replies.append(encode_reply(response, message.id))
        self._send(pair)

    def handle(self, message: Message, caller: Caller, router: Router) -> Response:
        """Route one decoded request and apply what the router says the gateway must do."""
        method, path = message.subject, message.address
        if not isinstance(method, str) or not isinstance(path, str):
            return Response(400, "a request needs the method in 'subject' and the path in 'to'")
        response = router.handle(Request(method, path, message.body), caller)
        registry = router.registry
        if response.deleted_queue is not None:
            self._on_queue_deleted(registry, response.deleted_queue)
            self._exclusive.get(caller.owner, set()).discard((registry, response.deleted_queue))
        if response.exclusive_queue is not None:
            exclusive = self._exclusive.setdefault(caller.owner, set())
            exclusive.add((registry, response.exclusive_queue))
        return response

    def consumer_left(self, registry: QueueRegistry, queue: QueueType, consumers: int) -> None:
        """RabbitMQ's auto-delete: such a queue goes when its last consumer detaches;
        ``consumers`` is how many it still has."""
        name = queue.name
        if registry.get(name) is not queue or not registry.settings(name).auto_delete:
            return
        if consumers == 0:
            registry.delete_queue(name)
            self._on_queue_deleted(registry, name)

    def release(self, owner: object) -> None:
        """A connection closed: its exclusive queues go with it, as in RabbitMQ."""
        for registry, name in sorted(self._exclusive.pop(owner, ()), key=lambda q: q[1]):
            if registry.owner(name) is owner:
                registry.delete_queue(name)
                self._on_queue_deleted(registry, name)

    def on_link_flow(self, event: Event) -> None:
        """The client granted reply credit: send what waits."""
        pair = getattr(link_of(event), "sg", None)
        if isinstance(pair, Pair):
            self._send(pair)

    def on_link_remote_close(self, event: Event) -> None:
        """One half detached: answer it; the pair is forgotten with its last half."""
        link = link_of(event)
        link_detached(link)
        pair = getattr(link, "sg", None)
        link.close()
        if not isinstance(pair, Pair):
            return
        if link.is_sender:
            pair.sender = None
        else:
            pair.requests = None
        if pair.sender is None and pair.requests is None:
            _pairs(link).pop(link.name, None)

    on_link_remote_detach = on_link_remote_close

    # -- internals --------------------------------------------------------------------------

    @staticmethod
    def _send(pair: Pair) -> None:
        """Send the replies the client has credit for, then top up the request credit."""
        sender = pair.sender
        replies = pair.replies
        if sender is not None:
            while replies and sender.credit > 0:
                pair.tag += 1
                delivery = sender.delivery(str(pair.tag))
                sender.stream(replies.popleft())
                sender.advance()
                delivery.settle()
        requests = pair.requests
        if requests is not None and requests.credit <= REQUEST_CREDIT_LOW:
            grant = REQUEST_CREDIT - len(replies) - requests.credit
            if grant > 0:
                requests.flow(grant)

    @staticmethod
    def _refuse(link: Link, delivery: Delivery | None, condition: str, description: str) -> None:
        if delivery is not None:
            delivery.settle()
        link.condition = Condition(condition, description)
        link.close()
