"""Basic composition: (sum of epsilons, sum of deltas) (Dwork & Roth 2014, Thm 3.16).

Gaussian steps have a curve, not one (epsilon, delta): at query time the target delta (after
the deltas of pure/approximate steps) is split evenly over the Gaussian steps, each step's
epsilon is the exact Gaussian epsilon at its share (Balle & Wang 2018), and Poisson sampling
amplifies a step's (epsilon, delta) to (log(1 + q (e^epsilon - 1)), q delta) (Balle, Barthe,
Gaboardi 2018, Thm 8; Li, Qardaji, Su 2012).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from dpcore.accountants.base import PrivacyAccountant, handles
from dpcore.accountants.inversion import delta_for_epsilon
from dpcore.events import EpsilonDeltaEvent, GaussianEvent, LaplaceEvent, PoissonSampledEvent
from dpcore.mechanisms.gaussian import gdp_epsilon

__all__ = ["BasicCompositionAccountant", "amplify"]


def amplify(*, epsilon: float, delta: float, sampling_probability: float) -> tuple[float, float]:
    """(epsilon, delta) of a mechanism on a Poisson sample (Balle, Barthe, Gaboardi 2018, Thm 8)."""
    q = sampling_probability
    if q == 0:
        return 0.0, 0.0
    if math.isinf(epsilon):
        return math.inf, q * delta
    if epsilon > 700:  # e^epsilon overflows: log(1 - q + q e^eps) in log space
        return float(
            np.logaddexp(math.log1p(-q) if q < 1 else -math.inf, math.log(q) + epsilon)
        ), q * delta
    return math.log1p(q * math.expm1(epsilon)), q * delta


class _StepLedger(PrivacyAccountant):
    """Shared bookkeeping: fixed (epsilon, delta) steps and Gaussian steps awaiting a delta."""

    def __init__(self) -> None:
        super().__init__()
        # (epsilon, delta) -> count for steps with a fixed guarantee.
        self._fixed: dict[tuple[float, float], int] = defaultdict(int)
        # (q, sigma) -> count for (sampled) Gaussian steps.
        self._gaussian: dict[tuple[float, float], int] = defaultdict(int)

    @handles((EpsilonDeltaEvent,))
    def _pure(self, event: EpsilonDeltaEvent, count: int) -> None:
        self._fixed[(event.epsilon, event.delta)] += count

    @handles((LaplaceEvent,))
    def _laplace(self, event: LaplaceEvent, count: int) -> None:
        b = event.noise_multiplier
        self._fixed[(math.inf if b == 0 else 1 / b, 0.0)] += count

    @handles((GaussianEvent,))
    def _plain_gaussian(self, event: GaussianEvent, count: int) -> None:
        self._gaussian[(1.0, event.noise_multiplier)] += count

    @handles((PoissonSampledEvent, GaussianEvent))
    def _sampled_gaussian(self, event: PoissonSampledEvent, count: int) -> None:
        inner = event.event
        assert isinstance(inner, GaussianEvent)  # guaranteed by the registry signature
        if event.sampling_probability > 0:
            self._gaussian[(event.sampling_probability, inner.noise_multiplier)] += count

    @handles((PoissonSampledEvent, LaplaceEvent), (PoissonSampledEvent, EpsilonDeltaEvent))
    def _sampled_fixed(self, event: PoissonSampledEvent, count: int) -> None:
        inner = event.event
        if isinstance(inner, LaplaceEvent):
            b = inner.noise_multiplier
            epsilon, delta = (math.inf if b == 0 else 1 / b), 0.0
        else:
            assert isinstance(inner, EpsilonDeltaEvent)
            epsilon, delta = inner.epsilon, inner.delta
        if event.sampling_probability > 0:
            self._fixed[
                amplify(
                    epsilon=epsilon, delta=delta, sampling_probability=event.sampling_probability
                )
            ] += count

    def _steps(self, gaussian_delta: float) -> list[tuple[float, float, int]]:
        """All steps as (epsilon, delta, count); Gaussian steps share ``gaussian_delta``."""
        steps = [(e, d, n) for (e, d), n in self._fixed.items() if e > 0 or d > 0]
        total = max(1, sum(self._gaussian.values()))
        for (q, sigma), n in self._gaussian.items():
            if sigma == 0:
                steps.append((math.inf, 0.0, n))
                continue
            share = gaussian_delta / total  # this step's delta after amplification
            inner = gdp_epsilon(mu=1 / sigma, delta=min(share / q, 1 - 1e-12))
            epsilon, delta = amplify(
                epsilon=inner, delta=min(share / q, 1 - 1e-12), sampling_probability=q
            )
            steps.append((epsilon, delta, n))
        return steps

    def _fixed_delta(self) -> float:
        return sum(d * n for (_, d), n in self._fixed.items())

    def _delta(self, epsilon: float) -> float:
        return delta_for_epsilon(self._epsilon, epsilon)


class BasicCompositionAccountant(_StepLedger):
    """Basic composition with amplification by sampling and an even delta split.

    Example:
        >>> acc = BasicCompositionAccountant().compose(EpsilonDeltaEvent(0.5, 1e-7), 10)
        >>> acc.get_epsilon(1e-5)
        5.0
    """

    name = "basic"

    def _epsilon(self, delta: float) -> float:
        budget = delta - self._fixed_delta()
        if budget < 0 or (budget == 0 and self._gaussian):
            return math.inf
        return math.fsum(e * n for e, _, n in self._steps(budget))
