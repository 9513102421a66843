"""Read samples from Prometheus' text exposition format (what ``--metrics-listen`` serves).

Pure parsing, so the slow-consumer scenario's reading of ``sluicegate_session_outgoing_pending``
is tested on known text. Only what a scrape needs: names, labels, values; comments are skipped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["MetricsError", "Sample", "parse_exposition", "pending_figures"]

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


def pending_figures(samples: Iterable[Sample], metric: str) -> tuple[float, float] | None:
    """The sum and max over sessions of a per-session gauge such as outgoing_pending.

    Accepts the shapes a server may choose: one sample per session (labelled), or aggregate
    samples told apart by a ``_sum``/``_max`` suffix or an ``aggregate``/``stat`` label.
    ``None`` when the scrape has no such metric (the server does not export it).
    """
    total: float | None = None
    largest: float | None = None
    per_session: list[float] = []
    for sample in samples:
        if not sample.name.startswith(metric) or math.isnan(sample.value):
            continue
        suffix = sample.name[len(metric) :].lstrip("_")
        kind = suffix or sample.labels.get("aggregate") or sample.labels.get("stat") or ""
        if kind == "sum":
            total = sample.value
        elif kind == "max":
            largest = sample.value
        elif not suffix:
            per_session.append(sample.value)
    if total is None and per_session:
        total = sum(per_session)
    if largest is None and per_session:
        largest = max(per_session)
    if total is None and largest is None:
        return None
    return (total if total is not None else largest or 0.0, largest if largest is not None else 0.0)
