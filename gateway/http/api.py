"""RabbitMQ's HTTP API, the part its clients' users reach for (docs/http-api.md).

Queues, exchanges and bindings are answered by the same router as the AMQP ``/management``
node (gateway/rules/management/router.py, through ``ManagementNode.route``): one implementation, two
transports; this module only translates paths, bodies and shapes between RabbitMQ's HTTP API and
that router; each resource's routes are a module of their own (gateway/http/api_*.py), over
one request's checks (gateway/http/api_request.py). Every request is one job on the reactor
thread (gateway/http/reactor_calls.py) and every answer is JSON; bad input gets RabbitMQ's
status code and ``{"error", "reason"}``.

Who may see what: a user enters the virtual hosts where it has permissions, and in them sees
and changes what its permissions allow (the router's rules); other virtual hosts answer 401, as
RabbitMQ's do. A user sees its own connections, users and permissions; the anonymous user of a
server without users (loopback only by default) sees everything.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Final
from urllib.parse import parse_qsl, unquote

from aiohttp import web

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.http.api_connections import ConnectionsApi
from sluicegate.gateway.http.api_exchanges import bindings, exchanges
from sluicegate.gateway.http.api_overview import OverviewApi
from sluicegate.gateway.http.api_queues import QueuesApi
from sluicegate.gateway.http.api_request import Answer, ApiRequest, HttpRefused
from sluicegate.gateway.http.api_vhosts import VhostsApi
from sluicegate.gateway.http.basic_auth import BasicAuth
from sluicegate.gateway.http.errors import json_error
from sluicegate.gateway.http.get_api import GetApi
from sluicegate.gateway.http.loops_api import ApiError, LoopsApi
from sluicegate.gateway.http.publish_api import PublishApi
from sluicegate.gateway.http.reactor_calls import ReactorCalls
from sluicegate.gateway.http.stack import BodyTooLarge, read_body
from sluicegate.gateway.rules.auth import User
from sluicegate.gateway.runtime_vhosts import RuntimeVhosts
from sluicegate.session.channel.queries import Asked

log = logging.getLogger("sluicegate.http")

# Runs after a request's first that may wait for other workers' answers (docs/workers.md): a
# deletion of another worker's queue reads its counts (if-empty, if-unused), then asks its
# owner to delete it, then answers; a declaration asks its owner, then answers.
_MORE_RUNS: Final = 2


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
        listing_delay: float = 0.0,
    ) -> None:
        self._broker = broker
        self._calls = calls
        self._auth = auth
        # Seconds a job may wait for the reactor: the listener's request deadline.
        self._timeout = timeout
        self._max_request_size = max_request_size
        self._loops = LoopsApi(broker, calls, timeout)
        self._publisher = PublishApi(broker, calls, timeout)
        self._getter = GetApi(broker, calls, timeout)
        connections = ConnectionsApi(broker, node, listing_delay)
        overview = OverviewApi(broker, node, connections)
        vhost_routes = VhostsApi(broker, vhosts, connections)
        self._routes: dict[str, Callable[[ApiRequest, list[str]], Answer]] = {
            "overview": overview.overview,
            "whoami": overview.whoami,
            "vhosts": vhost_routes.vhosts,
            "connections": connections.answer,
            "queues": QueuesApi(node).answer,
            "exchanges": exchanges,
            "bindings": bindings,
            "users": vhost_routes.users,
            "permissions": vhost_routes.permissions,
            "nodes": overview.nodes,
        }

    @property
    def http_publishers(self) -> int:
        """HTTP connections named as publishers now: at most the listener's open ones."""
        return len(self._publisher.clients)

    def closed(self, client: object) -> None:
        """An HTTP connection closed (gateway/http/stack.py): what named it goes."""
        self._publisher.closed(client)

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
            job = ApiRequest(self._broker, user, request, segments, body)
            waiting: list[Future[Asked | None]] = []
            answer = await self._calls.call(lambda: self._run(job, waiting), self._timeout)
            for _ in range(_MORE_RUNS):
                if not waiting:
                    break
                # It read queues other workers own: answered again with their figures.
                failure = await asyncio.wait_for(asyncio.wrap_future(waiting.pop()), self._timeout)
                if failure is not None:
                    answer = Answer(503, failure.error)
                    break
                answer = await self._calls.call(lambda: self._run(job, waiting), self._timeout)
        except HttpRefused as refused:
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
                answer = {
                    "routed": await self._publisher.publish(
                        user,
                        vhost,
                        name,
                        body,
                        request.protocol,
                        request.transport is not None,
                    )
                }
        except HttpRefused as refused:
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
            raise HttpRefused(400, f"the body is not JSON: {error}") from None

    def _run(self, job: ApiRequest, waiting: list[Future[Asked | None]]) -> Answer:
        """The request's route, on the reactor thread; on a server of several workers, a read
        or a deletion that asked other workers for figures adds to ``waiting`` what says when
        they answered."""
        workers = self._broker.peers
        if workers is None:
            return self._route(job)
        with workers.reads.using(job.figures):
            answer = self._route(job)
        if (job.asking or job.figures.failure is not None) and job.method in (
            "GET",
            "DELETE",
            "PUT",
        ):
            answered: Future[Asked | None] = Future()
            workers.gather(job.figures, answered.set_result)
            waiting.append(answered)
        return answer

    def _route(self, job: ApiRequest) -> Answer:
        segments = job.segments
        if not segments or segments[0] not in self._routes:
            return Answer(404, "Not Found")
        try:
            return self._routes[segments[0]](job, segments[1:])
        except HttpRefused as refused:
            return Answer(refused.status, refused.reason)
