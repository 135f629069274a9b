"""Empirical tradeoff curves from samples: validity and convergence (an estimate, not a bound)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.errors import InvalidParameterError
from dpcore.tradeoff import GaussianTradeoff, TradeoffFunction, from_samples

GRID = np.linspace(0.0, 1.0, 801)


@settings(max_examples=25, deadline=None)
@given(
    samples=st.lists(st.floats(min_value=-3, max_value=3), min_size=1, max_size=200),
    shift=st.floats(min_value=-2, max_value=2),
)
def test_empirical_curves_are_tradeoff_functions(
    samples: list[float],
    shift: float,
    assert_tradeoff_function: Callable[[TradeoffFunction], None],
) -> None:
    assert_tradeoff_function(from_samples(samples, [s + shift for s in samples]))


def test_from_samples_approaches_the_gaussian_curve() -> None:
    # Dvoretzky-Kiefer-Wolfowitz: each empirical CDF of n = 2e5 samples is within t = 0.006 of
    # its CDF with probability >= 1 - 2 exp(-2 n t^2) > 1 - 1.2e-6; then every threshold test's
    # (alpha, beta) is within t of the true one, so the curve lies in the band below (plus the
    # 1/n spacing of the points). Fixed seed.
    rng = np.random.default_rng(20260101)
    n, t = 200_000, 0.006
    f = from_samples(rng.normal(0, 1, n), rng.normal(1, 1, n))
    g = GaussianTradeoff(1.0)
    estimate = f(GRID)
    assert np.all(estimate <= g(np.maximum(GRID - t, 0.0)) + t + 1e-4)
    assert np.all(estimate >= g(np.minimum(GRID + t, 1.0)) - t)
    assert np.max(np.abs(estimate - g(GRID))) < 0.01


def test_extreme_samples() -> None:
    separated = from_samples([0.0, 1.0], [2.0, 3.0])
    assert np.all(separated(GRID) == 0.0)
    same = from_samples([0.0, 1.0, 2.0], [0.0, 1.0, 2.0])
    assert np.allclose(same(GRID), 1 - GRID, atol=1e-15)
    # The direction of the score does not matter: both tails are tried.
    assert np.array_equal(from_samples([2.0, 3.0], [0.0, 1.0])(GRID), separated(GRID))


@pytest.mark.parametrize(
    ("p", "q", "parameter"),
    [
        ([], [1.0], "samples_p"),
        ([1.0], [], "samples_q"),
        ([math.nan], [1.0], "samples_p"),
        ([1.0], [math.inf], "samples_q"),
        (["a"], [1.0], "samples_p"),
    ],
)
def test_bad_samples(p: list[object], q: list[object], parameter: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        from_samples(p, q)
