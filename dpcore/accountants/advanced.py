"""Advanced ("strong") composition with amplification by sampling: Abadi et al.'s baseline.

Homogeneous form (Dwork, Rothblum, Vadhan 2010, Thm III.3; Dwork & Roth 2014, Thm 3.20): k
adaptively composed (epsilon, delta)-DP steps are (epsilon', k delta + delta')-DP for every
delta' > 0, with epsilon' = sqrt(2 k ln(1/delta')) epsilon + k epsilon (e^epsilon - 1).

Heterogeneous steps (epsilon_i, delta_i) use

    epsilon' = sqrt(2 ln(1/delta') sum_i epsilon_i^2) + sum_i epsilon_i (e^{epsilon_i} - 1),

with total delta delta' + sum_i delta_i. This is valid by Kairouz, Oh, Viswanath 2015, Thm 3.5
(third term of its minimum), which gives the same square-root term with the *smaller* drift
sum_i epsilon_i (e^{epsilon_i} - 1) / (e^{epsilon_i} + 1) and total delta
1 - (1 - delta') prod_i (1 - delta_i) <= delta' + sum_i delta_i; we keep the looser DRV drift so
that equal steps give exactly the DRV number. Basic composition is valid too, so the answer is
the minimum of the two.

Steps come from :class:`~dpcore.accountants.basic.StepLedger` (amplification by sampling,
Balle, Barthe, Gaboardi 2018, Thm 8). With Gaussian steps the target delta (after the fixed
steps' deltas) is split between delta' (a fraction f of it) and the Gaussian steps (the rest,
evenly per step as in basic composition); f is chosen by a grid search over logit(f) and a
bounded 1-D minimisation, f = 0 (pure basic composition) is always a candidate, and the chosen
split is then re-checked to spend at most the target delta. Every f gives a valid bound, so the
minimum is one too. With q = 0.01, sigma = 4, T = 10,000 this is the "strong composition" curve
that Abadi et al. 2016 (Sec. 3.1, Fig. 2) compare the moments accountant against.

At ``target_delta = 0`` there is no slack delta' > 0 for the square-root term, so the answer is
basic composition's: the sum of the pure epsilons when every step is pure (delta = 0, not
Gaussian), inf otherwise. (The optimal composition of pure steps at delta = 0 is that sum too:
all k privacy losses can be at their maximum at once; Kairouz, Oh, Viswanath 2015, Thm 3.3 at
delta = 0.)

Randomized response and the exponential mechanism are pure steps here, as in basic composition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize

from dpcore.accountants.basic import Step, StepLedger

__all__ = ["AdvancedCompositionAccountant", "advanced_composition_epsilon"]

# With a step of epsilon > 50 the drift term epsilon (e^epsilon - 1) alone dwarfs basic
# composition (and e^epsilon overflows past ~709); basic composition is then the answer.
_LARGE_STEP_EPSILON = 50.0
# Grid over logit(f), f the share of the budget kept as delta'.
_LOGIT_GRID = np.linspace(-14.0, 14.0, 29)


def advanced_composition_epsilon(steps: Sequence[Step], *, slack: float) -> float:
    """epsilon' for steps (epsilon_i, delta_i, count_i) with delta' = ``slack``.

    The minimum of basic composition sum_i epsilon_i and
    sqrt(2 ln(1/delta') sum_i epsilon_i^2) + sum_i epsilon_i (e^{epsilon_i} - 1)
    (Dwork & Roth 2014, Thm 3.20; Kairouz, Oh, Viswanath 2015, Thm 3.5). The composition is then
    (epsilon', slack + sum_i delta_i)-DP. ``slack <= 0`` gives basic composition.

    >>> round(advanced_composition_epsilon([(0.1, 0.0, 100)], slack=1e-5), 4)
    5.8502
    """
    if not steps:
        return 0.0
    if any(math.isinf(epsilon) for epsilon, _, _ in steps):
        return math.inf
    basic = math.fsum(count * epsilon for epsilon, _, count in steps)
    if slack <= 0 or slack >= 1 or any(e > _LARGE_STEP_EPSILON for e, _, _ in steps):
        return basic
    squares = math.fsum(count * epsilon * epsilon for epsilon, _, count in steps)
    drift = math.fsum(count * epsilon * math.expm1(epsilon) for epsilon, _, count in steps)
    return min(basic, math.sqrt(2 * math.log(1 / slack) * squares) + drift)


class AdvancedCompositionAccountant(StepLedger):
    """Advanced composition of amplified steps; the "strong composition" of Abadi et al. Fig. 2.

    Supports the same events as :class:`~dpcore.accountants.basic.BasicCompositionAccountant`
    and is never above it.

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
            return math.inf  # the fixed steps alone spend the whole target
        fixed = self._fixed_steps()
        if not self._gaussian:
            return advanced_composition_epsilon(fixed, slack=budget)

        def split(fraction: float) -> tuple[list[Step], float]:
            # delta' = fraction * budget; the Gaussian steps share the rest (with the ledger's
            # rounding margin), so the two never add up to more than the budget.
            slack = fraction * budget
            return fixed + self._gaussian_steps(budget - slack), slack

        def at(fraction: float) -> float:
            steps, slack = split(fraction)
            return advanced_composition_epsilon(steps, slack=slack)

        def at_logit(logit: float) -> float:
            return at(1 / (1 + math.exp(-logit)))

        values = [at_logit(x) for x in _LOGIT_GRID]
        best = int(np.argmin(values))
        candidates = {0.0: at(0.0)}  # f = 0: basic composition, always valid
        if math.isfinite(values[best]):
            low = _LOGIT_GRID[max(best - 1, 0)]
            high = _LOGIT_GRID[min(best + 1, len(_LOGIT_GRID) - 1)]
            refined = optimize.minimize_scalar(
                at_logit, bounds=(low, high), method="bounded", options={"xatol": 1e-4}
            )
            for logit in (float(_LOGIT_GRID[best]), float(refined.x)):
                fraction = 1 / (1 + math.exp(-logit))
                candidates[fraction] = at(fraction)
        fraction = min(candidates, key=lambda f: candidates[f])
        steps, slack = split(fraction)  # certify the chosen split: total delta <= target
        self._certified(steps, delta, slack=slack)
        return advanced_composition_epsilon(steps, slack=slack)
