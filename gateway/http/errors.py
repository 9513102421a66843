"""RabbitMQ's JSON error bodies: ``{"error": WORD, "reason": TEXT}`` with the word it uses."""

from __future__ import annotations

from typing import Final

from aiohttp import web

# The ``error`` word RabbitMQ's management plugin answers each status with.
_WORDS: Final = {
    400: "bad_request",
    401: "not_authorised",
    403: "not_authorised",
    404: "Object Not Found",
    405: "Method Not Allowed",
    409: "precondition_failed",
    413: "request_too_large",
    415: "unsupported_media_type",
    501: "not_implemented",
    503: "service_unavailable",
}


def json_error(status: int, reason: str) -> web.Response:
    """An error response as RabbitMQ's HTTP API sends it (never a traceback)."""
    response = web.json_response(
        {"error": _WORDS.get(status, "internal_server_error"), "reason": reason}, status=status
    )
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Basic realm="RabbitMQ Management"'
    return response
