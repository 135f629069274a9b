"""Gaussian-DP central-limit accountant of Bu, Dong, Long, Su (2019) — an approximation.

Noisy SGD with T Poisson-sampled Gaussian steps (rate q, multiplier sigma) is *asymptotically*
mu-GDP with mu = q sqrt(T (e^{1/sigma^2} - 1)) as q sqrt(T) converges (Bu et al. 2019, arXiv
1911.11607, Thm 5 / Cor. 5; Dong, Roth, Su 2019, Thm 3.6). It is not a bound: for few steps or
large q it can *understate* epsilon, so every answer is an :class:`Approximate` float labelled
"approximate, not a guarantee". A plain Gaussian step is exactly (1/sigma)-GDP, and GDP
compositions add mu^2 (Dong, Roth, Su 2019, Cor. 3.3).
"""

from __future__ import annotations

import math

from dpcore.accountants.base import EstimateKind, PrivacyAccountant, handles
from dpcore.events import GaussianEvent, PoissonSampledEvent
from dpcore.mechanisms.gaussian import gdp_delta, gdp_epsilon

__all__ = ["GdpCltAccountant", "clt_mu_squared"]

# Beyond this 1/sigma^2 the factor e^{1/sigma^2} overflows; mu is then infinite.
_MAX_EXPONENT = 700.0


def clt_mu_squared(*, sampling_probability: float, noise_multiplier: float, steps: int) -> float:
    """mu^2 = q^2 T (e^{1/sigma^2} - 1) of Bu et al. 2019, Thm 5 (inf when sigma = 0)."""
    q, sigma = sampling_probability, noise_multiplier
    if q == 0 or steps == 0:
        return 0.0
    if sigma == 0 or 1 / sigma**2 > _MAX_EXPONENT:
        return math.inf
    return q * q * steps * math.expm1(1 / sigma**2)


class GdpCltAccountant(PrivacyAccountant):
    """CLT accountant (Bu et al. 2019): an approximation, *not* an upper bound.

    Example:
        >>> from dpcore.events import dpsgd_event
        >>> acc = GdpCltAccountant().compose(
        ...     dpsgd_event(sampling_probability=256 / 60_000, noise_multiplier=1.3, steps=3516))
        >>> round(acc.mu, 3)
        0.227
        >>> acc.get_epsilon(1e-5)
        Approximate(0.834..., 'approximate, not a guarantee')
    """

    name = "gdp_clt"
    kind = EstimateKind.APPROXIMATE

    def __init__(self) -> None:
        super().__init__()
        self._mu_squared = 0.0

    @property
    def mu(self) -> float:
        """The (approximate) GDP parameter of everything composed so far."""
        return math.sqrt(self._mu_squared)

    @handles((GaussianEvent,))
    def _gaussian(self, event: GaussianEvent, count: int) -> None:
        sigma = event.noise_multiplier
        self._mu_squared += math.inf if sigma == 0 else count / sigma**2

    @handles((PoissonSampledEvent, GaussianEvent))
    def _sampled(self, event: PoissonSampledEvent, count: int) -> None:
        inner = event.event
        assert isinstance(inner, GaussianEvent)  # guaranteed by the registry signature
        if event.sampling_probability == 1.0:
            self._gaussian(inner, count)
            return
        self._mu_squared += clt_mu_squared(
            sampling_probability=event.sampling_probability,
            noise_multiplier=inner.noise_multiplier,
            steps=count,
        )

    def _epsilon(self, delta: float) -> float:
        return gdp_epsilon(mu=self.mu, delta=delta)

    def _delta(self, epsilon: float) -> float:
        return gdp_delta(mu=self.mu, epsilon=epsilon)
