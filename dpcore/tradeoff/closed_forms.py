"""Tradeoff functions in closed form, and piecewise-linear ones given by their vertices."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import special

from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_delta, gdp_epsilon
from dpcore.tradeoff.base import DEFAULT_POINTS, TradeoffFunction
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
        # G_0 = Id and G_inf = 0 are polygons.
        self.exact_vertices = self.mu == 0.0 or math.isinf(self.mu)

    def __repr__(self) -> str:
        return f"GaussianTradeoff(mu={self.mu!r})"

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        if math.isinf(self.mu):
            return np.zeros_like(alpha)
        return np.asarray(special.ndtr(special.ndtri(1 - alpha) - self.mu))

    def points(self, count: int = DEFAULT_POINTS) -> tuple[np.ndarray, np.ndarray]:
        if self.mu == 0.0:
            return np.array([0.0, 1.0]), np.array([1.0, 0.0])
        if math.isinf(self.mu):
            return np.array([0.0, 1.0]), np.array([0.0, 0.0])
        return super().points(count)

    def slope(self, alpha: np.ndarray) -> np.ndarray:
        """G_mu'(alpha) = -exp(mu z - mu^2 / 2), z = Phi^{-1}(1 - alpha)."""
        z = special.ndtri(1 - np.asarray(alpha, dtype=float))
        return np.asarray(-np.exp(self.mu * z - self.mu**2 / 2))

    def delta(self, epsilon: float) -> float:
        """Exact: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Cor. 2.13).

        >>> GaussianTradeoff(1.0).delta(1.0) == gdp_delta(mu=1.0, epsilon=1.0)
        True
        """
        return gdp_delta(mu=self.mu, epsilon=epsilon)

    def epsilon(self, delta: float) -> float:
        """Exact inverse of :meth:`delta` (:func:`~dpcore.mechanisms.gaussian.gdp_epsilon`)."""
        return gdp_epsilon(mu=self.mu, delta=delta)


class EpsilonDeltaTradeoff(TradeoffFunction):
    """f_{eps,delta}(alpha) = max{0, 1 - delta - e^eps alpha, e^{-eps}(1 - delta - alpha)}.

    Dong, Roth, Su 2019, Prop. 2.5: (eps, delta)-DP is exactly f_{eps,delta}-DP.

    >>> round(EpsilonDeltaTradeoff(1.0, 0.01).delta(1.0), 12)
    0.01
    """

    exact_vertices = True

    def __init__(self, epsilon: float, delta: float = 0.0) -> None:
        self.epsilon_ = check_non_negative("epsilon", epsilon)
        self.delta_ = check_delta_closed("delta", delta)

    def __repr__(self) -> str:
        return f"EpsilonDeltaTradeoff(epsilon={self.epsilon_!r}, delta={self.delta_!r})"

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        e, d = self.epsilon_, self.delta_
        lines = [np.zeros_like(alpha), 1 - d - math.exp(e) * alpha, math.exp(-e) * (1 - d - alpha)]
        return np.asarray(np.maximum.reduce(lines), dtype=float)

    def points(self, count: int = DEFAULT_POINTS) -> tuple[np.ndarray, np.ndarray]:
        e, d = self.epsilon_, self.delta_
        corner = (1 - d) / (1 + math.exp(e))
        alpha = np.unique([0.0, corner, 1 - d, 1.0])
        return alpha, self(alpha)


class IdentityTradeoff(TradeoffFunction):
    """Id(alpha) = 1 - alpha: perfect privacy (P = Q).

    >>> IdentityTradeoff().delta(0.0)
    0.0
    """

    exact_vertices = True

    def __repr__(self) -> str:
        return "IdentityTradeoff()"

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        return 1.0 - alpha

    def points(self, count: int = DEFAULT_POINTS) -> tuple[np.ndarray, np.ndarray]:
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

    Validated (up to 1e-9): alpha starts at 0 and ends at 1, strictly increasing; beta is in
    [0, 1], non-increasing, convex, below 1 - alpha, and so reaches 0 at alpha = 1. With
    ``hull=True`` arbitrary points are accepted instead and replaced by their lower convex
    envelope (the convex hull of the function through them, with (1, 0) added).

    Args:
        alpha_vertices: type I errors of the vertices.
        beta_vertices: type II errors of the vertices.
        hull: take the lower convex envelope instead of requiring a convex polygon.

    Raises:
        InvalidParameterError: naming ``alpha_vertices`` or ``beta_vertices``.

    >>> f = PiecewiseLinearTradeoff([0.0, 0.25, 1.0], [0.5, 0.1, 0.0])
    >>> float(f(0.5))
    0.0666...
    >>> PiecewiseLinearTradeoff([0.0, 0.5, 1.0], [1.0, 0.6, 0.0], hull=True).alpha
    array([0., 1.])
    """

    exact_vertices = True

    def __init__(self, alpha_vertices: Any, beta_vertices: Any, *, hull: bool = False) -> None:
        alpha = _vertex_array("alpha_vertices", alpha_vertices)
        beta = _vertex_array("beta_vertices", beta_vertices)
        if alpha.shape != beta.shape:
            raise InvalidParameterError(
                "beta_vertices", f"to have the length of alpha_vertices ({alpha.size})", beta.size
            )
        if hull:
            # Accumulated masses may stray from [0, 1] by roundoff; they are clipped.
            if np.any(alpha < -_TOLERANCE) or np.any(alpha > 1 + _TOLERANCE):
                raise InvalidParameterError("alpha_vertices", "in [0, 1]", alpha_vertices)
            alpha, beta = lower_convex_envelope(alpha, beta)
            if alpha[0] != 0:
                alpha, beta = np.concatenate([[0.0], alpha]), np.concatenate([[1.0], beta])
            beta = np.clip(np.minimum(beta, 1 - alpha), 0.0, 1.0)
        _check_polygon(alpha, beta)
        self.alpha = alpha
        self.beta = np.clip(beta, 0.0, 1.0)

    @classmethod
    def from_points(cls, alpha: Any, beta: Any) -> PiecewiseLinearTradeoff:
        """The lower convex envelope of arbitrary points, as a tradeoff function."""
        return cls(alpha, beta, hull=True)

    def __repr__(self) -> str:
        return f"PiecewiseLinearTradeoff({self.alpha.size} vertices)"

    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        return np.asarray(np.interp(alpha, self.alpha, self.beta), dtype=float)

    def points(self, count: int = DEFAULT_POINTS) -> tuple[np.ndarray, np.ndarray]:
        return self.alpha.copy(), self.beta.copy()


def _vertex_array(name: str, values: Any) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise InvalidParameterError(name, "to be a 1-D array of real numbers", values) from None
    if array.ndim != 1 or array.size < 2:
        raise InvalidParameterError(name, "to be 1-D with at least 2 entries", values)
    if not np.all(np.isfinite(array)):
        raise InvalidParameterError(name, "to be finite (no NaN or inf)", values)
    return array


def _check_polygon(alpha: np.ndarray, beta: np.ndarray) -> None:
    if alpha[0] != 0 or alpha[-1] != 1 or np.any(np.diff(alpha) <= 0):
        raise InvalidParameterError("alpha_vertices", "strictly increasing from 0 to 1", alpha)
    if np.any(beta < -_TOLERANCE) or np.any(beta > 1 + _TOLERANCE):
        raise InvalidParameterError("beta_vertices", "in [0, 1]", beta)
    if np.any(np.diff(beta) > _TOLERANCE):
        raise InvalidParameterError("beta_vertices", "non-increasing", beta)
    if np.any(beta > 1 - alpha + _TOLERANCE):
        raise InvalidParameterError("beta_vertices", "<= 1 - alpha (ending at 0)", beta)
    slopes = np.diff(beta) / np.diff(alpha)
    if np.any(np.diff(slopes) < -_TOLERANCE * np.maximum(1.0, np.abs(slopes[1:]))):
        raise InvalidParameterError(
            "beta_vertices", "convex in alpha (or pass hull=True)", "non-convex vertices"
        )
