"""Confidence bounds that turn attack outcomes into lower bounds on epsilon.

Every function states the confidence of its answer and that confidence is the true one: rates
are bounded with exact (Clopper–Pearson) intervals, several rates are combined with a union
bound, and choosing a threshold among several is paid for with Bonferroni.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, special, stats

from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_epsilon
from dpcore.validation import check_count, check_delta, check_non_negative

__all__ = [
    "AuditBound",
    "clopper_pearson",
    "epsilon_lower_bound",
    "gdp_lower_bound",
    "one_run_epsilon_lower_bound",
    "threshold_sweep_lower_bound",
]


@dataclasses.dataclass(frozen=True)
class AuditBound:
    """epsilon >= ``epsilon_lower`` holds with probability >= ``confidence``.

    ``mu_lower`` is set by the GDP route; ``threshold`` by threshold sweeps.
    """

    epsilon_lower: float
    confidence: float
    method: str
    mu_lower: float | None = None
    threshold: float | None = None


def _check_confidence(confidence: float) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        raise InvalidParameterError("confidence", "to be a number in (0, 1)", confidence)
    if not 0 < confidence < 1:
        raise InvalidParameterError("confidence", "in (0, 1)", confidence)
    return float(confidence)


def _check_counts(errors: int, trials: int, errors_name: str, trials_name: str) -> tuple[int, int]:
    trials = check_count(trials_name, trials, minimum=1)
    errors = check_count(errors_name, errors)
    if errors > trials:
        raise InvalidParameterError(errors_name, f"<= {trials_name} = {trials}", errors)
    return errors, trials


def clopper_pearson(successes: int, trials: int, *, confidence: float) -> tuple[float, float]:
    """Exact two-sided (Clopper & Pearson 1934) interval for a binomial proportion.

    Each side fails with probability at most (1 - confidence) / 2.

    >>> low, high = clopper_pearson(0, 100, confidence=0.95)
    >>> low, round(high, 4)
    (0.0, 0.0362)
    """
    successes, trials = _check_counts(successes, trials, "successes", "trials")
    confidence = _check_confidence(confidence)
    alpha = 1 - confidence
    low = (
        0.0
        if successes == 0
        else float(special.betaincinv(successes, trials - successes + 1, alpha / 2))
    )
    high = (
        1.0
        if successes == trials
        else float(special.betaincinv(successes + 1, trials - successes, 1 - alpha / 2))
    )
    return low, high


def _upper_rate(errors: int, trials: int, failure: float) -> float:
    """One-sided Clopper–Pearson upper bound failing with probability <= ``failure``."""
    if errors == trials:
        return 1.0
    return float(special.betaincinv(errors + 1, trials - errors, 1 - failure))


def _rate_bounds(
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    confidence: float,
) -> tuple[float, float, float, float]:
    """(FPR_hi, FNR_hi, delta, confidence): each rate bound fails w.p. (1 - confidence) / 2."""
    fp, negatives = _check_counts(false_positives, negatives, "false_positives", "negatives")
    fn, positives = _check_counts(false_negatives, positives, "false_negatives", "positives")
    delta = check_delta("delta", delta)
    confidence = _check_confidence(confidence)
    failure = (1 - confidence) / 2
    return (
        _upper_rate(fp, negatives, failure),
        _upper_rate(fn, positives, failure),
        delta,
        confidence,
    )


def epsilon_lower_bound(
    *,
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    confidence: float = 0.95,
) -> AuditBound:
    """Lower bound on epsilon from one distinguishing test (Jagielski, Ullman, Oprea 2020).

    FPR and FNR are bounded above by one-sided Clopper–Pearson bounds, each failing with
    probability (1 - confidence)/2 (union bound), and any (epsilon, delta)-DP mechanism obeys
    FPR + e^eps FNR >= 1 - delta and FNR + e^eps FPR >= 1 - delta (Kairouz et al. 2015), so
    eps >= max(log((1 - delta - FPR_hi) / FNR_hi), log((1 - delta - FNR_hi) / FPR_hi), 0).
    """
    fpr, fnr, delta, confidence = _rate_bounds(
        false_positives, negatives, false_negatives, positives, delta, confidence
    )
    candidates = [0.0]
    for a, b in ((fpr, fnr), (fnr, fpr)):
        if 1 - delta - a > 0 and b > 0:
            candidates.append(math.log((1 - delta - a) / b))
    return AuditBound(max(candidates), confidence, "clopper_pearson")


def gdp_lower_bound(
    *,
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    confidence: float = 0.95,
) -> AuditBound:
    """Lower bound via the Gaussian-DP route (Nasr et al. 2023, arXiv 2302.07956, Sec. 4).

    If the mechanism were mu-GDP, FNR >= Phi(Phi^{-1}(1 - FPR) - mu); with Clopper–Pearson upper
    bounds on both rates (union bound as in :func:`epsilon_lower_bound`),
    mu_lb = Phi^{-1}(1 - FPR_hi) - Phi^{-1}(FNR_hi) (0 if negative), and epsilon_lb is the
    epsilon of mu_lb-GDP at ``delta``. This is a lower bound on the epsilon of any mechanism
    that is mu-GDP for some mu, e.g. the Gaussian mechanism; much tighter than
    :func:`epsilon_lower_bound` for such mechanisms.
    """
    fpr, fnr, delta, confidence = _rate_bounds(
        false_positives, negatives, false_negatives, positives, delta, confidence
    )
    mu = max(0.0, float(special.ndtri(1 - fpr) - special.ndtri(fnr)))
    return AuditBound(gdp_epsilon(mu=mu, delta=delta), confidence, "gdp", mu_lower=mu)


def threshold_sweep_lower_bound(
    *,
    scores_negative: Sequence[float] | np.ndarray,
    scores_positive: Sequence[float] | np.ndarray,
    thresholds: Sequence[float] | np.ndarray,
    delta: float,
    confidence: float = 0.95,
    route: str = "clopper_pearson",
) -> AuditBound:
    """The best bound over a set of thresholds, paid for with Bonferroni.

    The test says "positive" when score > t. Each of the k thresholds is evaluated at
    confidence 1 - (1 - confidence)/k, so the maximum over them holds at ``confidence``. (Choose
    the thresholds on held-out scores, not these.)
    """
    negative = np.asarray(scores_negative, dtype=float)
    positive = np.asarray(scores_positive, dtype=float)
    grid = np.asarray(thresholds, dtype=float).ravel()
    if negative.size == 0 or positive.size == 0 or grid.size == 0:
        raise InvalidParameterError(
            "scores and thresholds", "to be non-empty", (negative.size, positive.size, grid.size)
        )
    if not (
        np.all(np.isfinite(negative))
        and np.all(np.isfinite(positive))
        and np.all(np.isfinite(grid))
    ):
        raise InvalidParameterError("scores and thresholds", "to be finite", "NaN or inf")
    bound_of = {"clopper_pearson": epsilon_lower_bound, "gdp": gdp_lower_bound}.get(route)
    if bound_of is None:
        raise InvalidParameterError("route", "in ['clopper_pearson', 'gdp']", route)
    confidence = _check_confidence(confidence)
    each = 1 - (1 - confidence) / grid.size
    negative.sort()
    positive.sort()
    best = AuditBound(0.0, confidence, route, threshold=None)
    for threshold in grid:
        fp = int(negative.size - np.searchsorted(negative, threshold, side="right"))
        fn = int(np.searchsorted(positive, threshold, side="right"))
        bound = bound_of(
            false_positives=fp,
            negatives=negative.size,
            false_negatives=fn,
            positives=positive.size,
            delta=delta,
            confidence=each,
        )
        if bound.epsilon_lower > best.epsilon_lower:
            best = AuditBound(
                bound.epsilon_lower, confidence, route, bound.mu_lower, float(threshold)
            )
    return best


def _one_run_p_value(
    epsilon: float, *, guesses: int, correct: int, canaries: int, delta: float
) -> float:
    """p(eps) of Steinke, Nasr, Jagielski 2023 (arXiv 2305.08846, Thm 5.2)."""
    q = 1 / (1 + math.exp(-epsilon))  # e^eps / (1 + e^eps)
    tail = float(stats.binom.sf(correct - 1, guesses, q))  # P[Bin(r, q) >= v]
    if delta == 0:
        return tail
    # P[v > Bin >= v - i] = P[Bin <= v - 1] - P[Bin <= v - i - 1] for i = 1..v, all at once.
    steps = np.arange(1, correct + 1)
    below = stats.binom.cdf(correct - 1, guesses, q)
    mass = below - stats.binom.cdf(correct - steps - 1, guesses, q)
    extra = max(0.0, float(np.max(mass / steps))) if correct > 0 else 0.0
    return tail + 2 * canaries * delta * extra


def one_run_epsilon_lower_bound(
    *, canaries: int, guesses: int, correct: int, delta: float, confidence: float = 0.95
) -> AuditBound:
    """Lower bound on epsilon from one training run (Steinke, Nasr, Jagielski 2023, Thm 5.2).

    ``canaries`` (m) are each included with probability 1/2; the auditor guesses inclusion for
    ``guesses`` (r) of them and gets ``correct`` (v) right. With q_eps = e^eps / (1 + e^eps),
    p(eps) = P[Bin(r, q_eps) >= v] + 2 m delta max_{i>=1} P[v > Bin(r, q_eps) >= v - i] / i,
    and epsilon_lb = sup{eps : p(eps) < 1 - confidence}. ``guesses`` must be fixed before
    seeing the scores (or chosen with a correction, as for thresholds). For mechanisms audited
    as Gaussian DP, :func:`dpcore.auditing.one_run_fdp.one_run_gdp_lower_bound` is tighter on
    the same outcomes.
    """
    m = check_count("canaries", canaries, minimum=1)
    r = check_count("guesses", guesses)
    v = check_count("correct", correct)
    if r > m:
        raise InvalidParameterError("guesses", f"<= canaries = {m}", guesses)
    if v > r:
        raise InvalidParameterError("correct", f"<= guesses = {r}", correct)
    delta = check_non_negative("delta", delta)
    if delta >= 1:
        raise InvalidParameterError("delta", "in [0, 1)", delta)
    confidence = _check_confidence(confidence)
    gamma = 1 - confidence

    def excess(epsilon: float) -> float:
        return _one_run_p_value(epsilon, guesses=r, correct=v, canaries=m, delta=delta) - gamma

    if v == 0 or excess(0.0) >= 0:
        return AuditBound(0.0, confidence, "one_run")
    high = 1.0
    while excess(high) < 0:
        high *= 2
        if high > 1e3:
            return AuditBound(math.inf, confidence, "one_run")
    epsilon = optimize.brentq(excess, 0.0, high, xtol=1e-10)
    # The root itself has p = gamma; step just below it to keep p < gamma.
    return AuditBound(max(0.0, float(epsilon) - 1e-9), confidence, "one_run")
