"""RabbitMQ's HTTP API, the part its clients' users reach for (docs/http-api.md).

Queues, exchanges and bindings are answered by the same router as the AMQP ``/management``
node (gateway/rules/management/router.py, through ``ManagementNode.route``): one implementation, two
transports; this module only translates paths, bodies and shapes between RabbitMQ's HTTP API and
that router. Every request is one job on the reactor thread (gateway/http/reactor_calls.py) and
every answer is JSON; bad input gets RabbitMQ's status code and ``{"error", "reason"}``.

Who may see what: a user enters the virtual hosts where it has permissions, and in them sees
and changes what its permissions allow (the router's rules); other virtual hosts answer 401, as
RabbitMQ's do. A user sees its own connections, users and permissions; the anonymous user of a
server without users (loopback only by default) sees everything.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar
from urllib.parse import parse_qsl, quote, unquote

from aiohttp import web
from proton import Condition

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.http.basic_auth import BasicAuth
from sluicegate.gateway.http.errors import json_error
from sluicegate.gateway.http.get_api import GetApi
from sluicegate.gateway.http.loop_views import sees_everything
from sluicegate.gateway.http.loops_api import ApiError, LoopsApi
from sluicegate.gateway.http.node_map import node_map
from sluicegate.gateway.http.publish_api import PublishApi
from sluicegate.gateway.http.reactor_calls import ReactorCalls
from sluicegate.gateway.http.stack import BodyTooLarge, read_body
from sluicegate.gateway.rules.auth import DEFAULT_VHOST, User
from sluicegate.gateway.rules.management.listing import MAX_PAGE_SIZE, MAX_UNPAGED, listing
from sluicegate.gateway.rules.management.requests import Caller, Refused, Request, Response
from sluicegate.gateway.rules.management.router import Router
from sluicegate.gateway.rules.tenancy import VirtualHost
from sluicegate.gateway.runtime_vhosts import RuntimeVhosts, VhostRefused
from sluicegate.gateway.state import ConnectionState
from sluicegate.queues.exchange_graph import PREDECLARED
from sluicegate.queues.registry import QueueRegistry

log = logging.getLogger("sluicegate.http")
T = TypeVar("T")

# The RabbitMQ version sluicegate answers as: the HTTP API of RabbitMQ 4.1.
RABBITMQ_VERSION: Final = "4.1.0"
# RabbitMQ's status words for the router's statuses, where the HTTP API differs from the AMQP
# management: an inequivalent redeclaration is a 400 over HTTP, a 409 over AMQP.
_HTTP_STATUS: Final = {409: 400}


class _Refused(Exception):
    """A request answered with an error status before or after the router."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Answer:
    """What a reactor job answers: a status and a JSON body (None: no body)."""

    status: int
    body: object = None
    headers: Mapping[str, str] | None = None


class HttpApi:
    """The API's request handler, for the HTTP stack (gateway/http/stack.py)."""

    def __init__(
        self,
        broker: Broker,
        vhosts: RuntimeVhosts,
        calls: ReactorCalls,
        auth: BasicAuth,
        *,
        node: str,
        timeout: float,
        max_request_size: int,
    ) -> None:
        self._broker = broker
        self._vhosts = vhosts
        self._calls = calls
        self._auth = auth
        self._node = node
        # Seconds a job may wait for the reactor: the listener's request deadline.
        self._timeout = timeout
        self._max_request_size = max_request_size
        self._loops = LoopsApi(broker, calls, timeout)
        self._publisher = PublishApi(broker, calls, timeout)
        self._getter = GetApi(broker, calls, timeout)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Authenticate, read the body, run the route on the reactor, answer JSON."""
        path = request.raw_path.partition("?")[0]
        if path.rstrip("/") != "/api" and not path.startswith("/api/"):
            return json_error(404, "Not Found")
        user = await self._auth.user(request.headers.get("Authorization"))
        if user is None:
            refused = json_error(401, "Login failed")
            if request.headers.get("X-Requested-With") == "XMLHttpRequest":
                # A script's request (the console's): no challenge, or the browser would ask
                # for a password in a dialog of its own instead of the console's login page.
                del refused.headers["WWW-Authenticate"]
            return refused
        segments = [unquote(part) for part in path.split("/")[2:]]
        if segments and segments[-1] == "":
            segments.pop()
        if segments and segments[0] == "sluicegate":
            return await self._sluicegate(user, request, segments[1:])
        if len(segments) == 4 and segments[0] == "exchanges" and segments[3] == "publish":
            return await self._publish(user, request, segments[1], segments[2])
        if len(segments) == 4 and segments[0] == "queues" and segments[3] == "get":
            return await self._publish(user, request, segments[1], segments[2], get=True)
        try:
            body = await self._body(request)
            job = _Job(self._broker, self._vhosts, self._node, user, request, segments, body)
            answer = await self._calls.call(job.run, self._timeout)
        except _Refused as refused:
            return json_error(refused.status, refused.reason)
        except (BodyTooLarge, TimeoutError):
            raise  # the listener's bounds answer them (gateway/http/stack.py)
        except Exception:
            log.exception("internal error in an HTTP API request")
            return json_error(500, "internal error")
        if answer.status >= 400:
            return json_error(answer.status, str(answer.body))
        if answer.body is None:
            return web.Response(status=answer.status, headers=answer.headers)
        return web.Response(
            status=answer.status,
            text=json.dumps(answer.body, default=str),
            content_type="application/json",
            headers=answer.headers,
        )

    async def _sluicegate(
        self, user: User, request: web.BaseRequest, segments: list[str]
    ) -> web.StreamResponse:
        """sluicegate's own routes: the flow-control loops (gateway/http/loops_api.py)."""
        try:
            body = await self._loops.answer(
                user, request.method, segments, dict(parse_qsl(request.query_string))
            )
        except ApiError as refused:
            return json_error(refused.status, refused.reason)
        except TimeoutError:
            raise  # the listener's deadline answers it (gateway/http/stack.py)
        except Exception:
            log.exception("internal error in an HTTP API request")
            return json_error(500, "internal error")
        return web.json_response(body)

    async def _publish(
        self, user: User, request: web.BaseRequest, vhost: str, name: str, *, get: bool = False
    ) -> web.StreamResponse:
        """A test message to an exchange (gateway/http/publish_api.py), or messages got from a
        queue (gateway/http/get_api.py)."""
        if request.method != "POST":
            return json_error(405, f"method {request.method} not allowed here")
        answer: object
        try:
            body = await self._body(request)
            if get:
                answer = await self._getter.get(user, vhost, name, body)
            else:
                answer = {"routed": await self._publisher.publish(user, vhost, name, body)}
        except _Refused as refused:
            return json_error(refused.status, refused.reason)
        except ApiError as refused:
            return json_error(refused.status, refused.reason)
        except (BodyTooLarge, TimeoutError):
            raise  # the listener's bounds answer them (gateway/http/stack.py)
        except Exception:
            log.exception("internal error in an HTTP API publish or get")
            return json_error(500, "internal error")
        return web.json_response(answer)

    async def _body(self, request: web.BaseRequest) -> object:
        if request.method not in ("PUT", "POST"):
            return None
        raw = await read_body(request, self._max_request_size)
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise _Refused(400, f"the body is not JSON: {error}") from None


class _Job:
    """One request's work on the reactor thread."""

    def __init__(
        self,
        broker: Broker,
        vhosts: RuntimeVhosts,
        node: str,
        user: User,
        request: web.BaseRequest,
        segments: list[str],
        body: object,
    ) -> None:
        self.broker = broker
        self.vhosts = vhosts
        self.node = node
        self.user = user
        self.method = request.method
        self.segments = segments
        self.query = dict(parse_qsl(request.query_string))
        # RabbitMQ's header for why a connection is closed (DELETE /api/connections/{name}).
        self.reason = request.headers.get("X-Reason")
        self.body = body

    def run(self) -> _Answer:
        routes: dict[str, Callable[[list[str]], _Answer]] = {
            "overview": self._overview,
            "whoami": self._whoami,
            "vhosts": self._vhosts,
            "connections": self._connections,
            "queues": self._queues,
            "exchanges": self._exchanges,
            "bindings": self._bindings,
            "users": self._users,
            "permissions": self._permissions,
            "nodes": self._nodes,
        }
        if not self.segments or self.segments[0] not in routes:
            return _Answer(404, "Not Found")
        try:
            return routes[self.segments[0]](self.segments[1:])
        except _Refused as refused:
            return _Answer(refused.status, refused.reason)

    # -- helpers ----------------------------------------------------------------------------

    def _allow(self, *methods: str) -> None:
        if self.method not in methods:
            raise _Refused(405, f"method {self.method} not allowed here")

    @property
    def _sees_everything(self) -> bool:
        """RabbitMQ's administrator: a user with that tag, or anyone on a server without users."""
        return sees_everything(self.broker, self.user)

    def _visible_vhosts(self) -> list[VirtualHost]:
        return [
            vhost
            for name, vhost in sorted(self.broker.tenancy.vhosts.items())
            if self.user.permissions(name) is not None
        ]

    def _vhost(self, name: str) -> VirtualHost:
        vhost = self.broker.tenancy.vhosts.get(name)
        if vhost is None:
            raise _Refused(404, "Not Found")
        if self.user.permissions(name) is None:
            raise _Refused(401, f"user '{self.user.name}' has no access to vhost '{name}'")
        return vhost

    def _route(self, vhost: VirtualHost, method: str, path: str, body: object = None) -> Response:
        """One request to the vhost's management router, as the user."""
        permissions = self.user.permissions(vhost.name)
        assert permissions is not None
        management = self.broker.management
        router: Router = management.routers[vhost.registry]
        response = management.route(Request(method, path, body), Caller(None, permissions), router)
        if response.status >= 400:
            status = _HTTP_STATUS.get(response.status, response.status)
            raise _Refused(status, str(response.body))
        return response

    def _listing(
        self, segments: list[str], kind: str, shape: Callable[[VirtualHost, dict[str, object]], T]
    ) -> _Answer:
        """``/api/KIND`` over every visible vhost, or ``/api/KIND/VHOST`` (paged if asked)."""
        self._allow("GET")
        vhosts = [self._vhost(segments[0])] if segments else self._visible_vhosts()
        paging = {k: v for k, v in self.query.items() if k in ("page", "page_size")}
        if paging and len(vhosts) != 1:
            raise _Refused(400, f"pages are per virtual host: ask /api/{kind}/VHOST?page=...")
        if len(vhosts) > 1:
            # Each vhost's listing is capped by the router; so is their sum, for one job.
            total = sum(_size(kind, vhost.registry) for vhost in vhosts)
            if total > MAX_UNPAGED:
                raise _Refused(
                    400,
                    f"{total} {kind} are too many for one reply (at most {MAX_UNPAGED}): "
                    f"ask per virtual host, /api/{kind}/VHOST?page=1&page_size={MAX_PAGE_SIZE}",
                )
        suffix = "?" + "&".join(f"{k}={quote(v)}" for k, v in paging.items()) if paging else ""
        items: list[T] = []
        for vhost in vhosts:
            listed = self._route(vhost, "GET", f"/{kind}{suffix}").body
            if isinstance(listed, dict):
                listed["items"] = [shape(vhost, item) for item in listed["items"]]
                return _Answer(200, listed)
            assert isinstance(listed, list)
            items.extend(shape(vhost, item) for item in listed)
        return _Answer(200, items)

    # -- routes -----------------------------------------------------------------------------

    def _overview(self, segments: list[str]) -> _Answer:
        self._allow("GET")
        if segments:
            return _Answer(404, "Not Found")
        vhosts = self._visible_vhosts()
        ready = unacked = queues = consumers = exchanges = published = delivered = acked = 0
        for vhost in vhosts:
            registry = vhost.registry
            exchanges += registry.exchange_count
            for name in registry.queue_names():
                queue = registry.get(name)
                if queue is None:
                    continue
                stats = queue.statistics()
                queues += 1
                ready += stats.ready
                unacked += stats.unacked
                consumers += stats.consumers
                published += stats.published
                delivered += stats.delivered
                acked += stats.acknowledged
        connections = len(self._own_connections())
        return _Answer(
            200,
            {
                "management_version": RABBITMQ_VERSION,
                "rabbitmq_version": RABBITMQ_VERSION,
                "product_name": "sluicegate",
                "product_version": RABBITMQ_VERSION,
                "node": self.node,
                "cluster_name": self.node,
                "object_totals": {
                    "connections": connections,
                    "queues": queues,
                    "exchanges": exchanges,
                    "consumers": consumers,
                },
                # Counts since the start of the queues there are (the console charts their
                # rates from two readings, as RabbitMQ's UI reads its ``*_details``).
                "message_stats": {"publish": published, "deliver_get": delivered, "ack": acked},
                "queue_totals": {
                    "messages": ready + unacked,
                    "messages_ready": ready,
                    "messages_unacknowledged": unacked,
                },
            },
        )

    def _nodes(self, segments: list[str]) -> _Answer:
        """RabbitMQ's ``/api/nodes``: its monitoring needs an administrator here."""
        self._allow("GET")
        if not self._sees_everything:
            raise _Refused(403, "the node's figures need an administrator")
        if segments and segments != [self.node]:
            return _Answer(404, "Not Found")
        shaped = node_map(self.broker, self.node)
        return _Answer(200, shaped if segments else [shaped])

    def _whoami(self, segments: list[str]) -> _Answer:
        self._allow("GET")
        return _Answer(200, {"name": self.user.name, "tags": self._tags(self.user)})

    def _tags(self, user: User) -> list[str]:
        if user.tags:
            return list(user.tags)
        return ["administrator"] if self._sees_everything else ["management"]

    def _vhosts(self, segments: list[str]) -> _Answer:
        if not segments:
            self._allow("GET")
            return _Answer(200, [self._vhost_map(vhost) for vhost in self._visible_vhosts()])
        if len(segments) == 2 and segments[1] == "connections":
            self._allow("GET")
            vhost = self._vhost(segments[0])
            return _Answer(
                200,
                [self._connection_map(c) for c in self._own_connections() if c.vhost is vhost],
            )
        if len(segments) != 1:
            return _Answer(404, "Not Found")
        self._allow("GET", "PUT", "DELETE")
        name = segments[0]
        if self.method == "GET":
            return _Answer(200, self._vhost_map(self._vhost(name)))
        if not self._sees_everything:
            # RabbitMQ's administrator tag (or the anonymous user of a server without users).
            raise _Refused(403, "creating or deleting a virtual host needs an administrator")
        try:
            if self.method == "PUT":
                return _Answer(201 if self.vhosts.create(name, self.user.name) else 204)
            self.vhosts.delete(name)
        except VhostRefused as refused:
            raise _Refused(refused.status, str(refused)) from None
        return _Answer(204)

    def _vhost_map(self, vhost: VirtualHost) -> dict[str, object]:
        ready = unacked = 0
        registry = vhost.registry
        for name in registry.queue_names():
            queue = registry.get(name)
            if queue is not None:
                stats = queue.statistics()
                ready += stats.ready
                unacked += stats.unacked
        return {
            "name": vhost.name,
            "description": "",
            "tags": [],
            "default_queue_type": "classic",
            "tracing": False,
            "messages": ready + unacked,
            "messages_ready": ready,
            "messages_unacknowledged": unacked,
        }

    # -- connections ------------------------------------------------------------------------

    def _own_connections(self) -> list[ConnectionState]:
        """The open connections the user may see: its own, or all for the anonymous admin."""
        everything = self._sees_everything
        return sorted(
            (
                c
                for c in self.broker.connections
                if c.user is not None
                and c.vhost is not None
                and (everything or c.user.name == self.user.name)
            ),
            key=lambda c: c.name,
        )

    def _connection_map(self, state: ConnectionState) -> dict[str, object]:
        connection = state.connection
        properties = connection.remote_properties or {}
        assert state.user is not None
        assert state.vhost is not None
        return {
            "name": state.name,
            "node": self.node,
            "user": state.user.name,
            "vhost": state.vhost.name,
            "protocol": "AMQP 1-0",
            "type": "network",
            # RabbitMQ's words: "blocked" by the memory alarm, "flow" by credit flow.
            "state": _connection_state(state),
            "container_id": connection.remote_container or "",
            "channels": len(state.sessions),
            "client_properties": {str(k): _json_value(v) for k, v in properties.items()},
        }

    def _connections(self, segments: list[str]) -> _Answer:
        if not segments:
            self._allow("GET")
            query = "&".join(f"{k}={quote(v)}" for k, v in self.query.items())
            try:
                listed = listing(["?" + query], self._own_connections(), self._connection_map)
            except Refused as error:
                raise _Refused(error.status, error.message) from None
            return _Answer(200, listed)
        if len(segments) != 1:
            return _Answer(404, "Not Found")
        self._allow("GET", "DELETE")
        found = next((c for c in self._own_connections() if c.name == segments[0]), None)
        if found is None:
            return _Answer(404, "Not Found")
        if self.method == "GET":
            return _Answer(200, self._connection_map(found))
        # RabbitMQ's forced close: CLOSE with connection-forced, "Connection forced: " and the
        # reason, as its AMQP 1.0 reader words it (RabbitMQ's Go client checks the prefix).
        self.broker.release_connection(found)
        reason = self.reason or "Closed via management plugin"
        found.connection.condition = Condition(
            "amqp:connection:forced", f"Connection forced: {reason}"
        )
        found.connection.close()
        return _Answer(204)

    # -- queues -----------------------------------------------------------------------------

    def _queues(self, segments: list[str]) -> _Answer:
        if len(segments) <= 1:
            return self._listing(segments, "queues", self._queue_shape)
        vhost = self._vhost(segments[0])
        name = segments[1]
        path = "/queues/" + quote(name, safe="")
        if len(segments) == 3 and segments[2] == "contents":
            self._allow("DELETE")
            self._route(vhost, "DELETE", path + "/messages")
            return _Answer(204)
        if len(segments) != 2:
            return _Answer(404, "Not Found")
        self._allow("GET", "PUT", "DELETE")
        if self.method == "GET":
            return _Answer(200, self._queue_shape(vhost, _dict(self._route(vhost, "GET", path))))
        if self.method == "DELETE":
            if vhost.registry.get(name) is None:
                return _Answer(404, "Not Found")
            self._check_if_unused(vhost, name)
            self._route(vhost, "DELETE", path)
            return _Answer(204)
        body = _object(self.body)
        if body.get("exclusive"):
            raise _Refused(400, "exclusive queues belong to a connection: declare them over AMQP")
        declared = {k: body[k] for k in ("durable", "auto_delete", "arguments") if k in body}
        response = self._route(vhost, "PUT", path, declared)
        return _Answer(201 if response.status == 201 else 204)

    def _check_if_unused(self, vhost: VirtualHost, name: str) -> None:
        """RabbitMQ's ``if-empty`` and ``if-unused`` deletion conditions."""
        queue = vhost.registry.get(name)
        if queue is None:
            return
        stats = queue.statistics()
        if self.query.get("if-empty") == "true" and stats.ready + stats.unacked:
            raise _Refused(400, f"queue '{name}' in vhost '{vhost.name}' is not empty")
        if self.query.get("if-unused") == "true" and stats.consumers:
            raise _Refused(400, f"queue '{name}' in vhost '{vhost.name}' is in use")

    def _queue_shape(self, vhost: VirtualHost, item: dict[str, object]) -> dict[str, object]:
        """The router's queue map in RabbitMQ's HTTP shape: counts named as the HTTP API does."""
        name = str(item["name"])
        queue = vhost.registry.get(name)
        unacked = ready_bytes = unacked_bytes = 0
        ready = int(_int(item.get("message_count")))
        if queue is not None:
            stats = queue.statistics()
            unacked, ready_bytes, unacked_bytes = (
                stats.unacked,
                stats.ready_bytes,
                stats.unacked_bytes,
            )
        shaped = {
            key: value
            for key, value in item.items()
            if key not in ("message_count", "consumer_count", "leader", "replicas")
        }
        shaped.update(
            node=self.node,
            state="running",
            consumers=_int(item.get("consumer_count")),
            messages=ready + unacked,
            messages_ready=ready,
            messages_unacknowledged=unacked,
            message_bytes=ready_bytes + unacked_bytes,
            message_bytes_ready=ready_bytes,
            message_bytes_unacknowledged=unacked_bytes,
        )
        if item.get("type") != "classic":
            shaped.update(leader=self.node, members=[self.node])
        return shaped

    # -- exchanges --------------------------------------------------------------------------

    def _exchanges(self, segments: list[str]) -> _Answer:
        if len(segments) <= 1:
            return self._listing(segments, "exchanges", _exchange_shape)
        if len(segments) != 2:
            return _Answer(404, "Not Found")
        vhost = self._vhost(segments[0])
        name = "" if segments[1] == "amq.default" else segments[1]
        path = "/exchanges/" + quote(name, safe="")
        self._allow("GET", "PUT", "DELETE")
        if self.method == "GET" and not name:
            # The default exchange: RabbitMQ's HTTP API shows it, the router has no map for it.
            return _Answer(200, _default_exchange(vhost))
        if self.method == "GET":
            return _Answer(200, _exchange_shape(vhost, _dict(self._route(vhost, "GET", path))))
        if self.method == "DELETE":
            self._route(vhost, "GET", path)  # 404 for none, as RabbitMQ answers
            self._route(vhost, "DELETE", path)
            return _Answer(204)
        body = _object(self.body)
        if "type" not in body:
            raise _Refused(400, "an exchange needs its 'type'")
        existed = self._exists(vhost, path)
        declared = {
            k: body[k]
            for k in ("type", "durable", "auto_delete", "internal", "arguments")
            if k in body
        }
        self._route(vhost, "PUT", path, declared)
        return _Answer(204 if existed else 201)

    def _exists(self, vhost: VirtualHost, path: str) -> bool:
        try:
            self._route(vhost, "GET", path)
        except _Refused as refused:
            if refused.status == 404:
                return False
            raise
        return True

    # -- bindings ---------------------------------------------------------------------------

    def _bindings(self, segments: list[str]) -> _Answer:
        if len(segments) <= 1:
            return self._listing(segments, "bindings", _binding_shape)
        if len(segments) not in (5, 6) or segments[1] != "e" or segments[3] not in ("q", "e"):
            return _Answer(404, "Not Found")
        vhost = self._vhost(segments[0])
        source, destination = segments[2], segments[4]
        kind = "dstq" if segments[3] == "q" else "dste"
        ends = f"src={quote(source, safe='')}&{kind}={quote(destination, safe='')}"
        if len(segments) == 5:
            self._allow("GET", "POST")
            if self.method == "GET":
                listed = self._route(vhost, "GET", f"/bindings?{ends}").body
                assert isinstance(listed, list)
                return _Answer(200, [_binding_shape(vhost, item) for item in listed])
            return self._bind(vhost, source, destination, segments[3] == "e")
        self._allow("GET", "DELETE")
        listed = self._route(vhost, "GET", f"/bindings?{ends}").body
        assert isinstance(listed, list)
        found = next(
            (b for b in listed if _binding_shape(vhost, b)["properties_key"] == segments[5]), None
        )
        if found is None:
            return _Answer(404, "Not Found")
        if self.method == "GET":
            return _Answer(200, _binding_shape(vhost, found))
        self._route(vhost, "DELETE", str(found["location"]))
        return _Answer(204)

    def _bind(
        self, vhost: VirtualHost, source: str, destination: str, to_exchange: bool
    ) -> _Answer:
        body = _object(self.body)
        key = body.get("routing_key", "")
        request = {
            "source": source,
            "destination_exchange" if to_exchange else "destination_queue": destination,
            "binding_key": key,
            "arguments": body.get("arguments") or {},
        }
        self._route(vhost, "POST", "/bindings", request)
        kind = "e" if to_exchange else "q"
        properties = quote(str(key), safe="") if isinstance(key, str) else ""
        location = (
            f"/api/bindings/{quote(vhost.name, safe='')}/e/{quote(source, safe='')}/{kind}/"
            f"{quote(destination, safe='')}/{properties}"
        )
        return _Answer(201, None, {"Location": location})

    # -- users and permissions --------------------------------------------------------------

    def _visible_users(self) -> list[User]:
        users = self.broker.config.users
        if not users:
            return [self.user]
        if self._sees_everything:
            return list(users.values())
        return [users[self.user.name]] if self.user.name in users else []

    def _configured_only(self) -> None:
        """Users and permissions are configured: the API reads them and changes nothing."""
        if self.method != "GET":
            raise _Refused(
                405,
                "users and permissions are [users.NAME] tables of the configuration file "
                "(docs/configuration.md): the HTTP API does not change them",
            )

    def _users(self, segments: list[str]) -> _Answer:
        self._configured_only()
        users = {user.name: user for user in self._visible_users()}
        if not segments:
            return _Answer(200, [self._user_map(user) for user in users.values()])
        if (len(segments) == 2 and segments[1] == "permissions") or len(segments) == 1:
            user = users.get(segments[0])
            if user is None:
                return _Answer(404, "Not Found")
            if len(segments) == 1:
                return _Answer(200, self._user_map(user))
            return _Answer(200, self._permission_maps([user]))
        return _Answer(404, "Not Found")

    def _user_map(self, user: User) -> dict[str, object]:
        return {
            "name": user.name,
            "tags": self._tags(user),
            "password_hash": "",
            "hashing_algorithm": "scrypt",
            "limits": {},
        }

    def _permission_maps(self, users: Sequence[User]) -> list[dict[str, object]]:
        maps: list[dict[str, object]] = []
        for user in users:
            for vhost in sorted(self.broker.tenancy.vhosts):
                permissions = user.permissions(vhost)
                if permissions is None:
                    continue
                maps.append(
                    {
                        "user": user.name,
                        "vhost": vhost,
                        "configure": permissions.configure.pattern,
                        "write": permissions.write.pattern,
                        "read": permissions.read.pattern,
                    }
                )
        return maps

    def _permissions(self, segments: list[str]) -> _Answer:
        self._configured_only()
        maps = self._permission_maps(self._visible_users())
        if not segments:
            return _Answer(200, maps)
        if len(segments) == 2:
            found = [m for m in maps if m["vhost"] == segments[0] and m["user"] == segments[1]]
            return _Answer(200, found[0]) if found else _Answer(404, "Not Found")
        return _Answer(404, "Not Found")


def _connection_state(state: ConnectionState) -> str:
    inbound = state.inbound
    if inbound is not None and inbound.budget_paused:
        return "blocked"
    return "flow" if state.account.paused else "running"


def _size(kind: str, registry: QueueRegistry) -> int:
    """How many queues, exchanges or bindings a vhost holds, before any is rendered."""
    if kind == "queues":
        return registry.queue_count
    if kind == "exchanges":
        return registry.exchange_count + len(PREDECLARED)
    return registry.binding_count


def _default_exchange(vhost: VirtualHost) -> dict[str, object]:
    return {
        "name": "",
        "vhost": vhost.name,
        "type": "direct",
        "durable": True,
        "auto_delete": False,
        "internal": False,
        "arguments": {},
        "user_who_performed_action": "rmq-internal",
    }


def _exchange_shape(vhost: VirtualHost, item: dict[str, object]) -> dict[str, object]:
    return {**item, "user_who_performed_action": "rmq-internal"}


def _binding_shape(vhost: VirtualHost, item: dict[str, object]) -> dict[str, object]:
    """The router's binding map in RabbitMQ's HTTP shape: ``routing_key`` and
    ``properties_key`` (the key, and ``~`` and the arguments' hash when it has arguments)."""
    location = str(item["location"])
    args_hash = location.rpartition(";args=")[2]
    key = str(item["binding_key"])
    properties = quote(key, safe="") + (f"~{args_hash}" if args_hash else "")
    return {
        "source": item["source"],
        "vhost": vhost.name if vhost.name else DEFAULT_VHOST,
        "destination": item["destination"],
        "destination_type": item["destination_type"],
        "routing_key": key,
        "arguments": item["arguments"],
        "properties_key": properties,
    }


def _dict(response: Response) -> dict[str, object]:
    body = response.body
    assert isinstance(body, dict)
    return body


def _object(body: object) -> dict[str, object]:
    if not isinstance(body, dict):
        raise _Refused(400, "the body must be a JSON object")
    return body


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _json_value(value: object) -> object:
    """A client property as JSON has it: strings, numbers, booleans, maps and lists as they
    are, anything else (binary, timestamps, described values) as its text."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    return str(value)
