"""The Gaussian mechanism: exact (epsilon, delta) curve and its inverse.

A Gaussian mechanism with noise multiplier sigma (noise standard deviation over L2 sensitivity)
is mu-GDP with mu = 1/sigma (Dong, Roth, Su 2019, Thm 2.7), and its exact privacy profile is
(Balle & Wang 2018, Thm 8; Dong, Roth, Su 2019, Cor. 2.13)

    delta(epsilon) = Phi(-epsilon/mu + mu/2) - e^epsilon * Phi(-epsilon/mu - mu/2).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from dpcore.validation import check_delta, check_non_negative, check_positive

__all__ = [
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_epsilon_upper",
    "gdp_delta",
    "gdp_epsilon",
]


def _log_ndtr(x: float) -> float:
    return float(special.log_ndtr(x))


def _log_gdp_delta(mu: float, epsilon: float) -> float:
    """log delta(epsilon) of mu-GDP for finite mu > 0 and epsilon >= 0 (-inf when delta = 0)."""
    log_a = _log_ndtr(-epsilon / mu + mu / 2)
    log_b = epsilon + _log_ndtr(-epsilon / mu - mu / 2)
    if log_b >= log_a:
        return -math.inf
    return log_a + math.log(-math.expm1(log_b - log_a))


def gdp_delta(*, mu: float, epsilon: float) -> float:
    """delta(epsilon) of mu-GDP (Dong, Roth, Su 2019, Cor. 2.13).

    Computed as a difference of logs to stay accurate when delta is tiny.

    >>> round(gdp_delta(mu=1.0, epsilon=1.0), 6)
    0.126937
    """
    mu = check_non_negative("mu", mu, allow_infinity=True)
    epsilon = check_non_negative("epsilon", epsilon, allow_infinity=True)
    if mu == 0.0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    if math.isinf(epsilon):
        return 0.0
    return math.exp(_log_gdp_delta(mu, epsilon))


def gdp_epsilon(*, mu: float, delta: float) -> float:
    """Smallest epsilon >= 0 with mu-GDP => (epsilon, delta)-DP; inverse of :func:`gdp_delta`.

    >>> round(gdp_epsilon(mu=1.0, delta=gdp_delta(mu=1.0, epsilon=1.0)), 9)
    1.0
    """
    mu = check_non_negative("mu", mu, allow_infinity=True)
    delta = check_delta("delta", delta)
    if mu == 0.0:
        return 0.0
    if math.isinf(mu):
        return math.inf
    log_delta = math.log(delta)
    if _log_gdp_delta(mu, 0.0) <= log_delta:
        return 0.0
    # delta(eps) <= Phi(-eps/mu + mu/2) gives an upper end for the bracket.
    upper = mu * (mu / 2 - float(special.ndtri(delta))) + 1.0
    if not math.isfinite(upper):
        # mu^2 / 2 overflows (mu > ~1.9e154, sigma < ~5e-155): the root exceeds the largest
        # float, and IEEE rounding of such a value is inf.
        return math.inf
    while _log_gdp_delta(mu, upper) > log_delta:  # pragma: no cover - defensive
        upper *= 2
    root = optimize.brentq(
        lambda eps: max(_log_gdp_delta(mu, eps), -1e300) - log_delta,
        0.0,
        upper,
        xtol=1e-13,
        rtol=1e-14,
    )
    # brentq's answer may sit a hair below the root; step up so delta(eps) <= delta holds.
    eps = float(root)
    while math.exp(_log_gdp_delta(mu, eps)) > delta:
        eps = float(np.nextafter(eps, math.inf)) + 1e-12 * max(1.0, eps)
    return eps


def gaussian_delta(*, noise_multiplier: float, epsilon: float) -> float:
    """Exact delta(epsilon) of one Gaussian mechanism (Balle & Wang 2018, Thm 8)."""
    sigma = check_positive("noise_multiplier", noise_multiplier)
    return gdp_delta(mu=1.0 / sigma, epsilon=epsilon)


def gaussian_epsilon(*, noise_multiplier: float, delta: float) -> float:
    """Exact epsilon(delta) of one Gaussian mechanism (inverse of :func:`gaussian_delta`)."""
    sigma = check_positive("noise_multiplier", noise_multiplier)
    return gdp_epsilon(mu=1.0 / sigma, delta=delta)


def gaussian_epsilon_upper(*, noise_multiplier: float, delta: float) -> float:
    """An epsilon that the Gaussian mechanism certainly meets at ``delta`` (for accountants).

    :func:`gaussian_epsilon` for mu = 1/sigma >= 1e-4; below, where Phi(a) - Phi(b) in the
    exact profile loses its precision and can round delta(eps) down (even to 0), the inverse of
    the upper bound :func:`dpcore.tradeoff.closed_forms.log_small_mu_delta_bound`, so the answer
    is never below the true epsilon. (Audits, which need the other direction, keep the exact
    :func:`gdp_epsilon`.)
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    from dpcore.tradeoff.closed_forms import SMALL_MU, _small_mu_epsilon  # imports this module

    mu = 1.0 / sigma
    if mu >= SMALL_MU:
        return gdp_epsilon(mu=mu, delta=delta)
    return _small_mu_epsilon(mu, check_delta("delta", delta))
