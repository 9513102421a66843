"""The bench's arithmetic on sampled series, on known inputs."""

from __future__ import annotations

import pytest

from bench.series import Extent, Series, extent, idle_time, mean, rates, second_half, slope


def test_extent_is_first_largest_last() -> None:
    assert extent([(0.0, 10.0), (1.0, 30.0), (2.0, 20.0)]) == Extent(10.0, 30.0, 20.0)
    assert extent([]) is None


def test_mean() -> None:
    assert mean([(0.0, 1.0), (1.0, 2.0), (2.0, 6.0)]) == 3.0
    assert mean([]) is None


def test_second_half_keeps_the_later_half_of_the_time_covered() -> None:
    points = [(10.0, 1.0), (12.0, 2.0), (15.0, 3.0), (20.0, 4.0)]
    assert second_half(points) == [(15.0, 3.0), (20.0, 4.0)]
    assert second_half([]) == []


def test_slope_of_a_line_and_of_a_flat_series() -> None:
    assert slope([(0.0, 5.0), (1.0, 7.0), (2.0, 9.0), (3.0, 11.0)]) == pytest.approx(2.0)
    assert slope([(0.0, 4.0), (1.0, 4.0), (5.0, 4.0)]) == 0.0


def test_slope_needs_two_distinct_times() -> None:
    assert slope([(1.0, 3.0)]) is None
    assert slope([(1.0, 3.0), (1.0, 5.0)]) is None


def test_rates_between_samples_of_a_counter() -> None:
    counts = [(0.0, 0.0), (0.5, 250.0), (1.5, 750.0), (1.5, 800.0), (2.0, 800.0)]
    assert rates(counts) == [(0.5, 500.0), (1.5, 500.0), (2.0, 0.0)]


def test_idle_time_adds_the_intervals_without_growth() -> None:
    counts = [(0.0, 0.0), (1.0, 10.0), (3.0, 10.0), (3.5, 10.0), (4.0, 20.0)]
    assert idle_time(counts) == 2.5
    assert idle_time([]) == 0.0


def test_series_json() -> None:
    series = Series("server RSS", "MB")
    series.add(0.0, 20.5)
    series.add(0.5, 21.0)
    assert series.to_json() == {
        "name": "server RSS",
        "unit": "MB",
        "points": [[0.0, 20.5], [0.5, 21.0]],
    }
