"""Empirical tradeoff curves of two distributions from samples of a scalar score."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpcore.errors import InvalidParameterError
from dpcore.tradeoff.closed_forms import PiecewiseLinearTradeoff

__all__ = ["from_samples"]


def _samples(name: str, values: Any) -> np.ndarray:
    try:
        array = np.sort(np.asarray(values, dtype=float).ravel())
    except (TypeError, ValueError):
        raise InvalidParameterError(name, "to be real numbers", values) from None
    if array.size == 0 or not np.all(np.isfinite(array)):
        raise InvalidParameterError(name, "to be non-empty and finite", f"{array.size} samples")
    return array


def from_samples(samples_p: Any, samples_q: Any) -> PiecewiseLinearTradeoff:
    """Empirical tradeoff curve T(P_n, Q_m) of two distributions from scores — an *estimate*.

    Each sample is a scalar score (e.g. a log-likelihood ratio, or any statistic an attack
    computes). Every threshold test on the score, in both directions (reject P when the score is
    above t, or below t), gives an empirical (alpha, beta) point, i.e. the ROC curve; the lower
    convex envelope of all of them (randomised tests fill the gaps) is returned.

    This is the tradeoff function of the two *empirical* distributions. Sampling error is not
    accounted for, so it is neither an upper nor a lower bound on the true T(P, Q) (its
    deviation is of order 1/sqrt(n) in the Kolmogorov sense); :mod:`dpcore.auditing` adds
    confidence. With a score that is not the likelihood ratio the curve tends to a curve above
    T(P, Q).

    Args:
        samples_p: scores drawn from P (the null hypothesis).
        samples_q: scores drawn from Q (the alternative).

    Returns:
        The empirical curve, a convex polygon.

    Raises:
        InvalidParameterError: naming ``samples_p`` or ``samples_q`` when empty or not finite.

    >>> f = from_samples([0.0, 1.0], [2.0, 3.0])  # perfectly separated
    >>> float(f(0.0))
    0.0
    """
    p = _samples("samples_p", samples_p)
    q = _samples("samples_q", samples_q)
    thresholds = np.unique(np.concatenate([p, q, [-np.inf]]))
    # Reject P when score > t: alpha = P(score > t), beta = Q(score <= t).
    alpha_up = 1 - np.searchsorted(p, thresholds, side="right") / p.size
    beta_up = np.searchsorted(q, thresholds, side="right") / q.size
    # Reject P when score < t: alpha = P(score < t), beta = Q(score >= t).
    alpha_down = np.searchsorted(p, thresholds, side="left") / p.size
    beta_down = 1 - np.searchsorted(q, thresholds, side="left") / q.size
    alpha = np.concatenate([[0.0], alpha_up, alpha_down])
    beta = np.concatenate([[1.0], beta_up, beta_down])
    return PiecewiseLinearTradeoff(alpha, np.minimum(beta, 1 - alpha), hull=True)
