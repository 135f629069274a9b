"""Audit statistics: exact intervals, valid confidence, bounds that approach epsilon from below."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpcore.auditing import (
    clopper_pearson,
    epsilon_lower_bound,
    gdp_lower_bound,
    one_run_epsilon_lower_bound,
    threshold_sweep_lower_bound,
)
from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_epsilon

THRESHOLDS = np.linspace(-2, 8, 21)


def test_clopper_pearson_matches_the_beta_quantiles() -> None:
    # Clopper & Pearson 1934: [Beta(a/2; k, n-k+1), Beta(1-a/2; k+1, n-k)].
    low, high = clopper_pearson(7, 50, confidence=0.9)
    assert low == pytest.approx(stats.beta.ppf(0.05, 7, 44))
    assert high == pytest.approx(stats.beta.ppf(0.95, 8, 43))
    assert clopper_pearson(50, 50, confidence=0.9)[1] == 1.0


def test_clopper_pearson_coverage_is_at_least_nominal() -> None:
    # Exact intervals are conservative: coverage >= 90% for every p (checked exactly).
    n = 40
    for p in (0.01, 0.1, 0.37, 0.5, 0.9):
        covered = sum(
            stats.binom.pmf(k, n, p)
            for k in range(n + 1)
            if clopper_pearson(k, n, confidence=0.9)[0]
            <= p
            <= clopper_pearson(k, n, confidence=0.9)[1]
        )
        assert covered >= 0.9 - 1e-12


def test_null_scores_give_zero_in_most_seeds() -> None:
    # No signal: both score sets from one distribution. The bound must be 0 in >= 95% of seeds.
    zeros = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        bound = threshold_sweep_lower_bound(
            scores_negative=rng.normal(size=5000),
            scores_positive=rng.normal(size=5000),
            thresholds=THRESHOLDS,
            delta=1e-5,
            confidence=0.95,
            route="gdp",
        )
        zeros += bound.epsilon_lower == 0
    assert zeros >= 38


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
def test_gaussian_scores_approach_epsilon_from_below(mu: float) -> None:
    # Scores N(0,1) vs N(mu,1) are exactly the mu-GDP pair; its epsilon at 1e-5 is the truth.
    truth = gdp_epsilon(mu=mu, delta=1e-5)
    rng = np.random.default_rng(12345)
    bound = threshold_sweep_lower_bound(
        scores_negative=rng.normal(0, 1, 10**6),
        scores_positive=rng.normal(mu, 1, 10**6),
        thresholds=np.linspace(-1, 5, 61),
        delta=1e-5,
        route="gdp",
    )
    assert bound.epsilon_lower <= truth
    assert bound.epsilon_lower >= 0.9 * truth


def test_failure_rate_is_respected_on_gaussian_scores() -> None:
    # Over 200 seeds the GDP bound at 95% confidence may exceed the truth in at most ~5% of
    # them; binomial(200, 0.05) exceeds 22 with probability 1.9e-4 (the stated test rate).
    mu, exceed = 1.0, 0
    truth = gdp_epsilon(mu=mu, delta=1e-5)
    for seed in range(200):
        rng = np.random.default_rng(seed)
        fp = int((rng.normal(0, 1, 2000) > 1.0).sum())
        fn = int((rng.normal(mu, 1, 2000) <= 1.0).sum())
        bound = gdp_lower_bound(
            false_positives=fp, negatives=2000, false_negatives=fn, positives=2000, delta=1e-5
        )
        exceed += bound.epsilon_lower > truth
    assert exceed <= 22


@pytest.mark.parametrize("epsilon", [1.0, 2.0])
def test_laplace_scores_recover_pure_epsilon(epsilon: float) -> None:
    # Laplace(0, 1/eps) vs Laplace(1, 1/eps): the test "score > 1" has FPR = e^{-eps}/2 and
    # FNR = 1/2, meeting FNR + e^eps FPR = 1 exactly -- the bound converges to epsilon.
    rng = np.random.default_rng(7)
    n = 10**6
    negative = rng.laplace(0, 1 / epsilon, n)
    positive = rng.laplace(1, 1 / epsilon, n)
    bound = threshold_sweep_lower_bound(
        scores_negative=negative, scores_positive=positive, thresholds=[0.0, 1.0], delta=1e-5
    )
    assert 0.95 * epsilon <= bound.epsilon_lower <= epsilon


def test_one_run_bound() -> None:
    # All 100 guesses right among 1000 canaries: p(eps) = q_eps^100 (+ delta part) -> a clear,
    # finite bound; half right is what guessing gives and certifies nothing.
    strong = one_run_epsilon_lower_bound(canaries=1000, guesses=100, correct=100, delta=0.0)
    q = math.exp(strong.epsilon_lower) / (1 + math.exp(strong.epsilon_lower))
    assert q**100 == pytest.approx(0.05, rel=1e-6)
    assert (
        one_run_epsilon_lower_bound(
            canaries=1000, guesses=100, correct=50, delta=1e-5
        ).epsilon_lower
        == 0
    )
    weaker = one_run_epsilon_lower_bound(canaries=1000, guesses=100, correct=100, delta=1e-5)
    assert weaker.epsilon_lower <= strong.epsilon_lower


def test_bonferroni_makes_more_thresholds_cost_confidence() -> None:
    rng = np.random.default_rng(3)
    negative, positive = rng.normal(0, 1, 20_000), rng.normal(1.5, 1, 20_000)
    one = threshold_sweep_lower_bound(
        scores_negative=negative,
        scores_positive=positive,
        thresholds=[1.5],
        delta=1e-5,
        route="gdp",
    )
    many = threshold_sweep_lower_bound(
        scores_negative=negative,
        scores_positive=positive,
        thresholds=np.full(1000, 1.5),
        delta=1e-5,
        route="gdp",
    )
    assert many.epsilon_lower < one.epsilon_lower  # same test, paid for 1000 times


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: clopper_pearson(5, 3, confidence=0.9), "successes"),
        (lambda: clopper_pearson(1, 0, confidence=0.9), "trials"),
        (lambda: clopper_pearson(1, 10, confidence=1.0), "confidence"),
        (
            lambda: epsilon_lower_bound(
                false_positives=-1, negatives=10, false_negatives=1, positives=10, delta=1e-5
            ),
            "false_positives",
        ),
        (
            lambda: gdp_lower_bound(
                false_positives=1, negatives=10, false_negatives=1, positives=10, delta=0.0
            ),
            "delta",
        ),
        (
            lambda: threshold_sweep_lower_bound(
                scores_negative=[], scores_positive=[1.0], thresholds=[0.0], delta=1e-5
            ),
            "scores",
        ),
        (
            lambda: threshold_sweep_lower_bound(
                scores_negative=[0.0],
                scores_positive=[1.0],
                thresholds=[0.0],
                delta=1e-5,
                route="magic",
            ),
            "route",
        ),
        (
            lambda: one_run_epsilon_lower_bound(canaries=10, guesses=11, correct=1, delta=0.0),
            "guesses",
        ),
        (
            lambda: one_run_epsilon_lower_bound(canaries=10, guesses=5, correct=6, delta=0.0),
            "correct",
        ),
    ],
)
def test_bad_inputs(call, parameter: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        call()
