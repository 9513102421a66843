"""RabbitMQ's ``/api/connections``: the open AMQP connections a user may see, and their forced
close (docs/http-api.md). A user sees its own; the anonymous user of a server without users,
or an administrator, sees all. As in RabbitMQ's HTTP API, a connection is seen only once it
has been open a while (``http_connection_listing_delay``, with ``rabbitmq_compatible``):
RabbitMQ's clients' test suites drop "all connections" and rely on that to keep the ones they
have just opened.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from urllib.parse import quote

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.conditions import condition
from sluicegate.gateway.http.api_request import Answer, ApiRequest, HttpRefused
from sluicegate.gateway.rules.management.listing import listing
from sluicegate.gateway.rules.management.requests import Refused
from sluicegate.gateway.state import ConnectionState


class ConnectionsApi:
    """The connections' routes, and their map for the other resources that list them."""

    def __init__(self, broker: Broker, node: str, listing_delay: float = 0.0) -> None:
        self._broker = broker
        self._node = node
        self._listing_delay = listing_delay

    def visible(self, job: ApiRequest) -> list[ConnectionState]:
        """The open connections the user may see (its own, or all for the anonymous admin)
        that have been open for the listing delay."""
        everything = job.sees_everything
        opened_by = time.monotonic() - self._listing_delay
        return sorted(
            (
                c
                for c in self._broker.connections
                if c.user is not None
                and c.vhost is not None
                and c.opened_at <= opened_by
                and (everything or c.user.name == job.user.name)
            ),
            key=lambda c: c.name,
        )

    def map(self, state: ConnectionState) -> dict[str, object]:
        connection = state.connection
        properties = connection.remote_properties or {}
        assert state.user is not None
        assert state.vhost is not None
        return {
            "name": state.name,
            "node": self._node,
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

    def answer(self, job: ApiRequest, segments: list[str]) -> Answer:
        if not segments:
            job.allow("GET")
            query = "&".join(f"{k}={quote(v)}" for k, v in job.query.items())
            try:
                listed = listing(["?" + query], self.visible(job), self.map)
            except Refused as error:
                raise HttpRefused(error.status, error.message) from None
            return Answer(200, listed)
        if len(segments) != 1:
            return Answer(404, "Not Found")
        job.allow("GET", "DELETE")
        found = next((c for c in self.visible(job) if c.name == segments[0]), None)
        if found is None:
            return Answer(404, "Not Found")
        if job.method == "GET":
            return Answer(200, self.map(found))
        # RabbitMQ's forced close: CLOSE with connection-forced, "Connection forced: " and the
        # reason, as its AMQP 1.0 reader words it (RabbitMQ's Go client checks the prefix).
        self._broker.release_connection(found)
        reason = job.reason or "Closed via management plugin"
        found.connection.condition = condition(
            "amqp:connection:forced", f"Connection forced: {reason}"
        )
        found.connection.close()
        return Answer(204)


def _connection_state(state: ConnectionState) -> str:
    inbound = state.inbound
    if inbound is not None and inbound.budget_paused:
        return "blocked"
    return "flow" if state.account.paused else "running"


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
