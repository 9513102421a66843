"""Read samples from Prometheus' text exposition format (what ``--metrics-listen`` serves).

Pure parsing, so the scenarios' reading of ``sluicegate_session_outgoing_pending`` and the
other gauges is tested on known text. Only what a scrape needs: names, labels, values;
comments are skipped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["MetricsError", "Sample", "metric_total", "parse_exposition"]

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class MetricsError(ValueError):
    """The text is not the exposition format."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One exposed value: metric name, labels, value."""

    name: str
    labels: Mapping[str, str]
    value: float


def _unescape(text: str) -> str:
    return re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], text)


def _labels(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    labels: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _LABEL.match(text, position)
        if match is None or match.end() == position:
            raise MetricsError(f"bad labels {{{text}}}")
        labels[match.group(1)] = _unescape(match.group(2))
        position = match.end()
    return labels


def parse_exposition(text: str) -> list[Sample]:
    """Every sample in a scrape, in order."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise MetricsError(f"not a sample line: {line!r}")
        try:
            value = float(match["value"])
        except ValueError:
            raise MetricsError(f"bad value in {line!r}") from None
        samples.append(Sample(match["name"], _labels(match["labels"]), value))
    return samples


def metric_total(samples: Iterable[Sample], metric: str) -> float | None:
    """The sum of a metric's samples over all its labels; ``None`` when it is not exported."""
    values = [s.value for s in samples if s.name == metric and not math.isnan(s.value)]
    return sum(values) if values else None
