"""Tradeoff functions: validity (hypothesis), closed forms, operations, conversions."""

from __future__ import annotations

import math

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
    TradeoffFunction,
    compose,
    convex_hull,
    from_epsilon_delta_curve,
    from_samples,
    inverse,
    poisson_subsample,
    polygon_below,
    self_compose,
    symmetrise,
    to_epsilon_delta_curve,
)

GRID = np.linspace(0.0, 1.0, 801)
mus = st.floats(min_value=0.05, max_value=4.0)
epsilons = st.floats(min_value=0.0, max_value=4.0)
deltas = st.floats(min_value=0.0, max_value=0.2)
rates = st.floats(min_value=0.0, max_value=1.0)


def assert_valid(f: TradeoffFunction) -> None:
    """Convex, non-increasing, within [0, 1 - alpha] (Dong, Roth, Su 2019, Prop. 2.2)."""
    beta = f(GRID)
    assert np.all(beta >= 0) and np.all(beta <= 1 - GRID + 1e-12)
    assert np.all(np.diff(beta) <= 1e-12)
    assert np.all(np.diff(beta, 2) >= -1e-9)


@st.composite
def tradeoffs(draw: st.DrawFn) -> TradeoffFunction:
    kind = draw(
        st.sampled_from(
            [
                "gaussian",
                "eps_delta",
                "subsampled",
                "symmetrised",
                "composed",
                "envelope",
                "identity",
            ]
        )
    )
    if kind == "gaussian":
        return GaussianTradeoff(draw(mus))
    if kind == "eps_delta":
        return EpsilonDeltaTradeoff(draw(epsilons), draw(deltas))
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
    if kind == "envelope":
        eps = np.linspace(0, draw(epsilons) + 0.1, 5)
        return from_epsilon_delta_curve(eps, [gdp_delta(mu=1.0, epsilon=float(e)) for e in eps])
    return IdentityTradeoff()


@settings(max_examples=60, deadline=None)
@given(tradeoffs())
def test_every_produced_function_is_a_tradeoff_function(f: TradeoffFunction) -> None:
    assert_valid(f)


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.floats(min_value=-3, max_value=3), min_size=5, max_size=200),
    st.floats(min_value=0, max_value=2),
)
def test_empirical_curves_are_tradeoff_functions(samples: list[float], shift: float) -> None:
    f = from_samples(samples, [s + shift for s in samples])
    assert_valid(f)


@pytest.mark.parametrize(("mu", "nu"), [(1.0, 0.7), (0.3, 0.3), (2.0, 0.5)])
def test_gaussian_composition_matches_closed_form_from_below(mu: float, nu: float) -> None:
    # G_mu ⊗ G_nu = G_{sqrt(mu^2 + nu^2)} (Dong, Roth, Su 2019, Cor. 3.3); ours is pessimistic.
    exact = GaussianTradeoff(math.hypot(mu, nu))(GRID)
    numeric = compose(GaussianTradeoff(mu), GaussianTradeoff(nu))(GRID)
    assert np.all(numeric <= exact + 1e-7)
    assert np.max(exact - numeric) < 2e-3


def test_self_composition_of_small_gaussians() -> None:
    numeric = self_compose(GaussianTradeoff(0.1), 100)(GRID)
    exact = GaussianTradeoff(1.0)(GRID)
    assert np.all(numeric <= exact + 1e-7) and np.max(exact - numeric) < 2e-3
    assert isinstance(self_compose(GaussianTradeoff(1.0), 0), IdentityTradeoff)


@pytest.mark.parametrize("mu", [0.5, 1.0, 3.0])
def test_gaussian_delta_is_gdp_delta(mu: float) -> None:
    f = GaussianTradeoff(mu)
    for epsilon in (0.0, 0.5, 2.0):
        assert f.delta(epsilon) == gdp_delta(mu=mu, epsilon=epsilon)
        # The generic conjugate on the pessimistic polygon agrees and errs upwards only.
        polygon = polygon_below(f).delta(epsilon)
        assert f.delta(epsilon) <= polygon <= f.delta(epsilon) + 1e-5


@settings(max_examples=30, deadline=None)
@given(mus, st.floats(min_value=1e-8, max_value=0.3))
def test_epsilon_delta_round_trip(mu: float, delta: float) -> None:
    f = polygon_below(GaussianTradeoff(mu))
    epsilon = f.epsilon(delta)
    assert f.delta(epsilon) <= delta * (1 + 1e-9) + 1e-15
    curve = to_epsilon_delta_curve(f, [epsilon])
    assert curve[0] == pytest.approx(f.delta(epsilon))


def test_subsampling_boundaries() -> None:
    g = GaussianTradeoff(1.0)
    full = poisson_subsample(g, 1.0)(GRID)
    # The polygon below G_mu and its inverse are both pessimistic, by at most ~1e-6 here.
    assert np.all(full <= g(GRID) + 1e-12) and np.max(g(GRID) - full) < 1e-5
    assert np.max(np.abs(poisson_subsample(g, 0.0)(GRID) - (1 - GRID))) < 1e-12


def test_subsampling_is_symmetric_and_weaker_than_the_mechanism() -> None:
    f = poisson_subsample(GaussianTradeoff(2.0), 0.1)
    assert np.max(np.abs(inverse(f)(GRID) - f(GRID))) < 1e-6
    assert np.all(f(GRID) >= GaussianTradeoff(2.0)(GRID) - 1e-9)


def test_epsilon_delta_tradeoff_is_its_own_inverse_and_hull() -> None:
    f = EpsilonDeltaTradeoff(1.0, 0.01)
    assert np.max(np.abs(inverse(f)(GRID) - f(GRID))) < 1e-12
    assert np.max(np.abs(convex_hull(f)(GRID) - f(GRID))) < 1e-12
    assert f.delta(1.0) == pytest.approx(0.01)


def test_from_samples_approaches_the_gaussian_curve() -> None:
    rng = np.random.default_rng(20260101)
    f = from_samples(rng.normal(0, 1, 200_000), rng.normal(1, 1, 200_000))
    # Kolmogorov-type error of empirical CDFs with 2e5 samples is ~ 1/sqrt(n) ~ 0.002.
    assert np.max(np.abs(f(GRID) - GaussianTradeoff(1.0)(GRID))) < 0.01


def test_envelope_of_gaussian_profile_recovers_the_curve() -> None:
    eps = np.linspace(0, 8, 400)
    f = from_epsilon_delta_curve(eps, [gdp_delta(mu=1.0, epsilon=float(e)) for e in eps])
    g = GaussianTradeoff(1.0)(GRID)
    assert np.all(f(GRID) <= g + 1e-9)  # implied curves are never above the true one
    assert np.max(g - f(GRID)) < 0.01


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: GaussianTradeoff(1.0)(1.5), "alpha"),
        (lambda: GaussianTradeoff(1.0)(-0.1), "alpha"),
        (lambda: GaussianTradeoff(1.0)(math.nan), "alpha"),
        (lambda: GaussianTradeoff(-1.0), "mu"),
        (lambda: EpsilonDeltaTradeoff(-1.0), "epsilon"),
        (lambda: EpsilonDeltaTradeoff(1.0, 1.0), "delta"),
        (lambda: poisson_subsample(GaussianTradeoff(1.0), 1.5), "sampling_probability"),
        (lambda: GaussianTradeoff(1.0).delta(-1.0), "epsilon"),
        (lambda: GaussianTradeoff(1.0).epsilon(0.0), "delta"),
        (lambda: PiecewiseLinearTradeoff([0, 0.5, 1], [1, 0.2, 0.1]), "beta_vertices"),
        (lambda: PiecewiseLinearTradeoff([0, 0.5, 1], [0.5, 0.4, 0.0]), "beta_vertices"),
        (lambda: PiecewiseLinearTradeoff([0, 0.6, 0.5, 1], [1, 0.3, 0.2, 0]), "alpha_vertices"),
        (lambda: self_compose(GaussianTradeoff(1.0), -1), "count"),
        (lambda: from_samples([], [1.0]), "samples"),
    ],
)
def test_bad_inputs(call, parameter: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        call()
