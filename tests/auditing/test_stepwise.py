"""Per-step distinguishing: the threshold route (default) and the Gaussian-scores route."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpcore.auditing.gaussian_scores import gaussian_mu_lower_bound
from dpcore.auditing.stepwise import (
    composed_lower_bound,
    distinguish,
    held_out_threshold_bound,
    mu_ratio_for_epsilon_ratio,
    two_tailed_grid,
)
from dpcore.errors import InvalidParameterError

SETTINGS = {"delta": 1e-5, "confidence": 0.95, "held_out_fraction": 0.2}


def test_default_route_is_the_threshold_route() -> None:
    rng = np.random.default_rng(0)
    negative, positive = rng.normal(0, 1, 3000), rng.normal(1, 1, 3000)
    default = distinguish(negative, positive, seed=4, **SETTINGS)  # type: ignore[arg-type]
    bound, threshold = held_out_threshold_bound(
        negative, positive, seed=4, grid=two_tailed_grid, route="gdp", **SETTINGS
    )  # type: ignore[arg-type]
    assert default == (bound.mu_lower, threshold)
    explicit = distinguish(negative, positive, seed=4, route="threshold", **SETTINGS)  # type: ignore[arg-type]
    assert explicit == default
    assert math.isfinite(default[1])


@pytest.mark.parametrize(("n0", "n1"), [(500, 500), (2000, 200), (200, 50)])
def test_gaussian_route_is_tighter_at_the_same_sample_size(n0: int, n1: int) -> None:
    # Scores of a correct DP-SGD step at sigma = 1 (mu = 1); fewer positives = the canary
    # sampled in a fraction of the steps. On the same scores, over 10 seeds, the Gaussian route
    # is larger on at least 8 and at least 10% larger on average (measured over 20 seeds: mean
    # 0.82 against 0.73 at 500/500, 0.83 against 0.69 at 2000/200, 0.59 against 0.29 at
    # 200/50); both stay below mu = 1 (validity: test_gaussian_scores.py, test_statistics.py).
    thresholds, gaussians = [], []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        negative, positive = rng.normal(0, 1, n0), rng.normal(1, 1, n1)
        threshold_mu, _ = distinguish(negative, positive, seed=seed, **SETTINGS)  # type: ignore[arg-type]
        gaussian_mu, threshold = distinguish(
            negative,
            positive,
            seed=seed,
            route="gaussian",
            **SETTINGS,  # type: ignore[arg-type]
        )
        assert math.isnan(threshold)
        assert max(threshold_mu, gaussian_mu) < 1.0
        expected = gaussian_mu_lower_bound(negative, positive, confidence=0.95, two_sided=True)
        assert gaussian_mu == expected.mu_lower
        thresholds.append(threshold_mu)
        gaussians.append(gaussian_mu)
    assert sum(g > t for g, t in zip(gaussians, thresholds, strict=True)) >= 8
    assert np.mean(gaussians) >= 1.1 * np.mean(thresholds)
    # The larger mu_lb composes to a larger epsilon_lb (DP-SGD, q = 0.1, 100 steps).
    assert composed_lower_bound(0.1, float(np.mean(gaussians)), 100, 1e-5) > (
        composed_lower_bound(0.1, float(np.mean(thresholds)), 100, 1e-5)
    )


def test_unknown_route_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="Expected route"):
        distinguish(np.zeros(10), np.ones(10), seed=0, route="normal", **SETTINGS)  # type: ignore[arg-type]


def test_mu_ratio_for_epsilon_ratio_inverts_the_composition() -> None:
    # the per-step audit's default setting: q = 0.2, T = 100, sigma 2.3784 (epsilon 4)
    q, mu, steps, delta = 0.2, 1 / 2.378414230005442, 100, 1e-5
    needed = mu_ratio_for_epsilon_ratio(q=q, mu=mu, steps=steps, delta=delta, target_ratio=0.8)
    assert 0.82 < needed < 0.86  # measured 0.8385: slightly above the epsilon target
    epsilon = composed_lower_bound(q, mu, steps, delta)
    assert composed_lower_bound(q, needed * mu, steps, delta) >= 0.8 * epsilon
    assert composed_lower_bound(q, (needed - 0.01) * mu, steps, delta) < 0.8 * epsilon
    with pytest.raises(InvalidParameterError, match="target_ratio"):
        mu_ratio_for_epsilon_ratio(q=q, mu=mu, steps=steps, delta=delta, target_ratio=1.0)
    with pytest.raises(InvalidParameterError, match="mu"):
        mu_ratio_for_epsilon_ratio(q=q, mu=-1.0, steps=steps, delta=delta, target_ratio=0.5)
