"""Tradeoff functions (f-DP) as objects: closed forms, operations, conversions.

Convention (Dong, Roth, Su 2019): T(P, Q)(alpha) = inf{beta_phi : alpha_phi <= alpha}, with
alpha_phi = E_P[phi] the type I and beta_phi = 1 - E_Q[phi] the type II error.
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
    from_samples,
    to_epsilon_delta_curve,
)
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
    "inverse",
    "lower_convex_envelope",
    "minimum_hull",
    "poisson_subsample",
    "polygon_below",
    "self_compose",
    "symmetrise",
    "to_epsilon_delta_curve",
]
