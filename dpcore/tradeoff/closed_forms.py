"""Tradeoff functions in closed form, and piecewise-linear ones given by their vertices."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import special

from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_delta, gdp_epsilon
from dpcore.tradeoff.base import TradeoffFunction, conjugate_delta
from dpcore.validation import check_delta_closed, check_non_negative

__all__ = [
    "EpsilonDeltaTradeoff",
    "GaussianTradeoff",
    "IdentityTradeoff",
    "PiecewiseLinearTradeoff",
    "lower_convex_envelope",
]

_TOLERANCE = 1e-9


class GaussianTradeoff(TradeoffFunction):
    """G_mu(alpha) = Phi(Phi^{-1}(1 - alpha) - mu) = T(N(0, 1), N(mu, 1)).

    Dong, Roth, Su 2019, Def. 2.6.

    >>> round(GaussianTradeoff(1.0)(0.05), 6)
    0.740489
    """

    def __init__(self, mu: float) -> None:
        self.mu = check_non_negative("mu", mu, allow_infinity=True)

    def __repr__(self) -> str:
        return f"GaussianTradeoff(mu={self.mu!r})"

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        if math.isinf(self.mu):
            return np.zeros_like(alpha)
        return np.asarray(special.ndtr(special.ndtri(1 - alpha) - self.mu))

    def slope(self, alpha: np.ndarray) -> np.ndarray:
        """G_mu'(alpha) = -exp(mu z - mu^2 / 2), z = Phi^{-1}(1 - alpha)."""
        z = special.ndtri(1 - np.asarray(alpha, dtype=float))
        return np.asarray(-np.exp(self.mu * z - self.mu**2 / 2))

    def delta(self, epsilon: float) -> float:
        """Exact: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Cor. 2.13)."""
        return gdp_delta(mu=self.mu, epsilon=epsilon)

    def epsilon(self, delta: float) -> float:
        return gdp_epsilon(mu=self.mu, delta=delta)


class EpsilonDeltaTradeoff(TradeoffFunction):
    """f_{eps,delta}(alpha) = max{0, 1 - delta - e^eps alpha, e^{-eps}(1 - delta - alpha)}.

    Dong, Roth, Su 2019, Prop. 2.5: (eps, delta)-DP is exactly f_{eps,delta}-DP.
    """

    def __init__(self, epsilon: float, delta: float = 0.0) -> None:
        self.epsilon_ = check_non_negative("epsilon", epsilon)
        self.delta_ = check_delta_closed("delta", delta)

    def __repr__(self) -> str:
        return f"EpsilonDeltaTradeoff(epsilon={self.epsilon_!r}, delta={self.delta_!r})"

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        e, d = self.epsilon_, self.delta_
        lines = [np.zeros_like(alpha), 1 - d - math.exp(e) * alpha, math.exp(-e) * (1 - d - alpha)]
        return np.asarray(np.maximum.reduce(lines), dtype=float)

    def vertices(self) -> tuple[np.ndarray, np.ndarray]:
        e, d = self.epsilon_, self.delta_
        corner = (1 - d) / (1 + math.exp(e))
        alpha = np.array([0.0, corner, 1 - d, 1.0])
        return alpha, self(alpha)


class IdentityTradeoff(TradeoffFunction):
    """Id(alpha) = 1 - alpha: perfect privacy (P = Q)."""

    def __repr__(self) -> str:
        return "IdentityTradeoff()"

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        return 1.0 - alpha

    def vertices(self) -> tuple[np.ndarray, np.ndarray]:
        return np.array([0.0, 1.0]), np.array([1.0, 0.0])


def lower_convex_envelope(alpha: Any, beta: Any) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of the largest convex function below the points (monotone-chain lower hull).

    The point (1, 0) is added, as every tradeoff function reaches it.
    """
    # Roundoff in accumulated masses can push alpha a hair outside [0, 1].
    a = np.clip(np.concatenate([np.asarray(alpha, dtype=float), [1.0]]), 0.0, 1.0)
    b = np.concatenate([np.asarray(beta, dtype=float), [0.0]])
    # One point per alpha (the lowest beta), sorted by alpha.
    a, first = np.unique(a, return_inverse=True)
    lowest = np.full(a.size, np.inf)
    np.minimum.at(lowest, first, b)
    b = lowest
    hull: list[int] = []
    for i in range(a.size):
        while len(hull) >= 2:
            j, k = hull[-2], hull[-1]
            cross = (a[k] - a[j]) * (b[i] - b[j]) - (b[k] - b[j]) * (a[i] - a[j])
            if cross <= 0:
                hull.pop()
            else:
                break
        hull.append(i)
    return a[hull], b[hull]


class PiecewiseLinearTradeoff(TradeoffFunction):
    """The tradeoff function through the given vertices (linear in between).

    Validated: alpha starts at 0 and ends at 1 (strictly increasing), beta is non-increasing,
    within [0, 1], below 1 - alpha and convex (all up to 1e-9).
    """

    def __init__(self, alpha_vertices: Any, beta_vertices: Any) -> None:
        alpha = np.asarray(alpha_vertices, dtype=float)
        beta = np.asarray(beta_vertices, dtype=float)
        if alpha.ndim != 1 or alpha.shape != beta.shape or alpha.size < 2:
            raise InvalidParameterError(
                "alpha_vertices",
                "and beta_vertices to be 1-D of one length >= 2",
                (alpha.shape, beta.shape),
            )
        if np.any(~np.isfinite(alpha)) or np.any(~np.isfinite(beta)):
            raise InvalidParameterError("vertices", "to be finite", "NaN or inf")
        if alpha[0] != 0 or alpha[-1] != 1 or np.any(np.diff(alpha) <= 0):
            raise InvalidParameterError(
                "alpha_vertices", "strictly increasing from 0 to 1", alpha_vertices
            )
        if np.any(beta < -_TOLERANCE) or np.any(beta > 1 + _TOLERANCE):
            raise InvalidParameterError("beta_vertices", "in [0, 1]", beta_vertices)
        if np.any(np.diff(beta) > _TOLERANCE):
            raise InvalidParameterError("beta_vertices", "non-increasing", beta_vertices)
        if np.any(beta > 1 - alpha + _TOLERANCE):
            raise InvalidParameterError(
                "beta_vertices", "<= 1 - alpha (a tradeoff function)", beta_vertices
            )
        slopes = np.diff(beta) / np.diff(alpha)
        if np.any(np.diff(slopes) < -_TOLERANCE * np.maximum(1.0, np.abs(slopes[1:]))):
            raise InvalidParameterError(
                "beta_vertices",
                "convex in alpha (use lower_convex_envelope)",
                "non-convex vertices",
            )
        self.alpha = alpha
        self.beta = np.clip(beta, 0.0, 1.0)

    @classmethod
    def from_points(cls, alpha: Any, beta: Any) -> PiecewiseLinearTradeoff:
        """The lower convex envelope of arbitrary points, as a tradeoff function."""
        a, b = lower_convex_envelope(alpha, beta)
        if a[0] != 0:
            a, b = np.concatenate([[0.0], a]), np.concatenate([[1.0], b])
        return cls(a, np.minimum(b, 1 - a))

    def __repr__(self) -> str:
        return f"PiecewiseLinearTradeoff({self.alpha.size} vertices)"

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        return np.asarray(np.interp(alpha, self.alpha, self.beta), dtype=float)

    def vertices(self) -> tuple[np.ndarray, np.ndarray]:
        return self.alpha.copy(), self.beta.copy()

    def delta(self, epsilon: float) -> float:
        """Exact for a polygon: the supremum is attained at a vertex."""
        epsilon = check_non_negative("epsilon", epsilon, allow_infinity=True)
        if math.isinf(epsilon):
            return float(1 - self.beta[0])
        return conjugate_delta(self.alpha, self.beta, epsilon)
