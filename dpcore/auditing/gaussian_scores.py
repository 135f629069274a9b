"""A parametric lower confidence bound on mu from Gaussian per-step scores, and its run count.

Nasr et al. 2023 (arXiv 2302.07956, Sec. 5-6) use that in a white-box audit of DP-SGD each
step's score is N(0, sigma^2) without the canary and N(1, sigma^2) with it, so one step is the
mu-GDP pair with mu = 1 / sigma (Dong, Roth, Su 2019, Thm 2.7), an empirical sigma giving an
empirical mu. Trusting that shape, mu = |d| / sigma with d the mean shift is bounded from below with
the classical exact intervals (a t interval for d, a chi-square interval for sigma, joined by a
union bound), using every score and no threshold, which is much tighter than the
assumption-free threshold route (:func:`dpcore.auditing.stepwise.held_out_threshold_bound`)
at the same number of runs. The assumptions (independent Gaussian scores, one sigma in both
worlds) are exactly what a buggy implementation may break, so audits of untrusted code keep the
threshold route as their default and may add this one.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

import numpy as np
from scipy import stats

from dpcore.auditing.statistics import _check_confidence
from dpcore.errors import InvalidParameterError

__all__ = ["GaussianMuBound", "gaussian_mu_lower_bound", "runs_for_mu_ratio", "typical_mu_ratio"]

#: The most runs :func:`runs_for_mu_ratio` searches before declaring the target unreachable.
MAX_RUNS = 10**9


@dataclasses.dataclass(frozen=True)
class GaussianMuBound:
    """mu >= ``mu_lower`` with probability >= ``confidence`` (under the Gaussian assumptions).

    ``shift_lower`` is the lower confidence bound on |d| (0 if the interval contains 0),
    ``scale_upper`` the upper one on sigma; ``mu_estimate`` = |d_hat| / s is the point estimate
    (not a bound).
    """

    mu_lower: float
    confidence: float
    shift_lower: float
    scale_upper: float
    mu_estimate: float
    negatives: int
    positives: int


def _scores(name: str, values: Sequence[float] | np.ndarray) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=float).ravel()
    except (TypeError, ValueError):
        raise InvalidParameterError(name, "to be real numbers", values) from None
    if array.size < 2:
        raise InvalidParameterError(name, "to hold at least 2 scores", array.size)
    if not np.all(np.isfinite(array)):
        raise InvalidParameterError(name, "to be finite", "NaN or inf")
    return array


def _failures(confidence: float, two_sided: bool) -> tuple[float, float]:
    """(each tail of the t interval, the chi-square side): the union bound's split of gamma."""
    gamma = 1 - confidence
    return (gamma / 4 if two_sided else gamma / 2), gamma / 2


def gaussian_mu_lower_bound(
    negative: Sequence[float] | np.ndarray,
    positive: Sequence[float] | np.ndarray,
    *,
    confidence: float,
    two_sided: bool = False,
) -> GaussianMuBound:
    """Lower confidence bound on mu = |d| / sigma from scores N(0, sigma^2) vs N(d, sigma^2).

    With n0 negative and n1 positive scores, d_hat the difference of the means (positive minus
    negative), s^2 the pooled variance with nu = n0 + n1 - 2 degrees of freedom and
    se = s sqrt(1/n0 + 1/n1):

    * d >= d_lo = d_hat - t_{nu}^{-1}(1 - a) se fails with probability exactly a = gamma/2
      (Student 1908; the pooled two-sample t statistic is t_nu-distributed);
      with ``two_sided`` (when the sign of the shift is not known) |d| >= the distance from 0
      of the interval d_hat -+ t_{nu}^{-1}(1 - gamma/4) se, failing with probability gamma/2;
    * sigma <= s_hi = s sqrt(nu / chi2_{nu}^{-1}(gamma/2)) fails with probability exactly
      gamma/2 (nu s^2 / sigma^2 is chi-square with nu degrees of freedom);
    * by the union bound both hold with probability >= 1 - gamma, and then
      mu_lb = max(d_lo, 0) / s_hi <= |d| / sigma = mu.

    Assumptions (the bound is exact under them and may fail without them): the scores are
    independent; every negative score has one distribution N(m0, sigma^2) and every positive
    one N(m0 + d, sigma^2), with the *same* sigma -- what a correct DP-SGD step gives with the
    canary's gradient direction as the score (Nasr et al. 2023, Sec. 5-6). Without ``two_sided``
    the positive scores are expected to be the larger ones; a shift the other way gives 0.

    Args:
        negative: >= 2 finite scores from the world without the canary.
        positive: >= 2 finite scores from the world with it.
        confidence: in (0, 1).
        two_sided: bound |d| when the direction of the shift is unknown (slightly looser).

    Returns:
        A :class:`GaussianMuBound`.

    Raises:
        InvalidParameterError: fewer than 2 scores in a world, a non-finite score, a
            confidence outside (0, 1), or ``two_sided`` not a bool.

    >>> rng = np.random.default_rng(0)
    >>> bound = gaussian_mu_lower_bound(
    ...     rng.normal(0, 2, 4000), rng.normal(1, 2, 4000), confidence=0.95
    ... )
    >>> round(bound.mu_lower, 3), round(bound.mu_estimate, 3)
    (0.479, 0.53)
    """
    negative_scores = _scores("negative", negative)
    positive_scores = _scores("positive", positive)
    confidence = _check_confidence(confidence)
    if not isinstance(two_sided, bool):
        raise InvalidParameterError("two_sided", "to be a bool", two_sided)
    n0, n1 = negative_scores.size, positive_scores.size
    dof = n0 + n1 - 2
    shift = float(positive_scores.mean() - negative_scores.mean())
    squares = float(
        np.sum((negative_scores - negative_scores.mean()) ** 2)
        + np.sum((positive_scores - positive_scores.mean()) ** 2)
    )
    scale = math.sqrt(squares / dof)
    t_tail, chi2_side = _failures(confidence, two_sided)
    error = float(stats.t.isf(t_tail, dof)) * scale * math.sqrt(1 / n0 + 1 / n1)
    shift_lower = max(abs(shift) - error, 0.0) if two_sided else max(shift - error, 0.0)
    scale_upper = math.sqrt(squares / float(stats.chi2.ppf(chi2_side, dof)))
    if scale == 0.0:
        # Identical scores within each world: noiseless; mu is infinite if the means differ.
        mu_lower = math.inf if shift_lower > 0 else 0.0
        estimate = math.inf if shift != 0 else 0.0
    else:
        mu_lower = shift_lower / scale_upper
        estimate = abs(shift) / scale
    return GaussianMuBound(
        mu_lower=mu_lower,
        confidence=confidence,
        shift_lower=shift_lower,
        scale_upper=scale_upper,
        mu_estimate=estimate,
        negatives=n0,
        positives=n1,
    )


def _check_rate(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameterError(name, "to be a real number > 0", value)
    result = float(value)
    if not (result > 0 and math.isfinite(result)):
        raise InvalidParameterError(name, "> 0 and finite", value)
    return result


def typical_mu_ratio(
    *, mu: float, negatives: float, positives: float, confidence: float, two_sided: bool = False
) -> float:
    """mu_lb / mu of :func:`gaussian_mu_lower_bound` when d_hat = d and s = sigma exactly.

    (1 - t_{nu}^{-1}(1 - a) sqrt(1/n0 + 1/n1) / mu)_+ * sqrt(chi2_{nu}^{-1}(gamma/2) / nu) with
    nu = n0 + n1 - 2: the widths of the two intervals, relative to mu. It is about the median
    of mu_lb / mu (d_hat and s sit at their centres), increases with n0, n1 and mu, and tends
    to 1. Counts may be expectations (e.g. q * steps positives per run).

    Raises:
        InvalidParameterError: mu, negatives or positives not > 0 and finite,
            negatives + positives <= 2, or confidence outside (0, 1).

    >>> round(typical_mu_ratio(mu=1.0, negatives=1000, positives=1000, confidence=0.95), 3)
    0.884
    """
    mu = _check_rate("mu", mu)
    n0, n1 = _check_rate("negatives", negatives), _check_rate("positives", positives)
    confidence = _check_confidence(confidence)
    if n0 + n1 <= 2:
        raise InvalidParameterError("negatives + positives", "> 2", n0 + n1)
    dof = n0 + n1 - 2
    t_tail, chi2_side = _failures(confidence, bool(two_sided))
    shift_part = 1 - float(stats.t.isf(t_tail, dof)) * math.sqrt(1 / n0 + 1 / n1) / mu
    scale_part = math.sqrt(float(stats.chi2.ppf(chi2_side, dof)) / dof)
    return max(shift_part, 0.0) * scale_part


def runs_for_mu_ratio(
    *,
    target_ratio: float,
    mu: float,
    negatives_per_run: float,
    positives_per_run: float,
    confidence: float,
    two_sided: bool = False,
) -> int:
    """Runs per world for which :func:`typical_mu_ratio` reaches ``target_ratio``.

    An audit that records ``negatives_per_run`` scores per run without the canary and (on
    average) ``positives_per_run`` with it needs this many runs per world so that its typical
    mu_lb is ``target_ratio`` of the claimed ``mu`` (about half the audits do better) -- the
    ``runs`` setting of a white-box audit. Smallest such integer, by doubling and bisection
    (the ratio increases with the runs).

    Args:
        target_ratio: in (0, 1).
        mu: the claimed mu (1 / noise multiplier for one DP-SGD step), > 0.
        negatives_per_run: > 0 (e.g. the steps of a run).
        positives_per_run: > 0 (e.g. q * steps when only steps that sampled the canary count).
        confidence: in (0, 1).
        two_sided: as in :func:`gaussian_mu_lower_bound`.

    Returns:
        The number of runs per world, >= 1.

    Raises:
        InvalidParameterError: a parameter outside its range, or a target that needs more
            than 10^9 runs.

    >>> runs_for_mu_ratio(
    ...     target_ratio=0.9, mu=1.0, negatives_per_run=100, positives_per_run=100,
    ...     confidence=0.95,
    ... )
    14
    """
    target = _check_rate("target_ratio", target_ratio)
    if not target < 1:
        raise InvalidParameterError("target_ratio", "in (0, 1)", target_ratio)
    mu = _check_rate("mu", mu)
    n0 = _check_rate("negatives_per_run", negatives_per_run)
    n1 = _check_rate("positives_per_run", positives_per_run)
    confidence = _check_confidence(confidence)

    def ratio(runs: int) -> float:
        if runs * (n0 + n1) <= 2:
            return 0.0
        return typical_mu_ratio(
            mu=mu,
            negatives=runs * n0,
            positives=runs * n1,
            confidence=confidence,
            two_sided=bool(two_sided),
        )

    high = 1
    while ratio(high) < target:
        high *= 2
        if high > MAX_RUNS:
            raise InvalidParameterError(
                "target_ratio", f"reachable with at most {MAX_RUNS} runs", target_ratio
            )
    low = high // 2  # ratio(low) < target (or low = 0)
    while high - low > 1:
        middle = (low + high) // 2
        if ratio(middle) >= target:
            high = middle
        else:
            low = middle
    return high
