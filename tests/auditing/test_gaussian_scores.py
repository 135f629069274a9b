"""Gaussian per-step scores: exact intervals, coverage by simulation, runs needed, vs thresholds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpcore.auditing.gaussian_scores import (
    gaussian_mu_lower_bound,
    runs_for_mu_ratio,
    typical_mu_ratio,
)
from dpcore.errors import InvalidParameterError


def test_matches_the_textbook_intervals() -> None:
    # d_lo is the one-sided 97.5% lower end of the pooled two-sample t interval (scipy's
    # ttest_ind), s_hi the one-sided 97.5% chi-square upper end; mu_lb = d_lo / s_hi.
    rng = np.random.default_rng(1)
    negative, positive = rng.normal(0, 0.8, 30), rng.normal(1.2, 0.8, 25)
    bound = gaussian_mu_lower_bound(negative, positive, confidence=0.95)
    t_low = stats.ttest_ind(positive, negative, alternative="greater").confidence_interval(0.975)
    dof = 30 + 25 - 2
    pooled = ((29 * negative.var(ddof=1)) + (24 * positive.var(ddof=1))) / dof
    scale_upper = math.sqrt(dof * pooled / stats.chi2.ppf(0.025, dof))
    assert bound.shift_lower == pytest.approx(t_low.low, rel=1e-10)
    assert bound.scale_upper == pytest.approx(scale_upper, rel=1e-10)
    assert bound.mu_lower == pytest.approx(t_low.low / scale_upper, rel=1e-10)
    assert bound.mu_estimate == pytest.approx(
        (positive.mean() - negative.mean()) / math.sqrt(pooled)
    )
    assert (bound.negatives, bound.positives, bound.confidence) == (30, 25, 0.95)


@pytest.mark.parametrize("two_sided", [False, True])
@pytest.mark.parametrize(("mu", "n0", "n1"), [(1.0, 50, 50), (0.3, 200, 20), (3.0, 10, 30)])
def test_coverage_by_simulation(mu: float, n0: int, n1: int, two_sided: bool) -> None:
    # 1000 seeded audits at 90% confidence on exactly Gaussian scores (sigma = 2, shift 2 mu):
    # mu_lb > mu in at most 10%; Binomial(1000, 0.1) > 135 has probability 1.7e-4. And the
    # bound is not vacuous: its median is within 0.06 of typical_mu_ratio's prediction.
    rng = np.random.default_rng(int(100 * mu) + n0 + n1)
    sigma, exceed, ratios = 2.0, 0, []
    for _ in range(1000):
        negative = rng.normal(5.0, sigma, n0)
        positive = rng.normal(5.0 + mu * sigma, sigma, n1)
        bound = gaussian_mu_lower_bound(negative, positive, confidence=0.9, two_sided=two_sided)
        exceed += bound.mu_lower > mu
        ratios.append(bound.mu_lower / mu)
    assert exceed <= 135
    predicted = typical_mu_ratio(
        mu=mu, negatives=n0, positives=n1, confidence=0.9, two_sided=two_sided
    )
    assert abs(float(np.median(ratios)) - predicted) <= 0.06


def test_no_shift_gives_zero_mostly() -> None:
    # d = 0: only the t side can fail (probability gamma/2 = 2.5%); Binomial(1000, 0.025) > 45
    # has probability < 1e-4.
    rng = np.random.default_rng(5)
    positive_bounds = sum(
        gaussian_mu_lower_bound(rng.normal(0, 1, 40), rng.normal(0, 1, 40), confidence=0.95)
        .mu_lower > 0
        for _ in range(1000)
    )  # fmt: skip
    assert positive_bounds <= 45


def test_shift_direction() -> None:
    rng = np.random.default_rng(2)
    negative, positive = rng.normal(0, 1, 500), rng.normal(-1, 1, 500)
    assert gaussian_mu_lower_bound(negative, positive, confidence=0.95).mu_lower == 0.0
    flipped = gaussian_mu_lower_bound(negative, positive, confidence=0.95, two_sided=True)
    assert 0.6 < flipped.mu_lower < 1.0  # typical ratio 0.82 at 500 per world
    noiseless = gaussian_mu_lower_bound([0.0, 0.0], [1.0, 1.0], confidence=0.95)
    assert noiseless.mu_lower == math.inf


def test_runs_for_mu_ratio_is_the_smallest_sufficient_count() -> None:
    # White-box DP-SGD at sigma = 1 (mu = 1): 100 steps per run, the canary sampled in
    # q * steps = 10 of them on average.
    settings = {"mu": 1.0, "negatives_per_run": 100, "positives_per_run": 10, "confidence": 0.95}
    runs = runs_for_mu_ratio(target_ratio=0.9, **settings)  # type: ignore[arg-type]

    def ratio(r: int) -> float:
        return typical_mu_ratio(mu=1.0, negatives=100 * r, positives=10 * r, confidence=0.95)

    assert ratio(runs) >= 0.9 > ratio(runs - 1)
    assert runs_for_mu_ratio(target_ratio=0.95, **settings) > runs  # type: ignore[arg-type]
    more_confident = {**settings, "confidence": 0.999}
    assert runs_for_mu_ratio(target_ratio=0.9, **more_confident) > runs  # type: ignore[arg-type]
    assert runs_for_mu_ratio(target_ratio=0.1, mu=5.0, negatives_per_run=1000,
                             positives_per_run=1000, confidence=0.9) == 1  # fmt: skip


def test_runs_for_mu_ratio_delivers_the_ratio_in_simulation() -> None:
    # With the advised number of runs, about half the audits reach the target (median ratio
    # within 0.02 of it; 400 seeded audits).
    runs = runs_for_mu_ratio(
        target_ratio=0.8, mu=0.5, negatives_per_run=20, positives_per_run=20, confidence=0.95
    )
    rng = np.random.default_rng(11)
    ratios = [
        gaussian_mu_lower_bound(
            rng.normal(0, 2, 20 * runs), rng.normal(1, 2, 20 * runs), confidence=0.95
        ).mu_lower
        / 0.5
        for _ in range(400)
    ]
    assert abs(float(np.median(ratios)) - 0.8) <= 0.02


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: gaussian_mu_lower_bound([1.0], [1.0, 2.0], confidence=0.9), "negative"),
        (lambda: gaussian_mu_lower_bound([1.0, 2.0], [1.0, math.nan], confidence=0.9), "positive"),
        (lambda: gaussian_mu_lower_bound([1.0, 2.0], ["a", "b"], confidence=0.9), "positive"),
        (lambda: gaussian_mu_lower_bound([1.0, 2.0], [1.0, 2.0], confidence=1.0), "confidence"),
        (
            lambda: gaussian_mu_lower_bound([1.0, 2.0], [1.0, 2.0], confidence=0.9, two_sided=1),
            "two_sided",
        ),
        (lambda: typical_mu_ratio(mu=0.0, negatives=5, positives=5, confidence=0.9), "mu"),
        (
            lambda: typical_mu_ratio(mu=1.0, negatives=1, positives=1, confidence=0.9),
            "negatives \\+ positives",
        ),
        (
            lambda: runs_for_mu_ratio(
                target_ratio=1.0, mu=1.0, negatives_per_run=5, positives_per_run=5,
                confidence=0.9,
            ),
            "target_ratio",
        ),
        (
            lambda: runs_for_mu_ratio(
                target_ratio=0.5, mu=1.0, negatives_per_run=-5, positives_per_run=5,
                confidence=0.9,
            ),
            "negatives_per_run",
        ),
        (
            lambda: runs_for_mu_ratio(
                target_ratio=0.999999999, mu=1e-6, negatives_per_run=1, positives_per_run=1,
                confidence=0.9,
            ),
            "target_ratio",
        ),
    ],
)  # fmt: skip
def test_bad_inputs(call, parameter: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        call()
