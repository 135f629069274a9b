"""The lecture's median example at a cheap scale: the naive variant fails, Alg. 2 does not."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.auditing.statistics import epsilon_lower_bound, threshold_sweep_lower_bound
from dpcore.erm.median import naive_median_release, smooth_median_release
from dpcore.errors import InvalidParameterError

TRIALS = 20_000
DELTA = 1e-6  # epsilon_lower_bound needs delta > 0; the failure holds for any delta < 0.3


def test_naive_objective_perturbation_is_not_private() -> None:
    epsilon = 1.0
    rng = np.random.default_rng(0)
    out_d = naive_median_release([0.0, 100.0], epsilon=epsilon, rng=rng, size=TRIALS)
    out_d2 = naive_median_release([0.0, 101.0], epsilon=epsilon, rng=rng, size=TRIALS)
    # Say "D'" iff the output is 101: never wrong on D, right w.p. P[-2 < b < 0] on D'.
    false_positives = int(np.sum(out_d == 101.0))
    true_positives = int(np.sum(out_d2 == 101.0))
    assert false_positives == 0
    assert true_positives / TRIALS == pytest.approx(0.5 * (1 - np.exp(-epsilon)), abs=0.02)
    bound = epsilon_lower_bound(
        false_positives=false_positives,
        negatives=TRIALS,
        false_negatives=TRIALS - true_positives,
        positives=TRIALS,
        delta=DELTA,
        confidence=0.95,
    )
    assert bound.epsilon_lower > 5 * epsilon


def test_correct_variant_shows_no_violation() -> None:
    epsilon = 1.0
    options = {"epsilon": epsilon, "regularisation": 0.01, "huber_width": 50.0, "size": TRIALS}
    out_d = smooth_median_release([0.0, 100.0], rng=np.random.default_rng(1), **options)
    out_d2 = smooth_median_release([0.0, 101.0], rng=np.random.default_rng(2), **options)
    bound = threshold_sweep_lower_bound(
        scores_negative=out_d,
        scores_positive=out_d2,
        thresholds=[-100.0, 0.0, 50.0, 100.0, 100.5, 101.0],
        delta=DELTA,
        confidence=0.95,
    )
    assert bound.epsilon_lower <= epsilon


def test_bad_input() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidParameterError, match="Expected domain_radius > max"):
        naive_median_release([0.0, 100.0], epsilon=1.0, domain_radius=50.0, rng=rng, size=2)
    with pytest.raises(InvalidParameterError, match="Expected regularisation > 0"):
        smooth_median_release(
            [0.0, 100.0], epsilon=1.0, regularisation=0.0, huber_width=1.0, rng=rng, size=2
        )
