"""The smallest mu with G_mu <= f: exactness on Gaussian curves, certification, the eps-DP case.

Oracles: for f = f_{eps, 0} the binding vertex is the corner c = 1 / (1 + e^eps), so mu solves
G_mu(c) = c, solved here in mpmath (an independent root finding at 40 digits); vertices placed
on G_mu itself must give mu back; the composed Gaussian PLD must give about sqrt(T) / sigma
(T Gaussian steps are sqrt(T)/sigma-GDP, Dong, Roth, Su 2019, Cor. 3.3 with Thm 2.7).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.accountants.pld import PldAccountant
from dpcore.errors import InvalidParameterError
from dpcore.events import GaussianEvent
from dpcore.tradeoff import (
    EpsilonDeltaTradeoff,
    GaussianTradeoff,
    IdentityTradeoff,
    PiecewiseLinearTradeoff,
    group_privacy,
    polygon_below,
    smallest_gdp_mu,
)

GRID = np.linspace(0.0, 1.0, 4001)


def _mp_pure_dp_mu(epsilon: float) -> float:
    """mu with Phi(Phi^{-1}(1 - c) - mu) = c, c = 1 / (1 + e^eps), by mpmath root finding."""
    with mpmath.workdps(40):
        c = 1 / (1 + mpmath.exp(mpmath.mpf(epsilon)))
        upper = -mpmath.sqrt(2) * mpmath.erfinv(2 * c - 1)  # Phi^{-1}(1 - c)

        def gap(mu: mpmath.mpf) -> mpmath.mpf:
            return mpmath.ncdf(upper - mu) - c

        return float(mpmath.findroot(gap, mpmath.mpf(epsilon) / 2))


@pytest.mark.parametrize("mu", [0.0, 0.3, 1.0, 2.5, 7.0])
def test_gaussian_closed_form_fits_back_exactly(mu: float) -> None:
    assert smallest_gdp_mu(GaussianTradeoff(mu)) == mu


@settings(max_examples=25, deadline=None)
@given(mu=st.floats(min_value=0.05, max_value=5.0), size=st.integers(min_value=3, max_value=400))
def test_polygon_with_vertices_on_g_mu_fits_back(mu: float, size: int) -> None:
    # Vertices on the convex G_mu: the chords lie above it, so G_mu <= polygon, tight at the
    # vertices; the fit is mu up to the rounding margin.
    alpha = np.linspace(0.0, 1.0, size)
    polygon = PiecewiseLinearTradeoff(alpha, GaussianTradeoff(mu)(alpha), hull=True)
    assert smallest_gdp_mu(polygon) == pytest.approx(mu, abs=1e-9)


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0, 8.0])
def test_pure_dp_curve_gives_the_known_mu(epsilon: float) -> None:
    ours = smallest_gdp_mu(EpsilonDeltaTradeoff(epsilon, 0.0))
    oracle = _mp_pure_dp_mu(epsilon)
    assert oracle <= ours <= oracle + 1e-9
    # Closed form of the same condition: mu = 2 Phi^{-1}(e^eps / (1 + e^eps)).
    assert ours == pytest.approx(2 * float(mpmath.sqrt(2) * mpmath.erfinv(math.tanh(epsilon / 2))))


@pytest.mark.parametrize(
    "f",
    [
        EpsilonDeltaTradeoff(1.0, 0.0),
        PiecewiseLinearTradeoff([0.0, 0.05, 0.3, 1.0], [1.0, 0.5, 0.1, 0.0]),
        PiecewiseLinearTradeoff(
            np.linspace(0, 1, 51), GaussianTradeoff(1.2)(np.linspace(0, 1, 51)), hull=True
        ),
    ],
    ids=["pure", "polygon", "gaussian chords"],
)
def test_fit_is_certified_and_tight(f: PiecewiseLinearTradeoff) -> None:
    mu = smallest_gdp_mu(f)
    alpha, beta = f.points()
    assert np.all(GaussianTradeoff(mu)(alpha) <= beta)  # at the vertices ...
    assert np.all(GaussianTradeoff(mu)(GRID) <= f(GRID) + 1e-15)  # ... hence everywhere
    # Tight: a slightly smaller mu fails at some vertex.
    assert np.any(GaussianTradeoff(mu * (1 - 1e-6))(alpha) > beta)


def test_a_curve_that_is_not_gdp_gives_inf() -> None:
    assert math.isinf(smallest_gdp_mu(EpsilonDeltaTradeoff(1.0, 0.01)))  # f(0) = 0.99 < 1
    zero_early = PiecewiseLinearTradeoff([0.0, 0.5, 1.0], [1.0, 0.0, 0.0])
    assert math.isinf(smallest_gdp_mu(zero_early))  # G_mu > 0 before alpha = 1
    # A slack as large as delta makes (eps, delta)-DP curves fit.
    assert math.isfinite(smallest_gdp_mu(EpsilonDeltaTradeoff(1.0, 0.01), slack=0.01))


def test_slack_is_an_additive_allowance() -> None:
    f = EpsilonDeltaTradeoff(1.0, 0.0)
    strict, relaxed = smallest_gdp_mu(f), smallest_gdp_mu(f, slack=0.01)
    assert relaxed < strict
    alpha, beta = f.points()
    assert np.all(GaussianTradeoff(relaxed)(alpha) <= beta + 0.01)


def test_perfect_privacy_is_zero() -> None:
    assert smallest_gdp_mu(IdentityTradeoff()) == 0.0
    assert smallest_gdp_mu(EpsilonDeltaTradeoff(0.0, 0.0)) == 0.0


def test_group_privacy_of_gdp_refits_to_k_mu() -> None:
    # Thm 2.14's Gaussian case through the polygon route: a polygon below G_0.4, grouped by 3.
    grouped = group_privacy(polygon_below(GaussianTradeoff(0.4)), 3)
    # Its far tail is at float resolution: 1 - f rounds to 1 where f < 1e-16, so the curve
    # reaches 0 a rounding error before alpha = 1 and no finite mu fits it strictly ...
    assert math.isinf(smallest_gdp_mu(grouped))
    # ... while an allowance far below any delta of interest gives a mu of at least 1.2 (the
    # polygon is below G_0.4, so the group's curve is below G_1.2) and close to it.
    mu = smallest_gdp_mu(grouped, slack=1e-12)
    assert 1.2 <= mu < 1.2 * 1.01


def test_composed_gaussian_pld_fits_sqrt_count_over_sigma() -> None:
    sigma, count = 2.0, 4  # sqrt(4) / 2 = 1-GDP
    accountant = PldAccountant().compose(GaussianEvent(sigma), count)
    pessimistic, _ = accountant.composed_pmfs(1e-3)[0]
    f = PiecewiseLinearTradeoff.from_points(*pessimistic.tradeoff_vertices())
    # A grid PLD's far tail is rounded (its Q masses can sum to a little more than 1, so the
    # curve may reach 0 before alpha = 1 and no finite mu fits it strictly); with an additive
    # allowance of 1e-7 it is mu-GDP for mu close to 1.
    relaxed = smallest_gdp_mu(f, slack=1e-7)
    assert relaxed == pytest.approx(math.sqrt(count) / sigma, abs=1e-3)
    assert smallest_gdp_mu(f) >= relaxed  # a smaller allowance never gives a smaller mu


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan, "0"])
def test_bad_slack(bad: object) -> None:
    with pytest.raises(InvalidParameterError, match="slack"):
        smallest_gdp_mu(GaussianTradeoff(1.0), slack=bad)  # type: ignore[arg-type]


def test_bad_function() -> None:
    with pytest.raises(InvalidParameterError, match="f"):
        smallest_gdp_mu(0.5)  # type: ignore[arg-type]
