"""Operations on tradeoff functions: inverse, convex hull, symmetrisation, subsampling, composition.

Non-polygonal inputs are first replaced by a polygon that lies *below* them (pessimistic):
tangent lines for functions with a ``slope`` (e.g. G_mu), outer chords of sampled points for any
other convex curve (:func:`~dpcore.tradeoff.base.points_below`), exact vertices for polygons.
Every operation here is monotone (f >= g implies op(f) >= op(g)), so results stay pessimistic:
they lie below the exact answer, i.e. they never overstate privacy.
"""

from __future__ import annotations

import math

import numpy as np

from dpcore.errors import InvalidParameterError
from dpcore.pld.loss_pmf import TAIL_MASS, LossPmf, _chernoff_orders, _log_mgf, split_atoms
from dpcore.tradeoff.base import TradeoffFunction, points_below
from dpcore.tradeoff.closed_forms import IdentityTradeoff, PiecewiseLinearTradeoff
from dpcore.validation import check_allocation, check_count, check_positive, check_probability

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


def _check_tradeoff(f: object, name: str = "f") -> TradeoffFunction:
    if not isinstance(f, TradeoffFunction):
        raise InvalidParameterError(name, "to be a TradeoffFunction", f)
    return f


def polygon_below(f: TradeoffFunction) -> PiecewiseLinearTradeoff:
    """A piecewise-linear tradeoff function <= f (equal to f when f is already a polygon).

    For a function with ``slope(alpha)`` the polygon is the maximum of its tangent lines at
    :meth:`~TradeoffFunction.points` (tangents of a convex function lie below it); for other
    curves it is built from the outer chords of those points (:func:`points_below`). The gap to
    f is about the grid's interpolation error (measured for G_mu, mu <= 8: below 1e-6 with
    tangents, below 3e-6 from chords).

    >>> from dpcore.tradeoff.closed_forms import GaussianTradeoff
    >>> g = GaussianTradeoff(1.0)
    >>> grid = np.linspace(0, 1, 101)
    >>> bool(np.all(polygon_below(g)(grid) <= g(grid)))
    True
    """
    f = _check_tradeoff(f)
    alpha, beta = f.points()
    if f.exact_vertices:
        return PiecewiseLinearTradeoff(alpha, beta, hull=True)
    slope = getattr(f, "slope", None)
    if slope is None:
        a, b = points_below(alpha, beta)
        return PiecewiseLinearTradeoff(a, np.minimum(b, 1 - a), hull=True)
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
    return PiecewiseLinearTradeoff(points_a, np.minimum(points_b, 1 - points_a), hull=True)


def convex_hull(f: TradeoffFunction) -> PiecewiseLinearTradeoff:
    """The biconjugate f** (the largest convex function below f), as a polygon.

    Exact for polygons, including non-convex ones given through ``PiecewiseLinearTradeoff(...,
    hull=True)``; for smooth convex curves f** = f and :func:`polygon_below` is returned.
    """
    return polygon_below(f)


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
    """f^{-1}(alpha) = inf{t in [0, 1] : f(t) <= alpha}, as a polygon below the exact inverse.

    T(Q, P) = T(P, Q)^{-1}: the curve with the roles of the hypotheses swapped (Dong, Roth, Su
    2019, Sec. 2.2, eq. (5) there). Inversion is monotone, so the inverse of
    :func:`polygon_below` lies below f^{-1}.

    >>> from dpcore.tradeoff.closed_forms import EpsilonDeltaTradeoff
    >>> f = EpsilonDeltaTradeoff(1.0, 0.1)
    >>> grid = np.linspace(0, 1, 11)
    >>> bool(np.allclose(inverse(f)(grid), f(grid)))  # f_{eps,delta} is symmetric
    True
    """
    polygon = polygon_below(f)
    x, y = _inverse_vertices(polygon.alpha, polygon.beta)
    if x[0] > 0:
        x, y = np.concatenate([[0.0], x]), np.concatenate([[y[0]], y])
    return PiecewiseLinearTradeoff.from_points(x, y)


def minimum_hull(first: TradeoffFunction, second: TradeoffFunction) -> PiecewiseLinearTradeoff:
    """min{first, second}** exactly for polygons: the minimum is taken at all vertices and
    crossings (other curves are first replaced by :func:`polygon_below`).

    The minimum of two tradeoff functions is in general not convex; its hull is the strongest
    tradeoff function below both.
    """
    one = polygon_below(_check_tradeoff(first, "first"))
    two = polygon_below(_check_tradeoff(second, "second"))
    grid = np.union1d(one.alpha, two.alpha)
    d = one(grid) - two(grid)
    crossing = np.nonzero(d[:-1] * d[1:] < 0)[0]
    t = d[crossing] / (d[crossing] - d[crossing + 1])
    extra = grid[crossing] + t * (grid[crossing + 1] - grid[crossing])
    points = np.union1d(grid, extra)
    return PiecewiseLinearTradeoff(points, np.minimum(one(points), two(points)), hull=True)


def symmetrise(f: TradeoffFunction) -> PiecewiseLinearTradeoff:
    """min{f, f^{-1}}**: the symmetric tradeoff function implied by f under add/remove.

    If f bounds T(M(D), M(D')) for one order of the neighbours (say removal), then f^{-1}
    bounds the other (addition), since T(Q, P) = T(P, Q)^{-1}; the hull of their minimum is the
    largest symmetric (f = f^{-1}) tradeoff function below both (Dong, Roth, Su 2019, Sec. 4;
    the same construction defines C_p in their Thm 4.2).

    >>> from dpcore.tradeoff.closed_forms import GaussianTradeoff
    >>> g = GaussianTradeoff(1.0)
    >>> grid = np.linspace(0, 1, 11)
    >>> bool(np.max(np.abs(symmetrise(g)(grid) - g(grid))) < 1e-6)  # G_mu is symmetric
    True
    """
    polygon = polygon_below(_check_tradeoff(f))
    return minimum_hull(polygon, inverse(polygon))


def poisson_subsample(f: TradeoffFunction, sampling_probability: float) -> PiecewiseLinearTradeoff:
    """C_q(f) = min{f_q, f_q^{-1}}** with f_q = q f + (1 - q) Id.

    If M is f-DP, running it on a Poisson subsample (each record kept with probability q) is
    C_q(f)-DP under add/remove: the removal pair's tradeoff is at least f_q and the addition
    pair's at least f_q^{-1}, and :func:`symmetrise` joins them. The operator C_p is defined in
    Dong, Roth, Su 2019, Thm 4.2 (there for m of n records sampled without replacement, p =
    m/n); Bu, Dong, Long, Su 2019 (arXiv 1911.11607) use it to account for NoisySGD. Computed on
    :func:`polygon_below` (f), so pessimistic.

    Args:
        f: tradeoff function of the mechanism run on the subsample.
        sampling_probability: q in [0, 1]; q = 1 gives f symmetrised, q = 0 gives Id.

    Raises:
        InvalidParameterError: naming ``sampling_probability`` outside [0, 1] or NaN.
    """
    q = check_probability("sampling_probability", sampling_probability)
    polygon = polygon_below(_check_tradeoff(f))
    mixed = PiecewiseLinearTradeoff(
        polygon.alpha, q * polygon.beta + (1 - q) * (1 - polygon.alpha), hull=True
    )
    return minimum_hull(mixed, inverse(mixed))


def _as_loss_pmf(f: TradeoffFunction, spacing: float) -> LossPmf:
    """The dominating pair of a polygon below f, as a pessimistic grid PLD.

    A convex polygon is the tradeoff curve of a discrete pair: the segment from vertex i to i+1
    is an outcome with P-mass alpha_{i+1} - alpha_i and Q-mass beta_i - beta_{i+1}; an initial
    drop 1 - f(0) at alpha = 0 is Q-only mass (loss -inf, implicit in a PLD) and a final flat
    part is P-only mass (loss +inf). :func:`~dpcore.pld.loss_pmf.split_atoms` then refines the
    atoms onto the loss grid (the result dominates the pair: pessimistic); losses beyond
    +-40 are clamped by further splits (pessimistic too).
    """
    polygon = polygon_below(_check_tradeoff(f))
    p = np.diff(polygon.alpha)
    q = -np.diff(polygon.beta)
    bound = math.ceil(_LOSS_RANGE / spacing)
    return split_atoms(
        p_masses=p, q_masses=q, grid_spacing=spacing, min_index=-bound, max_index=bound
    )


def _from_pmf(pmf: LossPmf) -> PiecewiseLinearTradeoff:
    """T(P, Q) of a grid PLD, lowered by its ``error_mass`` m to stay a certified lower curve.

    Mass m of uncertain position changes the hockey-stick divergence delta(epsilon) by at most
    m for every real epsilon, and f(alpha) = sup_epsilon (1 - delta(epsilon) - e^epsilon alpha)
    (the conjugacy of Dong, Roth, Su 2019, Prop. 2.12), so the true curve is at least f - m.
    """
    alpha, beta = pmf.tradeoff_vertices()
    beta = np.maximum(beta - float(pmf.error_mass), 0.0)
    return PiecewiseLinearTradeoff(alpha, np.minimum(beta, 1 - alpha), hull=True)


def compose(
    f: TradeoffFunction, g: TradeoffFunction, *, grid_spacing: float = _COMPOSITION_SPACING
) -> PiecewiseLinearTradeoff:
    """f ⊗ g = T(P x P', Q x Q') (Dong, Roth, Su 2019, Def. 3.1), computed numerically.

    Both curves become dominating discrete pairs (polygons below them, atoms split onto a loss
    grid of spacing ``grid_spacing``), whose privacy-loss distributions are convolved by FFT.
    Every step only lowers the curve, so the result lies *below* the true f ⊗ g (pessimistic);
    for G_1 ⊗ G_0.7 at the default spacing it is within about 1e-6 of G_sqrt(1.49).

    Raises:
        InvalidParameterError: ``grid_spacing`` not > 0, or f, g not tradeoff functions.
        ResourceLimitError: ``grid_spacing`` so fine that the grids would not fit in memory.
    """
    spacing = _check_spacing(grid_spacing, terms=2)
    first = _as_loss_pmf(_check_tradeoff(f), spacing)
    second = _as_loss_pmf(_check_tradeoff(g, "g"), spacing)
    window = _window([(first, 1), (second, 1)])
    check_allocation("grid_spacing", grid_spacing, elements=window, item_bytes=16, larger=True)
    return _from_pmf(first.compose(second))


def self_compose(
    f: TradeoffFunction, count: int, *, grid_spacing: float = _COMPOSITION_SPACING
) -> TradeoffFunction:
    """f ⊗ ... ⊗ f (``count`` times, pessimistic as :func:`compose`); Id for count = 0.

    Raises:
        InvalidParameterError: ``count`` not an integer >= 0, or ``grid_spacing`` not > 0.
        ResourceLimitError: the composed grid would not fit in memory (``count`` too large for
            ``grid_spacing``).
    """
    f = _check_tradeoff(f)
    count = check_count("count", count)
    spacing = _check_spacing(grid_spacing, terms=1)
    if count == 0:
        return IdentityTradeoff()
    pmf = _as_loss_pmf(f, spacing)
    check_allocation("count", count, elements=_window([(pmf, count)]), item_bytes=16)
    return _from_pmf(pmf.self_compose(count))


def _check_spacing(grid_spacing: float, *, terms: int) -> float:
    """grid_spacing > 0, coarse enough for ``terms`` grids over losses in [-40, 40]."""
    spacing = check_positive("grid_spacing", grid_spacing)
    points = 2 * _LOSS_RANGE / spacing + 3  # inf for subnormal spacings
    check_allocation(
        "grid_spacing", grid_spacing, elements=terms * points, item_bytes=16, larger=True
    )
    return spacing


def _window(parts: list[tuple[LossPmf, int]]) -> float:
    """Grid points of the FFT window :func:`~dpcore.pld.loss_pmf.compose_many` would use.

    The exact support, or (beyond 2^16 points) the Chernoff window of ``compose_many`` for the
    same tail mass; computed in floats so that huge counts cannot overflow.
    """
    parts = [(pmf, n) for pmf, n in parts if n]
    if not parts or (len(parts) == 1 and parts[0][1] == 1):
        return float(sum(pmf.pmf.size for pmf, _ in parts))
    if any(float(pmf.pmf.sum()) <= 0 for pmf, _ in parts):
        return 1.0
    h = parts[0][0].grid_spacing
    full = float(sum(n * (pmf.pmf.size - 1) for pmf, n in parts)) + 1
    if full <= 2**16:
        return full
    orders = _chernoff_orders(parts)
    up = np.array([sum(n * _log_mgf(pmf, t) for pmf, n in parts) for t in orders])
    down = np.array([sum(n * _log_mgf(pmf, -t) for pmf, n in parts) for t in orders])
    log_tail = math.log(TAIL_MASS)
    width = float(np.min((up - log_tail) / orders) - np.max((log_tail - down) / orders)) / h
    return min(full, width + 2)
