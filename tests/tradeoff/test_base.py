"""TradeoffFunction interface: evaluation, generic (epsilon, delta) conversion, points."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_delta, gdp_epsilon
from dpcore.tradeoff import (
    EpsilonDeltaTradeoff,
    GaussianTradeoff,
    IdentityTradeoff,
    TradeoffFunction,
    symmetrise,
)
from dpcore.tradeoff.base import points_below


class GenericGaussian(TradeoffFunction):
    """G_mu seen only through its values: exercises the generic numerical paths."""

    def __init__(self, mu: float) -> None:
        self.closed_form = GaussianTradeoff(mu)

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        return self.closed_form._evaluate(alpha)


def test_call_is_vectorised_and_keeps_shapes() -> None:
    f = GaussianTradeoff(1.0)
    assert isinstance(f(0.3), float)
    grid = np.linspace(0, 1, 12).reshape(3, 4)
    assert f(grid).shape == (3, 4)
    assert f(grid)[1, 2] == f(float(grid[1, 2]))
    assert f(0.0) == 1.0 and f(1.0) == 0.0


@pytest.mark.parametrize("alpha", [1.5, -0.1, math.nan, [0.2, math.nan], "half", [[0.1, 2.0]]])
def test_alpha_outside_unit_interval_raises(alpha: object) -> None:
    with pytest.raises(InvalidParameterError, match="Expected alpha"):
        GaussianTradeoff(1.0)(alpha)  # type: ignore[call-overload]


@settings(max_examples=25, deadline=None)
@given(st.floats(min_value=0.1, max_value=4.0), st.floats(min_value=0.0, max_value=6.0))
def test_generic_delta_is_an_upper_bound_close_to_exact(mu: float, epsilon: float) -> None:
    # The generic conjugate uses a polygon below f: it errs upwards, by < 1e-5 here.
    exact = gdp_delta(mu=mu, epsilon=epsilon)
    generic = GenericGaussian(mu).delta(epsilon)
    assert exact - 1e-15 <= generic <= exact + 1e-5


@settings(max_examples=15, deadline=None)
@given(st.floats(min_value=0.2, max_value=3.0), st.floats(min_value=1e-4, max_value=0.3))
def test_generic_epsilon_inverts_delta_conservatively(mu: float, delta: float) -> None:
    f = GenericGaussian(mu)
    epsilon = f.epsilon(delta)
    assert f.delta(epsilon) <= delta
    assert epsilon >= gdp_epsilon(mu=mu, delta=delta) - 1e-9  # never below the exact answer
    # delta(epsilon) is too large by < 5e-6, so epsilon is at most the exact one at delta - 5e-6.
    assert epsilon <= gdp_epsilon(mu=mu, delta=delta - 5e-6) + 1e-9


def test_points_below_lies_below_a_convex_curve() -> None:
    g = GaussianTradeoff(2.0)
    alpha = np.linspace(0, 1, 50)
    a, b = points_below(alpha, g(alpha))
    assert np.all(np.diff(a) >= 0)
    assert np.all(b <= g(a) + 1e-15)
    # Chords through the same points lie above: the construction is strictly lower somewhere.
    assert np.any(b < np.interp(a, alpha, g(alpha)) - 1e-6)


def test_points() -> None:
    alpha, beta = GaussianTradeoff(1.0).points(1000)
    assert alpha[0] == 0 and alpha[-1] == 1 and np.all(np.diff(alpha) > 0)
    assert 900 <= alpha.size <= 1000
    assert np.array_equal(beta, GaussianTradeoff(1.0)(alpha))
    vertex_alpha, vertex_beta = EpsilonDeltaTradeoff(1.0, 0.1).points()
    assert vertex_alpha.size == 4 and vertex_beta[-1] == 0
    with pytest.raises(InvalidParameterError, match="Expected count"):
        GaussianTradeoff(1.0).points(3)


def test_boundaries_of_the_conversion() -> None:
    f = EpsilonDeltaTradeoff(1.0, 0.1)
    assert f.delta(math.inf) == pytest.approx(0.1)  # 1 - f(0)
    assert f.epsilon(0.05) == math.inf  # delta below the mechanism's own delta
    assert IdentityTradeoff().epsilon(1e-9) == 0.0
    curve = f.epsilon_delta_curve(np.array([[0.0, 1.0], [2.0, 3.0]]))
    assert curve.shape == (2, 2) and np.all(np.diff(curve.ravel()) <= 0)


def test_symmetrise_method_is_the_operation() -> None:
    f = EpsilonDeltaTradeoff(1.0, 0.0)
    grid = np.linspace(0, 1, 101)
    assert np.array_equal(f.symmetrise()(grid), symmetrise(f)(grid))


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: GenericGaussian(1.0).delta(-1.0), "epsilon"),
        (lambda: GenericGaussian(1.0).delta(math.nan), "epsilon"),
        (lambda: GenericGaussian(1.0).epsilon(0.0), "delta"),
        (lambda: GenericGaussian(1.0).epsilon(1.0), "delta"),
        (lambda: GenericGaussian(1.0).epsilon(math.nan), "delta"),
        (lambda: GenericGaussian(1.0).epsilon_delta_curve([0.0, -1.0]), "epsilon"),
    ],
)
def test_bad_inputs(call, parameter: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        call()
