"""Operations: validity of every produced curve, composition accuracy and direction, C_q."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.errors import InvalidParameterError
from dpcore.tradeoff import (
    EpsilonDeltaTradeoff,
    GaussianTradeoff,
    IdentityTradeoff,
    PiecewiseLinearTradeoff,
    TradeoffFunction,
    compose,
    convex_hull,
    inverse,
    minimum_hull,
    poisson_subsample,
    polygon_below,
    self_compose,
    symmetrise,
)

GRID = np.linspace(0.0, 1.0, 801)
mus = st.floats(min_value=0.05, max_value=4.0)
epsilons = st.floats(min_value=0.0, max_value=4.0)
deltas = st.floats(min_value=0.0, max_value=0.2)
rates = st.floats(min_value=0.0, max_value=1.0)
#: An asymmetric tradeoff function (f != f^{-1}).
ASYMMETRIC = PiecewiseLinearTradeoff([0.0, 0.1, 1.0], [0.6, 0.2, 0.0])


@st.composite
def produced(draw: st.DrawFn) -> TradeoffFunction:
    kind = draw(
        st.sampled_from(
            ["subsampled", "symmetrised", "composed", "self_composed", "inverse", "hull"]
        )
    )
    if kind == "subsampled":
        return poisson_subsample(GaussianTradeoff(draw(mus)), draw(rates))
    if kind == "symmetrised":
        return symmetrise(EpsilonDeltaTradeoff(draw(epsilons), draw(deltas)))
    if kind == "composed":
        return compose(
            GaussianTradeoff(draw(mus)),
            EpsilonDeltaTradeoff(draw(epsilons), draw(deltas)),
            grid_spacing=5e-3,
        )
    if kind == "self_composed":
        inner = poisson_subsample(GaussianTradeoff(draw(mus)), draw(rates))
        return self_compose(inner, draw(st.integers(1, 20)), grid_spacing=5e-3)
    if kind == "inverse":
        return inverse(GaussianTradeoff(draw(mus)))
    return convex_hull(GaussianTradeoff(draw(mus)))


@settings(max_examples=40, deadline=None)
@given(f=produced())
def test_every_produced_function_is_a_tradeoff_function(
    f: TradeoffFunction, assert_tradeoff_function: Callable[[TradeoffFunction], None]
) -> None:
    assert_tradeoff_function(f)


@pytest.mark.parametrize(("mu", "nu"), [(1.0, 0.7), (0.3, 0.3), (2.0, 0.5), (3.0, 3.0)])
def test_gaussian_composition_matches_closed_form_from_below(mu: float, nu: float) -> None:
    # G_mu ⊗ G_nu = G_{sqrt(mu^2 + nu^2)} (Dong, Roth, Su 2019, Cor. 3.3). The numerical curve
    # is pessimistic (never above, up to 1e-12) and, at the default spacing 1e-3, within 2e-5
    # (measured: 6e-7 for (1, 0.7), 8e-6 for (3, 3), worst near alpha = 0).
    exact = GaussianTradeoff(math.hypot(mu, nu))(GRID)
    numeric = compose(GaussianTradeoff(mu), GaussianTradeoff(nu))(GRID)
    assert np.all(numeric <= exact + 1e-12)
    assert np.max(exact - numeric) < 2e-5


def test_self_composition_of_small_gaussians() -> None:
    # 100 x G_0.1 = G_1; measured gap 4e-6 at spacing 1e-3. delta(1) is then an upper bound.
    f = self_compose(GaussianTradeoff(0.1), 100)
    exact = GaussianTradeoff(1.0)
    assert np.all(f(GRID) <= exact(GRID) + 1e-12) and np.max(exact(GRID) - f(GRID)) < 1e-5
    assert exact.delta(1.0) <= f.delta(1.0) <= exact.delta(1.0) + 1e-5
    assert isinstance(self_compose(GaussianTradeoff(1.0), 0), IdentityTradeoff)


def test_composition_with_identity_changes_nothing() -> None:
    g = GaussianTradeoff(1.5)
    f = compose(g, IdentityTradeoff())(GRID)
    assert np.all(f <= g(GRID) + 1e-12) and np.max(g(GRID) - f) < 1e-5


def test_composition_of_pure_dp_against_the_product_pair() -> None:
    # f_{0.5,0} is T of a two-outcome pair with losses +-0.5 (Kairouz, Oh, Viswanath 2015); the
    # product pair has losses +1, 0, -1 with P-masses h^2, 2hl, l^2, so delta(0.2) = h^2 (1 -
    # e^{0.2 - 1}). Numerical composition errs upwards only.
    f = EpsilonDeltaTradeoff(0.5, 0.0)
    heavy = math.exp(0.5) / (1 + math.exp(0.5))
    exact = heavy**2 * (1 - math.exp(0.2 - 1.0))
    numeric = compose(f, f).delta(0.2)
    assert exact - 1e-12 <= numeric <= exact + 1e-6


def test_subsampling_boundaries() -> None:
    g = GaussianTradeoff(1.0)
    full = poisson_subsample(g, 1.0)(GRID)
    # q = 1 gives symmetrise(G_mu) = G_mu; the polygon below G_mu is within 2e-6 of it.
    assert np.all(full <= g(GRID) + 1e-12) and np.max(g(GRID) - full) < 5e-6
    assert np.max(np.abs(poisson_subsample(g, 0.0)(GRID) - (1 - GRID))) < 1e-12


def test_subsampling_is_symmetric_and_weaker_than_the_mechanism() -> None:
    f = poisson_subsample(GaussianTradeoff(2.0), 0.1)
    assert np.max(np.abs(inverse(f)(GRID) - f(GRID))) < 1e-6
    assert np.all(f(GRID) >= GaussianTradeoff(2.0)(GRID) - 1e-9)


@settings(max_examples=15, deadline=None)
@given(mus, rates, rates)
def test_subsampling_is_monotone_in_the_rate(mu: float, q1: float, q2: float) -> None:
    low, high = sorted((q1, q2))
    g = GaussianTradeoff(mu)
    assert np.all(poisson_subsample(g, low)(GRID) >= poisson_subsample(g, high)(GRID) - 1e-9)


def test_inverse_and_symmetrise_of_an_asymmetric_curve() -> None:
    inv = inverse(ASYMMETRIC)
    # f^{-1}(f(t)) = t on the strictly decreasing part.
    t = np.linspace(0, 1, 50)
    assert np.allclose(inv(ASYMMETRIC(t)), t, atol=1e-12)
    assert np.allclose(inverse(inv)(GRID), ASYMMETRIC(GRID), atol=1e-12)
    s = symmetrise(ASYMMETRIC)
    assert np.allclose(inverse(s)(GRID), s(GRID), atol=1e-12)
    assert np.all(s(GRID) <= np.minimum(ASYMMETRIC(GRID), inv(GRID)) + 1e-12)
    assert np.array_equal(ASYMMETRIC.symmetrise()(GRID), s(GRID))


def test_inverse_of_gaussian_is_gaussian_from_below() -> None:
    g = GaussianTradeoff(1.0)
    inv = inverse(g)(GRID)
    assert np.all(inv <= g(GRID) + 1e-12) and np.max(g(GRID) - inv) < 5e-6


def test_hulls() -> None:
    g = GaussianTradeoff(2.0)
    assert np.all(polygon_below(g)(GRID) <= g(GRID))
    assert np.array_equal(convex_hull(ASYMMETRIC)(GRID), ASYMMETRIC(GRID))
    first, second = EpsilonDeltaTradeoff(1.0, 0.0), EpsilonDeltaTradeoff(0.2, 0.1)
    lower = minimum_hull(first, second)
    assert np.all(lower(GRID) <= np.minimum(first(GRID), second(GRID)) + 1e-12)
    # alpha = 0 is an extreme point: the hull equals the minimum there.
    assert lower(0.0) == pytest.approx(0.9, abs=1e-12)


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: poisson_subsample(GaussianTradeoff(1.0), 1.5), "sampling_probability"),
        (lambda: poisson_subsample(GaussianTradeoff(1.0), -0.1), "sampling_probability"),
        (lambda: poisson_subsample(GaussianTradeoff(1.0), math.nan), "sampling_probability"),
        (lambda: self_compose(GaussianTradeoff(1.0), -1), "count"),
        (lambda: self_compose(GaussianTradeoff(1.0), 2.0), "count"),
        (lambda: compose(GaussianTradeoff(1.0), GaussianTradeoff(1.0), grid_spacing=0), "grid"),
        (lambda: compose(GaussianTradeoff(1.0), 0.5), "g"),
        (lambda: inverse(lambda a: 1 - a), "f"),
    ],
)
def test_bad_inputs(call, parameter: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        call()
