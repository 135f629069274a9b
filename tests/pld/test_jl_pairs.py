"""One DP-SGD-JL step: discretisation direction, tradeoff validity, Monte-Carlo agreement."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from dpcore.pld.jl_pairs import jl_shift_mixture, jl_step_pairs


@pytest.mark.parametrize("r", [1, 4, 30])
def test_pessimistic_shifts_dominate_optimistic_ones(r: int) -> None:
    """Same bins: the pessimistic law is stochastically larger (and keeps 1e-13 unbounded)."""
    high, high_w, unbounded = jl_shift_mixture(jl_dimension=r, pessimistic=True)
    low, low_w, none = jl_shift_mixture(jl_dimension=r, pessimistic=False)
    assert unbounded == pytest.approx(1e-13) and none == 0.0
    assert high_w.sum() + unbounded == pytest.approx(1.0, abs=1e-12)
    assert low_w.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(high >= low[1:] - 1e-12)  # bin k's lower-X end vs its upper-X end


@settings(max_examples=8, deadline=None)
@given(
    r=st.integers(2, 64),
    sigma=st.floats(0.6, 4.0),
    q=st.floats(0.05, 1.0),
)
def test_one_step_tradeoff_curves_are_valid(r: int, sigma: float, q: float) -> None:
    """Convex, non-increasing, below 1 - alpha, for both discretisations and directions."""
    for pessimistic in (True, False):
        for pair in jl_step_pairs(
            sampling_probability=q,
            noise_multiplier=sigma,
            jl_dimension=r,
            pessimistic=pessimistic,
            bins=80,
        ):
            pmf = pair.pessimistic(2e-2) if pessimistic else pair.optimistic(2e-2)
            alpha, beta = pmf.tradeoff_vertices()
            assert np.all(np.diff(alpha) >= -1e-12) and np.all(np.diff(beta) <= 1e-9)
            assert np.all(beta <= 1 - alpha + 1e-9)
            slopes = np.diff(beta)[np.diff(alpha) > 1e-9] / np.diff(alpha)[np.diff(alpha) > 1e-9]
            assert np.all(np.diff(slopes) >= -1e-6 * (1 + np.abs(slopes[1:])))


def _true_loss(y: np.ndarray, r: int, sigma: float) -> np.ndarray:
    """log E_X exp((2 S y - S^2) / (2 s^2)), S = sqrt(r / X), by a 2,000-point midpoint rule."""
    u = (np.arange(2_000) + 0.5) / 2_000
    shifts = np.sqrt(r / stats.chi2.ppf(u, r))
    out = np.empty_like(y)
    for start in range(0, y.size, 10_000):
        part = y[start : start + 10_000]
        exponents = (2 * np.outer(part, shifts) - shifts**2) / (2 * sigma**2)
        out[start : start + 10_000] = special.logsumexp(exponents, axis=1) - math.log(shifts.size)
    return out


def test_monte_carlo_delta_lies_in_the_certified_bracket() -> None:
    """Unsampled step, r = 6, sigma = 2: delta(eps) = E_P[(1 - e^{eps - L})_+] estimated from
    50,000 draws of the true mechanism lies within 5 standard errors of [optimistic,
    pessimistic] (a correct bracket fails this with probability < 1e-6 per epsilon)."""
    r, sigma = 6, 2.0
    rng = np.random.default_rng(0)
    x = rng.chisquare(r, 50_000)
    y = np.sqrt(r / x) + sigma * rng.standard_normal(x.size)
    losses = _true_loss(y, r, sigma)
    upper, _ = jl_step_pairs(
        sampling_probability=1.0, noise_multiplier=sigma, jl_dimension=r, pessimistic=True
    )
    lower, _ = jl_step_pairs(
        sampling_probability=1.0, noise_multiplier=sigma, jl_dimension=r, pessimistic=False
    )
    high_pmf, low_pmf = upper.pessimistic(5e-3), lower.optimistic(5e-3)
    for epsilon in (0.1, 0.5, 1.0, 2.0):
        terms = np.maximum(0.0, -np.expm1(epsilon - losses))
        estimate, error = terms.mean(), terms.std() / math.sqrt(terms.size)
        assert low_pmf.delta(epsilon) - 5 * error <= estimate <= high_pmf.delta(epsilon) + 5 * error
