"""A sluicegate server plus a bench-only Prometheus gauge of its sessions' outgoing_pending.

Used by the slow-consumer scenario only while the server has no ``--metrics-listen`` of its
own: it accepts the same command line (``serve ... --metrics-listen HOST:PORT``), runs the real
``sluicegate serve`` in this process with its ``Server`` extended by the endpoint, and at each
scrape reads every session's ``statistics()`` on the reactor thread, the way the real metrics
endpoint does. Nothing on the per-message path changes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Final

from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway import cli, serve_cli
from gateway.server import Server

__all__ = ["SampledServer", "SessionCollector", "main"]

METRIC: Final[str] = "sluicegate_session_outgoing_pending"


class SessionCollector(Collector):
    """outgoing_pending of every open session, one sample per session."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def read(self) -> list[int]:
        """The figures, read on the reactor thread."""
        return [
            session.pure.statistics().outgoing_pending
            for connection in self.server.broker.connections
            for session in connection.sessions.values()
        ]

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The family without samples: registering must not call into a reactor not running."""
        yield self.family()

    def family(self) -> GaugeMetricFamily:
        """The gauge, labelled by session."""
        return GaugeMetricFamily(
            METRIC, "Deliveries and credit replies queued in the session", labels=["session"]
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = self.family()
        for index, pending in enumerate(self.server.call(self.read)):
            gauge.add_metric([str(index)], pending)
        yield gauge


class SampledServer(Server):
    """The real server, plus the gauge above served from ``metrics_listen`` once it listens."""

    metrics_listen: str = ""

    def start(self) -> None:
        super().start()
        host, _, port = self.metrics_listen.rpartition(":")
        REGISTRY.register(SessionCollector(self))
        start_http_server(int(port), addr=host)


def main(argv: list[str] | None = None) -> int:
    """``serve`` with all of sluicegate's flags, plus ``--metrics-listen HOST:PORT``."""
    metrics = argparse.ArgumentParser(prog="python -m bench.sampled_server")
    metrics.add_argument("--metrics-listen", required=True, metavar="HOST:PORT")
    known, rest = metrics.parse_known_args(sys.argv[1:] if argv is None else argv)
    SampledServer.metrics_listen = known.metrics_listen
    serve_cli.Server = SampledServer  # type: ignore[attr-defined]
    return cli.main(rest)


if __name__ == "__main__":
    sys.exit(main())
