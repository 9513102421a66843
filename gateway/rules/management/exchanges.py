"""The ``/exchanges`` routes, and the check that a declared argument sends messages only where
the declarer may write (an alternate exchange, a dead-letter exchange)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sluicegate.gateway.rules.management.listing import listing
from sluicegate.gateway.rules.management.requests import (
    Arguments,
    Caller,
    Quotas,
    Refused,
    Request,
    Response,
    allow,
    body_map,
    flag,
)
from sluicegate.gateway.rules.names import check_name
from sluicegate.queues.errors import NotFound
from sluicegate.queues.exchanges import Exchange, exchange_settings
from sluicegate.queues.queue_homes import OwnerDeclared
from sluicegate.queues.registry import QueueRegistry

# The default exchange's name in permissions, as RabbitMQ checks it.
DEFAULT_EXCHANGE_RESOURCE: Final = "amq.default"


class ExchangeRoutes:
    """Answers ``/exchanges`` requests in one virtual host."""

    def __init__(self, registry: QueueRegistry, vhost: str, quotas: Quotas) -> None:
        self.registry = registry
        self.vhost = vhost
        self.quotas = quotas

    def handle(self, request: Request, rest: list[str], caller: Caller) -> Response:
        method = request.method
        if not rest or rest[0].startswith("?"):
            allow(method, "GET")
            listed = [x for x in self.registry.exchanges() if caller.sees(x.name)]
            return Response(200, listing(rest, listed, self._exchange_map))
        if len(rest) != 1:
            raise Refused(404, f"no such path: {request.path!r}")
        name = rest[0]
        if method == "GET":
            caller.check_any("exchange", name)
            return Response(200, self._exchange_map(self.registry.exchange(name)))
        caller.check("configure", "exchange", name)
        if name.startswith("amq.") or not name:
            # RabbitMQ refuses any declaration or deletion of its own exchanges.
            raise Refused(403, f"exchange '{name}' belongs to the server")
        if method == "PUT":
            check_name("exchange", name)
            body = body_map(request.body)
            type_name = body.get("type", "direct")
            if not isinstance(type_name, str):
                raise Refused(400, "'type' must be a string")
            arguments = body_map(body.get("arguments"), "arguments")
            if not self._exchange_exists(name):
                check_routing_argument("exchange", name, arguments, "alternate-exchange", caller)
                self.quotas.check_exchange_room(name)
            durable = flag(body, "durable", True)
            auto_delete = flag(body, "auto_delete", False)
            internal = flag(body, "internal", False)
            # Checked here first, so that a bad declaration is refused with its own reason.
            exchange_settings(
                type_name,
                durable=durable,
                auto_delete=auto_delete,
                internal=internal,
                arguments=arguments,
            )
            placement = self.registry.placement
            judged = (
                None
                if placement is None
                else placement.owner_declares_exchange(
                    name,
                    type_name,
                    arguments,
                    durable=durable,
                    auto_delete=auto_delete,
                    internal=internal,
                )
            )
            if judged is OwnerDeclared.ASKED:
                # Another worker judges it: answered again once it has, its declaration here
                # by then, so this one is judged as on one worker (docs/workers.md).
                return Response(200, None)
            self.registry.declare_exchange(
                name,
                type_name,
                durable=durable,
                auto_delete=auto_delete,
                internal=internal,
                arguments=dict(arguments),
            )
            return Response(204)
        allow(method, "DELETE")
        self.registry.delete_exchange(name)
        return Response(204)

    def _exchange_exists(self, name: str) -> bool:
        try:
            self.registry.exchange(name)
        except NotFound:
            return False
        return True

    def _exchange_map(self, exchange: Exchange) -> dict[str, object]:
        settings = exchange.settings
        return {
            "name": exchange.name,
            "vhost": self.vhost,
            "type": settings.type.value,
            "durable": settings.durable,
            "auto_delete": settings.auto_delete,
            "internal": settings.internal,
            "arguments": Arguments(settings.arguments),
        }


def check_routing_argument(
    kind: str, name: str, arguments: Mapping[str, object], argument: str, caller: Caller
) -> None:
    """*read* on what is declared and *write* on the exchange an argument sends messages to."""
    target = arguments.get(argument)
    if not isinstance(target, str):
        return  # absent, or refused by the declaration's own argument checks
    caller.check("read", kind, name)
    caller.check("write", "exchange", target or DEFAULT_EXCHANGE_RESOURCE)
