"""Gaussian-DP central-limit accountant of Bu, Dong, Long, Su (2019) -- an approximation.

**This accountant does not give a guarantee.** Noisy SGD with T Poisson-sampled Gaussian steps
(rate q, noise multiplier sigma) is only *asymptotically* mu-GDP, with

    mu = q sqrt(T (e^{1/sigma^2} - 1)),

in the limit T -> inf with q sqrt(T) converging (Bu, Dong, Long, Su 2019, arXiv 1911.11607,
Thm 5 / Cor. 5, via the central limit theorem for f-DP of Dong, Roth, Su 2019). For few steps
or a large q the true privacy loss can be worse, so the epsilon it reports can *understate*
the true epsilon. Every answer is therefore an :class:`~dpcore.accountants.base.Approximate`
float labelled "approximate, not a guarantee", and saved state carries the same label.

Exact parts: an unsampled Gaussian step (or one with q = 1, the same mechanism) is exactly
(1/sigma)-GDP (Dong, Roth, Su 2019, Thm 2.7), and GDP composes exactly by adding mu^2 (ibid.,
Cor. 3.3). Step groups with different (q, sigma) add their q^2 T (e^{1/sigma^2} - 1). Epsilon
and delta come from the exact mu-GDP duality (:func:`~dpcore.mechanisms.gaussian.gdp_epsilon`,
:func:`~dpcore.mechanisms.gaussian.gdp_delta`); at delta = 0 any mu > 0 gives epsilon = inf
(mu-GDP's delta(epsilon) is positive for every finite epsilon, Dong, Roth, Su 2019, Cor. 2.13).
Only Gaussian and Poisson-sampled Gaussian steps are supported; anything else raises
:class:`~dpcore.errors.UnsupportedEventError`.
"""

from __future__ import annotations

import math
from typing import cast

from dpcore.accountants.base import EstimateKind, PrivacyAccountant, handles
from dpcore.events import GaussianEvent, PoissonSampledEvent
from dpcore.mechanisms.gaussian import gdp_delta, gdp_epsilon
from dpcore.validation import check_count, check_non_negative, check_probability

__all__ = ["GdpCltAccountant", "clt_mu_squared"]

# Beyond this 1/sigma^2 the factor e^{1/sigma^2} overflows a float; mu is then infinite.
_MAX_EXPONENT = 700.0


def _inverse_square(noise_multiplier: float) -> float:
    """1/sigma^2 without ZeroDivision/OverflowError for tiny sigma (inf instead)."""
    if noise_multiplier == 0:
        return math.inf
    inverse = 1.0 / noise_multiplier  # may be inf for a subnormal sigma; never raises
    return inverse * inverse  # float multiply overflows to inf (``**`` would raise)


def clt_mu_squared(*, sampling_probability: float, noise_multiplier: float, steps: int) -> float:
    """mu^2 = q^2 T (e^{1/sigma^2} - 1) of Bu et al. 2019, Thm 5 (inf when sigma is tiny or 0).

    >>> round(math.sqrt(clt_mu_squared(
    ...     sampling_probability=256 / 60_000, noise_multiplier=1.3, steps=3516)), 4)
    0.2273

    Raises:
        InvalidParameterError: q outside [0, 1], sigma < 0 or NaN, steps not an integer >= 0.
    """
    q = check_probability("sampling_probability", sampling_probability)
    sigma = check_non_negative("noise_multiplier", noise_multiplier)
    count = check_count("steps", steps)
    if q == 0 or count == 0:
        return 0.0
    exponent = _inverse_square(sigma)
    if exponent > _MAX_EXPONENT:
        return math.inf
    return q * q * count * math.expm1(exponent)


class GdpCltAccountant(PrivacyAccountant):
    """CLT accountant (Bu et al. 2019): an approximation that can understate epsilon.

    It is *not* an upper bound: for small T or large q the true epsilon can be larger than what
    it reports (see the module docstring). Answers are :class:`Approximate` floats.

    Example (Bu et al. 2019's MNIST setting: sigma = 1.3, lot 256 of 60,000, 15 epochs):
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
        """The (approximate) GDP parameter of everything composed so far (inf if no noise)."""
        return math.sqrt(self._mu_squared)

    @handles((GaussianEvent,))
    def _gaussian(self, event: GaussianEvent, count: int) -> None:
        # Exact: one Gaussian step is (1/sigma)-GDP; count of them compose to mu^2 = count/sigma^2.
        self._mu_squared += count * _inverse_square(event.noise_multiplier)

    @handles((PoissonSampledEvent, GaussianEvent))
    def _sampled(self, event: PoissonSampledEvent, count: int) -> None:
        inner = cast(GaussianEvent, event.event)  # the registry signature guarantees the type
        if event.sampling_probability == 1.0:  # no sampling: the exact Gaussian rule applies
            self._gaussian(inner, count)
            return
        self._mu_squared += clt_mu_squared(
            sampling_probability=event.sampling_probability,
            noise_multiplier=inner.noise_multiplier,
            steps=count,
        )

    def _epsilon(self, delta: float) -> float:
        if delta == 0:  # mu-GDP with mu > 0 is (epsilon, 0)-DP for no finite epsilon
            return math.inf if self._mu_squared > 0 else 0.0
        return gdp_epsilon(mu=self.mu, delta=delta)

    def _delta(self, epsilon: float) -> float:
        return gdp_delta(mu=self.mu, epsilon=epsilon)
