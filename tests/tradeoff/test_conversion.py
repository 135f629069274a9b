"""Tradeoff functions <-> (epsilon, delta) profiles."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_delta
from dpcore.tradeoff import (
    EpsilonDeltaTradeoff,
    GaussianTradeoff,
    TradeoffFunction,
    from_epsilon_delta_curve,
    to_epsilon_delta_curve,
)

GRID = np.linspace(0.0, 1.0, 801)


@settings(max_examples=30, deadline=None)
@given(
    mu=st.floats(min_value=0.1, max_value=4.0),
    top=st.floats(min_value=0.1, max_value=10.0),
    size=st.integers(1, 30),
)
def test_implied_curves_are_tradeoff_functions(
    mu: float, top: float, size: int, assert_tradeoff_function: Callable[[TradeoffFunction], None]
) -> None:
    eps = np.linspace(0, top, size)
    f = from_epsilon_delta_curve(eps, [gdp_delta(mu=mu, epsilon=float(e)) for e in eps])
    assert_tradeoff_function(f)
    assert np.all(f(GRID) <= GaussianTradeoff(mu)(GRID) + 1e-12)  # never above the truth


def test_envelope_of_gaussian_profile_recovers_the_curve_and_the_profile() -> None:
    eps = np.linspace(0, 8, 400)
    deltas = np.array([gdp_delta(mu=1.0, epsilon=float(e)) for e in eps])
    f = from_epsilon_delta_curve(eps, deltas)
    g = GaussianTradeoff(1.0)(GRID)
    assert np.all(f(GRID) <= g + 1e-12)
    assert np.max(g - f(GRID)) < 0.01
    # Round trip: the implied curve's profile at the given epsilons is the given one (exact
    # polygon conjugate), because the profile is tight for G_1.
    assert np.allclose(to_epsilon_delta_curve(f, eps), deltas, rtol=0, atol=1e-12)


def test_a_single_pair_gives_f_epsilon_delta() -> None:
    f = from_epsilon_delta_curve([1.3], [0.05])
    assert np.allclose(f(GRID), EpsilonDeltaTradeoff(1.3, 0.05)(GRID), atol=1e-15)
    # A huge epsilon (its steep line is left out, pessimistically) and epsilon = inf are fine.
    g = from_epsilon_delta_curve([1.0, 800.0, math.inf], [0.1, 0.0, 0.0])
    assert np.allclose(g(GRID), EpsilonDeltaTradeoff(1.0, 0.1)(GRID), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mu", [0.5, 2.0])
def test_to_epsilon_delta_curve_of_gaussian(mu: float) -> None:
    eps = np.array([[0.0, 0.5], [1.0, 3.0]])
    curve = to_epsilon_delta_curve(GaussianTradeoff(mu), eps)
    assert curve.shape == (2, 2)
    expected = [[gdp_delta(mu=mu, epsilon=float(e)) for e in row] for row in eps]
    assert np.array_equal(curve, expected)


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: from_epsilon_delta_curve([-1.0], [0.1]), "epsilons"),
        (lambda: from_epsilon_delta_curve([math.nan], [0.1]), "epsilons"),
        (lambda: from_epsilon_delta_curve([], []), "epsilons"),
        (lambda: from_epsilon_delta_curve([1.0], [1.5]), "deltas"),
        (lambda: from_epsilon_delta_curve([1.0], [math.nan]), "deltas"),
        (lambda: from_epsilon_delta_curve([1.0, 2.0], [0.1]), "deltas"),
        (lambda: to_epsilon_delta_curve(GaussianTradeoff(1.0), [math.nan]), "epsilons"),
        (lambda: to_epsilon_delta_curve(GaussianTradeoff(1.0), [-1.0]), "epsilon"),
        (lambda: to_epsilon_delta_curve(0.5, [1.0]), "f"),
    ],
)
def test_bad_inputs(call, parameter: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        call()
