"""RabbitMQ's ``/api/overview``, ``/api/nodes`` and ``/api/whoami`` (docs/http-api.md): the
totals over the virtual hosts a user may enter, the node's figures (gateway/http/node_map.py)
for an administrator, and who the user is.
"""

from __future__ import annotations

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.http.api_connections import ConnectionsApi
from sluicegate.gateway.http.api_request import Answer, ApiRequest, HttpRefused
from sluicegate.gateway.http.node_map import node_map
from sluicegate.gateway.identity import PRODUCT, RABBITMQ_VERSION, VERSION
from sluicegate.session.channel.remote import management_statistics


class OverviewApi:
    """The overview's, node's and user's routes."""

    def __init__(self, broker: Broker, node: str, connections: ConnectionsApi) -> None:
        self._broker = broker
        self._node = node
        self._connections = connections

    def overview(self, job: ApiRequest, segments: list[str]) -> Answer:
        job.allow("GET")
        if segments:
            return Answer(404, "Not Found")
        vhosts = job.visible_vhosts()
        ready = unacked = queues = consumers = exchanges = published = delivered = acked = 0
        for vhost in vhosts:
            registry = vhost.registry
            exchanges += registry.exchange_count
            for name in registry.queue_names():
                queue = registry.get(name)
                if queue is None:
                    continue
                stats = management_statistics(queue)
                queues += 1
                ready += stats.ready
                unacked += stats.unacked
                consumers += stats.consumers
                published += stats.published
                delivered += stats.delivered
                acked += stats.acknowledged
        connections = len(self._connections.visible(job))
        return Answer(
            200,
            {
                # The version the OPEN frame advertises (gateway/identity.py), and what
                # sluicegate itself is.
                "management_version": RABBITMQ_VERSION,
                "rabbitmq_version": RABBITMQ_VERSION,
                "product_name": PRODUCT,
                "product_version": VERSION,
                "node": self._node,
                "cluster_name": self._node,
                "object_totals": {
                    "connections": connections,
                    "queues": queues,
                    "exchanges": exchanges,
                    "consumers": consumers,
                },
                # Counts since the start of the queues there are (the console charts their
                # rates from two readings, as RabbitMQ's UI reads its ``*_details``).
                "message_stats": {"publish": published, "deliver_get": delivered, "ack": acked},
                "queue_totals": {
                    "messages": ready + unacked,
                    "messages_ready": ready,
                    "messages_unacknowledged": unacked,
                },
            },
        )

    def nodes(self, job: ApiRequest, segments: list[str]) -> Answer:
        """RabbitMQ's ``/api/nodes``: its monitoring needs an administrator here."""
        job.allow("GET")
        if not job.sees_everything:
            raise HttpRefused(403, "the node's figures need an administrator")
        if segments and segments != [self._node]:
            return Answer(404, "Not Found")
        shaped = node_map(self._broker, self._node)
        return Answer(200, shaped if segments else [shaped])

    def whoami(self, job: ApiRequest, segments: list[str]) -> Answer:
        job.allow("GET")
        return Answer(200, {"name": job.user.name, "tags": job.tags(job.user)})
