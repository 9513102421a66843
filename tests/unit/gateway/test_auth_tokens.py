"""``PUT /auth/tokens`` (RabbitMQ 4.1's OAuth 2 token renewal) on the management router."""

from __future__ import annotations

from sluicegate.gateway.management.router import Request, Router
from sluicegate.queues.registry import QueueRegistry


def test_a_binary_token_is_accepted_as_rabbitmq_without_oauth_accepts_it() -> None:
    router = Router(QueueRegistry())
    assert router.handle(Request("PUT", "/auth/tokens", b"eyJhbGciOi.token")).status == 204


def test_anything_else_is_refused_with_the_status_rabbitmq_gives() -> None:
    router = Router(QueueRegistry())
    assert router.handle(Request("PUT", "/auth/tokens", "a string")).status == 400
    assert router.handle(Request("PUT", "/auth/tokens", None)).status == 400
    assert router.handle(Request("GET", "/auth/tokens")).status == 405
    assert router.handle(Request("PUT", "/auth/other", b"t")).status == 404
