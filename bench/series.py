"""Values sampled over time and the figures drawn from them: start, peak, end, slope, rates.

Pure functions over ``(seconds, value)`` points, so the numbers a benchmark prints can be checked
on known inputs; the samplers in ``bench.probes`` fill the series.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "Extent",
    "Point",
    "Series",
    "extent",
    "idle_time",
    "mean",
    "rates",
    "second_half",
    "slope",
]

Point = tuple[float, float]  # (seconds since the scenario started, value)


@dataclass
class Series:
    """One quantity over time; ``unit`` groups series into the same plot panel."""

    name: str
    unit: str
    points: list[Point] = field(default_factory=list)

    def add(self, t: float, value: float) -> None:
        """Append a sample taken ``t`` seconds into the run."""
        self.points.append((t, value))

    def to_json(self) -> dict[str, object]:
        """Plain JSON: name, unit, and the points as ``[t, value]`` pairs."""
        return {"name": self.name, "unit": self.unit, "points": [list(p) for p in self.points]}


@dataclass(frozen=True, slots=True)
class Extent:
    """First, largest and last value of a series."""

    start: float
    peak: float
    end: float


def extent(points: Sequence[Point]) -> Extent | None:
    """Start, peak and end of the points; ``None`` without any."""
    if not points:
        return None
    return Extent(points[0][1], max(v for _, v in points), points[-1][1])


def mean(points: Sequence[Point]) -> float | None:
    """The average value; ``None`` without points."""
    if not points:
        return None
    return sum(v for _, v in points) / len(points)


def second_half(points: Sequence[Point]) -> list[Point]:
    """The points in the later half of the time the series covers (where a steady state shows)."""
    if not points:
        return []
    middle = (points[0][0] + points[-1][0]) / 2
    return [p for p in points if p[0] >= middle]


def slope(points: Sequence[Point]) -> float | None:
    """Least-squares slope in value units per second; ``None`` with fewer than two distinct times.

    A memory series whose second half has a slope near 0 is flat: bounded, not merely slow.
    """
    if len(points) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread


def rates(counts: Sequence[Point]) -> list[Point]:
    """Per-second rates between consecutive samples of a growing counter, at each interval's end."""
    return [
        (t1, (v1 - v0) / (t1 - t0)) for (t0, v0), (t1, v1) in itertools.pairwise(counts) if t1 > t0
    ]


def idle_time(counts: Sequence[Point]) -> float:
    """Seconds between samples in which a counter did not grow (a publisher held back)."""
    return sum(t1 - t0 for (t0, v0), (t1, v1) in itertools.pairwise(counts) if v1 <= v0)
