"""RabbitMQ's ``/api/vhosts``, ``/api/users`` and ``/api/permissions`` (docs/http-api.md).

Virtual hosts are created and deleted at run time (gateway/runtime_vhosts.py) by an
administrator; users and permissions are the configuration file's, so the API only reads them.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.http.api_connections import ConnectionsApi
from sluicegate.gateway.http.api_request import Answer, ApiRequest, HttpRefused
from sluicegate.gateway.rules.auth import User
from sluicegate.gateway.rules.tenancy import VirtualHost
from sluicegate.gateway.runtime_vhosts import RuntimeVhosts, VhostRefused
from sluicegate.session.channel.remote import management_statistics


class VhostsApi:
    """The virtual hosts', users' and permissions' routes."""

    def __init__(self, broker: Broker, vhosts: RuntimeVhosts, connections: ConnectionsApi) -> None:
        self._broker = broker
        self._vhosts = vhosts
        self._connections = connections

    def vhosts(self, job: ApiRequest, segments: list[str]) -> Answer:
        if not segments:
            job.allow("GET")
            return Answer(200, [self._vhost_map(vhost) for vhost in job.visible_vhosts()])
        if len(segments) == 2 and segments[1] == "connections":
            job.allow("GET")
            vhost = job.vhost(segments[0])
            return Answer(
                200,
                [
                    self._connections.map(c)
                    for c in self._connections.visible(job)
                    if c.vhost is vhost
                ],
            )
        if len(segments) != 1:
            return Answer(404, "Not Found")
        job.allow("GET", "PUT", "DELETE")
        name = segments[0]
        if job.method == "GET":
            return Answer(200, self._vhost_map(job.vhost(name)))
        if not job.sees_everything:
            # RabbitMQ's administrator tag (or the anonymous user of a server without users).
            raise HttpRefused(403, "creating or deleting a virtual host needs an administrator")
        try:
            if job.method == "PUT":
                return Answer(201 if self._vhosts.create(name, job.user.name) else 204)
            self._vhosts.delete(name)
        except VhostRefused as refused:
            raise HttpRefused(refused.status, str(refused)) from None
        return Answer(204)

    def _vhost_map(self, vhost: VirtualHost) -> dict[str, object]:
        ready = unacked = 0
        registry = vhost.registry
        for name in registry.queue_names():
            queue = registry.get(name)
            if queue is not None:
                stats = management_statistics(queue)
                ready += stats.ready
                unacked += stats.unacked
        return {
            "name": vhost.name,
            "description": "",
            "tags": [],
            "default_queue_type": "classic",
            "tracing": False,
            "messages": ready + unacked,
            "messages_ready": ready,
            "messages_unacknowledged": unacked,
        }

    def _visible_users(self, job: ApiRequest) -> list[User]:
        users = self._broker.config.users
        if not users:
            return [job.user]
        if job.sees_everything:
            return list(users.values())
        return [users[job.user.name]] if job.user.name in users else []

    def _configured_only(self, job: ApiRequest) -> None:
        """Users and permissions are configured: the API reads them and changes nothing."""
        if job.method != "GET":
            raise HttpRefused(
                405,
                "users and permissions are [users.NAME] tables of the configuration file "
                "(docs/configuration.md): the HTTP API does not change them",
            )

    def users(self, job: ApiRequest, segments: list[str]) -> Answer:
        self._configured_only(job)
        users = {user.name: user for user in self._visible_users(job)}
        if not segments:
            return Answer(200, [self._user_map(job, user) for user in users.values()])
        if (len(segments) == 2 and segments[1] == "permissions") or len(segments) == 1:
            user = users.get(segments[0])
            if user is None:
                return Answer(404, "Not Found")
            if len(segments) == 1:
                return Answer(200, self._user_map(job, user))
            return Answer(200, self._permission_maps([user]))
        return Answer(404, "Not Found")

    def _user_map(self, job: ApiRequest, user: User) -> dict[str, object]:
        return {
            "name": user.name,
            "tags": job.tags(user),
            "password_hash": "",
            "hashing_algorithm": "scrypt",
            "limits": {},
        }

    def _permission_maps(self, users: Sequence[User]) -> list[dict[str, object]]:
        maps: list[dict[str, object]] = []
        for user in users:
            for vhost in sorted(self._broker.tenancy.vhosts):
                permissions = user.permissions(vhost)
                if permissions is None:
                    continue
                maps.append(
                    {
                        "user": user.name,
                        "vhost": vhost,
                        "configure": permissions.configure.pattern,
                        "write": permissions.write.pattern,
                        "read": permissions.read.pattern,
                    }
                )
        return maps

    def permissions(self, job: ApiRequest, segments: list[str]) -> Answer:
        self._configured_only(job)
        maps = self._permission_maps(self._visible_users(job))
        if not segments:
            return Answer(200, maps)
        if len(segments) == 2:
            found = [m for m in maps if m["vhost"] == segments[0] and m["user"] == segments[1]]
            return Answer(200, found[0]) if found else Answer(404, "Not Found")
        return Answer(404, "Not Found")
