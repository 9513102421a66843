"""RabbitMQ's ``/api/queues`` (docs/http-api.md): listed, declared, read, purged and deleted
through the vhost's management router, with the counts named as RabbitMQ's HTTP API names them.
"""

from __future__ import annotations

from urllib.parse import quote

from sluicegate.gateway.http.api_request import (
    Answer,
    ApiRequest,
    HttpRefused,
    count_of,
    json_object,
    response_map,
)
from sluicegate.gateway.rules.tenancy import VirtualHost
from sluicegate.session.channel.remote import management_statistics


class QueuesApi:
    """The queues' routes."""

    def __init__(self, node: str) -> None:
        self._node = node

    def answer(self, job: ApiRequest, segments: list[str]) -> Answer:
        if len(segments) <= 1:
            return job.listing(segments, "queues", self._queue_shape)
        vhost = job.vhost(segments[0])
        name = segments[1]
        path = "/queues/" + quote(name, safe="")
        if len(segments) == 3 and segments[2] == "contents":
            job.allow("DELETE")
            job.route(vhost, "DELETE", path + "/messages")
            return Answer(204)
        if len(segments) != 2:
            return Answer(404, "Not Found")
        job.allow("GET", "PUT", "DELETE")
        if job.method == "GET":
            return Answer(
                200, self._queue_shape(vhost, response_map(job.route(vhost, "GET", path)))
            )
        if job.method == "DELETE":
            if job.figures.deleted(vhost.name, name) is not None:
                # Its owner, another worker, deleted it: this run only answers.
                return Answer(204)
            if vhost.registry.get(name) is None:
                return Answer(404, "Not Found")
            self._check_if_unused(job, vhost, name)
            if job.asking:
                return Answer(204)
            job.route(vhost, "DELETE", path)
            return Answer(204)
        body = json_object(job.body)
        if body.get("exclusive"):
            raise HttpRefused(
                400, "exclusive queues belong to a connection: declare them over AMQP"
            )
        declared = {k: body[k] for k in ("durable", "auto_delete", "arguments") if k in body}
        response = job.route(vhost, "PUT", path, declared)
        return Answer(201 if response.status == 201 else 204)

    def _check_if_unused(self, job: ApiRequest, vhost: VirtualHost, name: str) -> None:
        """RabbitMQ's ``if-empty`` and ``if-unused`` deletion conditions."""
        queue = vhost.registry.get(name)
        if queue is None:
            return
        stats = management_statistics(queue)
        if job.asking:
            # A stand-in's counts are asked of its owner: checked when the request is answered
            # again with them, before anything is deleted.
            return
        if job.query.get("if-empty") == "true" and stats.ready + stats.unacked:
            raise HttpRefused(400, f"queue '{name}' in vhost '{vhost.name}' is not empty")
        if job.query.get("if-unused") == "true" and stats.consumers:
            raise HttpRefused(400, f"queue '{name}' in vhost '{vhost.name}' is in use")

    def _queue_shape(self, vhost: VirtualHost, item: dict[str, object]) -> dict[str, object]:
        """The router's queue map in RabbitMQ's HTTP shape: counts named as the HTTP API does."""
        name = str(item["name"])
        queue = vhost.registry.get(name)
        unacked = ready_bytes = unacked_bytes = 0
        ready = int(count_of(item.get("message_count")))
        if queue is not None:
            stats = management_statistics(queue)
            unacked, ready_bytes, unacked_bytes = (
                stats.unacked,
                stats.ready_bytes,
                stats.unacked_bytes,
            )
        shaped = {
            key: value
            for key, value in item.items()
            if key not in ("message_count", "consumer_count", "leader", "replicas")
        }
        shaped.update(
            node=self._node,
            state="running",
            consumers=count_of(item.get("consumer_count")),
            messages=ready + unacked,
            messages_ready=ready,
            messages_unacknowledged=unacked,
            message_bytes=ready_bytes + unacked_bytes,
            message_bytes_ready=ready_bytes,
            message_bytes_unacknowledged=unacked_bytes,
        )
        if item.get("type") != "classic":
            shaped.update(leader=self._node, members=[self._node])
        return shaped
