"""The quiver's arithmetic and text: rates, latency percentiles, status rows, the summary blocks.

Pure functions of counts and nanosecond timestamps (no proton, no clock, no IO), so every figure
the tool prints can be checked on known inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from sluicegate.clients.quiver.settings import Settings

__all__ = [
    "PERCENTILES",
    "Latency",
    "ProcessUsage",
    "Results",
    "Span",
    "cpu_percent",
    "merge_spans",
    "percentile",
    "rate",
    "render_configuration",
    "render_results",
    "status_heading",
    "status_row",
    "summarize",
    "summarize_latency",
    "summary_document",
]

NS_PER_S: Final[int] = 1_000_000_000
NS_PER_MS: Final[int] = 1_000_000
BYTES_PER_MB: Final[int] = 1024 * 1024  # RSS in MiB, as top and quiver's status rows show it
# Exact fractions: 99.9 % of 1000 samples must be rank 999, which float arithmetic rounds to 1000.
PERCENTILES: Final[tuple[tuple[str, Fraction], ...]] = (
    ("p50", Fraction(50)),
    ("p90", Fraction(90)),
    ("p99", Fraction(99)),
    ("p99.9", Fraction("99.9")),
)
NAME_WIDTH: Final[int] = 24  # quiver's layout: name dotted out to 24 columns,
VALUE_WIDTH: Final[int] = 37  # value dotted out to the next 37, then the unit
# Status columns fit their headings and 9-digit counts; each is right-aligned, two spaces apart.
STATUS_WIDTHS: Final[tuple[int, ...]] = (8, 11, 10, 12, 10, 8)
USAGE_WIDTH: Final[int] = 13  # "100% 1,024.0M", and the "S1 CPU/RSS" heading


@dataclass(frozen=True, slots=True)
class Span:
    """How many messages one side handled, and the times of its first and last."""

    count: int
    first_ns: int | None
    last_ns: int | None


@dataclass(frozen=True, slots=True)
class Latency:
    """Send-to-receive latency in milliseconds."""

    average_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float


@dataclass(frozen=True, slots=True)
class Results:
    """The RESULTS block: counts, the end-to-end duration, rates per side, latency."""

    count: int
    sent: int
    accepted: int | None
    duration_s: float | None
    sender_rate: float | None
    receiver_rate: float | None
    end_to_end_rate: float | None
    latency: Latency | None
    client_cpu_s: float | None = None  # the senders' and receivers' CPU, for cost per message


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """One process's CPU share over the last status period and its resident memory."""

    name: str
    cpu_percent: float | None
    rss_bytes: int | None


def merge_spans(spans: Sequence[Span]) -> Span:
    """Several senders (or receivers) as one side: counts add, the span covers them all."""
    firsts = [s.first_ns for s in spans if s.first_ns is not None]
    lasts = [s.last_ns for s in spans if s.last_ns is not None]
    return Span(
        count=sum(s.count for s in spans),
        first_ns=min(firsts) if firsts else None,
        last_ns=max(lasts) if lasts else None,
    )


def rate(count: int, start_ns: int | None, end_ns: int | None) -> float | None:
    """Messages per second over a span; ``None`` when the span is empty or has no length."""
    if start_ns is None or end_ns is None or end_ns <= start_ns or count == 0:
        return None
    return count * NS_PER_S / (end_ns - start_ns)


def percentile(sorted_values: Sequence[int], percent: Fraction) -> int:
    """Nearest rank: the smallest value with at least ``percent`` % of the values at or below it."""
    if not sorted_values:
        raise ValueError("no values")
    rank = math.ceil(percent * len(sorted_values) / 100)
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


def summarize_latency(latencies_ns: Sequence[int]) -> Latency | None:
    """Average and percentiles of latencies given in nanoseconds, in milliseconds."""
    if not latencies_ns:
        return None
    ordered = sorted(latencies_ns)
    p50, p90, p99, p999 = (percentile(ordered, p) / NS_PER_MS for _, p in PERCENTILES)
    return Latency(
        average_ms=sum(ordered) / len(ordered) / NS_PER_MS,
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        p999_ms=p999,
    )


def summarize(
    sent: Span,
    received: Span,
    accepted: int | None,
    latencies_ns: Sequence[int],
    client_cpu_s: float | None = None,
) -> Results:
    """Quiver's results: duration from the first send to the last receive, and rates over it."""
    end_to_end_s = (
        None
        if sent.first_ns is None or received.last_ns is None
        else (received.last_ns - sent.first_ns) / NS_PER_S
    )
    return Results(
        count=received.count,
        sent=sent.count,
        accepted=accepted,
        duration_s=end_to_end_s,
        sender_rate=rate(sent.count, sent.first_ns, sent.last_ns),
        receiver_rate=rate(received.count, received.first_ns, received.last_ns),
        end_to_end_rate=rate(received.count, sent.first_ns, received.last_ns),
        latency=summarize_latency(latencies_ns),
        client_cpu_s=client_cpu_s,
    )


def cpu_percent(ticks_before: int, ticks_after: int, ticks_per_s: int, seconds: float) -> float:
    """CPU use over a period from /proc clock ticks: 100 means one core busy all along."""
    if seconds <= 0:
        return 0.0
    return (ticks_after - ticks_before) / ticks_per_s / seconds * 100


def _field(name: str, value: str, unit: str = "") -> str:
    line = f"{name + ' ':.<{NAME_WIDTH}}{' ' + value:.>{VALUE_WIDTH}}"
    return f"{line} {unit}" if unit else line


def _number(value: float | None, decimals: int = 0) -> str:
    return "-" if value is None else f"{value:,.{decimals}f}"


def _plural(word: str, n: float) -> str:
    return word if n == 1 else word + "s"


def render_configuration(settings: Settings, implementation: str) -> str:
    """The CONFIGURATION block, as quiver prints it."""
    lines = [
        "CONFIGURATION",
        "",
        _field("Implementation", implementation),
        _field("Address URL", settings.url),
        _field("Address", settings.endpoint.address),
    ]
    if settings.output is not None:
        lines.append(_field("Output files", settings.output))
    if settings.count is not None:
        lines.append(_field("Count", _number(settings.count), _plural("message", settings.count)))
    if settings.duration is not None:
        lines.append(
            _field("Duration", _number(settings.duration, 1), _plural("second", settings.duration))
        )
    lines += [
        _field("Body size", _number(settings.body_size), _plural("byte", settings.body_size)),
        _field("Credit window", _number(settings.credit), _plural("message", settings.credit)),
        _field("Senders", _number(settings.senders)),
        _field("Receivers", _number(settings.receivers)),
        _field("Timeout", _number(settings.timeout, 1), "seconds"),
    ]
    if settings.flags:
        lines.append(_field("Flags", ", ".join(settings.flags)))
    return "\n".join(lines)


def render_results(results: Results) -> str:
    """The RESULTS block: quiver's rows, then one latency row per percentile."""
    latency = results.latency
    latency_rows = (
        ("Latency average", None if latency is None else latency.average_ms),
        ("Latency p50", None if latency is None else latency.p50_ms),
        ("Latency p90", None if latency is None else latency.p90_ms),
        ("Latency p99", None if latency is None else latency.p99_ms),
        ("Latency p99.9", None if latency is None else latency.p999_ms),
    )
    lines = [
        "RESULTS",
        "",
        _field("Count", _number(results.count), _plural("message", results.count)),
        _field("Duration", _number(results.duration_s, 1), "seconds"),
        _field("Sender rate", _number(results.sender_rate), "messages/s"),
        _field("Receiver rate", _number(results.receiver_rate), "messages/s"),
        _field("End-to-end rate", _number(results.end_to_end_rate), "messages/s"),
        "",
    ]
    lines += [_field(name, _number(value, 1), "ms") for name, value in latency_rows]
    return "\n".join(lines)


def summary_document(
    settings: Settings, implementation: str, results: Results
) -> dict[str, object]:
    """The ``--json`` summary: the configuration and results, in plain units named in the keys."""
    latency = results.latency
    return {
        "configuration": {
            "implementation": implementation,
            "url": settings.url,
            "host": settings.endpoint.host,
            "port": settings.endpoint.port,
            "address": settings.endpoint.address,
            "count": settings.count,
            "duration_s": settings.duration,
            "body_size": settings.body_size,
            "credit": settings.credit,
            "senders": settings.senders,
            "receivers": settings.receivers,
            "timeout_s": settings.timeout,
            "durable": settings.durable,
            "presettled": settings.presettled,
            "peer_to_peer": settings.peer_to_peer,
        },
        "results": {
            "count": results.count,
            "sent": results.sent,
            "accepted": results.accepted,
            "duration_s": results.duration_s,
            "sender_rate": results.sender_rate,
            "receiver_rate": results.receiver_rate,
            "end_to_end_rate": results.end_to_end_rate,
            "client_cpu_s": results.client_cpu_s,
            "latency_ms": None
            if latency is None
            else {
                "average": latency.average_ms,
                "p50": latency.p50_ms,
                "p90": latency.p90_ms,
                "p99": latency.p99_ms,
                "p99.9": latency.p999_ms,
            },
        },
    }


def _columns(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(f"{cell:>{width}}" for cell, width in zip(cells, widths, strict=True))


def status_heading(process_names: Sequence[str]) -> str:
    """The heading over status rows: both sides' counts and rates, then CPU and RSS per process."""
    fixed = ("Time [s]", "Sent [m]", "Rate [m/s]", "Received [m]", "Rate [m/s]", "Lat [ms]")
    short = [f"{name[0].upper()}{name.split()[-1]} CPU/RSS" for name in process_names]
    widths = STATUS_WIDTHS + (USAGE_WIDTH,) * len(short)
    return _columns((*fixed, *short), widths)


def status_row(
    elapsed_s: float,
    sent: int,
    sent_rate: float,
    received: int,
    received_rate: float,
    latency_ms: float | None,
    usages: Sequence[ProcessUsage],
) -> str:
    """One status line, every period, under ``status_heading``."""
    cells = [
        _number(elapsed_s, 1),
        _number(sent),
        _number(sent_rate),
        _number(received),
        _number(received_rate),
        _number(latency_ms),
    ]
    for usage in usages:
        cpu = "-" if usage.cpu_percent is None else f"{usage.cpu_percent:.0f}%"
        rss = "-" if usage.rss_bytes is None else f"{usage.rss_bytes / BYTES_PER_MB:,.1f}M"
        cells.append(f"{cpu} {rss}")
    return _columns(cells, STATUS_WIDTHS + (USAGE_WIDTH,) * len(usages))
