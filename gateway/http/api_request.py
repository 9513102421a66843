"""One HTTP API request on the reactor thread, and what every resource's routes share.

A request's user, method, path, query and body, the virtual hosts it may enter, and its way to
the vhost's management router (gateway/rules/management/router.py): the route modules
(gateway/http/api_*.py) answer with these, so who may see what is decided in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeVar
from urllib.parse import parse_qsl, quote

from aiohttp import web

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.http.loop_views import sees_everything
from sluicegate.gateway.rules.auth import User
from sluicegate.gateway.rules.management.listing import MAX_PAGE_SIZE, MAX_UNPAGED
from sluicegate.gateway.rules.management.requests import Caller, Request, Response
from sluicegate.gateway.rules.management.router import Router
from sluicegate.gateway.rules.tenancy import VirtualHost
from sluicegate.queues.exchange_graph import PREDECLARED
from sluicegate.queues.registry import QueueRegistry
from sluicegate.session.channel.queries import Figures

T = TypeVar("T")

# RabbitMQ's status words for the router's statuses, where the HTTP API differs from the AMQP
# management: an inequivalent redeclaration is a 400 over HTTP, a 409 over AMQP.
_HTTP_STATUS: Final = {409: 400}


class HttpRefused(Exception):
    """A request answered with an error status before or after the router."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Answer:
    """What a reactor job answers: a status and a JSON body (None: no body)."""

    status: int
    body: object = None
    headers: Mapping[str, str] | None = None


class ApiRequest:
    """One request's user and input, and the checks every route makes with them."""

    def __init__(
        self,
        broker: Broker,
        user: User,
        request: web.BaseRequest,
        segments: list[str],
        body: object,
    ) -> None:
        self.broker = broker
        self.user = user
        self.method = request.method
        self.segments = segments
        self.query = dict(parse_qsl(request.query_string))
        # RabbitMQ's header for why a connection is closed (DELETE /api/connections/{name}).
        self.reason = request.headers.get("X-Reason")
        self.body = body
        # What its reads of queues other workers own asked their owners (docs/workers.md):
        # a request that asked is answered again once they answered.
        self.figures = Figures()

    @property
    def asking(self) -> bool:
        """Whether questions to other workers are out: what depends on them waits for the
        request's next run (nothing is changed before)."""
        return self.figures.pending

    def allow(self, *methods: str) -> None:
        if self.method not in methods:
            raise HttpRefused(405, f"method {self.method} not allowed here")

    @property
    def sees_everything(self) -> bool:
        """RabbitMQ's administrator: a user with that tag, or anyone on a server without users."""
        return sees_everything(self.broker, self.user)

    def tags(self, user: User) -> list[str]:
        if user.tags:
            return list(user.tags)
        return ["administrator"] if self.sees_everything else ["management"]

    def visible_vhosts(self) -> list[VirtualHost]:
        return [
            vhost
            for name, vhost in sorted(self.broker.tenancy.vhosts.items())
            if self.user.permissions(name) is not None
        ]

    def vhost(self, name: str) -> VirtualHost:
        vhost = self.broker.tenancy.vhosts.get(name)
        if vhost is None:
            raise HttpRefused(404, "Not Found")
        if self.user.permissions(name) is None:
            raise HttpRefused(401, f"user '{self.user.name}' has no access to vhost '{name}'")
        return vhost

    def route(self, vhost: VirtualHost, method: str, path: str, body: object = None) -> Response:
        """One request to the vhost's management router, as the user."""
        permissions = self.user.permissions(vhost.name)
        assert permissions is not None
        management = self.broker.management
        router: Router = management.routers[vhost.registry]
        response = management.route(Request(method, path, body), Caller(None, permissions), router)
        if response.status >= 400:
            status = _HTTP_STATUS.get(response.status, response.status)
            raise HttpRefused(status, str(response.body))
        return response

    def listing(
        self, segments: list[str], kind: str, shape: Callable[[VirtualHost, dict[str, object]], T]
    ) -> Answer:
        """``/api/KIND`` over every visible vhost, or ``/api/KIND/VHOST`` (paged if asked)."""
        self.allow("GET")
        vhosts = [self.vhost(segments[0])] if segments else self.visible_vhosts()
        paging = {k: v for k, v in self.query.items() if k in ("page", "page_size")}
        if paging and len(vhosts) != 1:
            raise HttpRefused(400, f"pages are per virtual host: ask /api/{kind}/VHOST?page=...")
        if len(vhosts) > 1:
            # Each vhost's listing is capped by the router; so is their sum, for one job.
            total = sum(_size(kind, vhost.registry) for vhost in vhosts)
            if total > MAX_UNPAGED:
                raise HttpRefused(
                    400,
                    f"{total} {kind} are too many for one reply (at most {MAX_UNPAGED}): "
                    f"ask per virtual host, /api/{kind}/VHOST?page=1&page_size={MAX_PAGE_SIZE}",
                )
        suffix = "?" + "&".join(f"{k}={quote(v)}" for k, v in paging.items()) if paging else ""
        items: list[T] = []
        for vhost in vhosts:
            listed = self.route(vhost, "GET", f"/{kind}{suffix}").body
            if isinstance(listed, dict):
                listed["items"] = [shape(vhost, item) for item in listed["items"]]
                return Answer(200, listed)
            assert isinstance(listed, list)
            items.extend(shape(vhost, item) for item in listed)
        return Answer(200, items)


def _size(kind: str, registry: QueueRegistry) -> int:
    """How many queues, exchanges or bindings a vhost holds, before any is rendered."""
    if kind == "queues":
        return registry.queue_count
    if kind == "exchanges":
        return registry.exchange_count + len(PREDECLARED)
    return registry.binding_count


def response_map(response: Response) -> dict[str, object]:
    body = response.body
    assert isinstance(body, dict)
    return body


def json_object(body: object) -> dict[str, object]:
    if not isinstance(body, dict):
        raise HttpRefused(400, "the body must be a JSON object")
    return body


def count_of(value: object) -> int:
    return value if isinstance(value, int) else 0
