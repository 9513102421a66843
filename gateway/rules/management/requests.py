"""What a management request and its reply are, who sends it, and the checks every route makes
on a request's method and body (gateway/rules/management/router.py routes them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol, TypeAlias

from sluicegate.gateway.rules.auth import EVERYTHING, Access
from sluicegate.gateway.rules.tenancy import BindingRequest


class Arguments(dict[str, object]):
    """``x-*`` arguments as RabbitMQ echoes them: it keeps them as AMQP 0-9-1 field-table
    values, so the reply encodes each after that round trip (gateway/management/encoding.py)."""

    __slots__ = ()


# What request and reply bodies hold once decoded: AMQP's types as Python values.
Body: TypeAlias = object


class Allows(Protocol):
    """What a caller may do: :class:`~sluicegate.gateway.rules.auth.Permissions`, or the shell's
    view of a connection's permissions as of each request (gateway/management/node.py)."""

    def allows(self, access: Access, name: str, /) -> bool:
        """Whether ``access`` to the queue or exchange ``name`` is permitted."""


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
    permissions: Allows = EVERYTHING

    def check(self, access: Access, kind: str, name: str) -> None:
        if not self.permissions.allows(access, name):
            raise Refused(403, f"access refused: {access} on {kind} '{name}'")

    def sees(self, name: str) -> bool:
        """Whether the caller has any permission on the queue or exchange ``name``."""
        allows = self.permissions.allows
        return allows("read", name) or allows("write", name) or allows("configure", name)

    def check_any(self, kind: str, name: str) -> None:
        if not self.sees(name):
            raise Refused(403, f"access refused: no permission on {kind} '{name}'")


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


class Refused(Exception):
    """A request refused with an HTTP status of its own."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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


def allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise Refused(405, f"method {method!r} not allowed here")


def body_map(value: object, what: str = "the request body") -> Mapping[str, object]:
    """A map with string keys; an absent body or argument table is an empty map."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise Refused(400, f"{what} must be a map with string keys")
    return value


def flag(body: Mapping[str, object], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise Refused(400, f"'{key}' must be a boolean")
    return value
