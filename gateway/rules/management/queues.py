"""The ``/queues`` routes: list, describe, declare, delete and purge queues, a stream's byte
ranges; and the exclusive-queue check the ``/bindings`` routes share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import parse_qsl

from sluicegate.gateway.rules.auth import EVERYTHING
from sluicegate.gateway.rules.management.exchanges import check_routing_argument
from sluicegate.gateway.rules.management.listing import listing
from sluicegate.gateway.rules.management.requests import (
    Allows,
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
from sluicegate.queues.errors import ResourceLocked
from sluicegate.queues.queue_homes import OwnerDeclared
from sluicegate.queues.queue_type import QueueStatistics
from sluicegate.queues.registry import QueueInfo, QueueRegistry
from sluicegate.queues.stream import StreamQueue
from sluicegate.queues.volatile import is_reply_to
from sluicegate.session.channel.remote import RemoteQueue, management_statistics
from sluicegate.wire.amqp_types import UInt, ULong, Utf8Array


class QueueRoutes:
    """Answers ``/queues`` requests in one virtual host."""

    def __init__(self, registry: QueueRegistry, node: str, vhost: str, quotas: Quotas) -> None:
        self.registry = registry
        # The node name reported as a queue's leader and only replica.
        self.node = node
        self.vhost = vhost
        self.quotas = quotas
        # The last listing's names, permissions and visible names (:meth:`_visible`).
        self._visible_names: tuple[tuple[str, ...], Allows, list[str]] | None = None

    def handle(self, request: Request, rest: list[str], caller: Caller) -> Response:
        method = request.method
        if not rest or rest[0].startswith("?"):
            allow(method, "GET")
            return Response(200, listing(rest, self._visible(caller), self._listed_queue))
        name = rest[0]
        if len(rest) >= 2 and rest[1] == "byte-range":
            allow(method, "GET")
            caller.check("read", "queue", name)
            return Response(200, self._byte_range(name, rest[2:]))
        if len(rest) == 2 and rest[1] == "messages":
            allow(method, "DELETE")
            caller.check("read", "queue", name)
            check_exclusive(self.registry, self.vhost, name, caller)
            return Response(200, {"message_count": ULong(self.registry.purge_queue(name))})
        if len(rest) != 1:
            raise Refused(404, f"no such path: {request.path!r}")
        if method == "GET":
            caller.check_any("queue", name)
            return Response(200, self._queue_map(self._queue_info(name)))
        if method == "PUT":
            check_name("queue", name)
            caller.check("configure", "queue", name)
            return self._declare_queue(name, body_map(request.body), caller)
        allow(method, "DELETE")
        caller.check("configure", "queue", name)
        check_exclusive(self.registry, self.vhost, name, caller)
        placement = self.registry.placement
        owned = None if placement is None else placement.owner_deletes(name)
        if owned is not None:
            # Another worker owns it: deleted there, and the deletion, with its consumers'
            # detaching, reaches this worker from there (docs/workers.md).
            return Response(200, {"message_count": ULong(owned)})
        # A Direct Reply-To queue lives as long as its requester's link: RabbitMQ answers its
        # deletion with 200 and leaves it.
        existed = self.registry.get(name) is not None and not is_reply_to(name)
        # RabbitMQ's stream coordinator deletes a stream without counting it: 0.
        stream = existed and self.registry.settings(name).arguments.queue_type == "stream"
        count = self.registry.delete_queue(name)
        if stream:
            count = 0
        return Response(
            200, {"message_count": ULong(count)}, deleted_queue=name if existed else None
        )

    def _declare_queue(self, name: str, body: Mapping[str, object], caller: Caller) -> Response:
        if name.startswith("amq."):
            raise Refused(403, f"queue names starting with 'amq.' are reserved: '{name}'")
        arguments = body_map(body.get("arguments"), "arguments")
        existed = self.registry.get(name) is not None
        exclusive = flag(body, "exclusive", False)
        owner = caller.owner
        if existed:
            if self.registry.owner(name) is not (owner if exclusive else None):
                raise ResourceLocked(locked(self.vhost, name, declaring=True))
        else:
            _check_dead_letter_exchange(name, arguments, caller)
            self.quotas.check_queue_room(name)
        durable, auto_delete = flag(body, "durable", True), flag(body, "auto_delete", False)
        placement = self.registry.placement
        judged = (
            None
            if exclusive or placement is None
            else placement.owner_declares(name, arguments, durable=durable, auto_delete=auto_delete)
        )
        if judged is OwnerDeclared.ASKED:
            # Another worker owns it and judges the declaration: answered again once it has,
            # its settings here by then (docs/workers.md).
            return Response(200, None)
        self.registry.declare_queue(
            name,
            dict(arguments),
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            owner=owner if exclusive else None,
        )
        described = self._queue_map(self._queue_info(name))
        if existed and judged is not OwnerDeclared.MADE:
            return Response(200, described)
        return Response(201, described, exclusive_queue=name if exclusive else None)

    def _byte_range(self, name: str, rest: list[str]) -> dict[str, object]:
        """A stream's messages from ``start`` that fit in ``max_bytes`` (a sluicegate extension,
        docs/management.md): what a reader planning batches by bytes would otherwise read."""
        query = dict(parse_qsl(rest[0][1:])) if rest and rest[0].startswith("?") else {}
        try:
            start, stop, max_bytes = (int(query[key]) for key in ("start", "stop", "max_bytes"))
        except (KeyError, ValueError):
            raise Refused(400, "byte-range needs integers start, stop and max_bytes") from None
        if min(start, stop, max_bytes) < 0:
            raise Refused(400, "start, stop and max_bytes must not be negative")
        queue = self.registry.queue(name)
        if not isinstance(queue, StreamQueue):
            raise Refused(400, f"queue '{name}' is not a stream: it has no offsets")
        end, size, capped = queue.byte_range(
            start, stop, max_bytes, at_least_one=query.get("at_least_one") == "true"
        )
        return {"end": ULong(end), "bytes": ULong(size), "capped": capped}

    def _visible(self, caller: Caller) -> Sequence[str]:
        """The names of the queues the caller may see, sorted.

        Kept for the caller's permissions until a queue is declared or deleted, so that the
        pages of one listing do not each filter every queue of the server.
        """
        names = self.registry.queue_names()
        permissions = caller.permissions
        if permissions is EVERYTHING:
            return names
        cached = self._visible_names
        if cached is not None and cached[0] is names and cached[1] is permissions:
            return cached[2]
        visible = [name for name in names if caller.sees(name)]
        self._visible_names = (names, permissions, visible)
        return visible

    def _queue_info(self, name: str) -> QueueInfo:
        """A queue's description and counts: reading them is use (RabbitMQ's ``stat``)."""
        info = self._described(name)
        self.registry.renew_lease(name)
        return info

    def _described(self, name: str) -> QueueInfo:
        registry = self.registry
        statistics = management_statistics(registry.queue(name))
        return QueueInfo(name, registry.settings(name), None, statistics)

    def _listed_queue(self, name: str) -> dict[str, object]:
        """A queue's map in a listing, which is not use: no x-expires lease is renewed."""
        return self._queue_map(self._described(name))

    def _queue_map(self, info: QueueInfo) -> dict[str, object]:
        """A queue as RabbitMQ's ``queue_info`` reply has it: every key the client reads."""
        settings = info.settings
        queue_type = settings.arguments.queue_type
        # RabbitMQ counts a stream's readers nowhere: its stat says 0 consumers.
        consumers = 0 if queue_type == "stream" else info.statistics.consumers
        # A queue another worker owns has that worker's node for its leader (docs/workers.md).
        queue = self.registry.get(info.name)
        node = (
            home_node(self.node, queue.remote.home) if isinstance(queue, RemoteQueue) else self.node
        )
        return {
            "name": info.name,
            "vhost": self.vhost,
            "durable": settings.durable,
            "auto_delete": settings.auto_delete,
            "exclusive": settings.exclusive,
            "type": queue_type,
            "arguments": Arguments(settings.raw_arguments),
            "leader": node,
            "replicas": Utf8Array([node]),
            "message_count": ULong(info.statistics.ready),
            "consumer_count": UInt(consumers),
            **_stream_offsets(info.statistics),
        }


def check_exclusive(registry: QueueRegistry, vhost: str, name: str, caller: Caller) -> None:
    """Raise unless the queue is not exclusive or belongs to the caller's connection."""
    owner = registry.owner(name)
    if owner is not None and owner is not caller.owner:
        raise ResourceLocked(locked(vhost, name))


def locked(vhost: str, name: str, *, declaring: bool = False) -> str:
    """RabbitMQ's words for another connection's exclusive queue."""
    reason = f"cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost}'"
    if not declaring:
        return reason
    return (
        f"{reason}. It could be originally declared on another connection or the exclusive "
        "property value does not match that of the original declaration."
    )


def _check_dead_letter_exchange(
    queue: str, arguments: Mapping[str, object], caller: Caller
) -> None:
    """A new queue's dead letters go where its declarer may write (RabbitMQ's check).

    The default exchange as dead-letter exchange sends each dead letter to the queue its
    ``x-dead-letter-routing-key`` names (checked as writing to that queue, as publishing to
    ``/queues/NAME`` is), or without one to whatever queue the message's own routing key names:
    that needs *write* on ``amq.default``, RabbitMQ's name for the default exchange.
    """
    exchange = arguments.get("x-dead-letter-exchange")
    key = arguments.get("x-dead-letter-routing-key")
    if exchange != "" or not isinstance(key, str):
        check_routing_argument("queue", queue, arguments, "x-dead-letter-exchange", caller)
        return
    caller.check("read", "queue", queue)
    caller.check("write", "queue", key)


def _stream_offsets(statistics: QueueStatistics) -> dict[str, object]:
    """A stream's offsets (Spark plans its reads by them); nothing for other queues.

    ``first_offset`` and ``last_offset`` when it holds messages; ``next_offset`` always, the
    offset its next message gets, which tells where an empty stream stands.
    """
    offsets: dict[str, object] = {}
    if statistics.next_offset is not None:
        offsets["next_offset"] = statistics.next_offset
    if statistics.first_offset is not None and statistics.last_offset is not None:
        offsets["first_offset"] = statistics.first_offset
        offsets["last_offset"] = statistics.last_offset
    return offsets


def home_node(node: str, home: int) -> str:
    """The node name of worker ``home`` of the server whose worker is named ``node``."""
    return f"rabbit-worker-{home}@{node.partition('@')[2]}"
