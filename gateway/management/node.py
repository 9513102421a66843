"""The ``/management`` node: RabbitMQ 4's HTTP-over-AMQP link pair, carried over proton.

A client attaches a pair of links with one name to ``/management``: its sender carries requests
(method in ``subject``, path in ``to``, body in amqp-value), its receiver gets one reply per
request, in order, with the status code in ``subject`` and the request's message-id as
correlation-id. Each link gets this object as its proton handler (flow and detach events come
here); transfers reach it from the broker, as the reactor hands every delivery to the broker.
Management is not a hot path: requests and replies are decoded and encoded with proton's
``Message``.

Replies are what the client makes the server hold here, and it decides when it takes them. So
each reply waiting for reply credit is charged, at its encoded size, to its connection's waiting
deliveries (``session/waiting.py``: the connection's limit, ``max_outgoing_pending_size``, and
the memory budget), and once sent to its writer until the socket has taken it. A request that
comes while its connection is backlogged (at that limit, its writer full, or holding anything
while the budget is exhausted) is refused with 503 without being carried out, and a reply whose
body would pass the limit is refused with 400 before it is built whole
(``gateway/management/reply_size.py``). An error inside one request is answered with 500.

On a server of several workers, a request that reads or purges a queue another worker owns
asks that worker (docs/workers.md): its reply is parked in the pair's order, within the same
8 credits, and the request is routed again once the owners answered (:class:`Parked`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, Final, Protocol, TypeAlias, cast

from proton import (
    Delivery,
    Event,
    Handler,
    Link,
    Message,
    Receiver,
    Sender,
)

from sluicegate.gateway.conditions import close
from sluicegate.gateway.events import link_of
from sluicegate.gateway.limits import link_detached
from sluicegate.gateway.management.encoding import AMQP_VALUE, encode_reply_value
from sluicegate.gateway.management.reply_size import ReplyTooLarge, encode_within
from sluicegate.gateway.renewal import PATH as RENEWAL_PATH
from sluicegate.gateway.rules.auth import NOBODY, Access
from sluicegate.gateway.rules.management.requests import Caller, Request, Response
from sluicegate.gateway.rules.management.router import Router
from sluicegate.gateway.state import ConnectionState, SessionState
from sluicegate.queues.queue_type import QueueType
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.channel.queries import Asked, Figures, Reads
from sluicegate.session.channel.remote import RemoteQueue
from sluicegate.session.memory_budget import MemoryBudget
from sluicegate.session.waiting import WAITING_DELIVERY_COST
from sluicegate.wire.errors import AmqpError, DecodeError, MessageSizeExceeded

log = logging.getLogger("sluicegate")

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
_BACKLOGGED: Final = (
    "the connection holds all the unsent bytes it may (max_outgoing_pending_size): take the "
    "replies waiting, then ask again"
)


# Answers a renewal (connection, method, body) at once, or returns None and answers later
# through the callback (gateway/links.py).
Renew: TypeAlias = Callable[
    [ConnectionState, str, object, Callable[[Response], None]], Response | None
]


class Workers(Protocol):
    """The other workers of a server of several (gateway/peers.py), as management needs them."""

    reads: Reads

    def gather(self, figures: Figures, done: Callable[[Asked | None], None]) -> None:
        """Call ``done`` once ``figures``' questions are answered, or with one that failed."""

    def consumers_of(self, queue: QueueType) -> int:
        """How many consumers on other workers ``queue`` has."""


class Parked:
    """A reply in a pair's order that waits for the owners of the queues its request read
    (docs/workers.md): filled once they answered, sent in its turn."""

    __slots__ = ("dropped", "reply")

    def __init__(self) -> None:
        self.reply: bytes | None = None
        # Its pair's replies were let go: the reply is never sent nor charged.
        self.dropped = False


class Pair:
    """One client's link pair: the request receiver, the reply sender, replies not yet sent."""

    __slots__ = (
        "__weakref__",
        "caller",
        "replies",
        "requests",
        "router",
        "sender",
        "session",
        "tag",
    )

    def __init__(self, caller: Caller, router: Router, session: SessionState) -> None:
        self.caller = caller
        # The router of the connection's virtual host.
        self.router = router
        # The session of both links: its connection is charged for the replies.
        self.session = session
        self.requests: Receiver | None = None
        self.sender: Sender | None = None
        # Replies waiting for reply credit, each charged to the connection's waiting deliveries
        # (a parked one once it is filled).
        self.replies: deque[bytes | Parked] = deque()
        self.tag = 0

    def charge(self, reply: bytes, sign: int) -> None:
        """A reply joins (1) or leaves (-1) the replies waiting, at its size and bookkeeping."""
        self.session.connection.waiting.charge(sign * (len(reply) + WAITING_DELIVERY_COST))

    def drop_replies(self) -> None:
        """Nobody will take the waiting replies (their link or session is gone): uncharge them."""
        replies = self.replies
        while replies:
            entry = replies.popleft()
            if isinstance(entry, Parked):
                entry.dropped = True
                if entry.reply is not None:
                    self.charge(entry.reply, -1)
            else:
                self.charge(entry, -1)


def encode_reply(response: Response, correlation_id: object, limit: int | None = None) -> bytes:
    """A reply as RabbitMQ sends it: subject, correlation-id, ``http:response``, amqp-value.

    With a ``limit``, a body that would pass it is replaced by a 400 that says so.
    """
    message = Message(
        subject=str(response.status),
        correlation_id=correlation_id,
        properties=_HTTP_RESPONSE,
        inferred=False,
    )
    head: bytes = message.encode()
    body = response.body
    # The body may be a listing of thousands of maps (gateway/management/encoding.py). A reply
    # without one (204) carries amqp-value null, as RabbitMQ's does.
    if limit is None or body is None:
        return head + AMQP_VALUE + encode_reply_value(body)
    try:
        return head + AMQP_VALUE + encode_within(body, limit)
    except ReplyTooLarge:
        refusal = Response(
            400,
            f"the reply would pass {limit} bytes, what one connection may hold unsent "
            "(max_outgoing_pending_size): ask for smaller pages (?page=1&page_size=...)",
        )
        return encode_reply(refusal, correlation_id)


class _ConnectionPermissions:
    """What a connection's user may do in its virtual host as of each request: a renewed
    OAuth 2 token (gateway/renewal.py) changes it while the link pair stays."""

    __slots__ = ("_connection",)

    def __init__(self, connection: ConnectionState) -> None:
        self._connection = connection

    def allows(self, access: Access, name: str, /) -> bool:
        permissions = self._connection.permissions or NOBODY
        return permissions.allows(access, name)


def management_caller(connection: ConnectionState) -> Caller:
    """The caller a connection's requests run as: its user's permissions in its virtual host."""
    return Caller(connection, _ConnectionPermissions(connection))


class ManagementNode(Handler):
    """Serves every ``/management`` link pair of a server, each in its virtual host.

    ``routers`` has each virtual host's router by its registry; ``on_queue_deleted`` is told
    of every queue a request deletes, with its registry.
    """

    def __init__(
        self,
        routers: dict[QueueRegistry, Router],
        on_queue_deleted: Callable[[QueueRegistry, str], None],
        budget: MemoryBudget,
        renew: Renew,
    ) -> None:
        super().__init__()
        self.routers = routers
        # The server's memory budget: while it is exhausted, backlogged connections wait.
        self.budget = budget
        self._on_queue_deleted = on_queue_deleted
        # Answers PUT /auth/tokens for the caller's connection, at once or once its token is
        # verified off the reactor (gateway/renewal.py).
        self._renew = renew
        # Exclusive queues by the connection that declared them: deleted when it closes.
        self._exclusive: dict[object, set[tuple[QueueRegistry, str]]] = {}
        # Each session's link pairs by link name; a session's go when it ends.
        self.pairs: dict[SessionState, dict[str, Pair]] = {}
        # The other workers, on a server of several: a queue one of them owns is counted and
        # purged there.
        self.workers: Workers | None = None

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
        session: SessionState = link.session.sg
        pairs = self.pairs.get(session)
        if pairs is None:
            pairs = self.pairs[session] = {}
        pair = pairs.get(link.name)
        if pair is None:
            pair = pairs[link.name] = Pair(caller, self.routers[registry], session)
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

        The reactor hands every delivery to the broker directly (gateway/proton/reactor.py), which
        passes those of links it does not serve here.
        """
        pair = getattr(link, "sg", None)
        if not isinstance(pair, Pair):
            return
        if delivery.partial:
            if delivery.pending > MAX_REQUEST_SIZE:
                self._refuse(link, delivery, MessageSizeExceeded("request too big"))
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
            self._refuse(link, None, DecodeError(f"cannot decode the request: {error}"))
            return
        connection = pair.session.connection
        workers = self.workers
        figures = None if workers is None else Figures()
        if self.backlogged(connection):
            response = Response(503, _BACKLOGGED)
        elif message.address == RENEWAL_PATH:
            parked = Parked()
            renewed = self._renewal(message, pair, parked)
            if renewed is None:
                # Verified off the reactor: its reply takes its turn once filled.
                pair.replies.append(parked)
                self._send(pair)
                return
            response = renewed
        else:
            response = self._answer(message, pair, figures)
        if workers is not None and figures is not None and _again(message, response, figures):
            parked = Parked()
            pair.replies.append(parked)
            workers.gather(figures, partial(self._gathered, pair, parked, message, figures))
        else:
            reply = encode_reply(response, message.id, connection.waiting.limit)
            pair.replies.append(reply)
            pair.charge(reply, 1)
        self._send(pair)

    def _answer(self, message: Message, pair: Pair, figures: Figures | None) -> Response:
        """The request's response, the owners' figures read into ``figures``."""
        try:
            if self.workers is None:
                return self.handle(message, pair.caller, pair.router)
            with self.workers.reads.using(figures):
                return self.handle(message, pair.caller, pair.router)
        except Exception as error:
            log.exception("management request %s %s failed", message.subject, message.address)
            return Response(500, f"internal error: {error!r}")

    def _renewal(self, message: Message, pair: Pair, parked: Parked) -> Response | None:
        """Renew the connection's token (gateway/renewal.py); None while it is verified, the
        answer then filling ``parked``."""
        method = message.subject
        if not isinstance(method, str):
            return Response(400, "a request needs the method in 'subject' and the path in 'to'")
        try:
            return self._renew(
                pair.session.connection,
                method,
                message.body,
                partial(self._renewed, pair, parked, message.id),
            )
        except Exception as error:
            log.exception("token renewal failed")
            return Response(500, f"internal error: {error!r}")

    def _renewed(
        self, pair: Pair, parked: Parked, correlation_id: object, response: Response
    ) -> None:
        """A renewal's token was verified: its reply takes its turn."""
        if parked.dropped:
            return
        reply = parked.reply = encode_reply(
            response, correlation_id, pair.session.connection.waiting.limit
        )
        pair.charge(reply, 1)
        self._send(pair)

    def _gathered(
        self,
        pair: Pair,
        parked: Parked,
        message: Message,
        figures: Figures,
        failure: Asked | None,
    ) -> None:
        """The owners answered a parked request (or ``failure`` says why not): routed again,
        every stand-in it reads finds its answer."""
        if parked.dropped:
            return
        if failure is not None:
            response = Response(503, failure.error)
        else:
            response = self._answer(message, pair, figures)
        reply = parked.reply = encode_reply(
            response, message.id, pair.session.connection.waiting.limit
        )
        pair.charge(reply, 1)
        self._send(pair)

    def backlogged(self, connection: ConnectionState) -> bool:
        """Whether the connection holds all it may unsent: its waiting deliveries (management
        replies among them) at their limit or, with the memory budget exhausted, any; or its
        writer full of bytes the socket has not taken."""
        return connection.waiting.backlogged(self.budget.blocked) or connection.writer.full

    def handle(self, message: Message, caller: Caller, router: Router) -> Response:
        """Route one decoded request and apply what the router says the gateway must do."""
        method, path = message.subject, message.address
        if not isinstance(method, str) or not isinstance(path, str):
            return Response(400, "a request needs the method in 'subject' and the path in 'to'")
        return self.route(Request(method, path, message.body), caller, router)

    def route(self, request: Request, caller: Caller, router: Router) -> Response:
        """Answer one request from either transport, the ``/management`` link pair or the HTTP
        API (gateway/http/api.py), and apply what the router says the gateway must do."""
        response = router.handle(request, caller)
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
        # A stand-in's consumers are its owner's to count: the detach reaches it.
        if type(queue) is RemoteQueue or registry.get(name) is not queue:
            return
        if not registry.settings(name).auto_delete:
            return
        if self.workers is not None:
            consumers += self.workers.consumers_of(queue)
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
            pair.drop_replies()
        else:
            pair.requests = None
        if pair.sender is None and pair.requests is None:
            pairs = self.pairs.get(pair.session)
            if pairs is not None:
                pairs.pop(link.name, None)
                if not pairs:
                    del self.pairs[pair.session]

    def end_session(self, session: SessionState) -> None:
        """The session ended (or its connection closed): its pairs and their waiting replies
        go."""
        for pair in self.pairs.pop(session, {}).values():
            pair.drop_replies()

    on_link_remote_detach = on_link_remote_close

    # -- internals --------------------------------------------------------------------------

    @staticmethod
    def _send(pair: Pair) -> None:
        """Send the replies the client has credit for, then top up the request credit."""
        sender = pair.sender
        replies = pair.replies
        if sender is not None and pair.session.live:
            writer = pair.session.connection.writer
            credit = pair.session.pure.writer_credit
            while replies and sender.credit > 0:
                entry = replies[0]
                reply = entry.reply if isinstance(entry, Parked) else entry
                if reply is None:
                    break
                replies.popleft()
                pair.tag += 1
                pair.charge(reply, -1)
                delivery = sender.delivery(str(pair.tag))
                sender.stream(reply)
                sender.advance()
                delivery.settle()
                # Proton holds it until the socket takes it: the writer counts it till then.
                writer.handed(credit, 0, len(reply))
        requests = pair.requests
        if requests is not None and requests.credit <= REQUEST_CREDIT_LOW:
            grant = REQUEST_CREDIT - len(replies) - requests.credit
            if grant > 0:
                requests.flow(grant)

    @staticmethod
    def _refuse(link: Link, delivery: Delivery | None, error: AmqpError) -> None:
        if delivery is not None:
            delivery.settle()
        close(link, error)


def _again(message: Message, response: Response, figures: Figures) -> bool:
    """Whether the request is answered once the owners' figures it asked for are in: a read, a
    purge, a deletion, a redeclaration; routing them again changes nothing more (a new queue's
    reply has its counts, all zero, and is not routed again; a deletion's second run reads the
    owner's count)."""
    if not figures.asked:
        return False
    method, path = message.subject, str(message.address)
    return (
        method == "GET"
        or (method == "DELETE" and path.startswith("/queues/"))
        or (method == "PUT" and response.status == 200)
    )
