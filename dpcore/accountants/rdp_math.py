"""Rényi-DP closed forms and conversions (pure functions).

RDP of order a > 1 of a mechanism M: sup over neighbours of D_a(M(D) || M(D')). It composes
additively (Mironov 2017, Prop. 1) and converts to (epsilon, delta)-DP.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import special

from dpcore.mechanisms.noise_range import gaussian_rdp, is_huge, is_noiseless

__all__ = [
    "delta_from_rdp",
    "epsilon_from_rdp",
    "laplace_rdp",
    "pure_dp_rdp",
    "sampled_without_replacement_gaussian_rdp",
    "subsampled_gaussian_rdp",
]

_FRACTIONAL_TERMS = 1000


def _log_comb(n: float, k: Any) -> Any:
    """log |C(n, k)| of the (generalised) binomial coefficient, for floats or arrays k."""
    return special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)


def _log_a_integer(q: float, sigma: float, order: int) -> float:
    """log A_a for integer a (Mironov, Talwar, Zhang 2019, Sec. 3.3, binomial expansion):

    A_a = sum_{k=0}^{a} C(a, k) (1 - q)^{a - k} q^k exp((k^2 - k) / (2 sigma^2)).

    Since the binomial weights sum to one, A_a - 1 = sum_{k>=2} C(a,k) (1-q)^{a-k} q^k
    expm1((k^2 - k) / (2 sigma^2)), a sum of positive terms; log A_a = log1p(A_a - 1) keeps full
    relative accuracy when A_a - 1 is tiny (q ~ 1e-9), where summing the raw terms would round
    the RDP to 0 -- an epsilon of 0 for a mechanism that is not perfectly private.
    """
    if order < 2:
        return 0.0
    k = np.arange(2, order + 1, dtype=float)
    exponent = (k * k - k) / (2 * sigma**2)
    # log(expm1(x)) without overflow: x + log1p(-e^{-x}).
    log_expm1 = exponent + np.log(-np.expm1(-exponent))
    terms = _log_comb(order, k) + k * math.log(q) + (order - k) * math.log1p(-q) + log_expm1
    log_excess = float(special.logsumexp(terms))
    return float(np.logaddexp(0.0, log_excess))


def _log_erfc(x: float) -> float:
    return math.log(2) + float(special.log_ndtr(-x * math.sqrt(2)))


def _log_a_fractional(q: float, sigma: float, order: float) -> float:
    """log A_a for fractional a: the two-sided series of Mironov, Talwar, Zhang 2019, Sec. 3.3.

    A_a = sum_i C(a, i) [q^i (1-q)^{a-i} e^{(i^2-i)/(2 s^2)} erfc((i - z0)/(sqrt 2 s)) / 2
                         + q^{j} (1-q)^i e^{(j^2-j)/(2 s^2)} erfc((z0 - j)/(sqrt 2 s)) / 2],
    j = a - i,
    z0 = s^2 log(1/q - 1) + 1/2. For i > a the generalised coefficients alternate in sign; the
    magnitudes are summed (as Google's dp_accounting does), which can only overestimate A_a and
    so keeps the RDP an upper bound. Terms are added in log space until both halves decrease
    and fall below e^{-30} of the running total; if that never happens the answer is inf
    (never silently a smaller number).
    """
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    log_q, log_1mq = math.log(q), math.log1p(-q)
    log_a0 = log_a1 = -math.inf
    last0 = last1 = -math.inf
    for i in range(_FRACTIONAL_TERMS):
        j = order - i
        log_coef = float(_log_comb(order, i))
        log_s0 = (
            log_coef
            + i * log_q
            + j * log_1mq
            + (i * i - i) / (2 * sigma**2)
            + math.log(0.5)
            + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
        )
        log_s1 = (
            log_coef
            + j * log_q
            + i * log_1mq
            + (j * j - j) / (2 * sigma**2)
            + math.log(0.5)
            + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
        )
        log_a0 = float(np.logaddexp(log_a0, log_s0))
        log_a1 = float(np.logaddexp(log_a1, log_s1))
        total = float(np.logaddexp(log_a0, log_a1))
        if log_s0 < last0 and log_s1 < last1 and max(log_s0, log_s1) < total - 30:
            return total
        last0, last1 = log_s0, log_s1
    return math.inf


def subsampled_gaussian_rdp(
    *, sampling_probability: float, noise_multiplier: float, orders: np.ndarray
) -> np.ndarray:
    """RDP of the Poisson-subsampled Gaussian mechanism at each order (add/remove-one).

    RDP(a) = log(A_a) / (a - 1) (Mironov, Talwar, Zhang 2019, Thm 4 / Sec. 3.3); q = 1 is the
    Gaussian's a / (2 sigma^2) (Mironov 2017, Prop. 7); q = 0 gives 0; sigma = 0 gives inf.
    Outside the float range of sigma, see :mod:`dpcore.mechanisms.noise_range`.
    """
    q, sigma = sampling_probability, noise_multiplier
    out = np.empty(len(orders))
    for index, order in enumerate(orders):
        if q == 0:
            out[index] = 0.0
        elif is_noiseless(sigma) or math.isinf(order):
            out[index] = math.inf
        elif q == 1 or is_huge(sigma):
            # Sampling never increases the RDP: for a huge sigma the Gaussian's own bounds it.
            out[index] = gaussian_rdp(order, sigma)
        elif float(order).is_integer():
            out[index] = _log_a_integer(q, sigma, int(order)) / (order - 1)
        else:
            value = _log_a_fractional(q, sigma, float(order)) / (order - 1)
            # For tiny q the series' sum is 1 + O(q^2) and rounding can leave 0 or less: such an
            # order is dropped (inf) rather than allowed to certify epsilon = 0.
            out[index] = value if value > 0 else math.inf
    return out


def _signed_log_subtract(
    sign_a: np.ndarray, log_a: np.ndarray, sign_b: np.ndarray, log_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(sign, log|.|) of a - b for numbers given as (sign, log magnitude) pairs."""
    sign_b = -sign_b
    high = np.maximum(log_a, log_b)
    low = np.minimum(log_a, log_b)
    with np.errstate(invalid="ignore", divide="ignore"):
        same = sign_a == sign_b
        gap = np.where(np.isfinite(high), low - high, -np.inf)
        magnitude = np.where(same, high + np.log1p(np.exp(gap)), high + np.log1p(-np.exp(gap)))
    sign = np.where(same | (log_a >= log_b), sign_a, sign_b)
    magnitude = np.where(~same & (log_a == log_b), -np.inf, magnitude)
    return sign, magnitude


def _log_forward_differences(sigma: float, count: int) -> np.ndarray:
    """log |Delta^m v (0)| for m = 0..count, v = (1, f(0), f(1), ...), f(x) = e^{x(x+1)/(2 s^2)}.

    These are the forward differences in Wang, Balle, Kasiviswanathan 2019 (arXiv 1808.00087),
    Thm 27, for the Gaussian's cumulant generating function, computed by repeated differencing
    in signed log space (index 0, the sequence itself, is unused).
    """
    x = np.arange(count + 1, dtype=float)
    logs = np.concatenate([[0.0], x * (x + 1) / (2 * sigma**2)])
    signs = np.ones_like(logs)
    out = np.empty(count + 1)
    out[0] = -math.inf
    for m in range(1, count + 1):
        signs, logs = _signed_log_subtract(signs[1:], logs[1:], signs[:-1], logs[:-1])
        out[m] = logs[0]
    return out


_WOR_EXACT_LIMIT = 256


def _log_a_without_replacement(
    q: float, sigma: float, order: int, differences: np.ndarray
) -> float:
    """log of the bound on A_a for integer a under sampling without replacement.

    Wang, Balle, Kasiviswanathan 2019 (arXiv 1808.00087), Thm 27 (the Gaussian-specific
    strengthening of Thm 9): A_a <= 1 + C(a,2) q^2 min{4(e^{eps(2)} - 1), 2 e^{eps(2)}}
    + sum_{j>=3} q^j C(a,j) min{4 sqrt(|D^{2 floor(j/2)}| |D^{2 ceil(j/2)}|), 2 e^{(j-1) eps(j)}},
    with eps(j) = j / (2 sigma^2) the Gaussian's RDP. Above order 256 only the second arm is
    used (an upper bound too, cheaper).
    """
    if order == 1:
        return 0.0

    def cgf(x: float) -> float:
        return x * (x + 1) / (2 * sigma**2)

    eps2 = 2 / (2 * sigma**2)
    log_a = 0.0
    for j in range(2, order + 1):
        if j == 2:
            term = (
                2 * math.log(q)
                + float(_log_comb(order, 2))
                + min(math.log(4) + eps2 + math.log(-math.expm1(-eps2)), eps2 + math.log(2))
            )
        else:
            term = math.log(2) + cgf(j - 1)
            if order <= _WOR_EXACT_LIMIT:
                low = differences[2 * math.floor(j / 2)]
                high = differences[2 * math.ceil(j / 2)]
                term = min(term, math.log(4) + 0.5 * (low + high))
            term += j * math.log(q) + float(_log_comb(order, j))
        log_a = float(np.logaddexp(log_a, term))
    return log_a


def sampled_without_replacement_gaussian_rdp(
    *, sample_size: int, dataset_size: int, noise_multiplier: float, orders: np.ndarray
) -> np.ndarray:
    """RDP of the Gaussian on a uniformly random subset of fixed size (replace-one neighbours).

    Integer orders use :func:`_log_a_without_replacement`; a fractional order a interpolates
    the log-moments of floor(a) and ceil(a) linearly, which bounds them by convexity of the
    cumulant generating function (Wang, Balle, Kasiviswanathan 2019, Cor. 10).
    """
    q, sigma = sample_size / dataset_size, noise_multiplier
    out = np.empty(len(orders))
    if q == 0:
        out[:] = 0.0
        return out
    if is_noiseless(sigma):
        out[:] = math.inf
        return out
    if is_huge(sigma):
        out[:] = [gaussian_rdp(order, sigma) for order in orders]  # sampling never increases it
        return out
    finite = [o for o in orders if math.isfinite(o)]
    top = min(_WOR_EXACT_LIMIT, math.ceil(max(finite, default=2))) + 2
    differences = _log_forward_differences(sigma, top) if q < 1 else np.empty(0)
    cache: dict[int, float] = {}

    def log_a(order: int) -> float:
        if order not in cache:
            cache[order] = _log_a_without_replacement(q, sigma, order, differences)
        return cache[order]

    for index, order in enumerate(orders):
        if math.isinf(order):
            out[index] = math.inf
        elif q == 1:
            out[index] = gaussian_rdp(order, sigma)
        elif float(order).is_integer():
            out[index] = log_a(int(order)) / (order - 1)
        else:
            low, high = math.floor(order), math.ceil(order)
            t = order - low
            out[index] = ((1 - t) * log_a(low) + t * log_a(high)) / (order - 1)
    return out


def laplace_rdp(*, noise_multiplier: float, orders: np.ndarray) -> np.ndarray:
    """RDP of the Laplace mechanism with scale b = noise multiplier x L1 sensitivity.

    Mironov 2017, Prop. 6 (eps = 1/b): RDP(a) = eps + log(1 + (a-1)(e^{(1-2a) eps} - 1)/(2a-1))
    / (a - 1); exact. Near a = 1 the logarithm is expanded as a series for stability.
    """
    out = np.empty(len(orders))
    if noise_multiplier == 0:
        out[:] = math.inf
        return out
    eps = 1 / noise_multiplier
    for index, order in enumerate(orders):
        a = float(order)
        if math.isinf(a):
            out[index] = eps
        elif a < 1.1:
            c = math.expm1(eps * (1 - 2 * a)) / (2 * a - 1)
            v = -c * (a - 1)
            out[index] = eps + c * math.fsum(v ** (k - 1) / k for k in range(1, 100))
        else:
            out[index] = eps + math.log1p((a - 1) * math.expm1(eps * (1 - 2 * a)) / (2 * a - 1)) / (
                a - 1
            )
    return out


def pure_dp_rdp(*, epsilon: float, orders: np.ndarray) -> np.ndarray:
    """RDP of an epsilon-DP mechanism: min(epsilon, a epsilon^2 / 2).

    epsilon-DP implies (epsilon^2/2)-zCDP (Bun & Steinke 2016, Prop. 3.3), i.e. RDP a eps^2/2 at
    every order, and RDP <= epsilon always (Mironov 2017, Prop. 3 and the D_inf bound).
    """
    orders = np.asarray(orders, dtype=float)
    return np.minimum(epsilon, orders * (epsilon * epsilon) / 2)  # epsilon**2 overflow raises


def epsilon_from_rdp(
    *, orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray, delta: float
) -> tuple[float, float]:
    """(epsilon, optimal order): the smallest epsilon the RDP curve certifies at ``delta``.

    Per order a > 1.01: eps = r + log1p(-1/a) - (log delta + log a)/(a - 1) (Canonne, Kamath,
    Steinke 2020, Prop. 12 in v4; Asoodeh et al. 2020, eq. 20); eps = 0 whenever
    delta >= sqrt(1 - e^{-r}) (Pinsker-type bound via the KL divergence, which is at most the RDP
    at any order a >= 1). Orders <= 1.01 are skipped as numerically unstable. This reproduces
    Google's dp_accounting (``compute_epsilon``) exactly.
    """
    best, best_order = math.inf, float(orders[0])
    for a, r in zip(orders, rdp, strict=True):
        if r <= 0 or delta**2 + math.expm1(-r) > 0:
            value = 0.0
        elif a > 1.01 and math.isfinite(r):
            value = r + math.log1p(-1 / a) - math.log(delta * a) / (a - 1)
        else:
            value = math.inf
        if value < best:
            best, best_order = value, float(a)
    return max(0.0, best), best_order


def delta_from_rdp(
    *, orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray, epsilon: float
) -> tuple[float, float]:
    """(delta, optimal order): the smallest delta the RDP curve certifies at ``epsilon``.

    Per order: log delta = min(0.5 log(1 - e^{-r}), (a - 1)(r - eps + log1p(-1/a)) - log a)
    (the inverse of :func:`epsilon_from_rdp`, same sources; the second bound only for a > 1.01).
    """
    best, best_order = math.inf, float(orders[0])
    for a, r in zip(orders, rdp, strict=True):
        if r <= 0:
            log_delta = -math.inf
        elif math.isinf(r):
            log_delta = 0.0
        else:
            log_delta = 0.5 * math.log(-math.expm1(-r))  # exp(-r) rounds to 1 for tiny r
            if a > 1.01:
                log_delta = min(
                    log_delta, (a - 1) * (r - epsilon + math.log1p(-1 / a)) - math.log(a)
                )
        if log_delta < best:
            best, best_order = log_delta, float(a)
    return min(math.exp(best), 1.0), best_order
