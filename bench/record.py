"""What a scenario produces: one record per server and case, written as JSON, a plot, a table.

A record holds the figures of its table row and the series behind them, so the JSON file can be
re-plotted or compared later without running anything again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.series import Series
from bench.table import Cell, markdown_table

__all__ = ["Record", "Report"]


@dataclass
class Record:
    """One run of a scenario against one server (``server``) in one variant (``case``)."""

    server: str
    case: str
    parameters: dict[str, object] = field(default_factory=dict)
    figures: dict[str, Cell] = field(default_factory=dict)
    series: dict[str, Series] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How plots name this run."""
        return f"{self.server} {self.case}".strip()

    def to_json(self) -> dict[str, object]:
        """Plain JSON of everything measured."""
        return {
            "server": self.server,
            "case": self.case,
            "parameters": self.parameters,
            "figures": self.figures,
            "series": [s.to_json() for s in self.series.values()],
        }


@dataclass
class Report:
    """Every record of one scenario invocation, and the table columns it prints."""

    scenario: str
    columns: Sequence[str]
    records: list[Record] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        """The Markdown table: a row per record, ``server`` and ``case`` first."""
        rows = [{"server": r.server, "case": r.case, **r.figures} for r in self.records]
        return markdown_table(["server", "case", *self.columns], rows)

    def to_json(self) -> dict[str, object]:
        """The whole report as plain JSON."""
        return {
            "scenario": self.scenario,
            "columns": list(self.columns),
            "notes": self.notes,
            "records": [r.to_json() for r in self.records],
        }

    def write_json(self, path: Path) -> None:
        """Write ``to_json`` to ``path``."""
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
