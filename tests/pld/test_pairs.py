"""Single-step grid PLDs bracket the exact hockey-stick divergence of each mechanism."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpcore.mechanisms.gaussian import gaussian_delta
from dpcore.pld.pairs import epsilon_delta_pair, laplace_pair, subsampled_gaussian_pairs
from tests.pld.oracle import hockey_stick

SPACING = 1e-3


_hockey_stick = hockey_stick


def _normal(mean: float, sigma: float):
    return lambda x: mpmath.npdf(x, mean, sigma)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("epsilon", [0.0, 0.5, 2.0])
def test_gaussian_bracket_contains_analytic_delta(sigma: float, epsilon: float) -> None:
    remove, add = subsampled_gaussian_pairs(sampling_probability=1.0, noise_multiplier=sigma)
    exact = gaussian_delta(noise_multiplier=sigma, epsilon=epsilon)  # Balle & Wang 2018, Thm 8
    for pair in (remove, add):
        upper = pair.pessimistic(SPACING).delta(epsilon)
        lower = pair.optimistic(SPACING).delta(epsilon)
        assert lower <= exact * (1 + 1e-12) + 1e-15
        assert exact <= upper * (1 + 1e-12) + 1e-15
        assert upper - lower <= 1e-3 * exact + 1e-12


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (0.1, 0.6), (0.5, 2.0)])
@pytest.mark.parametrize("epsilon", [0.01, 0.3, 1.5])
def test_subsampled_gaussian_bracket_contains_quadrature(
    q: float, sigma: float, epsilon: float
) -> None:
    mixture = lambda x: (1 - q) * mpmath.npdf(x, 0, sigma) + q * mpmath.npdf(x, 1, sigma)  # noqa: E731
    base = _normal(0.0, sigma)
    # Remove direction: P = mixture, Q = N(0, s^2); add direction swaps them.
    exact_remove = _hockey_stick(mixture, base, epsilon, [0.0, 0.5, 1.0])
    exact_add = _hockey_stick(base, mixture, epsilon, [0.0, 0.5, 1.0])
    remove, add = subsampled_gaussian_pairs(sampling_probability=q, noise_multiplier=sigma)
    for pair, exact in ((remove, exact_remove), (add, exact_add)):
        upper = pair.pessimistic(SPACING).delta(epsilon)
        lower = pair.optimistic(SPACING).delta(epsilon)
        assert lower <= exact * (1 + 1e-9) + 1e-14
        assert exact <= upper * (1 + 1e-9) + 1e-14
        # A bracket narrower than 0.2% or, for deltas at the edge of the loss range, 1e-10 absolute.
        assert upper - lower <= 2e-3 * exact + 1e-10


@pytest.mark.parametrize("scale", [0.5, 1.0, 4.0])
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.9])
def test_laplace_bracket_contains_quadrature(scale: float, fraction: float) -> None:
    epsilon = fraction / scale
    p_pdf = lambda x: mpmath.exp(-abs(x) / scale) / (2 * scale)  # noqa: E731
    q_pdf = lambda x: mpmath.exp(-abs(x - 1) / scale) / (2 * scale)  # noqa: E731
    exact = _hockey_stick(p_pdf, q_pdf, epsilon, [0.0, 1.0])
    pair = laplace_pair(noise_multiplier=scale)
    upper = pair.pessimistic(SPACING).delta(epsilon)
    lower = pair.optimistic(SPACING).delta(epsilon)
    assert lower <= exact * (1 + 1e-9) + 1e-14 <= upper * (1 + 2e-9) + 3e-14
    assert upper - lower <= 2e-3


def test_laplace_is_pure_dp_at_one_over_scale() -> None:
    pmf = laplace_pair(noise_multiplier=2.0).pessimistic(SPACING)
    assert pmf.delta(0.5 + SPACING) == pytest.approx(0.0, abs=1e-15)
    assert pmf.infinity_mass == 0.0


@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 0.0), (0.5, 1e-6), (3.0, 0.01)])
def test_epsilon_delta_pair_reproduces_f_epsilon_delta(epsilon: float, delta: float) -> None:
    upper, lower = epsilon_delta_pair(epsilon=epsilon, delta=delta, grid_spacing=SPACING)
    for probe in (0.0, epsilon / 2):
        # delta(e') of f_{eps, delta}: delta + (1 - delta)(e^eps - e^e') / (1 + e^eps), e' <= eps.
        exact = delta + (1 - delta) * (math.exp(epsilon) - math.exp(probe)) / (
            1 + math.exp(epsilon)
        )
        assert lower.delta(probe) <= exact + 1e-15 <= upper.delta(probe) + 2e-15
        assert upper.delta(probe) - lower.delta(probe) <= 2 * SPACING
    assert upper.delta(epsilon + SPACING) == pytest.approx(delta, abs=1e-15)


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (0.2, 0.7), (1.0, 2.0)])
def test_pessimistic_pmf_is_a_probability_distribution(q: float, sigma: float) -> None:
    for pair in subsampled_gaussian_pairs(sampling_probability=q, noise_multiplier=sigma):
        pmf = pair.pessimistic(SPACING)
        assert np.all(pmf.pmf >= 0)
        assert pmf.pmf.sum() + pmf.infinity_mass == pytest.approx(1.0, abs=1e-12)
        # The implied Q-measure must not exceed one either.
        assert float(pmf.pmf @ np.exp(-pmf.losses())) <= 1.0 + 1e-12
        optimistic = pair.optimistic(SPACING)
        assert optimistic.pmf.sum() + optimistic.infinity_mass <= 1.0 + 1e-12
