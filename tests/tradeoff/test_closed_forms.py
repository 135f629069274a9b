"""Closed-form tradeoff functions against independent oracles; polygon validation."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_delta
from dpcore.tradeoff import (
    EpsilonDeltaTradeoff,
    GaussianTradeoff,
    IdentityTradeoff,
    PiecewiseLinearTradeoff,
)
from dpcore.tradeoff.closed_forms import SMALL_MU

GRID = np.linspace(0.0, 1.0, 801)


def mp_gaussian_tradeoff(mu: float, alpha: float) -> float:
    """G_mu(alpha) = Phi(Phi^{-1}(1 - alpha) - mu) in 50-digit arithmetic."""
    with mpmath.workdps(50):
        z = -mpmath.sqrt(2) * mpmath.erfinv(2 * mpmath.mpf(alpha) - 1)  # Phi^{-1}(1 - alpha)
        return float(mpmath.ncdf(z - mu))


@pytest.mark.parametrize("mu", [0.1, 1.0, 3.0])
@pytest.mark.parametrize("alpha", [1e-10, 1e-3, 0.05, 0.5, 0.9])
def test_gaussian_matches_mpmath(mu: float, alpha: float) -> None:
    assert GaussianTradeoff(mu)(alpha) == pytest.approx(mp_gaussian_tradeoff(mu, alpha), rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(st.floats(min_value=0.0, max_value=8.0), st.floats(min_value=0.0, max_value=10.0))
def test_gaussian_delta_is_gdp_delta(mu: float, epsilon: float) -> None:
    if mu >= SMALL_MU:
        assert GaussianTradeoff(mu).delta(epsilon) == gdp_delta(mu=mu, epsilon=epsilon)
    else:  # gdp_delta loses its precision there; an upper bound is returned instead
        assert GaussianTradeoff(mu).delta(epsilon) >= gdp_delta(mu=mu, epsilon=epsilon)


@settings(max_examples=30, deadline=None)
@given(st.floats(min_value=0.05, max_value=5.0), st.floats(min_value=1e-10, max_value=0.5))
def test_gaussian_delta_epsilon_round_trip(mu: float, delta: float) -> None:
    f = GaussianTradeoff(mu)
    epsilon = f.epsilon(delta)
    assert f.delta(epsilon) <= delta
    if epsilon > 0:
        assert f.delta(epsilon) == pytest.approx(delta, rel=1e-6)


def test_gaussian_extremes_are_polygons() -> None:
    assert np.allclose(GaussianTradeoff(0.0)(GRID), 1 - GRID, atol=1e-15)
    assert np.all(GaussianTradeoff(math.inf)(GRID) == 0.0)
    assert GaussianTradeoff(0.0).delta(0.0) == 0.0
    assert GaussianTradeoff(math.inf).delta(5.0) == 1.0


@settings(max_examples=30, deadline=None)
@given(
    st.floats(min_value=0.0, max_value=5.0),
    st.floats(min_value=0.0, max_value=0.5),
    st.floats(min_value=0.0, max_value=8.0),
)
def test_epsilon_delta_tradeoff_profile(epsilon: float, delta: float, other: float) -> None:
    # delta'(eps') = delta + (1 - delta)(e^eps - e^eps')_+ / (1 + e^eps): the conjugate at the
    # corner of f_{eps,delta} (Kairouz, Oh, Viswanath 2015, Thm 2.1).
    f = EpsilonDeltaTradeoff(epsilon, delta)
    expected = delta + (1 - delta) * max(0.0, math.exp(epsilon) - math.exp(other)) / (
        1 + math.exp(epsilon)
    )
    assert f.delta(other) == pytest.approx(expected, abs=1e-12)


def test_identity_and_trivial_pairs() -> None:
    assert np.array_equal(IdentityTradeoff()(GRID), 1 - GRID)
    assert np.allclose(EpsilonDeltaTradeoff(0.0, 0.0)(GRID), 1 - GRID, atol=1e-15)
    assert IdentityTradeoff().delta(0.0) == 0.0


def test_polygon_from_points_takes_the_hull() -> None:
    f = PiecewiseLinearTradeoff([0.0, 0.3, 0.5, 1.0], [1.0, 0.5, 0.45, 0.0], hull=True)
    assert np.array_equal(f.alpha, [0.0, 0.3, 1.0])
    g = PiecewiseLinearTradeoff.from_points([0.2, 0.5], [0.4, 0.1])
    assert g.alpha[0] == 0.0 and g(0.0) == 1.0 and g(1.0) == 0.0


@pytest.mark.parametrize(
    ("alpha", "beta", "parameter"),
    [
        ([0, 0.5, 1], [1, 0.2, 0.1], "beta_vertices"),  # does not reach 0
        ([0, 0.5, 1], [0.5, 0.4, 0.0], "beta_vertices"),  # not convex
        ([0, 0.5, 1], [0.5, 0.6, 0.0], "beta_vertices"),  # increasing
        ([0, 0.5, 1], [1.2, 0.2, 0.0], "beta_vertices"),  # above 1
        ([0, 0.6, 0.5, 1], [1, 0.3, 0.2, 0], "alpha_vertices"),  # not increasing
        ([0.1, 1], [0.5, 0], "alpha_vertices"),  # does not start at 0
        ([0, math.nan, 1], [1, 0.2, 0], "alpha_vertices"),
        ([0, 0.5, 1], [1, math.nan, 0], "beta_vertices"),
        ([0, 1], [1, 0.5, 0], "beta_vertices"),  # lengths differ
        ([0], [1], "alpha_vertices"),
    ],
)
def test_bad_polygons(alpha: list[float], beta: list[float], parameter: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        PiecewiseLinearTradeoff(alpha, beta)


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: GaussianTradeoff(-1.0), "mu"),
        (lambda: GaussianTradeoff(math.nan), "mu"),
        (lambda: GaussianTradeoff("1"), "mu"),
        (lambda: EpsilonDeltaTradeoff(-1.0), "epsilon"),
        (lambda: EpsilonDeltaTradeoff(math.nan), "epsilon"),
        (lambda: EpsilonDeltaTradeoff(1.0, 1.0), "delta"),
        (lambda: EpsilonDeltaTradeoff(1.0, -0.1), "delta"),
        (lambda: PiecewiseLinearTradeoff([0, 2], [1, 0], hull=True), "alpha_vertices"),
    ],
)
def test_bad_parameters(call, parameter: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        call()
