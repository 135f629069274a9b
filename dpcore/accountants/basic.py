"""Basic composition: (sum of epsilons, sum of deltas) (Dwork & Roth 2014, Thm 3.16).

Supported steps and the (epsilon, delta) each one contributes:

* :class:`EpsilonDeltaEvent` -- its own (epsilon, delta);
* :class:`LaplaceEvent` with scale b (relative to the L1 sensitivity) -- (1/b, 0);
* :class:`PoissonSampledEvent` of either -- amplified by sampling to
  (log(1 + q (e^epsilon - 1)), q delta) (Balle, Barthe, Gaboardi 2018, Thm 8; Li, Qardaji, Su
  2012);
* :class:`GaussianEvent` and :class:`PoissonSampledEvent` of a Gaussian -- see below.

A Gaussian step has a whole curve of (epsilon, delta), not one pair, so it is fixed only at query
time. **Delta split (our choice):** ``get_epsilon(delta)`` first pays the deltas of the fixed
steps; the remaining budget is divided *evenly over the Gaussian steps* (one share per step,
whatever its q or sigma). A step sampled with rate q runs its Gaussian at delta_g = share / q, so
that after amplification it spends q delta_g = share; its epsilon is the exact analytic Gaussian
epsilon at delta_g (Balle & Wang 2018, Thm 8), then amplified. An even split is simple and
reproducible, not optimal for heterogeneous steps; every split is valid, so the answer is an
upper bound. ``get_delta(epsilon)`` inverts ``get_epsilon`` by bisection on log delta and
returns the upper end of the final bracket, so the delta it returns certifies epsilon.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from typing import cast

import numpy as np

from dpcore.accountants.base import PrivacyAccountant, handles
from dpcore.accountants.inversion import delta_for_epsilon
from dpcore.events import EpsilonDeltaEvent, GaussianEvent, LaplaceEvent, PoissonSampledEvent
from dpcore.mechanisms.gaussian import gaussian_epsilon_upper
from dpcore.mechanisms.noise_range import is_noiseless
from dpcore.validation import check_delta_closed, check_non_negative, check_probability

__all__ = ["BasicCompositionAccountant", "StepLedger", "amplify"]

#: (epsilon, delta, count): ``count`` steps, each (epsilon, delta)-DP.
Step = tuple[float, float, int]

# The Gaussian budget is shrunk by this relative margin so that rounding in the split (share / q,
# then q * delta_g, summed) can never make the spent delta exceed the target.
_ROUNDING_MARGIN = 1e-9
# delta_g is capped below 1 (gaussian_epsilon needs delta < 1); there epsilon is already 0.
_MAX_STEP_DELTA = 1.0 - 1e-12


def amplify(*, epsilon: float, delta: float, sampling_probability: float) -> tuple[float, float]:
    """(epsilon, delta) of an (epsilon, delta)-DP mechanism run on a Poisson sample of rate q.

    The result is (log(1 + q (e^epsilon - 1)), q delta) (Balle, Barthe, Gaboardi 2018, Thm 8;
    Li, Qardaji, Su 2012), computed without overflow for large epsilon.

    >>> amplify(epsilon=1.0, delta=1e-6, sampling_probability=0.5)
    (0.6201145069582775, 5e-07)

    Raises:
        InvalidParameterError: epsilon < 0 or NaN, delta outside [0, 1), q outside [0, 1].
    """
    epsilon = check_non_negative("epsilon", epsilon, allow_infinity=True)
    delta = check_delta_closed("delta", delta)
    q = check_probability("sampling_probability", sampling_probability)
    if q == 0:
        return 0.0, 0.0
    if math.isinf(epsilon):
        return math.inf, q * delta
    if epsilon > 700:  # e^epsilon overflows: log(1 - q + q e^epsilon) in log space
        log_rest = math.log1p(-q) if q < 1 else -math.inf
        return float(np.logaddexp(log_rest, math.log(q) + epsilon)), q * delta
    return math.log1p(q * math.expm1(epsilon)), q * delta


def _laplace_epsilon(scale: float) -> float:
    """Laplace mechanism with scale b x L1 sensitivity is (1/b)-DP (Dwork & Roth, Thm 3.6)."""
    return math.inf if scale == 0 else 1.0 / scale


class StepLedger(PrivacyAccountant):
    """Bookkeeping shared by basic and advanced composition (not itself an accountant).

    Steps with a fixed guarantee are kept as (epsilon, delta) -> count; Gaussian steps as
    (q, sigma) -> count (q = 1 for an unsampled Gaussian), to be given a delta at query time.
    """

    def __init__(self) -> None:
        super().__init__()
        self._fixed: dict[tuple[float, float], int] = defaultdict(int)
        self._gaussian: dict[tuple[float, float], int] = defaultdict(int)

    @handles((EpsilonDeltaEvent,))
    def _epsilon_delta(self, event: EpsilonDeltaEvent, count: int) -> None:
        if event.epsilon > 0 or event.delta > 0:
            self._fixed[(event.epsilon, event.delta)] += count

    @handles((LaplaceEvent,))
    def _laplace(self, event: LaplaceEvent, count: int) -> None:
        self._fixed[(_laplace_epsilon(event.noise_multiplier), 0.0)] += count

    @handles((GaussianEvent,))
    def _plain_gaussian(self, event: GaussianEvent, count: int) -> None:
        self._gaussian[(1.0, event.noise_multiplier)] += count

    @handles((PoissonSampledEvent, GaussianEvent))
    def _sampled_gaussian(self, event: PoissonSampledEvent, count: int) -> None:
        inner = cast(GaussianEvent, event.event)  # the registry signature guarantees the type
        if event.sampling_probability > 0:  # q = 0: the record is never used
            self._gaussian[(event.sampling_probability, inner.noise_multiplier)] += count

    @handles((PoissonSampledEvent, LaplaceEvent), (PoissonSampledEvent, EpsilonDeltaEvent))
    def _sampled_fixed(self, event: PoissonSampledEvent, count: int) -> None:
        inner = event.event
        if isinstance(inner, LaplaceEvent):
            epsilon, delta = _laplace_epsilon(inner.noise_multiplier), 0.0
        else:
            inner = cast(EpsilonDeltaEvent, inner)
            epsilon, delta = inner.epsilon, inner.delta
        amplified = amplify(
            epsilon=epsilon, delta=delta, sampling_probability=event.sampling_probability
        )
        if amplified != (0.0, 0.0):
            self._fixed[amplified] += count

    # ----------------------------------------------------------------- helpers
    def _fixed_delta(self) -> float:
        """Sum of the deltas of the steps with a fixed guarantee."""
        return math.fsum(delta * count for (_, delta), count in self._fixed.items())

    def _fixed_steps(self) -> list[Step]:
        return [(epsilon, delta, count) for (epsilon, delta), count in self._fixed.items()]

    def _gaussian_steps(self, budget: float) -> list[Step]:
        """The Gaussian steps as (epsilon, delta, count), sharing ``budget`` evenly per step.

        Each step spends at most ``budget * (1 - 1e-9) / number_of_gaussian_steps``.
        """
        total = sum(self._gaussian.values())
        share = budget * (1 - _ROUNDING_MARGIN) / max(total, 1)
        steps: list[Step] = []
        for (q, sigma), count in self._gaussian.items():
            step_delta = min(share / q, _MAX_STEP_DELTA)
            # No noise, or a share in the subnormal range, where rounding can overspend the
            # budget: such a step is not certified at all (epsilon inf, never an overspent delta).
            if is_noiseless(sigma) or share < sys.float_info.min:
                steps.append((math.inf, 0.0, count))
                continue
            inner = gaussian_epsilon_upper(noise_multiplier=sigma, delta=step_delta)
            steps.append((*amplify(epsilon=inner, delta=step_delta, sampling_probability=q), count))
        return steps

    @staticmethod
    def _spent(steps: list[Step]) -> float:
        return math.fsum(delta * count for _, delta, count in steps)

    def _certified(self, steps: list[Step], target_delta: float, slack: float = 0.0) -> list[Step]:
        """``steps`` after checking that they spend at most ``target_delta`` with ``slack``."""
        if self._spent(steps) + slack > target_delta:  # pragma: no cover - a defect
            raise ArithmeticError(
                f"{type(self).__name__} split overspent delta = {target_delta!r}; please report."
            )
        return steps

    def _delta(self, epsilon: float) -> float:
        return delta_for_epsilon(self._epsilon, epsilon)


class BasicCompositionAccountant(StepLedger):
    """Basic composition with amplification by sampling and an even delta split.

    Example:
        >>> acc = BasicCompositionAccountant().compose(EpsilonDeltaEvent(0.5, 1e-7), 10)
        >>> acc.get_epsilon(1e-5), acc.get_delta(5.0)
        (5.0, 1e-06)
    """

    name = "basic"

    def _epsilon(self, delta: float) -> float:
        budget = delta - self._fixed_delta()
        if budget < 0 or (budget == 0 and self._gaussian):
            return math.inf  # the fixed steps alone spend the whole target
        steps = self._fixed_steps() + self._gaussian_steps(budget)
        return math.fsum(epsilon * count for epsilon, _, count in self._certified(steps, delta))

    def _delta(self, epsilon: float) -> float:
        if not self._gaussian:  # fixed steps only: delta is exactly their sum, or nothing works
            fixed = self._fixed_steps()
            spent = math.fsum(e * count for e, _, count in fixed)
            return self._fixed_delta() if spent <= epsilon else 1.0
        return super()._delta(epsilon)
