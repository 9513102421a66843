"""RabbitMQ 4's HTTP-over-AMQP management API as a pure request router.

A request is an HTTP method, a path and a body already decoded to Python values; the answer is a
status code and a body. No proton and no sockets here: :mod:`gateway.management.node` carries
requests and replies over the ``/management`` link pair, the tests call :meth:`Router.handle`
directly. Paths, bodies and status codes follow ``rabbit_amqp_management`` (docs/management.md):

=========  ===========================================  ===============================
method     path                                         success
=========  ===========================================  ===============================
GET        ``/queues[?page=&page_size=]``                200, list of queue maps (ours)
GET        ``/queues/{q}``                              200, queue map
PUT        ``/queues/{q}``                              201 created, 200 existed
DELETE     ``/queues/{q}``                              200, ``{message_count}``
DELETE     ``/queues/{q}/messages``                     200, ``{message_count}`` (purge)
GET        ``/queues/{q}/byte-range?...``                  200, ``{end, bytes, capped}`` (ours)
GET        ``/exchanges[?page=&page_size=]``             200, list of exchange maps (ours)
GET        ``/exchanges/{x}``                           200, exchange map
PUT        ``/exchanges/{x}``                           204
DELETE     ``/exchanges/{x}``                           204
GET        ``/bindings?src=&dstq=|dste=&key=&page=...`` 200, list of binding maps
POST       ``/bindings``                                204
DELETE     ``/bindings/src={x};dstq={q};key={k};args=`` 204 (``dste={x}`` for an exchange)
=========  ===========================================  ===============================

A listing with ``page`` or ``page_size`` in its query is paged as RabbitMQ's HTTP API pages:
pages of at most :data:`MAX_PAGE_SIZE`, counted from 1, each a map of ``items``, ``page``,
``page_size``, ``page_count``, ``item_count``, ``total_count`` and ``filtered_count``. Queue maps
are built only for the page's queues, so a page costs little however many queues exist;
``sluicegate queues list`` lists page by page. An unpaged listing of more than
:data:`MAX_UNPAGED` items is refused (400): its cost would grow with the server.

Errors: 400 bad request or another connection's exclusive queue (RabbitMQ's answer), 403 the
default or an ``amq.*`` exchange, a permission or a vhost limit, 404 no such queue, exchange or
path, 405 method not allowed on the path, 409 an inequivalent redeclaration or a bad argument
(RabbitMQ's precondition-failed, which the client reports as ``ErrPreconditionFailed``),
501 what sluicegate does not implement (a plugin exchange type, ``x-consistent-hash``).

Each router serves one virtual host: its registry is that virtual host's namespace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import unquote

from sluicegate.gateway.rules.auth import DEFAULT_VHOST
from sluicegate.gateway.rules.management.bindings import BindingRoutes
from sluicegate.gateway.rules.management.exchanges import ExchangeRoutes
from sluicegate.gateway.rules.management.queues import QueueRoutes
from sluicegate.gateway.rules.management.requests import (
    UNLIMITED,
    Caller,
    Quotas,
    Refused,
    Request,
    Response,
)
from sluicegate.gateway.rules.names import BadName
from sluicegate.gateway.rules.tenancy import QuotaExceeded
from sluicegate.queues.errors import (
    NotFound,
    NotImplementedByServer,
    PreconditionFailed,
    QueueError,
    ResourceLocked,
)
from sluicegate.queues.registry import AccessRefused, QueueRegistry
from sluicegate.wire.errors import AmqpError

# Each queue-layer error and the status RabbitMQ's management answers it with.
_STATUS: Final[tuple[tuple[type[QueueError], int], ...]] = (
    (NotFound, 404),
    (AccessRefused, 403),
    (QuotaExceeded, 403),
    (PreconditionFailed, 409),
    (ResourceLocked, 400),
    (BadName, 400),
    (NotImplementedByServer, 501),
)


@dataclass
class Router:
    """Answers management requests against one server's queue registry."""

    registry: QueueRegistry
    # The node name reported as a queue's leader and only replica.
    node: str = "sluicegate"
    # The virtual host whose registry this is, as queue maps report it.
    vhost: str = DEFAULT_VHOST
    # The virtual host's limits on new queues, exchanges and bindings.
    quotas: Quotas = UNLIMITED
    _routes: dict[str, Callable[[Request, list[str], Caller], Response]] = field(
        init=False, repr=False
    )

    def __post_init__(self) -> None:
        registry, vhost, quotas = self.registry, self.vhost, self.quotas
        self._routes = {
            "queues": QueueRoutes(registry, self.node, vhost, quotas).handle,
            "exchanges": ExchangeRoutes(registry, vhost, quotas).handle,
            "bindings": BindingRoutes(registry, vhost, quotas).handle,
        }

    def handle(self, request: Request, caller: Caller | None = None) -> Response:
        """Answer one request from ``caller`` (by default: anyone, allowed everything)."""
        caller = caller if caller is not None else Caller()
        path, _, query = request.path.partition("?")
        segments = [unquote(s) for s in path.split("/")[1:]] if path.startswith("/") else []
        route = self._routes.get(segments[0]) if segments else None
        if route is None:
            return Response(404, f"no such path: {request.path!r}")
        try:
            if query:
                segments.append("?" + query)
            return route(request, segments[1:], caller)
        except Refused as error:
            return Response(error.status, error.message)
        except AmqpError as error:
            for kind, status in _STATUS:
                if isinstance(error, kind):
                    return Response(status, str(error))
            return Response(400, str(error))
