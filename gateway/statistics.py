"""A snapshot of the whole server, gathered on the reactor thread a slice at a time.

Every pure part already counts what it owns (``statistics()`` on queues, sessions and writers);
this module only gathers those records, so nothing is counted on the per-message path. A server
with ten thousand queues took some 200 ms to read in one go, all that time with every client
waiting; :func:`gathering` reads :data:`SLICE` queues or connections per turn of the reactor
instead (``Server.call_in_turns``), so a scrape costs a few milliseconds at a time. The parts of
a snapshot are thus read at slightly different instants, as a Prometheus scrape of any busy
server is.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Final

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.rules.tenancy import Tenancy
from sluicegate.queues.filters.view import ViewStatistics
from sluicegate.queues.queue_type import QueueStatistics
from sluicegate.session.account import AccountStatistics
from sluicegate.session.dead_letter_debt import DeadLetterDebtStatistics
from sluicegate.session.incoming_link import IncomingLinkStatistics
from sluicegate.session.memory_budget import BudgetStatistics
from sluicegate.session.outbound import SessionStatistics
from sluicegate.session.waiting import WaitingStatistics
from sluicegate.writer.writer import WriterStatistics

# Queues, or connections, read per turn of the reactor: a few milliseconds of work.
SLICE: Final = 500


@dataclass(frozen=True, slots=True)
class ServerStatistics:
    """Every queue, session, connection, publishing link and the budget, at one instant."""

    connections: int
    # Each virtual host's queues, by name.
    vhost_queues: dict[str, list[QueueStatistics]]
    sessions: list[SessionStatistics]
    writers: list[WriterStatistics]
    accounts: list[AccountStatistics]
    # What each connection's sessions hold for its consumers (session/waiting.py).
    waiting: list[WaitingStatistics]
    # The dead letters each connection's consumers owe (session/dead_letter_debt.py).
    dead_letter_debts: list[DeadLetterDebtStatistics]
    # Connections whose socket is not read, and those of them the memory budget holds.
    reads_paused: int
    reads_paused_by_budget: int
    budget: BudgetStatistics
    publishers: list[IncomingLinkStatistics]
    # What consumer filters decoded of messages (queues.filters.view).
    filter_views: ViewStatistics
    # What queues deleted since the start had counted.
    deleted_published: int
    deleted_delivered: int
    # Connection records alive, open or closed and not yet freed (Connections.records), and the
    # times the heap was given back to the system (gateway/proton/heap_trim.py).
    connection_records: int
    heap_trims: int
    # What clients' connections, sessions and links hold (session/endpoint_memory.py), its
    # peak and its limit.
    endpoints_bytes: int
    endpoints_peak_bytes: int
    endpoints_limit_bytes: int
    # Channels to other workers ended because the peer broke the protocol (gateway/peers.py).
    channel_protocol_errors: int
    # Connections handed to other workers, taken from them, and kept after an attempt
    # (gateway/handover.py); zeros unless a worker hands over.
    handovers_given: int = 0
    handovers_taken: int = 0
    handovers_kept: int = 0
    # What else weighs on the publishers' part with other workers (gateway/peers.py): bytes
    # this worker sent them unconfirmed (counted here), their publishes parked here (counted
    # by them), and the links of theirs charged here while blocked and the held ones among
    # them (session/remote_publishers.py): what a breach of the adversary is told apart by.
    channel_sent_bytes: int = 0
    channel_parked_bytes: int = 0
    # Other workers' publishes given back released past what this worker keeps parked.
    channel_given_back: int = 0
    remote_publishers: int = 0
    remote_publishers_held: int = 0
    # Other workers' deliveries given back by consumers whose clients read nothing while
    # another waited for the imports' part, and the links stalled so now (session/waiting.py).
    imports_given_back: int = 0
    consumer_links_stalled: int = 0
    # Of the imports' count, what is reserved on credit granted (the rest waits in sessions).
    imports_reserved_bytes: int = 0

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
    """Read every part's counters at once; must run on the reactor thread."""
    turns = gathering(broker, tenancy)
    while True:
        try:
            next(turns)
        except StopIteration as done:
            snapshot: ServerStatistics = done.value
            return snapshot


def gathering(broker: Broker, tenancy: Tenancy) -> Generator[None, None, ServerStatistics]:
    """Read every part's counters, pausing after each :data:`SLICE` queues or connections.

    Run one step per turn of the reactor; what was deleted between two steps is left out.
    """
    vhost_queues: dict[str, list[QueueStatistics]] = {}
    for name, vhost in list(tenancy.vhosts.items()):
        registry = vhost.registry
        queues = vhost_queues[name] = []
        names = registry.queue_names()
        for start in range(0, len(names), SLICE):
            for queue_name in names[start : start + SLICE]:
                queue = registry.get(queue_name)
                if queue is not None:
                    queues.append(queue.statistics())
            yield
    sessions: list[SessionStatistics] = []
    writers: list[WriterStatistics] = []
    accounts: list[AccountStatistics] = []
    waiting: list[WaitingStatistics] = []
    dead_letter_debts: list[DeadLetterDebtStatistics] = []
    reads_paused = reads_paused_by_budget = 0
    connections = [state for state in broker.connections if not state.closed]
    for start in range(0, len(connections), SLICE):
        for connection in connections[start : start + SLICE]:
            if connection.closed:
                continue
            sessions.extend(session.pure.statistics() for session in connection.sessions.values())
            writers.append(connection.writer.statistics())
            accounts.append(connection.account.statistics())
            waiting.append(connection.waiting.statistics())
            dead_letter_debts.append(connection.letters.statistics())
            reads_paused += connection.reads_paused
            inbound = connection.inbound
            reads_paused_by_budget += inbound is not None and inbound.budget_paused
        yield
    registries = [vhost.registry for vhost in tenancy.vhosts.values()]
    handovers = broker.handovers
    return ServerStatistics(
        connections=len(writers),
        vhost_queues=vhost_queues,
        sessions=sessions,
        writers=writers,
        accounts=accounts,
        waiting=waiting,
        dead_letter_debts=dead_letter_debts,
        reads_paused=reads_paused,
        reads_paused_by_budget=reads_paused_by_budget,
        budget=broker.publishing.budget.statistics(),
        publishers=[state.link.statistics() for state in broker.publishing.links],
        filter_views=broker.filter_views.statistics(),
        deleted_published=sum(registry.deleted_published for registry in registries),
        deleted_delivered=sum(registry.deleted_delivered for registry in registries),
        connection_records=len(broker.records),
        heap_trims=broker.trimmer.trims,
        endpoints_bytes=broker.endpoints.held,
        endpoints_peak_bytes=broker.endpoints.peak,
        endpoints_limit_bytes=broker.endpoints.limit,
        channel_protocol_errors=0 if broker.peers is None else broker.peers.protocol_errors,
        handovers_given=0 if handovers is None else handovers.given,
        handovers_taken=0 if handovers is None else handovers.taken,
        handovers_kept=0 if handovers is None else handovers.kept,
        imports_given_back=broker.sending.waiting.given_back,
        consumer_links_stalled=len(broker.sending.waiting.stalled),
        imports_reserved_bytes=broker.sending.waiting.reserved,
        **({} if broker.peers is None else broker.peers.budget_figures()),
    )
