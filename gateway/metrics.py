"""Prometheus metrics, read from the server's ``statistics()`` when Prometheus scrapes.

The collector asks the reactor thread for a snapshot when scraped (``Server.submit_in_turns``)
instead of having the reactor publish snapshots on a timer: values are exact at scrape time, the
reactor does no work at all while nobody scrapes, and a scrape costs one pass over queues and
sessions, however many messages flow. Nothing on the per-message path touches prometheus-client.
A reactor that does not answer within :data:`SNAPSHOT_TIMEOUT` fails the scrape (HTTP 500), which
Prometheus records as ``up == 0``: a stuck reactor must not look healthy.

As RabbitMQ's Prometheus plugin does, metrics per queue are left to ``/metrics/per-object``
once a server has many queues: ``/metrics`` (any other path) gives them per queue up to
:data:`PER_QUEUE_LIMIT` queues and summed per virtual host beyond, so that a routine scrape of
a server with 10,000 queues formats a few dozen samples, not 70,000, on a thread that shares the
interpreter with the reactor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Final

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate.gateway.http.errors import json_error
from sluicegate.gateway.http.reactor_calls import Throttled
from sluicegate.gateway.statistics import ServerStatistics

# Shorter than Prometheus's default scrape timeout (10 s), so that a stuck reactor shows as a
# failed scrape rather than a scrape Prometheus gave up on.
SNAPSHOT_TIMEOUT: Final = 5.0
# Seconds from the end of one snapshot to the start of the next, whoever scrapes: Prometheus
# scrapes every 15 s or so, and a client scraping in a loop gets the same snapshot meanwhile.
MIN_SNAPSHOT_INTERVAL: Final = 0.5
# Queues up to which /metrics gives each its own samples (seven families each).
PER_QUEUE_LIMIT: Final = 1000
# RabbitMQ's path for metrics per object whatever their number.
PER_OBJECT_PATH: Final = "/metrics/per-object"


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


class ServerCollector(Collector):
    """Turns one :class:`ServerStatistics` snapshot into metric families."""

    def __init__(self, snapshot: Callable[[], ServerStatistics], *, per_object: bool) -> None:
        self._snapshot = snapshot
        # Whether queues always get samples of their own, however many there are.
        self._per_object = per_object

    def collect(self) -> Iterator[Metric]:
        """Take a snapshot and describe it."""
        stats = self._snapshot()
        per_queue = self._per_object or len(stats.queues) <= PER_QUEUE_LIMIT
        yield from self._queues(stats, per_queue)
        yield CounterMetricFamily(
            "sluicegate_messages_published",
            "Messages enqueued into any queue since the server started.",
            value=stats.messages_published,
        )
        yield CounterMetricFamily(
            "sluicegate_messages_delivered",
            "Deliveries handed to consumers by any queue since the server started.",
            value=stats.messages_delivered,
        )
        yield _gauge("sluicegate_connections", "Open client connections.", stats.connections)
        yield _gauge(
            "sluicegate_connection_records",
            "Connection records in memory: the open connections and closed ones not yet freed.",
            stats.connection_records,
        )
        yield _gauge(
            "sluicegate_endpoints_bytes",
            "What clients' connections, sessions and links hold, their ATTACH data included.",
            stats.endpoints_bytes,
        )
        yield _gauge(
            "sluicegate_endpoints_peak_bytes",
            "The most the connections, sessions and links have held since the server started.",
            stats.endpoints_peak_bytes,
        )
        yield _gauge(
            "sluicegate_endpoints_limit_bytes",
            "max_endpoints_size: past it a connection is refused at OPEN, BEGIN or ATTACH.",
            stats.endpoints_limit_bytes,
        )
        yield CounterMetricFamily(
            "sluicegate_heap_trims",
            "Times the server gave freed heap memory back to the system (malloc_trim).",
            value=stats.heap_trims,
        )
        yield CounterMetricFamily(
            "sluicegate_worker_channel_protocol_errors",
            "Channels to other workers ended because the peer sent a malformed or unexpected "
            "frame (docs/workers.md).",
            value=stats.channel_protocol_errors,
        )
        for outcome, count in (
            ("given", stats.handovers_given),
            ("taken", stats.handovers_taken),
            ("kept", stats.handovers_kept),
        ):
            yield CounterMetricFamily(
                f"sluicegate_worker_connections_{outcome}",
                "Connections handed over at their first ATTACH to the worker of its queue: "
                "given to another worker, taken from one, kept after an attempt that did not "
                "succeed (docs/workers.md).",
                value=count,
            )
        yield _gauge(
            "sluicegate_connection_reads_paused",
            "Connections whose socket is not read: held by the memory budget or their account.",
            stats.reads_paused,
        )
        yield _gauge(
            "sluicegate_connection_reads_paused_by_memory_budget",
            "Publishing connections the memory budget (or its cap on deliveries still arriving) "
            "holds unread.",
            stats.reads_paused_by_budget,
        )
        yield _gauge(
            "sluicegate_connection_reads_paused_by_account",
            "Connections not read because their account (copies not yet stored) is over its limit.",
            sum(1 for account in stats.accounts if account.paused),
        )
        yield _gauge(
            "sluicegate_connection_outgoing_pending_paused",
            "Connections whose consumers get nothing more from queues until their sessions send.",
            sum(1 for waiting in stats.waiting if waiting.paused),
        )
        yield _gauge(
            "sluicegate_deferred_credit_requests",
            "Consumer links whose credit request waits for their connection's sessions to send.",
            sum(waiting.deferred for waiting in stats.waiting),
        )
        yield _gauge(
            "sluicegate_connection_account_debt",
            "Routed copies published and not yet stored, summed over connections.",
            sum(account.debt for account in stats.accounts),
        )
        yield _gauge(
            "sluicegate_connection_dead_letter_debt",
            "Dead letters consumers' outcomes made, not yet stored (one per copy while they wait "
            "for the memory budget), summed over connections.",
            sum(debt.debt for debt in stats.dead_letter_debts),
        )
        yield _gauge(
            "sluicegate_consumer_links_held_for_dead_letters",
            "Consumer links that get no new deliveries: their connection's dead-letter debt is "
            "over its limit and they made some of it.",
            sum(debt.held_links for debt in stats.dead_letter_debts),
        )
        budget = stats.budget
        yield _gauge(
            "sluicegate_memory_budget_used_bytes",
            "Message bytes held in memory, with a per-message overhead.",
            budget.used,
        )
        yield _gauge(
            "sluicegate_memory_budget_limit_bytes",
            "The memory budget: above it publishers get no credit.",
            budget.limit,
        )
        yield _gauge(
            "sluicegate_memory_budget_blocked",
            "1 while the memory budget withholds credit from publishers.",
            int(budget.blocked),
        )
        yield _gauge(
            "sluicegate_memory_budget_publishing_level_bytes",
            "What the publishers' part of the margin is weighed by: the bytes counted less what "
            "deliveries still arriving, other workers' deliveries and letters sent hold within "
            "their own parts; at the publishing ceiling every publisher waits.",
            budget.publishing_level,
        )
        yield _gauge(
            "sluicegate_memory_budget_unfinished_bytes",
            "Bytes of deliveries still arriving, counted in the memory budget.",
            budget.unfinished,
        )
        yield _gauge(
            "sluicegate_memory_budget_imported_bytes",
            "Bytes of other workers' deliveries reserved on credit granted or waiting in sessions.",
            budget.imported,
        )
        yield _gauge(
            "sluicegate_memory_budget_letters_sent_bytes",
            "Bytes of dead letters sent to other workers and not yet confirmed.",
            budget.letters_sent,
        )
        yield _gauge(
            "sluicegate_memory_budget_letters_window_peak_bytes",
            "The most bytes of dead letters sent to one other worker and not yet confirmed at "
            "once since the worker started: within the letters' window, but for a single copy "
            "larger than it, sent alone.",
            budget.letters_window_peak,
        )
        yield _gauge(
            "sluicegate_memory_budget_channel_sent_bytes",
            "Bytes this worker sent other workers' queues and they have not confirmed: counted "
            "in its memory budget.",
            stats.channel_sent_bytes,
        )
        yield _gauge(
            "sluicegate_memory_budget_channel_parked_bytes",
            "Bytes of other workers' publishes parked here while the memory budget is blocked: "
            "counted by their senders.",
            stats.channel_parked_bytes,
        )
        yield CounterMetricFamily(
            "sluicegate_memory_budget_channel_given_back",
            "Other workers' publishes given back released while the memory budget is blocked: "
            "past what this worker keeps parked for each of them (docs/bounds.md).",
            value=stats.channel_given_back,
        )
        yield CounterMetricFamily(
            "sluicegate_memory_budget_imports_given_back",
            "Other workers' deliveries given back unsent by consumers whose clients read "
            "nothing while another consumer waited for the imports' part (docs/bounds.md).",
            value=stats.imports_given_back,
        )
        yield _gauge(
            "sluicegate_memory_budget_import_reserved_bytes",
            "Of the imported bytes, what other workers may still send on the credit granted; "
            "the rest waits in sessions.",
            stats.imports_reserved_bytes,
        )
        yield _gauge(
            "sluicegate_consumer_links_stalled",
            "Consumer links of other workers' queues that gave back what they held and wait "
            "for their clients to read again.",
            stats.consumer_links_stalled,
        )
        yield _gauge(
            "sluicegate_memory_budget_remote_publishers",
            "Other workers' links charged here for what they stored while the budget is blocked.",
            stats.remote_publishers,
        )
        yield _gauge(
            "sluicegate_memory_budget_remote_publishers_held",
            "Other workers' links held here: their publishes park.",
            stats.remote_publishers_held,
        )
        yield _gauge(
            "sluicegate_publisher_links_held",
            "Publishing links the memory budget holds: no new credit.",
            sum(1 for link in stats.publishers if link.held),
        )
        yield CounterMetricFamily(
            "sluicegate_memory_budget_blocks",
            "Times the memory budget has blocked publishers.",
            value=budget.blocks,
        )
        publishers = stats.publishers
        yield _gauge(
            "sluicegate_publisher_unconfirmed",
            "Messages received from publishers and not yet stored in every target queue.",
            sum(link.unconfirmed for link in publishers),
        )
        yield _gauge(
            "sluicegate_publisher_links_without_credit",
            "Publishing links with no credit left: throttled by storage or the memory budget.",
            sum(1 for link in publishers if link.credit <= 0),
        )
        yield from self._sessions(stats)
        yield from self._filter_views(stats)
        yield _gauge(
            "sluicegate_writer_bytes_pending",
            "Bytes of transfers handed to proton but not yet written to sockets.",
            sum(writer.bytes_pending for writer in stats.writers),
        )

    @staticmethod
    def _filter_views(stats: ServerStatistics) -> Iterator[Metric]:
        views = stats.filter_views
        yield CounterMetricFamily(
            "sluicegate_filter_view_decodes",
            "Times consumer filters decoded a message's properties (at most once per message "
            "while its view is cached).",
            value=views.decodes,
        )
        yield CounterMetricFamily(
            "sluicegate_filter_view_hits",
            "Filter evaluations served by a message's cached view.",
            value=views.hits,
        )
        yield CounterMetricFamily(
            "sluicegate_filter_view_evictions",
            "Cached views forgotten to keep the cache within its budget.",
            value=views.evictions,
        )
        yield _gauge(
            "sluicegate_filter_view_cached_bytes",
            "Estimated bytes of the message views consumer filters keep decoded.",
            views.cost,
        )

    @staticmethod
    def _queues(stats: ServerStatistics, per_queue: bool) -> Iterator[Metric]:
        """Each queue's samples, or their sums per virtual host (``per_queue`` false)."""
        labels = ["vhost", "queue"] if per_queue else ["vhost"]
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "ready": GaugeMetricFamily(
                "sluicegate_queue_messages_ready",
                "Messages ready to be delivered.",
                labels=labels,
            ),
            "unacked": GaugeMetricFamily(
                "sluicegate_queue_messages_unacked",
                "Messages delivered and not yet settled.",
                labels=labels,
            ),
            "ready_bytes": GaugeMetricFamily(
                "sluicegate_queue_messages_ready_bytes",
                "Encoded bytes of the messages ready to be delivered.",
                labels=labels,
            ),
            "consumers": GaugeMetricFamily(
                "sluicegate_queue_consumers", "Consumer links attached.", labels=labels
            ),
            "published": CounterMetricFamily(
                "sluicegate_queue_messages_published",
                "Messages enqueued since the queue was declared.",
                labels=labels,
            ),
            "delivered": CounterMetricFamily(
                "sluicegate_queue_messages_delivered",
                "Deliveries to consumers since the queue was declared.",
                labels=labels,
            ),
            "acknowledged": CounterMetricFamily(
                "sluicegate_queue_messages_acknowledged",
                "Deliveries settled for good (accepted, rejected or pre-settled).",
                labels=labels,
            ),
        }
        for vhost, queues in stats.vhost_queues.items():
            for field, family in families.items():
                if per_queue:
                    for queue in queues:
                        family.add_metric([vhost, queue.name], getattr(queue, field))
                else:
                    family.add_metric([vhost], sum(getattr(queue, field) for queue in queues))
        yield from families.values()

    @staticmethod
    def _sessions(stats: ServerStatistics) -> Iterator[Metric]:
        sessions = stats.sessions
        pending = [session.outgoing_pending for session in sessions]
        yield _gauge("sluicegate_sessions", "Open AMQP sessions.", len(sessions))
        yield _gauge(
            "sluicegate_session_outgoing_pending",
            "Deliveries and credit replies waiting in outgoing_pending, summed over sessions.",
            sum(pending),
        )
        yield _gauge(
            "sluicegate_session_outgoing_pending_max",
            "The longest outgoing_pending of any session.",
            max(pending, default=0),
        )
        yield _gauge(
            "sluicegate_session_outgoing_pending_bytes",
            "What deliveries waiting in outgoing_pending hold (bytes in memory, 256 more each).",
            sum(session.pending_bytes for session in sessions),
        )
        yield _gauge(
            "sluicegate_credit_requests_in_flight",
            "Consumer links waiting for a queue's credit reply.",
            sum(session.credit_requests_in_flight for session in sessions),
        )
        yield _gauge(
            "sluicegate_session_stashed_credit_requests",
            "Client FLOWs held back while a credit request is in flight.",
            sum(session.stashed_credit_reqs for session in sessions),
        )
        yield _gauge(
            "sluicegate_sessions_remote_window_closed",
            "Sessions whose client's incoming window is closed.",
            sum(1 for session in sessions if session.remote_incoming_window <= 0),
        )
        yield _gauge(
            "sluicegate_sessions_writer_blocked",
            "Sessions the connection writer has blocked until the socket drains.",
            sum(1 for session in sessions if session.writer_blocked),
        )


class MetricsPages:
    """``/metrics`` and ``/metrics/per-object``, served on the HTTP stack (gateway/http/stack.py).

    Scrapes share snapshots (gateway/http/reactor_calls.py): one at a time and at most one per
    :data:`MIN_SNAPSHOT_INTERVAL`, each page rendered once per snapshot, so that a hundred
    scrapers cost the reactor what one does.
    """

    def __init__(
        self,
        snapshot: Callable[[], Awaitable[ServerStatistics]],
        peers: Callable[[str, bytes], Awaitable[bytes]] | None = None,
    ) -> None:
        self._snapshots = Throttled(snapshot, MIN_SNAPSHOT_INTERVAL)
        # Worker 0 of several: adds the other workers' pages to its own
        # (gateway/worker_metrics.py).
        self._peers = peers
        self._current: ServerStatistics | None = None
        self._registries = {}
        for per_object in (False, True):
            registry = CollectorRegistry(auto_describe=False)
            registry.register(ServerCollector(self._snapshot, per_object=per_object))
            registry.register(ProcessCollector(registry=None))
            self._registries[per_object] = registry
        # Each page's last rendering and the snapshot it shows.
        self._rendered: dict[bool, tuple[ServerStatistics, bytes]] = {}

    def _snapshot(self) -> ServerStatistics:
        assert self._current is not None
        return self._current

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """One scrape: a fresh enough snapshot, rendered in Prometheus's text format."""
        if request.method not in ("GET", "HEAD"):
            return json_error(405, f"method {request.method} not allowed on the metrics endpoint")
        per_object = request.path.rstrip("/") == PER_OBJECT_PATH
        try:
            stats = await self._snapshots.get()
        except TimeoutError:
            # A stuck reactor must not look healthy: Prometheus records up == 0.
            return web.Response(status=500, text="the reactor did not answer\n")
        rendered = self._rendered.get(per_object)
        if rendered is None or rendered[0] is not stats:
            self._current = stats
            rendered = self._rendered[per_object] = (
                stats,
                generate_latest(self._registries[per_object]),
            )
        body = rendered[1]
        if self._peers is not None:
            body = await self._peers(request.path, body)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
