"""``python -m bench.channel_cost`` crosses real sockets and prints one row per batch and size."""

from __future__ import annotations

import pytest

from bench.channel_cost import BATCHES, SIZES, crossing_cpu, main


def test_a_crossing_costs_less_per_message_in_a_batch_than_alone() -> None:
    alone = crossing_cpu(1, 100, 2000)
    batched = crossing_cpu(256, 100, 2048 * 8)
    assert 0 < batched < alone


def test_the_table_has_a_row_per_batch_and_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--messages", "512"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [tuple(map(int, row.split("|")[1:3])) for row in rows] == [
        (batch, size) for batch in BATCHES for size in SIZES
    ]
