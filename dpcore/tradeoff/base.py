"""The tradeoff-function interface (f-DP, Dong, Roth, Su 2019, arXiv 1905.02383).

Convention: for distributions P, Q, T(P, Q)(alpha) = inf{beta_phi : alpha_phi <= alpha} with
alpha_phi = E_P[phi] (type I error) and beta_phi = 1 - E_Q[phi] (type II error). A function is a
tradeoff function iff it is convex, continuous, non-increasing and f(alpha) <= 1 - alpha on [0, 1]
(Dong, Roth, Su 2019, Prop. 2.2). A mechanism is f-DP if T(M(D), M(D')) >= f for neighbours.
"""

from __future__ import annotations

import abc
import math
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from dpcore.errors import InvalidParameterError
from dpcore.validation import check_allocation, check_count, check_delta, check_non_negative

if TYPE_CHECKING:
    from dpcore.tradeoff.closed_forms import PiecewiseLinearTradeoff

__all__ = ["TradeoffFunction", "check_alpha", "conjugate_delta", "points_below"]

#: Default number of points at which a curve without exact vertices is sampled.
DEFAULT_POINTS = 12000


def conjugate_delta(alpha: np.ndarray, beta: np.ndarray, epsilon: float) -> float:
    """max over points of 1 - e^epsilon alpha - beta, clipped to [0, 1] (no overflow)."""
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.where(alpha > 0, np.exp(epsilon) * alpha, 0.0)
    return float(np.clip(np.max(1.0 - scaled - beta), 0.0, 1.0))


def check_alpha(alpha: Any) -> np.ndarray:
    """alpha as a float array in [0, 1]; NaN or out-of-range values raise."""
    try:
        values = np.asarray(alpha, dtype=float)
    except (TypeError, ValueError):
        raise InvalidParameterError("alpha", "to be real numbers in [0, 1]", alpha) from None
    if np.any(np.isnan(values)) or np.any(values < 0) or np.any(values > 1):
        raise InvalidParameterError("alpha", "in [0, 1]", alpha)
    return values


def sample_grid(count: int) -> np.ndarray:
    """About ``count`` alphas in [0, 1], geometric towards both ends, where curves bend most.

    Relative steps of about 0.5% (at the default count) from 1e-10 to 1 - 1e-10, coarser
    beyond, down to 1e-300 so that f(0) = 1 is resolved for steep curves (large mu).
    """
    far_zero, far_one = count // 8, count // 12
    fine_low = (count - far_zero - far_one) // 2
    fine_high = count - far_zero - far_one - fine_low
    low = np.concatenate(
        [np.geomspace(1e-300, 1e-10, far_zero), np.geomspace(1e-10, 0.5, fine_low)]
    )
    high = 1 - np.concatenate(
        [np.geomspace(1e-16, 1e-10, far_one), np.geomspace(1e-10, 0.5, fine_high)]
    )
    return np.unique(np.concatenate([[0.0, 1.0], low, high]))


def points_below(alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of a piecewise-linear function g <= f, for a *convex* f known at points.

    By convexity the chord through two neighbouring points, extended beyond them, lies below f.
    On [a_i, a_{i+1}] f is therefore at least the larger of the chords of the intervals to its
    left and right; g is that maximum, which equals f at every a_i (i >= 1) and dips to the
    crossing of the two outer chords in between. On [0, a_1] only the right chord is available;
    on the last interval the left chord and f(1).
    The sampling error is thus turned into a pessimistic (too low) curve rather than the chord
    interpolation, which would lie *above* f. Points where rounding makes the samples slightly
    non-convex get no dip.

    Args:
        alpha: strictly increasing, from 0 to 1 (at least three points).
        beta: f(alpha).

    Returns:
        (alpha, beta) vertices of g, alpha non-decreasing.
    """
    a, b = np.asarray(alpha, dtype=float), np.asarray(beta, dtype=float)
    slopes = np.diff(b) / np.diff(a)
    # Interval i = [a_i, a_{i+1}] for 1 <= i <= n - 2 has chords on both sides.
    left, right = slopes[:-2], slopes[2:]
    a_lo, a_hi, b_lo, b_hi = a[1:-2], a[2:-1], b[1:-2], b[2:-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        x = (b_hi - b_lo + left * a_lo - right * a_hi) / (left - right)
    dips = (left < right) & (x > a_lo) & (x < a_hi)
    y = np.clip(b_hi[dips] + right[dips] * (x[dips] - a_hi[dips]), b_hi[dips], b_lo[dips])
    start = float(np.clip(b[1] - slopes[1] * a[1], b[1], b[0]))
    # On the last interval: the chord to its left, and f(1) (f is non-increasing).
    end_a, end_b = np.empty(0), np.empty(0)
    if slopes[-2] < 0:
        x_end = a[-2] + (b[-1] - b[-2]) / slopes[-2]
        if a[-2] < x_end < a[-1]:
            end_a, end_b = np.array([x_end]), b[-1:]
    points_a = np.concatenate([[0.0], a[1:], x[dips], end_a])
    points_b = np.concatenate([[start], b[1:], y, end_b])
    order = np.argsort(points_a, kind="stable")
    return points_a[order], points_b[order]


class TradeoffFunction(abc.ABC):
    """A tradeoff function f: [0, 1] -> [0, 1], evaluated elementwise on arrays.

    Subclasses implement ``_evaluate``. Those that are piecewise linear set
    ``exact_vertices = True`` and return their vertices from :meth:`points`; this makes
    :meth:`delta` exact and lets the operations use the curve as it is.
    """

    #: Whether :meth:`points` returns the exact vertices of a piecewise-linear curve.
    exact_vertices: bool = False

    @abc.abstractmethod
    def _evaluate(self, alpha: np.ndarray) -> np.ndarray:
        """f on a validated 1-D float array."""

    @overload
    def __call__(self, alpha: float) -> float: ...

    @overload
    def __call__(self, alpha: np.ndarray) -> np.ndarray: ...

    def __call__(self, alpha: Any) -> Any:
        """f(alpha), elementwise; a float for a scalar alpha.

        Raises:
            InvalidParameterError: alpha is NaN or outside [0, 1].
        """
        values = check_alpha(alpha)
        out = np.clip(self._evaluate(np.atleast_1d(values).ravel()), 0.0, 1.0)
        return float(out[0]) if values.ndim == 0 else out.reshape(values.shape)

    def points(self, count: int = DEFAULT_POINTS) -> tuple[np.ndarray, np.ndarray]:
        """A vertex set (alpha, beta) of the curve, alpha increasing from 0 to 1.

        The exact vertices for piecewise-linear functions (``count`` is then ignored); otherwise
        about ``count`` points on the curve, denser near alpha = 0 and alpha = 1.

        Raises:
            InvalidParameterError: ``count`` < 16.
            ResourceLimitError: ``count`` too large for the memory limit.
        """
        count = check_count("count", count, minimum=16)
        check_allocation("count", count, elements=4 * count)
        alpha = sample_grid(count)
        return alpha, self(alpha)

    def delta(self, epsilon: float) -> float:
        """delta(epsilon) = 1 + f*(-e^epsilon) = sup_alpha (1 - e^epsilon alpha - f(alpha)).

        The f-DP => (epsilon, delta)-DP conversion (Dong, Roth, Su 2019, Prop. 2.12). Exact for
        piecewise-linear curves (the supremum sits at a vertex). Otherwise the supremum is taken
        over the vertices of a polygon *below* f built from :meth:`points` (see
        :func:`points_below`), so the answer errs upwards: an upper bound on delta, too large by
        at most the polygon's gap to f (measured below 3e-6 for G_mu, mu <= 8). Subclasses with a
        closed form override this.

        Raises:
            InvalidParameterError: epsilon < 0 or NaN.
        """
        epsilon = check_non_negative("epsilon", epsilon, allow_infinity=True)
        if math.isinf(epsilon):
            return float(1.0 - self(0.0))
        alpha, beta = self.points()
        if not self.exact_vertices:
            alpha, beta = points_below(alpha, beta)
        return conjugate_delta(alpha, beta, epsilon)

    def epsilon(self, delta: float) -> float:
        """Smallest epsilon >= 0 with :meth:`delta` (epsilon) <= delta (inf if none below 1e4).

        Bisection on the non-increasing delta(epsilon); the result is the upper end of the final
        bracket, so delta(result) <= delta holds.

        Raises:
            InvalidParameterError: delta not in (0, 1).
        """
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
        """delta(epsilon) for each epsilon (the privacy profile), same shape as ``epsilons``."""
        values = np.asarray(epsilons, dtype=float)
        flat = [self.delta(float(e)) for e in values.ravel()]
        return np.asarray(flat, dtype=float).reshape(values.shape)

    def symmetrise(self) -> PiecewiseLinearTradeoff:
        """min{f, f^{-1}}**: see :func:`dpcore.tradeoff.operations.symmetrise`."""
        from dpcore.tradeoff.operations import symmetrise

        return symmetrise(self)
