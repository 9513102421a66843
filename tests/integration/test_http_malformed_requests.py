"""Malformed HTTP requests are answered and closed, and cost the server's log nothing.

Before: aiohttp logged each request it could not parse (too many headers, a bad request line)
with a traceback of ~15 lines, so a client sending them in a loop wrote the log at its own pace,
and the adversary's ``http-api`` steps read it as an internal error (docs/adversary.md).
"""

from __future__ import annotations

import socket
from typing import Final

from support.ports import free_port
from support.process import serving

# Past the listener's 32 headers (gateway/http/stack.py's MAX_HEADERS).
TOO_MANY_HEADERS: Final = b"".join(b"X-Adversary-%d: x\r\n" % index for index in range(40))
MALFORMED: Final = (
    b"GET /api/queues HTTP/1.1\r\nHost: a\r\n" + TOO_MANY_HEADERS + b"\r\n",
    b"GET /api/queues HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
    b"GET /api/queues HTTP/1.1\r\nHost a\r\n\r\n",
    b"GET /metrics HTTP/9.9\r\nHost: a\r\n\r\n",
)
ROUNDS: Final = 25


def _answer(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(4096)


def test_malformed_requests_are_answered_400_and_not_logged() -> None:
    """Each malformed request, a hundred times over to the API and the metrics endpoint, gets
    a 400; the server goes on answering, and its log says nothing of them."""
    api, metrics = free_port(), free_port()
    options = ("--http-api-listen", f"127.0.0.1:{api}", "--metrics-listen", f"127.0.0.1:{metrics}")
    with serving(*options) as (process, _):
        for _ in range(ROUNDS):
            for port in (api, metrics):
                for request in MALFORMED:
                    assert _answer(port, request).startswith(b"HTTP/1.0 400 ")
        assert b" 200 OK" in _answer(metrics, b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n")
        process.terminate()
        assert process.stderr is not None
        log = process.stderr.read()
    assert "Traceback" not in log
    assert "Error handling request" not in log
