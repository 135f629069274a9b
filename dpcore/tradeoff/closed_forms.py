"""Tradeoff functions in closed form, and piecewise-linear ones given by their vertices."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
from scipy import special

from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_delta, gdp_epsilon
from dpcore.tradeoff.base import DEFAULT_POINTS, TradeoffFunction, check_alpha
from dpcore.validation import check_delta, check_delta_closed, check_non_negative

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
        return np.asarray(special.ndtr(_upper_quantile(alpha) - self.mu))

    def points(self, count: int = DEFAULT_POINTS) -> tuple[np.ndarray, np.ndarray]:
        if self.mu == 0.0:
            return np.array([0.0, 1.0]), np.array([1.0, 0.0])
        if math.isinf(self.mu):
            return np.array([0.0, 1.0]), np.array([0.0, 0.0])
        return super().points(count)

    def slope(self, alpha: np.ndarray) -> np.ndarray:
        """G_mu'(alpha) = -exp(mu z - mu^2 / 2), z = Phi^{-1}(1 - alpha).

        -inf at alpha = 0 and 0 at alpha = 1 (for 0 < mu < inf); -1 everywhere for mu = 0.
        """
        a = check_alpha(alpha)
        if self.mu == 0.0:
            return np.full_like(a, -1.0)
        if math.isinf(self.mu):
            return np.where(a > 0, 0.0, -math.inf)
        z = _upper_quantile(a)
        # mu z - mu^2/2 = mu (z - mu/2) avoids overflowing mu^2 for huge mu.
        with np.errstate(over="ignore", invalid="ignore"):
            exponent = self.mu * (z - self.mu / 2)
            slope = -np.exp(exponent)
        return np.asarray(np.where(a == 0, -math.inf, np.where(a == 1, 0.0, slope)))

    def delta(self, epsilon: float) -> float:
        """Exact: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Cor. 2.13).

        For mu < 1e-4 the difference loses its precision (it is of order mu between terms of
        order 1), so the upper bound Phi(-eps/mu + mu/2) - Phi(-eps/mu - mu/2) <=
        mu phi(max(0, eps/mu - mu/2)) is returned instead (e^eps >= 1, and phi is largest
        where |x| is smallest on the interval): never below the exact value.

        >>> GaussianTradeoff(1.0).delta(1.0) == gdp_delta(mu=1.0, epsilon=1.0)
        True
        """
        epsilon = check_non_negative("epsilon", epsilon, allow_infinity=True)
        if 0.0 < self.mu < SMALL_MU and not math.isinf(epsilon):
            return _exp_up(log_small_mu_delta_bound(self.mu, epsilon))
        return gdp_delta(mu=self.mu, epsilon=epsilon)

    def epsilon(self, delta: float) -> float:
        """Exact inverse of :meth:`delta` (:func:`~dpcore.mechanisms.gaussian.gdp_epsilon`).

        For mu < 1e-4 the inverse of the upper bound used by :meth:`delta`, so that
        delta(epsilon(d)) <= d holds for the exact delta too.
        """
        delta = check_delta("delta", delta)
        if 0.0 < self.mu < SMALL_MU:
            return _small_mu_epsilon(self.mu, delta)
        return gdp_epsilon(mu=self.mu, delta=delta)


#: Below this mu, G_mu's delta(epsilon) is computed from an upper bound (see its ``delta``).
SMALL_MU = 1e-4


def _upper_quantile(alpha: np.ndarray) -> np.ndarray:
    """Phi^{-1}(1 - alpha), accurate for tiny alpha too (1 - 1e-20 rounds to 1 in floats)."""
    a = np.asarray(alpha, dtype=float)
    return np.asarray(np.where(a < 0.5, -special.ndtri(a), special.ndtri(1 - a)))


def log_small_mu_delta_bound(mu: float, epsilon: float) -> float:
    """An upper bound on log delta(epsilon) of mu-GDP that keeps its precision for tiny mu.

    With a, b = -eps/mu +- mu/2: delta = (Phi(a) - Phi(b)) - (e^eps - 1) Phi(b), and the
    integral Phi(a) - Phi(b) of phi over [b, a] is at most its width mu times phi's largest
    value there, mu phi(max(0, eps/mu - mu/2)) =: U. So delta <= U - (e^eps - 1) Phi(b); the two
    terms nearly cancel for tiny mu, so 1e-12 U (far above their rounding errors) is added
    back, and U alone is the bound where they round to more than U. Computed in logs: nothing
    overflows or underflows for subnormal mu or huge epsilon.
    """
    with np.errstate(over="ignore"):
        ratio = float(np.float64(epsilon) / np.float64(mu))
    x = max(0.0, ratio - mu / 2)
    log_first = math.log(mu) - 0.5 * math.log(2 * math.pi) - 0.5 * x * x
    if epsilon == 0.0 or math.isinf(ratio):
        return log_first + _LOG_SLACK
    log_growth = epsilon + math.log(-math.expm1(-epsilon))  # log(e^eps - 1), no overflow
    log_second = log_growth + float(special.log_ndtr(-ratio - mu / 2))
    kept = -math.expm1(log_second - log_first) if log_second < log_first else 0.0
    return log_first + math.log(min(1.0, kept + 1e-12)) + _LOG_SLACK


#: Added to the logarithm of the bound: covers the rounding of its own computation.
_LOG_SLACK = 1e-12


def _exp_up(log_value: float) -> float:
    """e^log_value rounded up (exp is coarse below the normal range: one step up there)."""
    value = math.exp(log_value)
    return value if value >= sys.float_info.min else math.nextafter(value, math.inf)


def _small_mu_epsilon(mu: float, delta: float) -> float:
    """Smallest epsilon >= 0 with e^:func:`log_small_mu_delta_bound` <= delta, rounded up.

    The bracket's upper end comes from the first term alone (mu phi(x) = delta at
    x = sqrt(2 log(mu / (delta sqrt(2 pi))))); bisection keeps an upper end that meets delta.
    """
    if _exp_up(log_small_mu_delta_bound(mu, 0.0)) <= delta:
        return 0.0
    x = math.sqrt(2 * (math.log(mu) - math.log(delta) - 0.5 * math.log(2 * math.pi)))
    high = mu * (x + mu / 2)
    while _exp_up(log_small_mu_delta_bound(mu, high)) > delta:
        high = math.nextafter(high, math.inf) * (1 + 1e-15)
    low = 0.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if not low < middle < high:
            break
        if _exp_up(log_small_mu_delta_bound(mu, middle)) <= delta:
            high = middle
        else:
            low = middle
    return high


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
        # e^eps overflows for eps > ~709.78: the steep line is then 1 - d at alpha = 0 only.
        with np.errstate(over="ignore", invalid="ignore"):
            steep = np.where(alpha > 0, np.float64(np.exp(np.float64(e))) * alpha, 0.0)
        lines = [np.zeros_like(alpha), 1 - d - steep, math.exp(-e) * (1 - d - alpha)]
        return np.asarray(np.maximum.reduce(lines), dtype=float)

    def points(self, count: int = DEFAULT_POINTS) -> tuple[np.ndarray, np.ndarray]:
        """The vertices (0, 1 - d), (c, c), (1 - d, 0), (1, 0) with c = (1 - d) / (1 + e^eps).

        Where c underflows to 0 (eps > ~745) the corner is put at the smallest float above 0
        with beta = 0: on every representable alpha > 0 that polygon is <= the exact curve.
        """
        e, d = self.epsilon_, self.delta_
        corner = math.exp(math.log1p(-d) - float(np.logaddexp(0.0, e)))
        alpha = np.unique([0.0, max(corner, 5e-324), 1 - d, 1.0])
        return alpha, self(alpha)

    def delta(self, epsilon: float) -> float:
        """Exact: max{d, 1 - (1 - d)(1 + e^eps')/(1 + e^eps), 1 - e^eps' (1 - d)} (at least 0).

        The supremum of 1 - e^eps' alpha - f(alpha) over the vertices (0, 1 - d), (c, c),
        (1 - d, 0) with c = (1 - d) / (1 + e^eps) (Dong, Roth, Su 2019, Prop. 2.12), computed
        in logs so that no e^eps overflows.

        >>> EpsilonDeltaTradeoff(1.0, 0.0).delta(0.0) == (math.e - 1) / (math.e + 1)
        True
        """
        eps2 = check_non_negative("epsilon", epsilon, allow_infinity=True)
        e, d = self.epsilon_, self.delta_
        if math.isinf(eps2):
            return d
        log_keep = math.log1p(-d)
        log_ratio = float(np.logaddexp(0.0, eps2) - np.logaddexp(0.0, e)) + log_keep
        corner = -math.expm1(log_ratio) if log_ratio < 0 else 0.0
        far = -math.expm1(eps2 + log_keep) if eps2 + log_keep < 0 else 0.0
        return float(min(1.0, max(d, corner, far, 0.0)))


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
        # Not np.interp: its slopes overflow between vertices a subnormal distance apart.
        last = self.alpha.size - 2
        i = np.clip(np.searchsorted(self.alpha, alpha, side="right") - 1, 0, last)
        a0, a1, b0, b1 = self.alpha[i], self.alpha[i + 1], self.beta[i], self.beta[i + 1]
        weight = np.clip((alpha - a0) / (a1 - a0), 0.0, 1.0)
        return np.asarray(b0 + weight * (b1 - b0), dtype=float)

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
    # Subnormal alpha steps give slopes beyond the float range (inf); comparisons stay valid.
    with np.errstate(over="ignore", invalid="ignore"):
        slopes = np.diff(beta) / np.diff(alpha)
        concave = np.diff(slopes) < -_TOLERANCE * np.maximum(1.0, np.abs(slopes[1:]))
    if np.any(concave):
        raise InvalidParameterError(
            "beta_vertices", "convex in alpha (or pass hull=True)", "non-convex vertices"
        )
