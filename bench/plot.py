"""The PNG of a scenario: one panel per unit (RSS, rates, outgoing_pending, ...) over time.

Every record's series share the panels, so ``--compare`` runs are drawn on the same axes.
Matplotlib (the ``bench`` extra) is imported here only, with the Agg backend: no display needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from bench.record import Report

__all__ = ["PANEL_TITLES", "plot_report"]

# Panel order and titles by unit; units not listed follow, titled by the unit itself.
PANEL_TITLES: Final[dict[str, str]] = {
    "MB": "memory (MB)",
    "msg/s": "rate (messages/s)",
    "deliveries": "outgoing_pending (deliveries)",
    "%": "CPU (% of one core)",
    "copies": "account debt (copies)",
    "messages": "messages",
}
PANEL_HEIGHT_IN: Final[float] = 2.6
FIGURE_WIDTH_IN: Final[float] = 10.0


def panels(report: Report) -> list[str]:
    """The units present, in ``PANEL_TITLES`` order then first appearance."""
    units: list[str] = []
    for record in report.records:
        for series in record.series.values():
            if series.points and series.unit not in units:
                units.append(series.unit)
    order = list(PANEL_TITLES)
    return sorted(units, key=lambda u: order.index(u) if u in order else len(order))


def plot_report(report: Report, path: Path) -> bool:
    """Draw the report's series to ``path``; False when there is nothing to draw."""
    units = panels(report)
    if not units:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        len(units),
        1,
        figsize=(FIGURE_WIDTH_IN, PANEL_HEIGHT_IN * len(units)),
        sharex=True,
        squeeze=False,
    )
    for axis, unit in zip(axes[:, 0], units, strict=True):
        for record in report.records:
            for series in record.series.values():
                if series.unit != unit or not series.points:
                    continue
                times, values = zip(*series.points, strict=True)
                axis.plot(times, values, label=f"{record.label}: {series.name}", linewidth=1.2)
        axis.set_ylabel(PANEL_TITLES.get(unit, unit))
        axis.grid(alpha=0.3)
        axis.legend(fontsize="x-small", loc="best")
    axes[-1, 0].set_xlabel("seconds")
    figure.suptitle(f"sluicegate bench: {report.scenario}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True
