"""Group privacy of tradeoff functions: neighbours that differ in k records.

Dong, Roth, Su 2019 (arXiv 1905.02383), Thm 2.14: a mechanism that is f-DP is
[1 - (1 - f)^{∘k}]-DP for groups of size k, where ∘k is the k-fold composition of the function
g = 1 - f with itself. (Along a chain D_0, ..., D_k of neighbours, a test of type I error alpha
for D_0 against D_1 has power at most g(alpha) = 1 - f(alpha), which is then the type I error it
has against the next pair, and so on.) f must bound the tradeoff between the outputs on *every
ordered* pair of neighbours, as f-DP under a symmetric neighbouring relation does; a curve that
bounds one direction only (say removal) should be passed through
:func:`~dpcore.tradeoff.operations.symmetrise` first.
"""

from __future__ import annotations

import numpy as np

from dpcore.errors import InvalidParameterError, ResourceLimitError
from dpcore.tradeoff.base import TradeoffFunction
from dpcore.tradeoff.closed_forms import (
    GaussianTradeoff,
    IdentityTradeoff,
    PiecewiseLinearTradeoff,
)
from dpcore.tradeoff.operations import polygon_below
from dpcore.validation import check_allocation, check_count

__all__ = ["group_privacy"]


def _interpolate(xs: np.ndarray, ys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The piecewise-linear function through (xs, ys) at x (xs increasing, x in its range).

    Written with weights rather than slopes, so that knots a subnormal distance apart cannot
    overflow a slope (as in :class:`~dpcore.tradeoff.closed_forms.PiecewiseLinearTradeoff`).
    """
    last = xs.size - 2
    i = np.clip(np.searchsorted(xs, x, side="right") - 1, 0, last)
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        weight = np.clip(np.where(x1 > x0, (x - x0) / (x1 - x0), 0.0), 0.0, 1.0)
    return np.asarray(y0 + weight * (y1 - y0), dtype=float)


def _compose_vertices(
    outer_x: np.ndarray, outer_y: np.ndarray, inner_x: np.ndarray, inner_y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Vertices of outer ∘ inner for non-decreasing piecewise-linear maps of [0, 1] into [0, 1].

    outer ∘ inner is linear between the knots of inner and the points where inner crosses a
    knot of outer, so evaluating it there gives its vertices exactly (up to rounding).
    """
    # The segment [j, j + 1] of the non-decreasing inner with inner_y[j] <= t < inner_y[j + 1]
    # is unique; a crossing strictly inside it is a new knot (t = inner_y[j] is a knot already).
    j = np.searchsorted(inner_y, outer_x, side="right") - 1
    inside = (j >= 0) & (j < inner_y.size - 1)
    j, t = j[inside], outer_x[inside]
    low, high = inner_y[j], inner_y[j + 1]
    strict = (low < t) & (t < high)
    j, t, low, high = j[strict], t[strict], low[strict], high[strict]
    crossings = inner_x[j] + (t - low) / (high - low) * (inner_x[j + 1] - inner_x[j])
    x = np.unique(np.concatenate([inner_x, crossings]))
    y = _interpolate(outer_x, outer_y, _interpolate(inner_x, inner_y, x))
    # Rounding must not break monotonicity; raising a value only lowers the curve 1 - y.
    return x, np.maximum.accumulate(y)


def group_privacy(
    f: TradeoffFunction, group_size: int, *, max_vertices: int = 2**22
) -> TradeoffFunction:
    """1 - (1 - f)^{∘k}: the tradeoff function of an f-DP mechanism for groups of size k.

    Dong, Roth, Su 2019 (arXiv 1905.02383), Thm 2.14 (see the module docstring for what f
    must bound). Closed forms:

    * ``GaussianTradeoff(mu)`` -> ``GaussianTradeoff(k mu)`` (the same theorem: mu-GDP is
      k mu-GDP for groups of size k; exact, as 1 - G_mu(alpha) = Phi(Phi^{-1}(alpha) + mu));
    * ``IdentityTradeoff()`` -> itself.

    Any other f is replaced by :func:`~dpcore.tradeoff.operations.polygon_below` (f) (the
    polygon itself for piecewise-linear f, e.g. ``EpsilonDeltaTradeoff``), and the k-fold
    composition of 1 - f is computed on its vertices exactly: a composition of non-decreasing
    piecewise-linear maps is piecewise linear, with knots at the inner map's knots and where it
    crosses the outer map's knots. The operation is monotone in f, so a polygon below f gives a
    curve below the exact answer (pessimistic). ``group_size = 1`` returns f itself.

    For f = f_{eps, delta} the result lies above the classic group lemma's
    f_{k eps, delta_k}, delta_k = delta (1 + e^eps + ... + e^{(k-1) eps}) (the lemma follows by
    dropping the mixed terms of the composition; see
    :func:`~dpcore.accountants.basic.group_epsilon_delta`), and is strictly above it in between
    the corners: group privacy in f-DP is sharper than (k eps, delta_k)-DP.

    Args:
        f: a tradeoff function the mechanism satisfies for every ordered pair of neighbours.
        group_size: k >= 1.
        max_vertices: refuse (before computing) a polygon result with more vertices than this;
            the count grows about linearly in k.

    Raises:
        InvalidParameterError: f not a tradeoff function, or ``group_size`` not an integer >= 1.
        ResourceLimitError: the vertex count (about k times that of f) exceeds ``max_vertices``
            or the memory limit.

    >>> group_privacy(GaussianTradeoff(0.5), 3)
    GaussianTradeoff(mu=1.5)
    """
    if not isinstance(f, TradeoffFunction):
        raise InvalidParameterError("f", "to be a TradeoffFunction", f)
    k = check_count("group_size", group_size, minimum=1)
    limit = check_count("max_vertices", max_vertices, minimum=2)
    if k == 1 or isinstance(f, IdentityTradeoff):
        return f
    if isinstance(f, GaussianTradeoff):
        return GaussianTradeoff(k * f.mu)
    polygon = polygon_below(f)
    estimate = float(k) * polygon.alpha.size
    if estimate > limit:
        raise ResourceLimitError(
            "group_size", f"small enough for at most {limit} vertices (about {estimate:.3g})", k
        )
    check_allocation("group_size", k, elements=4 * estimate)
    # g = 1 - f is non-decreasing and concave, from [0, 1] into [0, 1].
    gx, gy = polygon.alpha, np.maximum.accumulate(np.clip(1.0 - polygon.beta, 0.0, 1.0))
    hx, hy = gx, gy
    for _ in range(k - 1):
        hx, hy = _compose_vertices(gx, gy, hx, hy)
        if np.all(hy >= 1.0):  # 1 - f^{(k)} = 1 already: nothing is left to protect
            break
    beta = np.clip(1.0 - hy, 0.0, 1.0)
    return PiecewiseLinearTradeoff(hx, np.minimum(beta, 1.0 - hx), hull=True)
