"""Samplers that run beside a scenario: a server's RSS and CPU, its metrics, client counters.

A ``Sampler`` thread calls each probe every ``period`` seconds and appends what it returns to
named series. Probes read /proc or HTTP only, so sampling costs the server nothing it would not
pay for a Prometheus scrape.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Final

from bench.promtext import MetricsError, parse_exposition, pending_figures
from bench.series import Series
from gateway.quiver import procstat

__all__ = [
    "BYTES_PER_MB",
    "DEFAULT_PERIOD_S",
    "OUTGOING_PENDING",
    "MetricsProbe",
    "Probe",
    "ProcessProbe",
    "Sampler",
]

DEFAULT_PERIOD_S: Final[float] = 0.5  # fine enough to see a 30 s run's shape, cheap for /proc
BYTES_PER_MB: Final[int] = 1024 * 1024
OUTGOING_PENDING: Final[str] = "sluicegate_session_outgoing_pending"
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


class MetricsProbe:
    """outgoing_pending (sum and max over sessions) from a Prometheus endpoint."""

    units: Final[dict[str, str]] = {
        "outgoing_pending max": "deliveries",
        "outgoing_pending sum": "deliveries",
    }

    def __init__(self, url: str) -> None:
        self.url = url

    def scrape(self) -> str:
        """The exposition text; ``OSError`` when the endpoint does not answer."""
        with urllib.request.urlopen(self.url, timeout=SCRAPE_TIMEOUT_S) as response:
            text: str = response.read().decode()
        return text

    def __call__(self) -> Mapping[str, float]:
        try:
            figures = pending_figures(parse_exposition(self.scrape()), OUTGOING_PENDING)
        except (OSError, MetricsError, urllib.error.URLError):
            return {}
        if figures is None:
            return {}  # not exported: no figure rather than a made-up zero
        return {"outgoing_pending sum": figures[0], "outgoing_pending max": figures[1]}


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
