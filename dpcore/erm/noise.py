"""Noise for private ERM: the "norm-Laplace" density of CMS 2011 and the analytic Gaussian.

CMS Alg. 1 and Alg. 2 draw b in R^d with density nu(b) proportional to exp(-beta ||b||). In polar
coordinates the density of r = ||b|| is proportional to r^{d-1} e^{-beta r}: ||b|| ~ Gamma(d,
scale 1/beta), independent of the direction b / ||b||, which is uniform on the sphere (CMS §3.1
gives this sampling recipe). E||b|| = d / beta and E||b||^2 = d (d + 1) / beta^2.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from scipy import optimize

from dpcore.erm.objective import check_rng
from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import _log_gdp_delta
from dpcore.tradeoff.closed_forms import log_small_mu_delta_bound
from dpcore.validation import check_allocation, check_count, check_delta, check_positive

__all__ = ["analytic_gaussian_sigma", "sample_norm_laplace"]


def sample_norm_laplace(
    dimension: int, *, scale: float, rng: np.random.Generator, size: int | None = None
) -> np.ndarray:
    """Draw b with density proportional to exp(-||b|| / scale) in R^dimension.

    ``scale`` is 1/beta (2/(n lambda epsilon) for CMS Alg. 1, 2/epsilon' for Alg. 2). Returns
    shape (dimension,), or (size, dimension) when ``size`` is given.

    >>> b = sample_norm_laplace(3, scale=2.0, rng=np.random.default_rng(0), size=4)
    >>> b.shape
    (4, 3)
    """
    d = check_count("dimension", dimension, minimum=1)
    s = check_positive("scale", scale)
    count = 1 if size is None else check_count("size", size, minimum=1)
    check_rng(rng)
    check_allocation("dimension" if size is None else "size", size or d, elements=count * d)
    radius = rng.gamma(shape=d, scale=s, size=count)
    direction = rng.standard_normal((count, d))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    with np.errstate(over="ignore"):
        draws = direction * radius[:, None]
    if not np.all(np.isfinite(draws)):
        raise InvalidParameterError("scale", "small enough that the draws are finite", s)
    return draws[0] if size is None else draws


def finite_noise(noise: np.ndarray, epsilon: float) -> np.ndarray:
    """``noise`` if every entry is finite; else the scale is too large for floats (tiny epsilon).

    Raises:
        InvalidParameterError: naming ``epsilon``.
    """
    if not np.all(np.isfinite(noise)):
        raise InvalidParameterError("epsilon", "large enough that the noise is finite", epsilon)
    return noise


#: Below this mu, the exact Gaussian delta is replaced by an upper bound (see
#: :func:`_log_delta_upper`).
_SMALL_MU = 1e-4
#: Relative slack on the exact delta: its floating-point error was measured below 1e-9 for
#: mu >= 1e-4 (against 80-digit arithmetic).
_RELATIVE_SLACK = 1e-8
_LOG_LARGEST = math.log(sys.float_info.max)
_LOG_SMALLEST = math.log(5e-324)


def _log_delta_upper(log_mu: float, epsilon: float) -> float:
    """An upper bound on log delta(epsilon) of mu-GDP, mu = e^log_mu, never below the truth.

    The exact value (with a relative slack) for mu >= 1e-4; below, where the difference of
    Phi's loses its precision, log(mu phi(max(0, epsilon/mu - mu/2))) (the width of the
    interval times phi's largest value on it; see
    :func:`dpcore.tradeoff.closed_forms.log_small_mu_delta_bound`).
    """
    if log_mu >= math.log(_SMALL_MU):
        return _log_gdp_delta(math.exp(log_mu), epsilon) + math.log1p(_RELATIVE_SLACK)
    if log_mu < _LOG_SMALLEST:
        return -math.inf  # mu underflows to 0: as good as no leak (callers stop before this)
    return log_small_mu_delta_bound(math.exp(log_mu), epsilon)


def analytic_gaussian_sigma(*, sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest sigma with N(0, sigma^2 I) noise at L2 ``sensitivity`` being (epsilon, delta)-DP.

    The exact curve is the mu-GDP one with mu = sensitivity / sigma (Balle & Wang 2018, Thm 8;
    :func:`dpcore.mechanisms.gaussian.gdp_delta`); we find the largest mu with
    delta(epsilon) <= ``delta`` by bisection and return sensitivity / mu, rounded up so the
    target is met. Valid for every epsilon > 0 (unlike sqrt(2 ln(1.25/delta)) / epsilon,
    Dwork & Roth 2014, Thm A.1, which needs epsilon < 1).

    >>> from dpcore.mechanisms.gaussian import gdp_delta
    >>> sigma = analytic_gaussian_sigma(sensitivity=1.0, epsilon=1.0, delta=1e-5)
    >>> round(sigma, 3), gdp_delta(mu=1 / sigma, epsilon=1.0) <= 1e-5
    (3.731, True)
    """
    sens = check_positive("sensitivity", sensitivity)
    eps = check_positive("epsilon", epsilon)
    target = check_delta("delta", delta)
    log_target = math.log(target)

    def excess(log_mu: float) -> float:
        return _log_delta_upper(log_mu, eps) - log_target

    low, high = -10.0, 1.0
    while excess(high) < 0:
        high += 2.0
    while excess(low) > 0:
        low -= 10.0
        if math.log(sens) - low > _LOG_LARGEST:
            raise InvalidParameterError(
                "delta", f"large enough for a finite sigma at epsilon = {eps!r}", target
            )
    log_mu = float(optimize.brentq(excess, low, high, xtol=1e-13))
    while excess(log_mu) > 0:
        log_mu -= 1e-12 * max(1.0, abs(log_mu))
    log_sigma = math.log(sens) - log_mu
    if log_sigma > _LOG_LARGEST:
        raise InvalidParameterError(
            "delta", f"large enough for a finite sigma at epsilon = {eps!r}", target
        )
    # Below the normal range exp rounds coarsely: step up one float (and never to 0 noise).
    sigma = math.exp(log_sigma)
    return sigma if sigma >= sys.float_info.min else math.nextafter(sigma, math.inf)
