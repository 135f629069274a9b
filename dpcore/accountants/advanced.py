"""Advanced ("strong") composition with amplification by sampling: Abadi et al.'s baseline.

k steps with guarantees (epsilon_i, delta_i) are (epsilon', delta' + sum delta_i)-DP for every
delta' > 0 with epsilon' = sqrt(2 ln(1/delta') sum epsilon_i^2) + sum epsilon_i (e^{epsilon_i} - 1)
(Dwork, Rothblum, Vadhan 2010, Thm III.3; Dwork & Roth 2014, Thm 3.20, whose proof bounds each
step's loss separately and so covers different epsilon_i). The answer is also never worse than
basic composition. For Gaussian steps the split of delta between delta' and the steps is chosen
by numerical minimisation; every split gives a valid bound, so the minimum is one too.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from dpcore.accountants.basic import _StepLedger

__all__ = ["AdvancedCompositionAccountant", "advanced_composition_epsilon"]


def advanced_composition_epsilon(steps: list[tuple[float, float, int]], slack: float) -> float:
    """epsilon' of advanced composition for steps (epsilon_i, delta_i, count_i), delta' = slack."""
    if any(math.isinf(e) for e, _, _ in steps):
        return math.inf
    basic = math.fsum(n * e for e, _, n in steps)
    if slack <= 0 or any(e > 50 for e, _, _ in steps):
        return basic  # with such a step the drift term alone exceeds basic composition
    squares = math.fsum(n * e * e for e, _, n in steps)
    drift = math.fsum(n * e * math.expm1(e) for e, _, n in steps)
    return min(basic, math.sqrt(2 * math.log(1 / slack) * squares) + drift)


class AdvancedCompositionAccountant(_StepLedger):
    """Advanced composition of amplified steps; the "strong composition" of Abadi et al. Fig. 2.

    Example:
        >>> from dpcore.events import EpsilonDeltaEvent
        >>> acc = AdvancedCompositionAccountant().compose(EpsilonDeltaEvent(0.01, 0.0), 10_000)
        >>> round(acc.get_epsilon(1e-5), 3)  # sqrt(2 ln(1e5) 1e4) 0.01 + 1e4 0.01 (e^0.01 - 1)
        5.804
    """

    name = "advanced"

    def _epsilon(self, delta: float) -> float:
        budget = delta - self._fixed_delta()
        if budget < 0 or (budget == 0 and self._gaussian):
            return math.inf
        if not self._gaussian:
            return advanced_composition_epsilon(self._steps(0.0), budget)

        def at(logit: float) -> float:
            fraction = 1 / (1 + math.exp(-logit))  # share of the budget kept as delta'
            return advanced_composition_epsilon(
                self._steps((1 - fraction) * budget), fraction * budget
            )

        grid = np.linspace(-12, 12, 25)
        values = [at(x) for x in grid]
        best = int(np.argmin(values))
        if not math.isfinite(values[best]):
            return math.inf
        low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
        refined = optimize.minimize_scalar(
            at, bounds=(low, high), method="bounded", options={"xatol": 1e-6}
        )
        return float(min(values[best], at(float(refined.x))))
