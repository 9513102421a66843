"""Samplers that run beside a scenario: a server's RSS and CPU, its metrics, client counters.

A ``Sampler`` thread calls each probe every ``period`` seconds and appends what it returns to
named series. Probes read /proc or HTTP only, so sampling costs the server nothing it would not
pay for a Prometheus scrape.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from bench.promtext import MetricsError, metric_total, parse_exposition
from bench.series import Series
from sluicegate.clients.quiver import procstat

__all__ = [
    "BUDGET_GAUGES",
    "BYTES_PER_MB",
    "DEFAULT_PERIOD_S",
    "PENDING_GAUGES",
    "Gauge",
    "MetricsProbe",
    "Probe",
    "ProcessProbe",
    "Sampler",
]

DEFAULT_PERIOD_S: Final[float] = 0.5  # fine enough to see a 30 s run's shape, cheap for /proc
BYTES_PER_MB: Final[int] = 1024 * 1024
SCRAPE_TIMEOUT_S: Final[float] = 5.0  # a loaded reactor answers late; later than this it is stuck

# A probe returns readings named ``series name`` → value; ``units`` says which panel each goes to.
Probe = Callable[[], Mapping[str, float]]


class ProcessProbe:
    """RSS (MB) and CPU (% of one core since the previous sample) of one process."""

    def __init__(self, pid: int, label: str = "server") -> None:
        self.pid = pid
        self.label = label
        self.previous: tuple[float, int] | None = None

    @property
    def units(self) -> dict[str, str]:
        """The series this probe fills and their units."""
        return {f"{self.label} RSS": "MB", f"{self.label} CPU": "%"}

    def __call__(self) -> Mapping[str, float]:
        sample = procstat.sample(self.pid)
        if sample is None:
            return {}
        now = time.monotonic()
        readings = {f"{self.label} RSS": sample.rss_bytes / BYTES_PER_MB}
        if self.previous is not None and now > self.previous[0]:
            ticks = sample.cpu_ticks - self.previous[1]
            readings[f"{self.label} CPU"] = (
                ticks / procstat.TICKS_PER_S / (now - self.previous[0]) * 100
            )
        self.previous = (now, sample.cpu_ticks)
        return readings


@dataclass(frozen=True, slots=True)
class Gauge:
    """A Prometheus metric read into a series: its name there, the series' name, unit, scale."""

    metric: str
    series: str
    unit: str
    scale: float = 1.0


# The session ← queue loop's bound, as sluicegate exports it (issue 10's names).
PENDING_GAUGES: Final[tuple[Gauge, ...]] = (
    Gauge("sluicegate_session_outgoing_pending_max", "outgoing_pending max", "deliveries"),
    Gauge("sluicegate_session_outgoing_pending", "outgoing_pending sum", "deliveries"),
)
# The publisher side: bytes held against the memory budget, copies not yet stored.
BUDGET_GAUGES: Final[tuple[Gauge, ...]] = (
    Gauge("sluicegate_memory_budget_used_bytes", "budget used", "MB", 1 / BYTES_PER_MB),
    Gauge("sluicegate_connection_account_debt", "account debt", "copies"),
)


class MetricsProbe:
    """Gauges from a Prometheus endpoint; a gauge the server does not export gives no reading."""

    def __init__(self, url: str, gauges: Sequence[Gauge]) -> None:
        self.url = url
        self.gauges = tuple(gauges)

    @property
    def units(self) -> dict[str, str]:
        """The series this probe fills and their units."""
        return {g.series: g.unit for g in self.gauges}

    def scrape(self) -> str:
        """The exposition text; ``OSError`` when the endpoint does not answer."""
        with urllib.request.urlopen(self.url, timeout=SCRAPE_TIMEOUT_S) as response:
            text: str = response.read().decode()
        return text

    def __call__(self) -> Mapping[str, float]:
        try:
            samples = parse_exposition(self.scrape())
        except (OSError, MetricsError):
            return {}
        readings = {}
        for gauge in self.gauges:
            total = metric_total(samples, gauge.metric)
            if total is not None:
                readings[gauge.series] = total * gauge.scale
        return readings


class Sampler:
    """Calls probes on a timer in a daemon thread; series are read after ``stop``."""

    def __init__(self, period: float = DEFAULT_PERIOD_S) -> None:
        self.period = period
        self.probes: list[tuple[Probe, Mapping[str, str]]] = []
        self.series: dict[str, Series] = {}
        self.started = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def add(self, probe: Probe, units: Mapping[str, str]) -> None:
        """Sample ``probe``; each reading name it returns must be a key of ``units``."""
        self.probes.append((probe, units))
        for name, unit in units.items():
            self.series.setdefault(name, Series(name, unit))

    def start(self) -> None:
        """Take the first samples now (time 0) and keep sampling."""
        self.started = time.monotonic()
        self.sample()
        self._thread.start()

    def elapsed(self) -> float:
        """Seconds since ``start``."""
        return time.monotonic() - self.started

    def sample(self) -> None:
        """One round over every probe."""
        for probe, units in self.probes:
            readings = probe()
            t = self.elapsed()
            for name, value in readings.items():
                self.series.setdefault(name, Series(name, units.get(name, ""))).add(t, value)

    def _run(self) -> None:
        deadline = self.started
        while True:
            deadline += self.period
            if self._stop.wait(max(0.0, deadline - time.monotonic())):
                return
            self.sample()

    def stop(self) -> dict[str, Series]:
        """Take a last sample, stop the thread, and return the series."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()
        return self.series
