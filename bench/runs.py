"""What the scenarios share: samplers for a server, unique queue names, quiver as a subprocess.

These are the reusable pieces for any benchmark script in ``bench/``: start or reach a server
(``bench.servers.running``), sample it (``server_sampler``), drive load (``run_quiver`` or
``bench.clients``), and return ``Record``s for ``bench.record.Report``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TextIO

from bench.probes import Gauge, MetricsProbe, ProcessProbe, Sampler
from bench.quiverlog import parse_status_row
from bench.series import Series, extent, mean, rates
from bench.servers import Server
from bench.table import Cell

__all__ = [
    "QuiverRun",
    "ScenarioError",
    "counter_probe",
    "quiver_figures",
    "rate_series",
    "run_quiver",
    "server_figures",
    "server_sampler",
    "unique_queue",
]

QUIVER_TIMEOUT_S: Final[float] = 60.0  # RabbitMQ 3.10 stalls for many seconds at large credit


class ScenarioError(RuntimeError):
    """A run could not produce its figures; the message is one line for the user."""


def unique_queue(scenario: str) -> str:
    """A queue name no earlier run used, so no leftovers are measured."""
    return f"bench-{scenario}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


def server_sampler(server: Server, gauges: Sequence[Gauge] = ()) -> Sampler:
    """A sampler of the server's RSS and CPU (if its pid is known) and ``gauges`` (if exported)."""
    sampler = Sampler()
    if server.pid is not None:
        process = ProcessProbe(server.pid)
        sampler.add(process, process.units)
    if server.metrics_url is not None and gauges:
        metrics = MetricsProbe(server.metrics_url, gauges)
        sampler.add(metrics, metrics.units)
    return sampler


def counter_probe(
    name: str, read: Callable[[], int]
) -> tuple[Callable[[], Mapping[str, float]], dict[str, str]]:
    """A probe of a client's counter, for ``Sampler.add``; ``rate_series`` turns it into a rate."""
    return (lambda: {name: float(read())}), {name: "messages"}


def rate_series(series: dict[str, Series], counter: str, name: str) -> None:
    """Replace the counter series ``counter`` by its per-second rate, called ``name``."""
    counts = series.pop(counter, None)
    if counts is not None:
        series[name] = Series(name, "msg/s", rates(counts.points))


def server_figures(series: Mapping[str, Series]) -> dict[str, Cell]:
    """RSS start/peak/end (MB) and mean CPU of the server, where sampled."""
    rss = extent(series["server RSS"].points) if "server RSS" in series else None
    cpu = mean(series["server CPU"].points) if "server CPU" in series else None
    return {
        "RSS start MB": None if rss is None else rss.start,
        "RSS peak MB": None if rss is None else rss.peak,
        "RSS end MB": None if rss is None else rss.end,
        "server CPU %": cpu,
    }


@dataclass
class QuiverRun:
    """A finished ``sluicegate quiver --json`` run: its summary and its status rows as series."""

    summary: dict[str, object]
    series: dict[str, Series] = field(default_factory=dict)


def run_quiver(
    url: str,
    options: Sequence[str],
    sampler: Sampler,
    out: TextIO,
    label: str,
    started: Callable[[int], None] | None = None,
) -> QuiverRun:
    """Run the quiver CLI in its own processes, echo its status rows, parse its JSON summary;
    ``started`` is given the quiver's pid once it runs.

    Row times are taken from ``sampler``'s clock when each row arrives, so rates and RSS share
    the time axis of the plot.
    """
    command = [sys.executable, "-m", "sluicegate.cli.main", "quiver", url, *options, "--json"]
    command += ["--timeout", str(QUIVER_TIMEOUT_S)]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    if started is not None:
        started(process.pid)
    assert process.stderr is not None
    output = process.stdout
    assert output is not None
    stdout: list[str] = []
    reader = threading.Thread(target=lambda: stdout.append(output.read()), daemon=True)
    reader.start()
    sent = Series("sender rate", "msg/s")
    received = Series("receiver rate", "msg/s")
    last_line = ""
    for line in process.stderr:
        line = line.rstrip("\n")
        if line:
            last_line = line
        row = parse_status_row(line)
        if row is not None:
            t = sampler.elapsed()
            sent.add(t, row.sent_rate)
            received.add(t, row.received_rate)
            print(f"  {label}: {line.strip()}", file=out, flush=True)
    status = process.wait()
    reader.join()
    if status != 0:
        raise ScenarioError(
            last_line.removeprefix("sluicegate quiver: ") or f"quiver exited {status}"
        )
    summary: dict[str, object] = json.loads("".join(stdout))
    return QuiverRun(summary, {s.name: s for s in (sent, received)})


def quiver_figures(summary: Mapping[str, object]) -> dict[str, Cell]:
    """The quiver summary's rates and latencies as table cells."""
    results = summary["results"]
    assert isinstance(results, dict)
    latency = results.get("latency_ms") or {}
    assert isinstance(latency, dict)
    return {
        "messages": results.get("count"),
        "e2e msg/s": results.get("end_to_end_rate"),
        "sender msg/s": results.get("sender_rate"),
        "receiver msg/s": results.get("receiver_rate"),
        "p50 ms": latency.get("p50"),
        "p99 ms": latency.get("p99"),
    }
