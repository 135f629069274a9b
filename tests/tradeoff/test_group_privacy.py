"""Group privacy of tradeoff functions, 1 - (1 - f)^{∘k} (Dong, Roth, Su 2019, Thm 2.14).

Oracles: the Gaussian case G_mu -> G_{k mu} of the same theorem (exact, since
1 - G_mu(alpha) = Phi(Phi^{-1}(alpha) + mu)); the composition 1 - f applied k times point by
point at grid alphas (an independent evaluation of the definition); the classic group lemma
f_{k eps, delta (1 + ... + e^{(k-1) eps})}, which the exact curve must dominate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.errors import InvalidParameterError, ResourceLimitError
from dpcore.tradeoff import (
    EpsilonDeltaTradeoff,
    GaussianTradeoff,
    IdentityTradeoff,
    PiecewiseLinearTradeoff,
    TradeoffFunction,
    group_privacy,
    polygon_below,
)

GRID = np.linspace(0.0, 1.0, 2001)
ASYMMETRIC = PiecewiseLinearTradeoff([0.0, 0.1, 1.0], [0.6, 0.2, 0.0])


def _pointwise(f: TradeoffFunction, k: int, alpha: np.ndarray) -> np.ndarray:
    """1 - g(g(...g(alpha))) with g = 1 - f, evaluated point by point."""
    value = np.asarray(alpha, dtype=float)
    for _ in range(k):
        value = 1.0 - f(np.clip(value, 0.0, 1.0))
    return 1.0 - value


@pytest.mark.parametrize(("mu", "k"), [(0.5, 3), (1.0, 2), (0.0, 4), (math.inf, 2)])
def test_gaussian_closed_form(mu: float, k: int) -> None:
    result = group_privacy(GaussianTradeoff(mu), k)
    assert isinstance(result, GaussianTradeoff)
    assert result.mu == k * mu


def test_gaussian_polygon_agrees_with_the_closed_form_from_below() -> None:
    exact = GaussianTradeoff(1.5)
    computed = group_privacy(polygon_below(GaussianTradeoff(0.5)), 3)
    gap = exact(GRID) - computed(GRID)
    assert np.all(gap >= -1e-12)  # a polygon below G_0.5 gives a curve below G_1.5
    assert np.max(gap) < 1e-5
    # The definition, evaluated point by point on the polygon, gives the same curve.
    polygon = polygon_below(GaussianTradeoff(0.5))
    assert computed(GRID) == pytest.approx(_pointwise(polygon, 3, GRID), abs=1e-12)


@pytest.mark.parametrize(("epsilon", "delta"), [(0.7, 0.0), (0.7, 0.01), (2.0, 1e-4)])
@pytest.mark.parametrize("k", [2, 3, 5])
def test_epsilon_delta_curve_is_exact_and_beats_the_group_lemma(
    epsilon: float, delta: float, k: int, assert_tradeoff_function: Callable[..., None]
) -> None:
    f = EpsilonDeltaTradeoff(epsilon, delta)
    result = group_privacy(f, k)
    assert_tradeoff_function(result)
    # The vertices are exact: the definition evaluated point by point agrees.
    assert result(GRID) == pytest.approx(_pointwise(f, k, GRID), abs=1e-12)
    # The classic lemma (k eps, delta (1 + e^eps + ... + e^{(k-1) eps}))-DP lies below it ...
    group_delta = delta * math.fsum(math.exp(j * epsilon) for j in range(k))
    lemma = EpsilonDeltaTradeoff(k * epsilon, group_delta)
    assert np.all(result(GRID) >= lemma(GRID) - 1e-12)
    # ... and touches it at alpha = 0 (both start at 1 - delta_k), but not in between.
    assert result(0.0) == pytest.approx(1 - group_delta, abs=1e-12)
    assert np.max(result(GRID) - lemma(GRID)) > 1e-3


@pytest.mark.parametrize(
    "f",
    [
        GaussianTradeoff(0.8),
        EpsilonDeltaTradeoff(1.0, 0.05),
        IdentityTradeoff(),
        ASYMMETRIC,
        PiecewiseLinearTradeoff([0.0, 1.0], [0.0, 0.0]),
    ],
    ids=["gaussian", "eps-delta", "identity", "asymmetric", "zero"],
)
def test_group_of_one_is_f_itself(f: TradeoffFunction) -> None:
    assert group_privacy(f, 1) is f


def test_identity_and_zero_curves() -> None:
    assert isinstance(group_privacy(IdentityTradeoff(), 7), IdentityTradeoff)
    zero = group_privacy(PiecewiseLinearTradeoff([0.0, 1.0], [0.0, 0.0]), 3)
    assert np.all(zero(GRID) == 0)


def test_pure_dp_group_saturates_without_error() -> None:
    # eps = 30: after two steps 1 - f is 1 almost everywhere; the loop stops early and stays valid.
    result = group_privacy(EpsilonDeltaTradeoff(30.0, 0.1), 50)
    assert np.all(result(GRID) == 0)


@settings(max_examples=20, deadline=None)
@given(
    epsilon=st.floats(min_value=0.0, max_value=3.0),
    delta=st.floats(min_value=0.0, max_value=0.1),
    k=st.integers(min_value=1, max_value=6),
)
def test_larger_groups_have_lower_curves(epsilon: float, delta: float, k: int) -> None:
    f = EpsilonDeltaTradeoff(epsilon, delta)
    smaller, larger = group_privacy(f, k), group_privacy(f, k + 1)
    assert np.all(larger(GRID) <= smaller(GRID) + 1e-12)
    assert np.all(smaller(GRID) <= f(GRID) + 1e-12)


@settings(max_examples=20, deadline=None)
@given(
    mu=st.floats(min_value=0.0, max_value=4.0),
    epsilon=st.floats(min_value=0.0, max_value=4.0),
    delta=st.floats(min_value=0.0, max_value=0.2),
)
def test_group_of_one_property(mu: float, epsilon: float, delta: float) -> None:
    for f in (GaussianTradeoff(mu), EpsilonDeltaTradeoff(epsilon, delta)):
        assert group_privacy(f, 1) is f
        assert np.array_equal(group_privacy(f, 1)(GRID), f(GRID))


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_bad_group_size(bad: object) -> None:
    with pytest.raises(InvalidParameterError, match="group_size"):
        group_privacy(GaussianTradeoff(1.0), bad)  # type: ignore[arg-type]


def test_bad_function_and_limit() -> None:
    with pytest.raises(InvalidParameterError, match="f"):
        group_privacy(lambda a: 1 - a, 2)  # type: ignore[arg-type]
    with pytest.raises(ResourceLimitError, match="group_size"):
        group_privacy(polygon_below(GaussianTradeoff(1.0)), 1000, max_vertices=10_000)
