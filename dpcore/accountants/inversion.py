"""delta(epsilon) from an epsilon(delta) bound, for accountants that only have the latter."""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["delta_for_epsilon"]


def delta_for_epsilon(epsilon_of_delta: Callable[[float], float], epsilon: float) -> float:
    """Smallest delta (to 1e-6 relative) with ``epsilon_of_delta(delta) <= epsilon``.

    ``epsilon_of_delta`` must be non-increasing. Bisection on log(delta) over
    [1e-300, 1 - 1e-12]; the returned delta is the upper end of the final bracket, so it
    certifies ``epsilon`` (never an overshoot). Returns 1.0 if even delta -> 1 does not reach it,
    0.0 only if ``epsilon_of_delta(0.0) <= epsilon`` (pure DP), and 1e-300 (an upper bound, not a
    claim of pure DP) when delta = 1e-300 already suffices but delta = 0 does not.
    """
    high = math.log1p(-1e-12)
    if epsilon_of_delta(math.exp(high)) > epsilon:
        return 1.0
    low = math.log(1e-300)
    if epsilon_of_delta(math.exp(low)) <= epsilon:
        return 0.0 if epsilon_of_delta(0.0) <= epsilon else math.exp(low)
    while high - low > 1e-6:
        middle = (low + high) / 2
        if epsilon_of_delta(math.exp(middle)) <= epsilon:
            high = middle
        else:
            low = middle
    return math.exp(high)
