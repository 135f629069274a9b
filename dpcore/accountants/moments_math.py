"""Log moments of the sampled Gaussian mechanism, by numerical integration (Abadi et al. 2016).

With mu0 = N(0, sigma^2) and mu = (1 - q) mu0 + q N(1, sigma^2), Abadi et al. (2016, §3.2,
"Computing alpha(lambda)") bound the lambda-th log moment of the privacy loss by
alpha(lambda) = log max(E1, E2), E1 = E_{z~mu0}[(mu0(z)/mu(z))^lambda],
E2 = E_{z~mu}[(mu(z)/mu0(z))^lambda], and compute both expectations numerically. We do the same,
integrating in log space around the integrand's mode so that large lambda cannot overflow.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import numpy as np
from scipy import integrate

from dpcore.mechanisms.noise_range import gaussian_rdp, is_huge, is_noiseless

__all__ = ["log_moments"]


def _log_ratio(z: Any, q: float, sigma: float) -> Any:
    """log(mu(z) / mu0(z)) = log(1 - q + q exp((2z - 1) / (2 sigma^2))), for floats or arrays."""
    if q == 1.0:
        return (2 * z - 1) / (2 * sigma**2)
    return np.logaddexp(math.log1p(-q), math.log(q) + (2 * z - 1) / (2 * sigma**2))


def _log_integral(log_integrand, low: float, high: float, width: float) -> float:  # type: ignore[no-untyped-def]
    """log of the integral of exp(log_integrand) over [low, high], which holds all its mass.

    The integrands here can be bimodal (a bump near 0 from mu0 and one near lambda + 1 from the
    likelihood ratio), so the maxima are located on a dense grid first; the integrand is then
    scaled by its largest value (no overflow) and integrated with those maxima as breakpoints.
    """
    grid = np.linspace(low, high, 4001)
    values = log_integrand(grid)
    top = float(values.max())
    peaks = [
        float(grid[i])
        for i in range(1, grid.size - 1)
        if values[i] >= values[i - 1] and values[i] >= values[i + 1] and values[i] > top - 80
    ]
    # Integrate over windows of +-width around each peak (the integrands are Gaussian-like
    # with scale ``width``); a peak narrower than the grid is still resolved this way.
    windows: list[list[float]] = []
    for peak in sorted(peaks):
        start, end = max(low, peak - 40 * width), min(high, peak + 40 * width)
        if windows and start <= windows[-1][1]:
            windows[-1][1] = max(windows[-1][1], end)
        else:
            windows.append([start, end])
    total = 0.0
    for start, end in windows:
        inside = [p for p in peaks if start < p < end]
        # Ask for 1e-12; extreme settings (sigma ~ 0.02) cannot reach it in floating point,
        # and then 1e-8 relative is accepted, which changes epsilon by far less than 1e-6.
        for tolerance in (1e-12, 1e-8):
            with warnings.catch_warnings():
                warnings.simplefilter("error", integrate.IntegrationWarning)
                try:
                    value, _ = integrate.quad(
                        lambda z: math.exp(min(float(log_integrand(z)) - top, 700.0)),
                        start,
                        end,
                        points=inside or None,
                        epsabs=0.0,
                        epsrel=tolerance,
                        limit=1000,
                    )
                    break
                except integrate.IntegrationWarning:
                    value = math.nan
        if not value > 0:
            return math.inf  # an unresolved integral never passes for a small moment
        total += value
    if not total > 0:
        return math.inf  # an unresolved integral never passes for a small moment
    return top + math.log(total)


@functools.lru_cache(maxsize=256)
def log_moments(
    *, sampling_probability: float, noise_multiplier: float, max_lambda: int
) -> tuple[float, ...]:
    """alpha(lambda) for lambda = 1..max_lambda of one sampled Gaussian step (Abadi et al. §3.2).

    Returns a tuple (cached per argument triple). q = 0 gives zeros, sigma = 0 gives inf; for
    sigma outside the float range see :mod:`dpcore.mechanisms.noise_range`.
    """
    q, sigma = sampling_probability, noise_multiplier
    if q == 0:
        return (0.0,) * max_lambda
    if is_noiseless(sigma):
        return (math.inf,) * max_lambda
    if is_huge(sigma):
        # alpha(lambda) = lambda RDP(lambda + 1) <= lambda (lambda + 1) / (2 sigma^2), the
        # Gaussian's own (Mironov 2017, Prop. 7; sampling never increases it).
        return tuple(lam * gaussian_rdp(lam + 1.0, sigma) for lam in range(1, max_lambda + 1))
    log_norm = -0.5 * math.log(2 * math.pi * sigma**2)
    moments = []
    for lam in range(1, max_lambda + 1):

        def log_e1(z: Any, lam: int = lam) -> Any:
            # mu0^{lam+1} mu^{-lam} = mu0 * (mu / mu0)^{-lam}
            return log_norm - z * z / (2 * sigma**2) - lam * _log_ratio(z, q, sigma)

        def log_e2(z: Any, lam: int = lam) -> Any:
            # mu^{lam+1} mu0^{-lam} = mu0 * (mu / mu0)^{lam+1}
            return log_norm - z * z / (2 * sigma**2) + (lam + 1) * _log_ratio(z, q, sigma)

        # Both integrands are Gaussian-tailed beyond these ends (mass below e^{-700}).
        low, high = -40 * sigma - 2, lam + 2 + 40 * sigma
        moments.append(
            max(_log_integral(log_e1, low, high, sigma), _log_integral(log_e2, low, high, sigma))
        )
    return tuple(moments)
