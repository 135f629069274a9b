"""Noise for private ERM: the "norm-Laplace" density of CMS 2011 and the analytic Gaussian.

CMS Alg. 1 and Alg. 2 draw b in R^d with density nu(b) proportional to exp(-beta ||b||). In polar
coordinates the density of r = ||b|| is proportional to r^{d-1} e^{-beta r}: ||b|| ~ Gamma(d,
scale 1/beta), independent of the direction b / ||b||, which is uniform on the sphere (CMS §3.1
gives this sampling recipe). E||b|| = d / beta and E||b||^2 = d (d + 1) / beta^2.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from dpcore.mechanisms.gaussian import gdp_delta
from dpcore.validation import check_count, check_delta, check_positive

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
    radius = rng.gamma(shape=d, scale=s, size=count)
    direction = rng.standard_normal((count, d))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    draws = direction * radius[:, None]
    return draws[0] if size is None else draws


def analytic_gaussian_sigma(*, sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest sigma with N(0, sigma^2 I) noise at L2 ``sensitivity`` being (epsilon, delta)-DP.

    The exact curve is the mu-GDP one with mu = sensitivity / sigma (Balle & Wang 2018, Thm 8;
    :func:`dpcore.mechanisms.gaussian.gdp_delta`); we find the largest mu with
    delta(epsilon) <= ``delta`` by bisection and return sensitivity / mu, rounded up so the
    target is met. Valid for every epsilon > 0 (unlike sqrt(2 ln(1.25/delta)) / epsilon,
    Dwork & Roth 2014, Thm A.1, which needs epsilon < 1).

    >>> sigma = analytic_gaussian_sigma(sensitivity=1.0, epsilon=1.0, delta=1e-5)
    >>> round(sigma, 3), gdp_delta(mu=1 / sigma, epsilon=1.0) <= 1e-5
    (3.731, True)
    """
    sens = check_positive("sensitivity", sensitivity)
    eps = check_positive("epsilon", epsilon)
    target = check_delta("delta", delta)

    def excess(log_mu: float) -> float:
        return math.log(max(gdp_delta(mu=math.exp(log_mu), epsilon=eps), 1e-300)) - math.log(target)

    low, high = -10.0, 1.0
    while excess(high) < 0:
        high += 2.0
    while excess(low) > 0:  # pragma: no cover - delta >= delta(mu = e^-10) is absurd
        low -= 10.0
    log_mu = float(optimize.brentq(excess, low, high, xtol=1e-13))
    while excess(log_mu) > 0:
        log_mu -= 1e-12
    return sens / math.exp(log_mu)
