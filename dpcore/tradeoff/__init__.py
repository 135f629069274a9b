"""Tradeoff functions (f-DP) as objects: closed forms, operations, conversions.

Convention (Dong, Roth, Su 2019, arXiv 1905.02383): for a rejection rule phi,
alpha_phi = E_P[phi] is the type I and beta_phi = 1 - E_Q[phi] the type II error, and
T(P, Q)(alpha) = inf{beta_phi : alpha_phi <= alpha}. Valid tradeoff functions are exactly the
convex, continuous, non-increasing f on [0, 1] with f(alpha) <= 1 - alpha (their Prop. 2.2).

Numerical results state their direction: operations on curves without exact vertices
(composition, subsampling, inversion, symmetrisation) work on a polygon *below* the curve and
return a curve below the exact answer (pessimistic: privacy is never overstated), and
``delta(epsilon)`` of such curves is an upper bound. :func:`from_samples` is an estimate only.
"""

from dpcore.tradeoff.base import TradeoffFunction
from dpcore.tradeoff.closed_forms import (
    EpsilonDeltaTradeoff,
    GaussianTradeoff,
    IdentityTradeoff,
    PiecewiseLinearTradeoff,
    lower_convex_envelope,
)
from dpcore.tradeoff.conversion import (
    EpsilonDeltaEnvelope,
    from_epsilon_delta_curve,
    to_epsilon_delta_curve,
)
from dpcore.tradeoff.empirical import from_samples
from dpcore.tradeoff.gdp_fit import smallest_gdp_mu
from dpcore.tradeoff.group_privacy import group_privacy
from dpcore.tradeoff.operations import (
    compose,
    convex_hull,
    inverse,
    minimum_hull,
    poisson_subsample,
    polygon_below,
    self_compose,
    symmetrise,
)

__all__ = [
    "EpsilonDeltaEnvelope",
    "EpsilonDeltaTradeoff",
    "GaussianTradeoff",
    "IdentityTradeoff",
    "PiecewiseLinearTradeoff",
    "TradeoffFunction",
    "compose",
    "convex_hull",
    "from_epsilon_delta_curve",
    "from_samples",
    "group_privacy",
    "inverse",
    "lower_convex_envelope",
    "minimum_hull",
    "poisson_subsample",
    "polygon_below",
    "self_compose",
    "smallest_gdp_mu",
    "symmetrise",
    "to_epsilon_delta_curve",
]
