"""The per-step white-box audit's test of the claim: mu* (the per-step mu whose composition is
the claimed epsilon) and the p-value of "per-step mu <= mu*" on the held-out threshold.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from dpcore.auditing.stepwise import composed_lower_bound


@functools.lru_cache(maxsize=256)
def _mu_for_epsilon(q: float, steps: int, delta: float, epsilon: float, sigma: float) -> float:
    """mu* with composed_lower_bound(q, mu*, T, delta) = epsilon, to 0.1 % (bisection on log
    mu, bracketed around 1 / sigma, the claim's own noise multiplier)."""
    low, high = 0.5 / sigma, 2.0 / sigma
    while composed_lower_bound(q, high, steps, delta) <= epsilon and high < 1e3:
        low, high = high, 2 * high
    while composed_lower_bound(q, low, steps, delta) > epsilon and low > 1e-6:
        low, high = low / 2, low
    while high / low > 1.001:
        middle = math.sqrt(low * high)
        if composed_lower_bound(q, middle, steps, delta) > epsilon:
            high = middle
        else:
            low = middle
    return high


def _mu_lower(fp: int, negatives: int, fn: int, positives: int, alpha: float) -> float:
    """The GDP route's mu_lb at failure ``alpha`` (union bound over the two rates)."""
    fpr = (
        1.0 if fp == negatives else float(special.betaincinv(fp + 1, negatives - fp, 1 - alpha / 2))
    )
    fnr = (
        1.0 if fn == positives else float(special.betaincinv(fn + 1, positives - fn, 1 - alpha / 2))
    )
    return float(special.ndtri(1 - fpr) - special.ndtri(fnr))


def per_step_p_value(
    negative: np.ndarray,
    positive: np.ndarray,
    *,
    mu_claimed: float,
    threshold: float,
    held_out_fraction: float,
    seed: int,
) -> float:
    """p-value of "per-step mu <= mu_claimed": the smallest alpha whose mu_lb exceeds it.

    The same seeded split as :func:`dpcore.auditing.stepwise.held_out_threshold_bound`; the
    threshold (chosen on the held-out part) is evaluated once on the rest, so mu_lb(alpha) holds
    with probability 1 - alpha and ``{alpha : mu_lb(alpha) > mu_claimed}`` has probability at
    most alpha under the null.
    """
    rng = np.random.default_rng(seed)
    negative, positive = rng.permutation(negative), rng.permutation(positive)
    cut_n, cut_p = int(held_out_fraction * negative.size), int(held_out_fraction * positive.size)
    neg, pos = negative[cut_n:], positive[cut_p:]
    if neg.size == 0 or pos.size == 0:
        return 1.0
    fp, fn = int(np.sum(neg > threshold)), int(np.sum(pos <= threshold))
    if _mu_lower(fp, neg.size, fn, pos.size, 1.0 - 1e-12) <= mu_claimed:
        return 1.0
    low, high = -745.0, 0.0  # log alpha
    if _mu_lower(fp, neg.size, fn, pos.size, math.exp(low)) > mu_claimed:
        return 0.0
    for _ in range(60):
        middle = (low + high) / 2
        if _mu_lower(fp, neg.size, fn, pos.size, math.exp(middle)) > mu_claimed:
            high = middle
        else:
            low = middle
    return min(1.0, math.exp(high))
