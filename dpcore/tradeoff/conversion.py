"""Tradeoff functions from data: (epsilon, delta) profiles and samples of two distributions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpcore.errors import InvalidParameterError
from dpcore.tradeoff.base import TradeoffFunction
from dpcore.tradeoff.closed_forms import PiecewiseLinearTradeoff

__all__ = [
    "EpsilonDeltaEnvelope",
    "from_epsilon_delta_curve",
    "from_samples",
    "to_epsilon_delta_curve",
]


class EpsilonDeltaEnvelope(TradeoffFunction):
    """f(alpha) = max_i f_{eps_i, delta_i}(alpha): what an (epsilon, delta(epsilon)) family implies.

    A mechanism that is (eps_i, delta_i)-DP for every i is f-DP for this f (Dong, Roth, Su 2019,
    Prop. 2.5 and 2.12); e.g. the curve implied by an RDP accountant's epsilon(delta).
    """

    def __init__(self, epsilons: Any, deltas: Any) -> None:
        eps = np.asarray(epsilons, dtype=float).ravel()
        dl = np.asarray(deltas, dtype=float).ravel()
        if eps.size == 0 or eps.shape != dl.shape:
            raise InvalidParameterError(
                "epsilons", "and deltas to be non-empty and of one length", (eps.size, dl.size)
            )
        finite = np.isfinite(eps)
        if np.any(eps[finite] < 0) or np.any(np.isnan(eps)):
            raise InvalidParameterError("epsilons", ">= 0", epsilons)
        if np.any(np.isnan(dl)) or np.any(dl < 0) or np.any(dl > 1):
            raise InvalidParameterError("deltas", "in [0, 1]", deltas)
        self.epsilons, self.deltas = eps[finite], dl[finite]

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        if self.epsilons.size == 0:
            return np.zeros_like(alpha)
        out = np.zeros_like(alpha)
        for e, d in zip(self.epsilons, self.deltas, strict=True):
            out = np.maximum(
                out, np.maximum(1 - d - math.exp(e) * alpha, math.exp(-e) * (1 - d - alpha))
            )
        return out


def from_epsilon_delta_curve(epsilons: Any, deltas: Any) -> EpsilonDeltaEnvelope:
    """The tradeoff function implied by a privacy profile (see :class:`EpsilonDeltaEnvelope`)."""
    return EpsilonDeltaEnvelope(epsilons, deltas)


def to_epsilon_delta_curve(f: TradeoffFunction, epsilons: Any) -> np.ndarray:
    """delta(epsilon) = 1 + f*(-e^epsilon) for each epsilon (Dong, Roth, Su 2019, Prop. 2.12)."""
    return f.epsilon_delta_curve(epsilons)


def from_samples(samples_p: Any, samples_q: Any) -> PiecewiseLinearTradeoff:
    """Empirical tradeoff curve of two distributions from scalar samples — an *estimate*.

    Every threshold test on the score, in both directions (reject P above or below t), gives an
    (alpha, beta) point; the lower convex envelope of all of them (randomised tests fill the
    gaps) is returned. Sampling error is not accounted for: it is not a bound (the audits add
    confidence intervals).
    """
    p = np.sort(np.asarray(samples_p, dtype=float).ravel())
    q = np.sort(np.asarray(samples_q, dtype=float).ravel())
    if p.size == 0 or q.size == 0 or not (np.all(np.isfinite(p)) and np.all(np.isfinite(q))):
        raise InvalidParameterError("samples", "to be non-empty and finite", (p.size, q.size))
    thresholds = np.unique(np.concatenate([p, q, [-np.inf]]))
    # Reject P when score > t: alpha = P(score > t), beta = Q(score <= t).
    alpha_up = 1 - np.searchsorted(p, thresholds, side="right") / p.size
    beta_up = np.searchsorted(q, thresholds, side="right") / q.size
    # Reject P when score < t: alpha = P(score < t), beta = Q(score >= t).
    alpha_down = np.searchsorted(p, thresholds, side="left") / p.size
    beta_down = 1 - np.searchsorted(q, thresholds, side="left") / q.size
    alpha = np.concatenate([[0.0], alpha_up, alpha_down])
    beta = np.concatenate([[1.0], beta_up, beta_down])
    return PiecewiseLinearTradeoff.from_points(alpha, np.minimum(beta, 1 - alpha))
