"""Tradeoff functions and (epsilon, delta) privacy profiles, in both directions.

f => profile: delta(epsilon) = 1 + f*(-e^epsilon) (Dong, Roth, Su 2019, Prop. 2.12).
Profile => f: a mechanism that is (eps_i, delta_i)-DP for every i is f-DP with
f = max_i f_{eps_i, delta_i} (Dong, Roth, Su 2019, Prop. 2.5 and 2.12), e.g. the curve implied by
an RDP accountant's epsilon(delta).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpcore.errors import InvalidParameterError
from dpcore.tradeoff.base import TradeoffFunction
from dpcore.tradeoff.closed_forms import PiecewiseLinearTradeoff

__all__ = ["EpsilonDeltaEnvelope", "from_epsilon_delta_curve", "to_epsilon_delta_curve"]

#: Beyond this epsilon, e^epsilon overflows soon; the steep line of such a pair is left out,
#: which only lowers the curve (pessimistic), and only for alpha < 1e-304.
_LARGEST_EPSILON = 700.0


def _upper_envelope(slopes: np.ndarray, intercepts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices on [0, 1] of max_j (intercepts_j + slopes_j alpha), a convex polygon."""
    order = np.lexsort((intercepts, slopes))
    s, c = slopes[order], intercepts[order]
    # Equal slopes: keep the largest intercept (the last after lexsort).
    last = np.append(np.diff(s) != 0, True)
    s, c = s[last], c[last]
    stack: list[int] = []
    for k in range(s.size):
        while len(stack) >= 2:
            i, j = stack[-2], stack[-1]
            # Line j is nowhere the maximum if line k overtakes i no later than j does.
            if (c[i] - c[k]) * (s[j] - s[i]) <= (c[i] - c[j]) * (s[k] - s[i]):
                stack.pop()
            else:
                break
        stack.append(k)
    s, c = s[stack], c[stack]
    crossings = (c[:-1] - c[1:]) / (s[1:] - s[:-1])
    alpha = np.unique(np.concatenate([[0.0, 1.0], crossings[(crossings > 0) & (crossings < 1)]]))
    beta = np.max(intercepts[None, :] + slopes[None, :] * alpha[:, None], axis=1)
    return alpha, beta


class EpsilonDeltaEnvelope(PiecewiseLinearTradeoff):
    """f(alpha) = max_i f_{eps_i, delta_i}(alpha): what an (epsilon, delta(epsilon)) family implies.

    A convex polygon (a maximum of lines), stored through its exact vertices, so that
    :meth:`delta` is exact. Pairs with epsilon = inf say nothing and are ignored.

    Args:
        epsilons: epsilon_i >= 0.
        deltas: delta_i in [0, 1], one per epsilon.

    Raises:
        InvalidParameterError: naming ``epsilons`` or ``deltas``.

    >>> f = EpsilonDeltaEnvelope([1.0], [0.0])
    >>> bool(abs(f(0.2) - (1 - np.e * 0.2)) < 1e-12)
    True
    """

    def __init__(self, epsilons: Any, deltas: Any) -> None:
        eps = _real_array("epsilons", epsilons)
        dl = _real_array("deltas", deltas)
        if eps.size == 0:
            raise InvalidParameterError("epsilons", "to be non-empty", epsilons)
        if eps.shape != dl.shape:
            raise InvalidParameterError(
                "deltas", f"to have the length of epsilons ({eps.size})", dl.size
            )
        if np.any(np.isnan(eps)) or np.any(eps < 0):
            raise InvalidParameterError("epsilons", ">= 0", epsilons)
        if np.any(np.isnan(dl)) or np.any(dl < 0) or np.any(dl > 1):
            raise InvalidParameterError("deltas", "in [0, 1]", deltas)
        finite = np.isfinite(eps)
        self.epsilons, self.deltas = eps[finite], dl[finite]
        e, d = self.epsilons, self.deltas
        steep = e <= _LARGEST_EPSILON
        slopes = np.concatenate([[0.0], -np.exp(e[steep]), -np.exp(-e)])
        intercepts = np.concatenate([[0.0], 1 - d[steep], np.exp(-e) * (1 - d)])
        alpha, beta = _upper_envelope(slopes, intercepts)
        super().__init__(alpha, np.minimum(beta, 1 - alpha), hull=True)

    def __repr__(self) -> str:
        return f"EpsilonDeltaEnvelope({self.epsilons.size} pairs, {self.alpha.size} vertices)"


def _real_array(name: str, values: Any) -> np.ndarray:
    try:
        return np.asarray(values, dtype=float).ravel()
    except (TypeError, ValueError):
        raise InvalidParameterError(name, "to be real numbers", values) from None


def from_epsilon_delta_curve(epsilons: Any, deltas: Any) -> EpsilonDeltaEnvelope:
    """The tradeoff function implied by a privacy profile (see :class:`EpsilonDeltaEnvelope`).

    It is below the mechanism's true tradeoff function whenever each (eps_i, delta_i) is a valid
    guarantee, and tends to it as the epsilons get dense (Dong, Roth, Su 2019, Prop. 2.12).
    """
    return EpsilonDeltaEnvelope(epsilons, deltas)


def to_epsilon_delta_curve(f: TradeoffFunction, epsilons: Any) -> np.ndarray:
    """delta(epsilon) = 1 + f*(-e^epsilon) for each epsilon (Dong, Roth, Su 2019, Prop. 2.12).

    Exact for closed forms and polygons, an upper bound otherwise (see
    :meth:`TradeoffFunction.delta`).

    >>> from dpcore.tradeoff.closed_forms import EpsilonDeltaTradeoff
    >>> to_epsilon_delta_curve(EpsilonDeltaTradeoff(1.0, 0.0), [1.0, 2.0])
    array([0., 0.])
    """
    if not isinstance(f, TradeoffFunction):
        raise InvalidParameterError("f", "to be a TradeoffFunction", f)
    if math.isnan(float(np.sum(np.asarray(epsilons, dtype=float)))):
        raise InvalidParameterError("epsilons", "to be >= 0 (no NaN)", epsilons)
    return f.epsilon_delta_curve(epsilons)
