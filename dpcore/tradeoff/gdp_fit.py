"""The smallest mu for which a tradeoff curve is mu-GDP (G_mu <= f everywhere).

G_mu(alpha) = Phi(Phi^{-1}(1 - alpha) - mu) (Dong, Roth, Su 2019, arXiv 1905.02383, Def. 2.6)
is decreasing in mu and convex in alpha. For a piecewise-linear f, G_mu - f is convex on each
segment between two vertices, so its maximum over the segment is at an end: G_mu <= f holds
everywhere iff it holds at the vertices -- an exact check, not a sample. At a vertex
(alpha, beta) with 0 < alpha < 1, G_mu(alpha) <= beta iff mu >= Phi^{-1}(1 - alpha) -
Phi^{-1}(beta), since Phi is increasing; the smallest mu is the largest of these over the
vertices, in closed form (no bisection is needed).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from dpcore.errors import InvalidParameterError
from dpcore.tradeoff.base import TradeoffFunction
from dpcore.tradeoff.closed_forms import GaussianTradeoff, _upper_quantile
from dpcore.tradeoff.operations import polygon_below
from dpcore.validation import check_probability

__all__ = ["smallest_gdp_mu"]

#: Relative and absolute amounts by which the computed mu is rounded up (covers the rounding
#: of the two normal quantiles, each accurate to a few units in the last place).
_RELATIVE_MARGIN = 1e-12
_ABSOLUTE_MARGIN = 1e-12


def _lower_quantile(beta: np.ndarray) -> np.ndarray:
    """Phi^{-1}(beta), accurate near both ends (1 - beta is exact for beta in [0.5, 1])."""
    b = np.asarray(beta, dtype=float)
    with np.errstate(divide="ignore"):
        return np.asarray(np.where(b < 0.5, special.ndtri(b), -special.ndtri(1.0 - b)))


def smallest_gdp_mu(f: TradeoffFunction, *, slack: float = 0.0) -> float:
    """The smallest mu with G_mu(alpha) <= f(alpha) + slack for all alpha, rounded up.

    With ``slack = 0`` this is the smallest mu for which f-DP implies mu-GDP. A positive slack s
    certifies the weaker statement f >= G_mu - s, under which every delta(epsilon) of f is at
    most that of mu-GDP plus s (delta(eps) = sup_alpha (1 - e^eps alpha - f(alpha)), Dong, Roth,
    Su 2019, Prop. 2.12); it is useful for numerically computed curves whose far tail is off by
    a known mass (e.g. a PLD's error mass), which otherwise makes no finite mu possible.

    Exact for :class:`~dpcore.tradeoff.closed_forms.GaussianTradeoff` (its own mu, for
    ``slack = 0``) and for piecewise-linear f (the vertex check of the module docstring). Other
    curves are first replaced by :func:`~dpcore.tradeoff.operations.polygon_below` (f) <= f,
    so the answer is an upper bound (the fit of a slightly weaker curve). inf when no finite mu
    works: f(0) + slack < 1 (G_mu(0) = 1), or f(alpha) + slack = 0 at some alpha < 1 (G_mu > 0
    there). Numerically computed curves are known only to float resolution where beta is close
    to 1 or alpha close to 1 (there 1 - f rounds to 1 once f < 1e-16), which can make the strict
    fit inf or inflate it; a slack of 1e-15 to 1e-12 discounts that rounding.

    Args:
        f: the tradeoff function.
        slack: s in [0, 1], an additive allowance below f.

    Returns:
        mu >= 0, rounded up (by 1e-12 relative and absolute) so that G_mu <= f + s holds despite
        the rounding of the normal quantiles; inf if no finite mu works.

    Raises:
        InvalidParameterError: f not a tradeoff function, or slack not in [0, 1].

    >>> round(smallest_gdp_mu(GaussianTradeoff(1.3)), 12)
    1.3
    """
    if not isinstance(f, TradeoffFunction):
        raise InvalidParameterError("f", "to be a TradeoffFunction", f)
    s = check_probability("slack", slack)
    if isinstance(f, GaussianTradeoff) and s == 0:
        return f.mu
    polygon = f if f.exact_vertices else polygon_below(f)
    alpha, beta = polygon.points()
    level = np.minimum(beta + s, 1.0)
    if np.any((alpha == 0) & (level < 1.0)):
        return math.inf  # G_mu(0) = 1 for every finite mu
    inner = (alpha > 0) & (alpha < 1) & (level < 1.0)
    if not np.any(inner):
        return 0.0
    if np.any(level[inner] <= 0.0):
        return math.inf
    needed = _upper_quantile(alpha[inner]) - _lower_quantile(level[inner])
    mu = float(np.max(needed))
    if not math.isfinite(mu):
        return math.inf
    if mu <= 0:  # f = 1 - alpha at every vertex: perfect privacy
        return 0.0
    return mu * (1 + _RELATIVE_MARGIN) + _ABSOLUTE_MARGIN
