"""One asyncio event loop on its own thread serving every HTTP listener, each bounded.

prometheus-client's threading server gave each socket a thread and waited on it for ever: 1,050
half-sent requests took 1,024 descriptors and the AMQP listener's share with them (issue 31).
Here aiohttp (a maintained HTTP/1.1 implementation on asyncio) parses requests on one thread,
and each listener is bounded:

- at most ``max_connections`` sockets open: one more is closed as soon as it is accepted, so the
  descriptors HTTP can hold are the sum of its listeners' caps (and :data:`LISTEN_BACKLOG`
  accepted sockets each, for one pass of the loop), whatever clients do;
- ``request_timeout`` seconds from the connection (or the end of its previous response) to a
  complete request head, for the body to arrive and for the handler to answer: a client that
  trickles a byte a second is cut off, an idle keep-alive connection too;
- ``max_request_size`` bytes of body (413 beyond), aiohttp's limits on the request line and
  header fields (8 KiB each), :data:`MAX_HEADERS` headers, no decompression of request bodies;
- a malformed request is answered ``400`` and closed, never logged: aiohttp logs each one with
  its traceback, so a client sending them in a loop wrote the server's log at its own pace
  (the adversary's ``http-api`` steps, docs/adversary.md).

Handlers must not block: what touches the broker goes to the reactor thread and is awaited
(gateway/http/reactor_calls.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from sluicegate.gateway.http.errors import json_error

# Connections the kernel may queue before accept, and asyncio's accepts per readiness of the
# listening socket: each accepted socket over the cap holds a descriptor until the next pass of
# the loop closes it, so a listener holds at most its cap and this many (docs/http-api.md).
LISTEN_BACKLOG: Final = 16
# Seconds a response may take to write out after a handler returned: aiohttp's lingering read
# of an unread body, kept short for the same reason as the request deadline.
LINGERING_TIME: Final = 1.0
# Request headers aiohttp accepts (8 KiB each at most): browsers and HTTP clients send about 15;
# 32 keep what one socket can make the server hold before its handler runs under 256 KiB.
MAX_HEADERS: Final = 32
# Seconds close() waits for the loop to stop serving.
CLOSE_TIMEOUT: Final = 5.0

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
# Told of each connection that closed, by its ``request.protocol``.
Closed = Callable[[object], None]


class _MalformedRequests(logging.Filter):
    """Drops aiohttp's report of a request it could not parse (answered ``400`` already): the
    client's error, as many times as it likes; a handler's own failure is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None or not isinstance(record.exc_info[1], HttpProcessingError)


# What aiohttp reports about requests and their handlers, less the malformed requests.
_REQUESTS_LOG: Final = logging.getLogger("sluicegate.http.requests")
_REQUESTS_LOG.addFilter(_MalformedRequests())


@dataclass(frozen=True, slots=True)
class HttpBounds:
    """What one listener may hold and for how long (docs/http-api.md)."""

    max_connections: int
    request_timeout: float
    max_request_size: int


class _CappedServer(web.Server):
    """aiohttp's low-level server that closes a connection over its listener's cap at once."""

    def __init__(
        self, handler: Handler, bounds: HttpBounds, closed: Closed | None, **kwargs: Any
    ) -> None:
        super().__init__(handler, **kwargs)
        self._cap = bounds.max_connections
        self._closed = closed
        # Sockets closed at once for being over the cap, for tests and docs/http-api.md.
        self.refused = 0

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self.connections) > self._cap:
            self.refused += 1
            transport.abort()

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        if self._closed is not None:
            self._closed(handler)


def _bounded(handler: Handler, bounds: HttpBounds) -> Handler:
    """``handler`` with the request deadline and the body size checked before it runs."""

    async def serve(request: web.BaseRequest) -> web.StreamResponse:
        length = request.content_length
        if length is not None and length > bounds.max_request_size:
            return _error(413, f"request body over {bounds.max_request_size} bytes")
        if request.headers.get("Content-Encoding", "identity") != "identity":
            return _error(415, "compressed request bodies are not accepted")
        try:
            async with asyncio.timeout(bounds.request_timeout):
                return await handler(request)
        except TimeoutError:
            return _error(503, f"no answer within {bounds.request_timeout:g} s")
        except BodyTooLarge:
            return _error(413, f"request body over {bounds.max_request_size} bytes")

    return serve


def _error(status: int, reason: str) -> web.Response:
    """A JSON error with ``Connection: close``: the request may be half read."""
    response = json_error(status, reason)
    response.force_close()
    return response


async def read_body(request: web.BaseRequest, limit: int) -> bytes:
    """The request's body, chunked or not; 413 (:class:`BodyTooLarge`) past ``limit`` bytes."""
    body = bytearray()
    while chunk := await request.content.read(limit + 1 - len(body)):
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge
    return bytes(body)


class BodyTooLarge(Exception):
    """A request body over the listener's ``max_request_size``."""


@dataclass(slots=True)
class Listening:
    """One listener: its port and the count of sockets refused over its cap."""

    port: int
    server: _CappedServer
    sockets: asyncio.Server


class HttpStack:
    """The loop thread; :meth:`listen` opens a listener on it, :meth:`close` stops them all."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._listeners: list[Listening] = []
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="sluicegate-http", daemon=True
        )
        self._thread.start()

    def listen(
        self,
        host: str,
        port: int,
        handler: Handler,
        bounds: HttpBounds,
        closed: Closed | None = None,
    ) -> Listening:
        """Serve ``handler`` on ``host:port`` within ``bounds``, telling ``closed`` of each
        connection that closes; raises OSError as bind does."""
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        listening = asyncio.run_coroutine_threadsafe(
            self._serve(sock, handler, bounds, closed), self.loop
        ).result()
        self._listeners.append(listening)
        return listening

    async def _serve(
        self, sock: socket.socket, handler: Handler, bounds: HttpBounds, closed: Closed | None
    ) -> Listening:
        server = _CappedServer(
            _bounded(handler, bounds),
            bounds,
            closed,
            # From the connection to a complete request head, and between two requests.
            keepalive_timeout=bounds.request_timeout,
            lingering_time=LINGERING_TIME,
            max_headers=MAX_HEADERS,
            auto_decompress=False,
            access_log=None,
            handler_cancellation=True,
            logger=_REQUESTS_LOG,
        )
        sockets = await self.loop.create_server(server, sock=sock, backlog=LISTEN_BACKLOG)
        return Listening(sock.getsockname()[1], server, sockets)

    def close(self) -> None:
        """Close every listener and its connections, then end the loop thread."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(TimeoutError):
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(CLOSE_TIMEOUT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CLOSE_TIMEOUT)
        self.loop.close()

    async def _close(self) -> None:
        for listening in self._listeners:
            listening.sockets.close()
            listening.server.pre_shutdown()
        for listening in self._listeners:
            await listening.sockets.wait_closed()
            await listening.server.shutdown(1.0)
