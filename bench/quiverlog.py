"""What ``sluicegate quiver`` prints, read back: its status rows become rate series.

Pure parsing of the rows under the ``Time [s]  Sent [m] ...`` heading (see
``sluicegate.clients.quiver.stats.status_row``), so the throughput scenario's plots are tested on
known text.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StatusRow", "parse_status_row"]

FIXED_COLUMNS = 6  # time, sent, rate, received, rate, latency; then "CPU% RSS" per process


@dataclass(frozen=True, slots=True)
class StatusRow:
    """One status row: counts and rates of both sides, the latest latency."""

    elapsed_s: float
    sent: int
    sent_rate: float
    received: int
    received_rate: float
    latency_ms: float | None


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_status_row(line: str) -> StatusRow | None:
    """The row's figures; ``None`` for anything that is not a status row (headings, blocks)."""
    cells = line.split()
    if len(cells) < FIXED_COLUMNS:
        return None
    try:
        elapsed, sent, sent_rate, received, received_rate = (_number(c) for c in cells[:5])
        latency = None if cells[5] == "-" else _number(cells[5])
    except ValueError:
        return None
    return StatusRow(elapsed, int(sent), sent_rate, int(received), received_rate, latency)
