"""The requests of the adversary's ``http-api`` steps: RabbitMQ's HTTP API (docs/management.md).

Each step's parameters (steps.py) become raw HTTP/1.1 requests here, so that a step can send
them whole, several before reading any answer, or half, and so that the bad ones (a body that
is not JSON, a length the body never reaches, a path out of the API) are what the server reads.
The targets are the AMQP steps' own ``adv-q*`` and ``adv-x*``: what the API declares, publishes,
takes or deletes meets what their links hold.
"""

from __future__ import annotations

import json
from typing import Final

from support.adversary.steps import Params

__all__ = ["requests_of"]

VHOST: Final = "%2F"
# Where a ``list`` step looks, chosen by its ``count``: every listing the API pages or caps.
LISTINGS: Final = (
    "/api/queues",
    "/api/exchanges",
    "/api/bindings",
    "/api/connections",
    "/api/overview",
    f"/api/queues/{VHOST}?page=1&page_size=500",
    "/api/sluicegate/budget",
)
# A length no body reaches: the server must not wait for it past its request timeout, nor
# keep room for it.
LYING_LENGTH: Final = 10**9
MANY_HEADERS: Final = 40  # past the parser's 32


def requests_of(p: Params) -> list[bytes]:
    """The step's request ``repeat`` times (a ``bad`` step's one bad request, repeated)."""
    one = _bad(p) if p["request"] == "bad" else _request(p)
    return [one] * int(p["repeat"] or 1)


def _request(p: Params) -> bytes:
    request = p["request"]
    queue = f"/api/queues/{VHOST}/{p['queue']}"
    exchange = f"/api/exchanges/{VHOST}/{p['exchange']}"
    if request == "declare-queue":
        durable = p["kind"] in ("quorum", "stream")
        body = {"durable": durable, "auto_delete": False, "arguments": _arguments(p)}
        return _http("PUT", queue, body)
    if request == "declare-exchange":
        return _http("PUT", exchange, {"type": p["type"], "durable": False, "auto_delete": False})
    if request == "bind":
        # About a third bind an exchange to the next one: cycles come by themselves.
        if p["kind"] in ("quorum", "stream"):
            following = f"adv-x{(int(str(p['exchange'])[-1]) + 1) % 4}"
            path = f"/api/bindings/{VHOST}/e/{p['exchange']}/e/{following}"
        else:
            path = f"/api/bindings/{VHOST}/e/{p['exchange']}/q/{p['queue']}"
        return _http("POST", path, {"routing_key": p["key"], "arguments": {}})
    if request == "publish":
        return _http("POST", _publish_path(p), _publish_body(p))
    if request == "get":
        body = {
            "count": p["count"],
            "ackmode": p["ackmode"],
            "encoding": "auto",
            "truncate": 50_000,
        }
        return _http("POST", f"{queue}/get", body)
    if request == "purge":
        return _http("DELETE", f"{queue}/contents")
    if request == "delete-queue":
        return _http("DELETE", queue)
    if request == "delete-exchange":
        return _http("DELETE", exchange)
    return _http("GET", LISTINGS[int(p["count"] or 0) % len(LISTINGS)])


def _arguments(p: Params) -> dict[str, object]:
    kind = p["kind"]
    if kind in ("quorum", "stream"):
        return {"x-queue-type": kind}
    if kind == "length-1":
        return {"x-max-length": 1, "x-overflow": "reject-publish"}
    if kind == "ttl-0-dlx":
        return {"x-message-ttl": 0, "x-dead-letter-exchange": p["exchange"]}
    if kind == "lazy-bad":
        return {"x-queue-mode": 12, "x-max-length": -1}
    return {}


def _publish_path(p: Params) -> str:
    """Through the default exchange to a queue when the key is empty, else to an exchange."""
    name = "amq.default" if p["key"] == "" else p["exchange"]
    return f"/api/exchanges/{VHOST}/{name}/publish"


def _publish_body(p: Params) -> dict[str, object]:
    return {
        "properties": {"delivery_mode": 2 if p["persistent"] else 1, "headers": {"k": p["key"]}},
        "routing_key": p["queue"] if p["key"] == "" else p["key"],
        "payload": "x" * int(p["body"] or 0),
        "payload_encoding": "string",
    }


def _bad(p: Params) -> bytes:
    """One malformed request, chosen by the step's queue kind."""
    kind = p["kind"]
    queue = f"/api/queues/{VHOST}/{p['queue']}"
    if kind == "plain":
        return _raw("PUT", queue, b"{not json", {})
    if kind == "quorum":  # a body announced that never comes
        return _raw("POST", _publish_path(p), b"{", {"Content-Length": str(LYING_LENGTH)})
    if kind == "stream":
        return _http("PUT", f"/api/queues/no-such-vhost/{p['queue']}", {"durable": False})
    if kind == "length-1":
        return _http("GET", "/api/../../../etc/passwd")
    if kind == "ttl-0-dlx":
        extra = {f"X-Adversary-{index}": "x" * 100 for index in range(MANY_HEADERS)}
        return _raw("GET", "/api/queues", b"", extra)
    return _http("POST", f"{queue}/get", {"count": "all", "ackmode": 7})


def _http(method: str, path: str, body: object = None) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    return _raw(method, path, data, {"Content-Type": "application/json"} if data else {})


def _raw(method: str, path: str, data: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: adversary"]
    if "Content-Length" not in headers:
        headers = headers | {"Content-Length": str(len(data))}
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data
