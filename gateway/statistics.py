"""One consistent snapshot of the whole server, taken on the reactor thread.

Every pure part already counts what it owns (``statistics()`` on queues, sessions and writers);
this module only gathers those records in one pass, so that a scrape sees queues, sessions and
connections at the same instant and nothing is counted on the per-message path.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.tenancy import Tenancy
from sluicegate.queues.filters.view import ViewStatistics
from sluicegate.queues.queue_type import QueueStatistics
from sluicegate.session.account import AccountStatistics
from sluicegate.session.incoming_link import IncomingLinkStatistics
from sluicegate.session.memory_budget import BudgetStatistics
from sluicegate.session.session import SessionStatistics
from sluicegate.writer.writer import WriterStatistics


@dataclass(frozen=True, slots=True)
class ServerStatistics:
    """Every queue, session, connection, publishing link and the budget, at one instant."""

    connections: int
    # Each virtual host's queues, by name.
    vhost_queues: dict[str, list[QueueStatistics]]
    sessions: list[SessionStatistics]
    writers: list[WriterStatistics]
    accounts: list[AccountStatistics]
    budget: BudgetStatistics
    publishers: list[IncomingLinkStatistics]
    # What consumer filters decoded of messages (queues.filters.view).
    filter_views: ViewStatistics
    # What queues deleted since the start had counted.
    deleted_published: int
    deleted_delivered: int

    @property
    def queues(self) -> list[QueueStatistics]:
        """Every queue of every virtual host."""
        return [queue for queues in self.vhost_queues.values() for queue in queues]

    @property
    def messages_published(self) -> int:
        """Messages ever enqueued, into any queue, deleted or not."""
        return self.deleted_published + sum(queue.published for queue in self.queues)

    @property
    def messages_delivered(self) -> int:
        """Deliveries ever handed to consumers, by any queue, deleted or not."""
        return self.deleted_delivered + sum(queue.delivered for queue in self.queues)


def server_statistics(broker: Broker, tenancy: Tenancy) -> ServerStatistics:
    """Read every part's counters; must run on the reactor thread."""
    connections = [state for state in broker.connections if not state.closed]
    registries = [vhost.registry for vhost in tenancy.vhosts.values()]
    return ServerStatistics(
        connections=len(connections),
        vhost_queues={name: vhost.registry.statistics() for name, vhost in tenancy.vhosts.items()},
        sessions=[
            session.pure.statistics()
            for connection in connections
            for session in connection.sessions.values()
        ],
        writers=[connection.writer.statistics() for connection in connections],
        accounts=[connection.account.statistics() for connection in connections],
        budget=broker.publishing.budget.statistics(),
        publishers=[state.link.statistics() for state in broker.publishing.links],
        filter_views=broker.filter_views.statistics(),
        deleted_published=sum(registry.deleted_published for registry in registries),
        deleted_delivered=sum(registry.deleted_delivered for registry in registries),
    )
