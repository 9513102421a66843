"""The one Markdown table every scenario prints: a row per server and case, figures aligned.

Pure formatting, so ``--compare`` output and ``docs/benchmarks.md`` use the same layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["Cell", "cell_text", "markdown_table"]

Cell = str | int | float | None


def cell_text(value: Cell) -> str:
    """Integers and large figures with thousands separators, small ones with one decimal."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"
    return value


def markdown_table(columns: Sequence[str], rows: Sequence[Mapping[str, Cell]]) -> str:
    """A GitHub Markdown table of ``rows`` (missing cells as ``-``), text left, numbers right."""
    texts = [[cell_text(row.get(c)) for c in columns] for row in rows]
    numeric = [
        all(isinstance(row.get(c), int | float) or row.get(c) is None for row in rows)
        and any(row.get(c) is not None for row in rows)
        for c in columns
    ]
    widths = [max([len(c), 3, *(len(t[i]) for t in texts)]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        padded = (
            f"{cell:>{w}}" if right else f"{cell:<{w}}"
            for cell, w, right in zip(cells, widths, numeric, strict=True)
        )
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            "-" * (w + 1) + ":" if right else "-" * (w + 2)
            for w, right in zip(widths, numeric, strict=True)
        )
        + "|"
    )
    return "\n".join([line(columns), rule, *(line(t) for t in texts)])
