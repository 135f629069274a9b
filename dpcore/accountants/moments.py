"""The moments accountant exactly as Abadi et al. (2016, §3.2) describe it.

Log moments alpha(lambda) of each step, computed numerically (:mod:`moments_math`) for integer
lambda = 1..32, add over steps (Thm 2.1, composability); the tail bound gives
delta = min_lambda exp(alpha(lambda) - lambda epsilon) and, inverted,
epsilon = min_lambda (alpha(lambda) + log(1/delta)) / lambda. At delta = 0 the tail bound
certifies nothing: epsilon is inf once a noisy step has run (0 before).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpcore.accountants.base import PrivacyAccountant, handles
from dpcore.accountants.moments_math import log_moments
from dpcore.events import GaussianEvent, PoissonSampledEvent
from dpcore.validation import check_count

__all__ = ["MomentsAccountant"]


class MomentsAccountant(PrivacyAccountant):
    """Moments accountant of Abadi et al. 2016 over integer lambda <= ``max_lambda`` (32).

    Supports Gaussian and Poisson-sampled Gaussian steps (add/remove-one neighbouring).

    Example:
        >>> from dpcore.events import dpsgd_event
        >>> acc = MomentsAccountant().compose(
        ...     dpsgd_event(sampling_probability=0.01, noise_multiplier=4.0, steps=10_000))
        >>> 1.0 < acc.get_epsilon(1e-5) < 1.5
        True
    """

    name = "moments"

    def __init__(self, max_lambda: int = 32) -> None:
        super().__init__()
        self._max_lambda = check_count("max_lambda", max_lambda, minimum=1)
        self._moments = np.zeros(self._max_lambda)

    def config(self) -> dict[str, Any]:
        return {"max_lambda": self._max_lambda}

    @property
    def log_moments(self) -> np.ndarray:
        """Accumulated alpha(lambda), lambda = 1..max_lambda."""
        return self._moments.copy()

    def _add(self, q: float, sigma: float, count: int) -> None:
        step = np.array(
            log_moments(sampling_probability=q, noise_multiplier=sigma, max_lambda=self._max_lambda)
        )
        with np.errstate(invalid="ignore"):
            self._moments = self._moments + np.where(step == 0, 0.0, count * step)

    @handles((GaussianEvent,))
    def _gaussian(self, event: GaussianEvent, count: int) -> None:
        self._add(1.0, event.noise_multiplier, count)

    @handles((PoissonSampledEvent, GaussianEvent))
    def _sampled(self, event: PoissonSampledEvent, count: int) -> None:
        inner = event.event
        assert isinstance(inner, GaussianEvent)  # guaranteed by the registry signature
        self._add(event.sampling_probability, inner.noise_multiplier, count)

    def _epsilon(self, delta: float) -> float:
        if not np.any(self._moments > 0):
            return 0.0
        if delta == 0:  # the tail bound needs log(1/delta): no pure-DP epsilon is certified
            return math.inf
        lambdas = np.arange(1, self._max_lambda + 1)
        return float(np.min((self._moments + math.log(1 / delta)) / lambdas))

    def _delta(self, epsilon: float) -> float:
        if not np.any(self._moments > 0):
            return 0.0
        lambdas = np.arange(1, self._max_lambda + 1)
        with np.errstate(over="ignore"):
            return float(min(1.0, np.min(np.exp(self._moments - lambdas * epsilon))))
