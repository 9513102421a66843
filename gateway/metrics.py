"""Prometheus metrics, read from the server's ``statistics()`` when Prometheus scrapes.

The collector asks the reactor thread for one snapshot per scrape (through ``Server.call``)
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

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from sluicegate.gateway.statistics import ServerStatistics

# Shorter than Prometheus's default scrape timeout (10 s), so that a stuck reactor shows as a
# failed scrape rather than a scrape Prometheus gave up on.
SNAPSHOT_TIMEOUT: Final = 5.0
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
        yield CounterMetricFamily(
            "sluicegate_heap_trims",
            "Times the server gave freed heap memory back to the system (malloc_trim).",
            value=stats.heap_trims,
        )
        yield _gauge(
            "sluicegate_connection_reads_paused",
            "Connections whose socket is not read: held by the memory budget or their account.",
            stats.reads_paused,
        )
        yield _gauge(
            "sluicegate_connection_reads_paused_by_memory_budget",
            "Publishing connections the exhausted memory budget holds unread.",
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


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape on stderr."""

    def log_message(self, template: str, *args: Any) -> None:
        return


class _ThreadingWSGIServer6(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class MetricsEndpoint:
    """The HTTP endpoint Prometheus scrapes, on its own daemon thread."""

    def __init__(self, host: str, port: int, snapshot: Callable[[], ServerStatistics]) -> None:
        apps = {}
        for per_object in (False, True):
            registry = CollectorRegistry(auto_describe=False)
            registry.register(ServerCollector(snapshot, per_object=per_object))
            registry.register(ProcessCollector(registry=None))
            apps[per_object] = make_wsgi_app(registry)

        def route(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            per_object = str(environ.get("PATH_INFO", "")).rstrip("/") == PER_OBJECT_PATH
            response: Iterable[bytes] = apps[per_object](environ, start_response)
            return response

        server_class = _ThreadingWSGIServer6 if ":" in host else ThreadingWSGIServer
        self._server: WSGIServer = make_server(
            host.strip("[]"), port, route, server_class, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="sluicegate-metrics", daemon=True
        )
        self._thread.start()
        self.port: int = self._server.server_port

    def close(self) -> None:
        """Stop serving and release the port, at once.

        ``serve_forever`` sees a stop request only when its select returns, every 0.5 s, which
        made every server stop half a second long. A listening socket shut down for reading is
        readable at once (Linux), so the stop is asked for and the socket shut down: the loop
        ends now, without waking the interpreter more often the rest of the time.
        """
        server = self._server
        stopper = threading.Thread(target=server.shutdown, name="sluicegate-metrics-stop")
        stopper.start()
        with contextlib.suppress(OSError):
            server.socket.shutdown(socket.SHUT_RD)
        stopper.join()
        server.server_close()
        self._thread.join()
