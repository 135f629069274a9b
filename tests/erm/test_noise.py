"""The noise laws. Each statistical test rejects a correct sampler with probability <= 1e-5.

Seeds are fixed, so every run sees the same draws; the 1e-5 is the chance that a correct
implementation would have failed for the seed chosen.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpcore.erm.noise import analytic_gaussian_sigma, sample_norm_laplace
from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_delta

ALPHA = 1e-5


def check_norm_laplace_law(draws: np.ndarray, *, scale: float) -> None:
    """||b|| ~ Gamma(d, scale) and b/||b|| uniform on the sphere (two tests at ALPHA/2 each)."""
    d = draws.shape[1]
    norms = np.linalg.norm(draws, axis=1)
    assert stats.kstest(norms, stats.gamma(a=d, scale=scale).cdf).pvalue > ALPHA / 2
    # Uniform direction: (u . e + 1)/2 ~ Beta((d-1)/2, (d-1)/2) for d >= 2, sign for d = 1.
    first = draws[:, 0] / norms
    if d == 1:
        assert stats.binomtest(int(np.sum(first > 0)), first.size).pvalue > ALPHA / 2
    else:
        law = stats.beta((d - 1) / 2, (d - 1) / 2)
        assert stats.kstest((first + 1) / 2, law.cdf).pvalue > ALPHA / 2


@pytest.mark.parametrize(("dimension", "scale", "seed"), [(1, 2.0, 0), (3, 0.5, 1), (20, 1.5, 2)])
def test_norm_laplace_law(dimension: int, scale: float, seed: int) -> None:
    draws = sample_norm_laplace(dimension, scale=scale, rng=np.random.default_rng(seed), size=4000)
    check_norm_laplace_law(draws, scale=scale)


def test_norm_laplace_rejects_bad_input() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidParameterError, match="Expected scale > 0"):
        sample_norm_laplace(2, scale=-1.0, rng=rng)
    with pytest.raises(InvalidParameterError, match="Expected dimension >= 1"):
        sample_norm_laplace(0, scale=1.0, rng=rng)


@pytest.mark.parametrize(("epsilon", "delta"), [(0.1, 1e-5), (1.0, 1e-6), (8.0, 1e-3)])
def test_analytic_gaussian_is_tight(epsilon: float, delta: float) -> None:
    sigma = analytic_gaussian_sigma(sensitivity=2.0, epsilon=epsilon, delta=delta)
    assert gdp_delta(mu=2.0 / sigma, epsilon=epsilon) <= delta
    assert gdp_delta(mu=2.0 / (sigma * (1 - 1e-6)), epsilon=epsilon) > delta * (1 - 1e-4)
    classical = 2.0 * np.sqrt(2 * np.log(1.25 / delta)) / epsilon
    if epsilon < 1:
        assert sigma <= classical  # never worse than Dwork & Roth Thm A.1 where it applies


def test_analytic_gaussian_rejects_bad_delta() -> None:
    with pytest.raises(InvalidParameterError, match=r"Expected delta in \(0, 1\)"):
        analytic_gaussian_sigma(sensitivity=1.0, epsilon=1.0, delta=1.0)
