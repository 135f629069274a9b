"""Operations on tradeoff functions: inverse, convex hull, symmetrisation, subsampling, composition.

Non-polygonal inputs are first replaced by a polygon that lies *below* them (pessimistic):
tangent lines for functions with a ``slope`` (e.g. G_mu), exact vertices for polygons. Every
operation here is monotone (f >= g implies op(f) >= op(g)), so results stay pessimistic.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpcore.pld.loss_pmf import split_atoms
from dpcore.tradeoff.base import TradeoffFunction
from dpcore.tradeoff.closed_forms import (
    EpsilonDeltaTradeoff,
    IdentityTradeoff,
    PiecewiseLinearTradeoff,
)
from dpcore.validation import check_count, check_positive, check_probability

__all__ = [
    "compose",
    "convex_hull",
    "inverse",
    "minimum_hull",
    "poisson_subsample",
    "polygon_below",
    "self_compose",
    "symmetrise",
]

_COMPOSITION_SPACING = 1e-3
#: Losses beyond +-this are clamped (pessimistically) when tradeoff curves become PLDs.
_LOSS_RANGE = 40.0


def polygon_below(f: TradeoffFunction) -> PiecewiseLinearTradeoff:
    """A piecewise-linear tradeoff function <= f (equal to f when f is already a polygon).

    For a function with ``slope(alpha)`` the polygon is the maximum of its tangent lines at a
    dense grid (tangents of a convex function lie below it); otherwise the chords through
    :meth:`vertices` are used, which can lie above f by the grid's curvature error (stated
    here because it is the one non-pessimistic case; all closed forms in dpcore avoid it).
    """
    if isinstance(f, (PiecewiseLinearTradeoff, EpsilonDeltaTradeoff, IdentityTradeoff)):
        alpha, beta = f.vertices()
        return PiecewiseLinearTradeoff.from_points(alpha, beta)
    slope = getattr(f, "slope", None)
    alpha, beta = f.vertices()
    if slope is None:
        return PiecewiseLinearTradeoff.from_points(alpha, beta)
    inner = (alpha > 0) & (alpha < 1)
    a, b = alpha[inner], beta[inner]
    s = np.asarray(slope(a), dtype=float)
    # Consecutive tangents t_i, t_{i+1} meet at x_i; the max of tangents has its kinks there.
    with np.errstate(divide="ignore", invalid="ignore"):
        x = (b[1:] - b[:-1] + s[:-1] * a[:-1] - s[1:] * a[1:]) / (s[:-1] - s[1:])
    keep = np.isfinite(x) & (x > 0) & (x < 1)
    y = b[:-1][keep] + s[:-1][keep] * (x[keep] - a[:-1][keep])
    start = min(1.0, b[0] - s[0] * a[0])
    end = max(0.0, b[-1] + s[-1] * (1 - a[-1]))
    points_a = np.concatenate([[0.0], x[keep], [1.0]])
    points_b = np.concatenate([[start], np.maximum(y, 0.0), [end]])
    return PiecewiseLinearTradeoff.from_points(points_a, np.minimum(points_b, 1 - points_a))


def convex_hull(f: TradeoffFunction) -> PiecewiseLinearTradeoff:
    """The biconjugate f** (largest convex function below f), as a polygon."""
    alpha, beta = f.vertices()
    return PiecewiseLinearTradeoff.from_points(alpha, beta)


def _inverse_vertices(alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of f^{-1}(x) = inf{t : f(t) <= x} for a polygon with vertices (alpha, beta)."""
    x = np.concatenate([beta[::-1], [1.0]])
    y = np.concatenate([alpha[::-1], [0.0]])
    # Where beta is flat the inverse jumps; keep the smallest t for each x.
    order = np.lexsort((y, x))
    x, y = x[order], y[order]
    first = np.concatenate([[True], np.diff(x) > 0])
    return x[first], y[first]


def inverse(f: TradeoffFunction) -> PiecewiseLinearTradeoff:
    """f^{-1}(alpha) = inf{t in [0, 1] : f(t) <= alpha} (Dong, Roth, Su 2019, eq. (5))."""
    polygon = polygon_below(f)
    x, y = _inverse_vertices(polygon.alpha, polygon.beta)
    if x[0] > 0:
        x, y = np.concatenate([[0.0], x]), np.concatenate([[y[0]], y])
    return PiecewiseLinearTradeoff.from_points(x, y)


def minimum_hull(
    first: PiecewiseLinearTradeoff, second: PiecewiseLinearTradeoff
) -> PiecewiseLinearTradeoff:
    """convex_hull(min(first, second)) exactly: min is taken at all vertices and crossings."""
    grid = np.union1d(first.alpha, second.alpha)
    u, v = first(grid), second(grid)
    d = u - v
    crossing = np.nonzero(d[:-1] * d[1:] < 0)[0]
    t = d[crossing] / (d[crossing] - d[crossing + 1])
    extra = grid[crossing] + t * (grid[crossing + 1] - grid[crossing])
    points = np.union1d(grid, extra)
    return PiecewiseLinearTradeoff.from_points(points, np.minimum(first(points), second(points)))


def symmetrise(f: TradeoffFunction) -> PiecewiseLinearTradeoff:
    """min{f, f^{-1}}**: the symmetric tradeoff function implied by f under add/remove."""
    polygon = polygon_below(f)
    return minimum_hull(polygon, inverse(polygon))


def poisson_subsample(f: TradeoffFunction, sampling_probability: float) -> PiecewiseLinearTradeoff:
    """C_q(f) = min{f_q, f_q^{-1}}** with f_q = q f + (1 - q) Id.

    The subsampling theorem for f-DP: Bu, Dong, Long, Su 2019 (arXiv 1911.11607), Thm 4
    (Dong, Roth, Su 2019, Thm 4.2, for sampling without replacement with C_p).
    """
    q = check_probability("sampling_probability", sampling_probability)
    polygon = polygon_below(f)
    mixed = PiecewiseLinearTradeoff.from_points(
        polygon.alpha, q * polygon.beta + (1 - q) * (1 - polygon.alpha)
    )
    return minimum_hull(mixed, inverse(mixed))


def _as_loss_pmf(f: TradeoffFunction, spacing: float) -> Any:
    """The dominating pair of a polygon below f, as a pessimistic grid PLD.

    A convex polygon is the tradeoff curve of a discrete pair: the segment from vertex i to i+1
    is an outcome with P-mass alpha_{i+1} - alpha_i and Q-mass beta_i - beta_{i+1}.
    """
    polygon = polygon_below(f)
    p = np.diff(polygon.alpha)
    q = -np.diff(polygon.beta)
    bound = math.ceil(_LOSS_RANGE / spacing)
    return split_atoms(
        p_masses=p, q_masses=q, grid_spacing=spacing, min_index=-bound, max_index=bound
    )


def _from_pmf(pmf: Any) -> PiecewiseLinearTradeoff:
    alpha, beta = pmf.tradeoff_vertices()
    return PiecewiseLinearTradeoff.from_points(alpha, beta)


def compose(
    f: TradeoffFunction, g: TradeoffFunction, *, grid_spacing: float = _COMPOSITION_SPACING
) -> PiecewiseLinearTradeoff:
    """f ⊗ g = T(P x P', Q x Q') (Dong, Roth, Su 2019, Def. 3.1), computed numerically.

    Both curves become dominating discrete pairs (polygons below them, atoms split onto a loss
    grid), which are composed exactly by FFT; the result lies below the true f ⊗ g.
    """
    spacing = check_positive("grid_spacing", grid_spacing)
    return _from_pmf(_as_loss_pmf(f, spacing).compose(_as_loss_pmf(g, spacing)))


def self_compose(
    f: TradeoffFunction, count: int, *, grid_spacing: float = _COMPOSITION_SPACING
) -> TradeoffFunction:
    """f ⊗ ... ⊗ f (``count`` times); Id for count = 0."""
    count = check_count("count", count)
    spacing = check_positive("grid_spacing", grid_spacing)
    if count == 0:
        return IdentityTradeoff()
    return _from_pmf(_as_loss_pmf(f, spacing).self_compose(count))
