"""The ``/bindings`` routes: list, bind and unbind, with RabbitMQ's binding paths."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from functools import partial
from urllib.parse import parse_qsl, quote, unquote

from sluicegate.gateway.rules.management.listing import listing
from sluicegate.gateway.rules.management.queues import check_exclusive
from sluicegate.gateway.rules.management.requests import (
    Arguments,
    Caller,
    Quotas,
    Refused,
    Request,
    Response,
    allow,
    body_map,
)
from sluicegate.gateway.rules.tenancy import BindingRequest
from sluicegate.queues.exchanges import Binding
from sluicegate.queues.registry import QueueRegistry


class BindingRoutes:
    """Answers ``/bindings`` requests in one virtual host."""

    def __init__(self, registry: QueueRegistry, vhost: str, quotas: Quotas) -> None:
        self.registry = registry
        self.vhost = vhost
        self.quotas = quotas

    def handle(self, request: Request, rest: list[str], caller: Caller) -> Response:
        method = request.method
        if not rest or rest[0].startswith("?"):
            if method == "GET":
                listed = self._listed(rest, caller)
                return Response(200, listing(rest, listed, partial(_binding_map, vhost=self.vhost)))
            allow(method, "POST")
            return self._bind(body_map(request.body), caller)
        allow(method, "DELETE")
        if len(rest) != 1:
            raise Refused(404, f"no such path: {request.path!r}")
        fields = _binding_fields(request.path)
        source = fields.get("src")
        destination, to_exchange = _destination(fields, "dstq", "dste")
        if source is None or destination is None:
            raise Refused(400, "a binding path needs src= and dstq= or dste=")
        _check_binding(caller, source, destination, to_exchange=to_exchange)
        if not to_exchange:
            check_exclusive(self.registry, self.vhost, destination, caller)
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
            raise Refused(
                400,
                "a binding needs a 'source' string and a 'destination_queue' or "
                "'destination_exchange' string",
            )
        if not isinstance(key, str):
            raise Refused(400, "'binding_key' must be a string")
        arguments = body_map(body.get("arguments"), "arguments")
        _check_binding(caller, source, destination, to_exchange=to_exchange)
        if not to_exchange:
            check_exclusive(self.registry, self.vhost, destination, caller)
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


def _binding_fields(path: str) -> dict[str, str]:
    """``/bindings/src=X;dstq=Q;key=K;args=`` to its fields, each percent-decoded."""
    raw = path.split("/", 2)[2]
    fields: dict[str, str] = {}
    for part in raw.split(";"):
        name, equals, value = part.partition("=")
        if not equals:
            raise Refused(400, f"bad binding path {path!r}")
        fields[name] = unquote(value)
    return fields


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
        raise Refused(400, f"a binding has one destination: '{queue}' or '{exchange}'")
    if exchange in fields:
        named = fields[exchange]
        if not isinstance(named, str):
            raise Refused(400, f"'{exchange}' must be a string")
        return named, True
    named = fields.get(queue)
    if named is not None and not isinstance(named, str):
        raise Refused(400, f"'{queue}' must be a string")
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
