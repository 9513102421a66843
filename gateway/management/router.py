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

import base64
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final, Literal, Protocol, TypeAlias, TypeVar
from urllib.parse import parse_qsl, quote, unquote

from sluicegate.gateway.auth import DEFAULT_VHOST
from sluicegate.gateway.names import BadName, check_name
from sluicegate.gateway.tenancy import BindingRequest, QuotaExceeded
from sluicegate.queues.errors import (
    NotFound,
    NotImplementedByServer,
    PreconditionFailed,
    QueueError,
    ResourceLocked,
)
from sluicegate.queues.exchanges import Binding, Exchange
from sluicegate.queues.queue_type import QueueStatistics
from sluicegate.queues.registry import AccessRefused, QueueInfo, QueueRegistry
from sluicegate.queues.stream import StreamQueue
from sluicegate.queues.volatile import is_reply_to
from sluicegate.wire.codec import UInt, ULong, Utf8Array
from sluicegate.wire.errors import AmqpError

T = TypeVar("T")


class Arguments(dict[str, object]):
    """``x-*`` arguments as RabbitMQ echoes them: it keeps them as AMQP 0-9-1 field-table
    values, so the reply encodes each after that round trip (gateway/management/encoding.py)."""

    __slots__ = ()


# What request and reply bodies hold once decoded: AMQP's types as Python values.
Body: TypeAlias = object


Access: TypeAlias = Literal["configure", "write", "read"]


class Permissions(Protocol):
    """What the connection's user may do, by RabbitMQ's three patterns on names."""

    def allows(self, access: Access, name: str, /) -> bool:
        """Whether ``access`` to the queue or exchange ``name`` is permitted."""


class _Everything:
    def allows(self, access: Access, name: str, /) -> bool:
        return True


class _Nobody:
    def allows(self, access: Access, name: str, /) -> bool:
        return False


EVERYTHING: Final[Permissions] = _Everything()
# A connection that has not logged in.
NOBODY: Final[Permissions] = _Nobody()


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sends a request: ``owner`` for exclusive queues, and what they may do.

    RabbitMQ's rules: declaring and deleting need *configure* on the name, purging needs *read*
    on the queue, binding and unbinding need *write* on the destination (a queue or an
    exchange) and *read* on the source exchange. Declaring a queue with a dead-letter exchange,
    or an exchange with an alternate exchange, also needs *read* on what is declared and *write*
    on where its messages will go. Reading a queue's or an exchange's description needs one of
    the three permissions on its name (RabbitMQ's rule for a passive declaration); listings
    show only what the caller could read that way.
    """

    owner: object = None
    permissions: Permissions = EVERYTHING

    def check(self, access: Access, kind: str, name: str) -> None:
        if not self.permissions.allows(access, name):
            raise _Error(403, f"access refused: {access} on {kind} '{name}'")

    def sees(self, name: str) -> bool:
        """Whether the caller has any permission on the queue or exchange ``name``."""
        allows = self.permissions.allows
        return allows("read", name) or allows("write", name) or allows("configure", name)

    def check_any(self, kind: str, name: str) -> None:
        if not self.sees(name):
            raise _Error(403, f"access refused: no permission on {kind} '{name}'")


@dataclass(frozen=True, slots=True)
class Request:
    """One management request: ``subject`` (method), ``to`` (path) and the amqp-value body."""

    method: str
    path: str
    body: Body = None


@dataclass(frozen=True, slots=True)
class Response:
    """The reply: the status code goes in ``subject``, the body in an amqp-value section.

    ``deleted_queue`` names a queue the request deleted, whose consumers the gateway must detach
    with ``amqp:resource-deleted``, as RabbitMQ does; ``exclusive_queue`` an exclusive queue it
    created, which the gateway deletes when its connection closes.
    """

    status: int
    body: Body = None
    deleted_queue: str | None = None
    exclusive_queue: str | None = None


class _Error(Exception):
    """A request refused with an HTTP status of its own."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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
# RabbitMQ's HTTP API refuses pages larger than this.
MAX_PAGE_SIZE: Final = 500
# Its page size when only ``page`` is given.
DEFAULT_PAGE_SIZE: Final = 100
# An unpaged listing is built and encoded in one go, the server's clients waiting meanwhile:
# beyond this many items (some tens of milliseconds of work) it is refused with a 400 that says
# to ask for pages, which cost little whatever the total.
MAX_UNPAGED: Final = 2000
# The default exchange's name in permissions, as RabbitMQ checks it.
DEFAULT_EXCHANGE_RESOURCE: Final = "amq.default"


class Quotas(Protocol):
    """A virtual host's limits on what requests create; each check raises QuotaExceeded."""

    def check_queue_room(self, queue: str, /) -> None:
        """Room for ``queue`` unless it exists (``max_queues``)."""

    def check_exchange_room(self, exchange: str, /) -> None:
        """Room for ``exchange`` unless it exists (``max_exchanges``)."""

    def check_binding_room(self, binding: BindingRequest, /) -> None:
        """Room for ``binding`` unless it exists (``max_bindings``)."""


class _Unlimited:
    def check_queue_room(self, queue: str, /) -> None:
        pass

    def check_exchange_room(self, exchange: str, /) -> None:
        pass

    def check_binding_room(self, binding: BindingRequest, /) -> None:
        pass


UNLIMITED: Final[Quotas] = _Unlimited()


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
    # The last listing's names, permissions and visible names (:meth:`_visible`).
    _visible_names: tuple[tuple[str, ...], Permissions, list[str]] | None = field(
        default=None, init=False, repr=False
    )

    def __post_init__(self) -> None:
        self._routes = {
            "queues": self._queues,
            "exchanges": self._exchanges,
            "bindings": self._bindings,
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
        except _Error as error:
            return Response(error.status, error.message)
        except AmqpError as error:
            for kind, status in _STATUS:
                if isinstance(error, kind):
                    return Response(status, str(error))
            return Response(400, str(error))

    # -- queues ---------------------------------------------------------------------------

    def _queues(self, request: Request, rest: list[str], caller: Caller) -> Response:
        method = request.method
        if not rest or rest[0].startswith("?"):
            _allow(method, "GET")
            return Response(200, _listing(rest, self._visible(caller), self._listed_queue))
        name = rest[0]
        if len(rest) >= 2 and rest[1] == "byte-range":
            _allow(method, "GET")
            caller.check("read", "queue", name)
            return Response(200, self._byte_range(name, rest[2:]))
        if len(rest) == 2 and rest[1] == "messages":
            _allow(method, "DELETE")
            caller.check("read", "queue", name)
            self._check_exclusive(name, caller)
            return Response(200, {"message_count": ULong(self.registry.purge_queue(name))})
        if len(rest) != 1:
            raise _Error(404, f"no such path: {request.path!r}")
        if method == "GET":
            caller.check_any("queue", name)
            return Response(200, self._queue_map(self._queue_info(name)))
        if method == "PUT":
            check_name("queue", name)
            caller.check("configure", "queue", name)
            return self._declare_queue(name, _map(request.body), caller)
        _allow(method, "DELETE")
        caller.check("configure", "queue", name)
        self._check_exclusive(name, caller)
        # A Direct Reply-To queue lives as long as its requester's link: RabbitMQ answers its
        # deletion with 200 and leaves it.
        existed = self.registry.get(name) is not None and not is_reply_to(name)
        # RabbitMQ's stream coordinator deletes a stream without counting it: 0.
        stream = existed and self.registry.settings(name).arguments.queue_type == "stream"
        count = self.registry.delete_queue(name)
        if stream:
            count = 0
        return Response(
            200, {"message_count": ULong(count)}, deleted_queue=name if existed else None
        )

    def _declare_queue(self, name: str, body: Mapping[str, object], caller: Caller) -> Response:
        if name.startswith("amq."):
            raise _Error(403, f"queue names starting with 'amq.' are reserved: '{name}'")
        arguments = _map(body.get("arguments"), "arguments")
        existed = self.registry.get(name) is not None
        exclusive = _flag(body, "exclusive", False)
        owner = caller.owner
        if existed:
            if self.registry.owner(name) is not (owner if exclusive else None):
                raise ResourceLocked(self._locked(name, declaring=True))
        else:
            _check_dead_letter_exchange(name, arguments, caller)
            self.quotas.check_queue_room(name)
        self.registry.declare_queue(
            name,
            dict(arguments),
            durable=_flag(body, "durable", True),
            exclusive=exclusive,
            auto_delete=_flag(body, "auto_delete", False),
            owner=owner if exclusive else None,
        )
        body_map = self._queue_map(self._queue_info(name))
        if existed:
            return Response(200, body_map)
        return Response(201, body_map, exclusive_queue=name if exclusive else None)

    def _byte_range(self, name: str, rest: list[str]) -> dict[str, object]:
        """A stream's messages from ``start`` that fit in ``max_bytes`` (a sluicegate extension,
        docs/management.md): what a reader planning batches by bytes would otherwise read."""
        query = dict(parse_qsl(rest[0][1:])) if rest and rest[0].startswith("?") else {}
        try:
            start, stop, max_bytes = (int(query[key]) for key in ("start", "stop", "max_bytes"))
        except (KeyError, ValueError):
            raise _Error(400, "byte-range needs integers start, stop and max_bytes") from None
        if min(start, stop, max_bytes) < 0:
            raise _Error(400, "start, stop and max_bytes must not be negative")
        queue = self.registry.queue(name)
        if not isinstance(queue, StreamQueue):
            raise _Error(400, f"queue '{name}' is not a stream: it has no offsets")
        end, size, capped = queue.byte_range(
            start, stop, max_bytes, at_least_one=query.get("at_least_one") == "true"
        )
        return {"end": ULong(end), "bytes": ULong(size), "capped": capped}

    def _visible(self, caller: Caller) -> Sequence[str]:
        """The names of the queues the caller may see, sorted.

        Kept for the caller's permissions until a queue is declared or deleted, so that the
        pages of one listing do not each filter every queue of the server.
        """
        names = self.registry.queue_names()
        permissions = caller.permissions
        if permissions is EVERYTHING:
            return names
        cached = self._visible_names
        if cached is not None and cached[0] is names and cached[1] is permissions:
            return cached[2]
        visible = [name for name in names if caller.sees(name)]
        self._visible_names = (names, permissions, visible)
        return visible

    def _queue_info(self, name: str) -> QueueInfo:
        """A queue's description and counts: reading them is use (RabbitMQ's ``stat``)."""
        info = self._described(name)
        self.registry.renew_lease(name)
        return info

    def _described(self, name: str) -> QueueInfo:
        registry = self.registry
        return QueueInfo(name, registry.settings(name), None, registry.queue(name).statistics())

    def _listed_queue(self, name: str) -> dict[str, object]:
        """A queue's map in a listing, which is not use: no x-expires lease is renewed."""
        return self._queue_map(self._described(name))

    def _check_exclusive(self, name: str, caller: Caller) -> None:
        """Raise unless the queue is not exclusive or belongs to the caller's connection."""
        owner = self.registry.owner(name)
        if owner is not None and owner is not caller.owner:
            raise ResourceLocked(self._locked(name))

    def _locked(self, name: str, *, declaring: bool = False) -> str:
        """RabbitMQ's words for another connection's exclusive queue."""
        reason = f"cannot obtain exclusive access to locked queue '{name}' in vhost '{self.vhost}'"
        if not declaring:
            return reason
        return (
            f"{reason}. It could be originally declared on another connection or the exclusive "
            "property value does not match that of the original declaration."
        )

    def _queue_map(self, info: QueueInfo) -> dict[str, object]:
        """A queue as RabbitMQ's ``queue_info`` reply has it: every key the client reads."""
        settings = info.settings
        queue_type = settings.arguments.queue_type
        # RabbitMQ counts a stream's readers nowhere: its stat says 0 consumers.
        consumers = 0 if queue_type == "stream" else info.statistics.consumers
        return {
            "name": info.name,
            "vhost": self.vhost,
            "durable": settings.durable,
            "auto_delete": settings.auto_delete,
            "exclusive": settings.exclusive,
            "type": queue_type,
            "arguments": Arguments(settings.raw_arguments),
            "leader": self.node,
            "replicas": Utf8Array([self.node]),
            "message_count": ULong(info.statistics.ready),
            "consumer_count": UInt(consumers),
            **_stream_offsets(info.statistics),
        }

    # -- exchanges ------------------------------------------------------------------------

    def _exchanges(self, request: Request, rest: list[str], caller: Caller) -> Response:
        method = request.method
        if not rest or rest[0].startswith("?"):
            _allow(method, "GET")
            listed = [x for x in self.registry.exchanges() if caller.sees(x.name)]
            return Response(200, _listing(rest, listed, self._exchange_map))
        if len(rest) != 1:
            raise _Error(404, f"no such path: {request.path!r}")
        name = rest[0]
        if method == "GET":
            caller.check_any("exchange", name)
            return Response(200, self._exchange_map(self.registry.exchange(name)))
        caller.check("configure", "exchange", name)
        if name.startswith("amq.") or not name:
            # RabbitMQ refuses any declaration or deletion of its own exchanges.
            raise _Error(403, f"exchange '{name}' belongs to the server")
        if method == "PUT":
            check_name("exchange", name)
            body = _map(request.body)
            type_name = body.get("type", "direct")
            if not isinstance(type_name, str):
                raise _Error(400, "'type' must be a string")
            arguments = _map(body.get("arguments"), "arguments")
            if not self._exchange_exists(name):
                _check_routing_argument("exchange", name, arguments, "alternate-exchange", caller)
                self.quotas.check_exchange_room(name)
            self.registry.declare_exchange(
                name,
                type_name,
                durable=_flag(body, "durable", True),
                auto_delete=_flag(body, "auto_delete", False),
                internal=_flag(body, "internal", False),
                arguments=dict(arguments),
            )
            return Response(204)
        _allow(method, "DELETE")
        self.registry.delete_exchange(name)
        return Response(204)

    def _exchange_exists(self, name: str) -> bool:
        try:
            self.registry.exchange(name)
        except NotFound:
            return False
        return True

    def _exchange_map(self, exchange: Exchange) -> dict[str, object]:
        settings = exchange.settings
        return {
            "name": exchange.name,
            "vhost": self.vhost,
            "type": settings.type.value,
            "durable": settings.durable,
            "auto_delete": settings.auto_delete,
            "internal": settings.internal,
            "arguments": Arguments(settings.arguments),
        }

    # -- bindings -------------------------------------------------------------------------

    def _bindings(self, request: Request, rest: list[str], caller: Caller) -> Response:
        method = request.method
        if not rest or rest[0].startswith("?"):
            if method == "GET":
                listed = self._listed(rest, caller)
                return Response(
                    200, _listing(rest, listed, partial(_binding_map, vhost=self.vhost))
                )
            _allow(method, "POST")
            return self._bind(_map(request.body), caller)
        _allow(method, "DELETE")
        if len(rest) != 1:
            raise _Error(404, f"no such path: {request.path!r}")
        fields = _binding_fields(request.path)
        source = fields.get("src")
        destination, to_exchange = _destination(fields, "dstq", "dste")
        if source is None or destination is None:
            raise _Error(400, "a binding path needs src= and dstq= or dste=")
        _check_binding(caller, source, destination, to_exchange=to_exchange)
        if not to_exchange:
            self._check_exclusive(destination, caller)
        key = fields.get("key", "")
        arguments_hash = fields.get("args", "")
        candidates = self.registry.bindings(source, destination, to_exchange=to_exchange)
        if not to_exchange and self.registry.get(destination) is None:
            # rabbitmq-amqp-python-client 1.0.1 unbinds an exchange-to-exchange binding with
            # dstq= for its destination. With no such queue, no binding to a queue can exist:
            # the path can only mean the binding to the exchange of that name.
            candidates = self.registry.bindings(source, destination, to_exchange=True)
        for binding in candidates:
            if binding.binding_key == key and _arguments_hash(binding) == arguments_hash:
                self.registry.unbind(
                    source,
                    destination,
                    key,
                    dict(binding.arguments),
                    to_exchange=binding.to_exchange,
                )
                break
        return Response(204)

    def _listed(self, rest: list[str], caller: Caller) -> list[Binding]:
        """The bindings a ``GET /bindings?src=&dstq=|dste=&key=`` asks for and may see.

        Naming both ends is RabbitMQ's request, refused (403) without *read* on the source and
        *write* on the destination; a listing over fewer ends shows the bindings for which the
        caller has both.
        """
        query = dict(parse_qsl(rest[0][1:])) if rest else {}
        source = query.get("src")
        destination, to_exchange = _destination(query, "dstq", "dste")
        if source is not None and destination is not None:
            _check_binding(caller, source, destination, to_exchange=to_exchange)
        found = self.registry.bindings(
            source, destination, to_exchange=None if destination is None else to_exchange
        )
        if "key" in query:
            found = [b for b in found if b.binding_key == query["key"]]
        allows = caller.permissions.allows
        return [b for b in found if allows("read", b.source) and allows("write", b.destination)]

    def _bind(self, body: Mapping[str, object], caller: Caller) -> Response:
        source = body.get("source")
        destination, to_exchange = _destination(body, "destination_queue", "destination_exchange")
        key = body.get("binding_key", "")
        if not isinstance(source, str) or not isinstance(destination, str):
            raise _Error(
                400,
                "a binding needs a 'source' string and a 'destination_queue' or "
                "'destination_exchange' string",
            )
        if not isinstance(key, str):
            raise _Error(400, "'binding_key' must be a string")
        arguments = _map(body.get("arguments"), "arguments")
        _check_binding(caller, source, destination, to_exchange=to_exchange)
        if not to_exchange:
            self._check_exclusive(destination, caller)
        self.quotas.check_binding_room(
            BindingRequest(source, destination, key, arguments, to_exchange)
        )
        self.registry.bind(source, destination, key, dict(arguments), to_exchange=to_exchange)
        return Response(204)


def _check_binding(caller: Caller, source: str, destination: str, *, to_exchange: bool) -> None:
    """RabbitMQ's binding checks: *read* on the source exchange, *write* on the destination.

    An exchange-to-exchange binding is a way for messages to reach the destination exchange,
    so it needs the same *write* as publishing there.
    """
    caller.check("read", "exchange", source)
    caller.check("write", "exchange" if to_exchange else "queue", destination)


def _listing(rest: list[str], items: Sequence[T], render: Callable[[T], Body]) -> Body:
    """Every item rendered, or the page of them the query asks for (RabbitMQ's paging)."""
    query = dict(parse_qsl(rest[0][1:])) if rest else {}
    if "page" not in query and "page_size" not in query:
        if len(items) > MAX_UNPAGED:
            raise _Error(
                400,
                f"{len(items)} items are too many for one reply (at most {MAX_UNPAGED}): "
                f"ask for pages, ?page=1&page_size={MAX_PAGE_SIZE} and on",
            )
        return [render(item) for item in items]
    try:
        page = int(query.get("page", "1"))
        size = int(query.get("page_size", str(DEFAULT_PAGE_SIZE)))
    except ValueError:
        raise _Error(400, "page and page_size must be integers") from None
    if page < 1 or not 1 <= size <= MAX_PAGE_SIZE:
        raise _Error(400, f"page must be at least 1 and page_size 1 to {MAX_PAGE_SIZE}")
    total = len(items)
    page_count = -(-total // size)
    if page > max(page_count, 1):
        raise _Error(400, f"page out of range: there are {page_count} pages of {size}")
    chunk = items[(page - 1) * size : page * size]
    return {
        "items": [render(item) for item in chunk],
        "page": page,
        "page_size": size,
        "page_count": page_count,
        "item_count": len(chunk),
        "total_count": total,
        "filtered_count": total,
    }


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise _Error(405, f"method {method!r} not allowed here")


def _map(value: object, what: str = "the request body") -> Mapping[str, object]:
    """A map with string keys; an absent body or argument table is an empty map."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise _Error(400, f"{what} must be a map with string keys")
    return value


def _flag(body: Mapping[str, object], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise _Error(400, f"'{key}' must be a boolean")
    return value


def _binding_fields(path: str) -> dict[str, str]:
    """``/bindings/src=X;dstq=Q;key=K;args=`` to its fields, each percent-decoded."""
    raw = path.split("/", 2)[2]
    fields: dict[str, str] = {}
    for part in raw.split(";"):
        name, equals, value = part.partition("=")
        if not equals:
            raise _Error(400, f"bad binding path {path!r}")
        fields[name] = unquote(value)
    return fields


def _check_dead_letter_exchange(
    queue: str, arguments: Mapping[str, object], caller: Caller
) -> None:
    """A new queue's dead letters go where its declarer may write (RabbitMQ's check).

    The default exchange as dead-letter exchange sends each dead letter to the queue its
    ``x-dead-letter-routing-key`` names (checked as writing to that queue, as publishing to
    ``/queues/NAME`` is), or without one to whatever queue the message's own routing key names:
    that needs *write* on ``amq.default``, RabbitMQ's name for the default exchange.
    """
    exchange = arguments.get("x-dead-letter-exchange")
    key = arguments.get("x-dead-letter-routing-key")
    if exchange != "" or not isinstance(key, str):
        _check_routing_argument("queue", queue, arguments, "x-dead-letter-exchange", caller)
        return
    caller.check("read", "queue", queue)
    caller.check("write", "queue", key)


def _check_routing_argument(
    kind: str, name: str, arguments: Mapping[str, object], argument: str, caller: Caller
) -> None:
    """*read* on what is declared and *write* on the exchange an argument sends messages to."""
    target = arguments.get(argument)
    if not isinstance(target, str):
        return  # absent, or refused by the declaration's own argument checks
    caller.check("read", kind, name)
    caller.check("write", "exchange", target or DEFAULT_EXCHANGE_RESOURCE)


def _binding_map(binding: Binding, vhost: str) -> dict[str, object]:
    """A binding as RabbitMQ lists it (with its ``location``, the path that deletes it)."""
    kind = "exchange" if binding.to_exchange else "queue"
    source, destination, key = (
        quote(name, safe="-._~")
        for name in (binding.source, binding.destination, binding.binding_key)
    )
    location = (
        f"/bindings/src={source};dst{kind[0]}={destination};key={key};"
        f"args={_arguments_hash(binding)}"
    )
    return {
        "source": binding.source,
        "vhost": vhost,
        "destination": binding.destination,
        "destination_type": kind,
        f"destination_{kind}": binding.destination,
        "binding_key": binding.binding_key,
        "arguments": Arguments(binding.arguments),
        "location": location,
    }


def _destination(
    fields: Mapping[str, object], queue: str, exchange: str
) -> tuple[str | None, bool]:
    """The destination a request names (a queue or an exchange, not both) and its kind."""
    if queue in fields and exchange in fields:
        raise _Error(400, f"a binding has one destination: '{queue}' or '{exchange}'")
    if exchange in fields:
        named = fields[exchange]
        if not isinstance(named, str):
            raise _Error(400, f"'{exchange}' must be a string")
        return named, True
    named = fields.get(queue)
    if named is not None and not isinstance(named, str):
        raise _Error(400, f"'{queue}' must be a string")
    return named, False


def _arguments_hash(binding: Binding) -> str:
    """What a binding path's ``args=`` holds: empty for no arguments, else a short hash.

    RabbitMQ hashes the arguments with an Erlang function no client recomputes: clients take
    the path from a listed binding's ``location``. This hash is of the arguments' canonical
    encoding, so it is the same after a restart.
    """
    if not binding.arguments:
        return ""
    digest = hashlib.sha256(binding.arguments_identity).digest()[:4]
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def _stream_offsets(statistics: QueueStatistics) -> dict[str, object]:
    """A stream's offsets (Spark plans its reads by them); nothing for other queues.

    ``first_offset`` and ``last_offset`` when it holds messages; ``next_offset`` always, the
    offset its next message gets, which tells where an empty stream stands.
    """
    offsets: dict[str, object] = {}
    if statistics.next_offset is not None:
        offsets["next_offset"] = statistics.next_offset
    if statistics.first_offset is not None and statistics.last_offset is not None:
        offsets["first_offset"] = statistics.first_offset
        offsets["last_offset"] = statistics.last_offset
    return offsets
