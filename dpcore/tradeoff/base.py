"""Tradeoff functions (f-DP, Dong, Roth, Su 2019, arXiv 1905.02383) as objects.

Convention: for distributions P, Q, T(P, Q)(alpha) = inf{beta_phi : alpha_phi <= alpha} with
alpha_phi = E_P[phi] (type I error) and beta_phi = 1 - E_Q[phi] (type II error). A function is a
tradeoff function iff it is convex, continuous, non-increasing and f(alpha) <= 1 - alpha on [0, 1]
(Dong, Roth, Su 2019, Prop. 2.2). A mechanism is f-DP if T(M(D), M(D')) >= f for neighbours.
"""

from __future__ import annotations

import abc
import math
from typing import Any, overload

import numpy as np

from dpcore.errors import InvalidParameterError
from dpcore.validation import check_delta, check_non_negative

__all__ = ["TradeoffFunction", "check_alpha", "conjugate_delta"]


def conjugate_delta(alpha: np.ndarray, beta: np.ndarray, epsilon: float) -> float:
    """max over points of 1 - e^epsilon alpha - beta, clipped to [0, 1] (no overflow)."""
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.where(alpha > 0, np.exp(epsilon) * alpha, 0.0)
    return float(np.clip(np.max(1.0 - scaled - beta), 0.0, 1.0))


def check_alpha(alpha: Any) -> np.ndarray:
    """alpha as a float array in [0, 1]; NaN or out-of-range values raise."""
    values = np.asarray(alpha, dtype=float)
    if np.any(np.isnan(values)) or np.any(values < 0) or np.any(values > 1):
        raise InvalidParameterError("alpha", "in [0, 1]", alpha)
    return values


class TradeoffFunction(abc.ABC):
    """A tradeoff function f: [0, 1] -> [0, 1], evaluated elementwise on arrays."""

    @abc.abstractmethod
    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        """f on a validated float array."""

    @overload
    def __call__(self, alpha: float) -> float: ...

    @overload
    def __call__(self, alpha: np.ndarray) -> np.ndarray: ...

    def __call__(self, alpha: Any) -> Any:
        values = check_alpha(alpha)
        out = np.clip(self._evaluate(np.atleast_1d(values)), 0.0, 1.0)
        return float(out[0]) if values.ndim == 0 else out.reshape(values.shape)

    def vertices(self) -> tuple[np.ndarray, np.ndarray]:
        """(alpha, beta) points on the curve, alpha increasing from 0 to 1.

        Exact vertices for piecewise-linear functions; otherwise a dense grid, refined near
        alpha = 0 and alpha = 1, where tradeoff curves bend most.
        """
        # Down to 1e-300 near 0 so that f(0) = 1 is resolved for steep curves (large mu).
        near_zero = np.geomspace(1e-300, 1e-3, 3000)
        near_one = 1 - np.geomspace(1e-15, 1e-3, 1500)
        middle = np.linspace(1e-3, 1 - 1e-3, 4000)
        alpha = np.unique(np.concatenate([[0.0], near_zero, middle, near_one, [1.0]]))
        return alpha, self(alpha)

    def delta(self, epsilon: float) -> float:
        """delta(epsilon) = 1 + f*(-e^epsilon) = sup_alpha (1 - e^epsilon alpha - f(alpha)).

        The f-DP => (epsilon, delta)-DP conversion (Dong, Roth, Su 2019, Prop. 2.12). For curves
        that are not piecewise linear the supremum is taken over :meth:`vertices`, which can
        miss the exact maximiser by a hair: an estimate from below, accurate to the grid.
        Subclasses with a closed form override this.
        """
        epsilon = check_non_negative("epsilon", epsilon, allow_infinity=True)
        if math.isinf(epsilon):
            return float(1.0 - self(0.0))
        alpha, beta = self.vertices()
        return conjugate_delta(alpha, beta, epsilon)

    def epsilon(self, delta: float) -> float:
        """Smallest epsilon >= 0 with :meth:`delta` (epsilon) <= delta (inf if none)."""
        delta = check_delta("delta", delta)
        if self.delta(0.0) <= delta:
            return 0.0
        high = 1.0
        while self.delta(high) > delta:
            high *= 2
            if high > 1e4:
                return math.inf
        low = 0.0
        while high - low > 1e-10 * max(1.0, high):
            middle = (low + high) / 2
            if self.delta(middle) <= delta:
                high = middle
            else:
                low = middle
        return high

    def epsilon_delta_curve(self, epsilons: Any) -> np.ndarray:
        """delta(epsilon) for each epsilon (the privacy profile)."""
        return np.array([self.delta(float(e)) for e in np.atleast_1d(epsilons)])
