"""The shape of a scenario, so the CLI runs any of them against one server or several."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from bench.record import Record
from bench.servers import Target

__all__ = ["Scenario"]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named benchmark: its options, its table columns, and how it runs against one target."""

    name: str
    help: str
    columns: Sequence[str]
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Target, argparse.Namespace, TextIO], list[Record]]
