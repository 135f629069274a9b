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

from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.noise_range import gaussian_rdp, is_huge, is_noiseless

__all__ = [
    "delta_from_rdp",
    "epsilon_from_rdp",
    "exponential_mechanism_rdp",
    "laplace_rdp",
    "mixture_of_gaussians_rdp",
    "pure_dp_rdp",
    "randomized_response_rdp",
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


def _square_over(x: float, divisor: float) -> float:
    """x^2 / divisor without overflow (inf where the quotient exceeds the float range).

    An infinite error term makes the bracket uncertified, so the caller falls back to the
    magnitude sum and the convexity bound, both valid upper bounds.
    """
    ratio = x / math.sqrt(divisor)
    return ratio * ratio if ratio < 1e150 else math.inf


def _log_a_fractional_magnitudes(q: float, sigma: float, order: float) -> float:
    """An upper bound on log A_a for fractional a: the series of Mironov, Talwar, Zhang 2019
    (Sec. 3.3) with the magnitudes of its terms summed.

    A_a = sum_i C(a, i) [q^i (1-q)^{a-i} e^{(i^2-i)/(2 s^2)} erfc((i - z0)/(sqrt 2 s)) / 2
                         + q^{j} (1-q)^i e^{(j^2-j)/(2 s^2)} erfc((z0 - j)/(sqrt 2 s)) / 2],
    j = a - i,
    z0 = s^2 log(1/q - 1) + 1/2. For i > a the generalised coefficients alternate in sign; the
    magnitudes are summed (as Google's dp_accounting 0.6 does), which can only overestimate A_a.
    Terms are added in log space until both halves decrease and fall below e^{-30} of the
    running total; if that never happens the answer is inf (never silently a smaller number).
    Only the fallback of :func:`_log_a_fractional_bounds`.
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


# Certified evaluation of the fractional-order series (see _log_a_fractional_bounds).
_UNIT_ROUNDOFF = 2.0**-53
#: Absolute error allowed, in a log-space term, per unit of magnitude of its parts (about 9 ulp).
_LOG_PART_ERROR = 1e-15
#: Absolute error allowed in every log-space term for the special functions' own inaccuracy.
_LOG_FUNCTION_ERROR = 1e-13
#: Number J of Euler differences bracketing the alternating tail.
_EULER_DEPTH = 6
#: Terms beyond ceil(a) tried in turn until the bracket is tight.
_EXTRA_TERMS = (48, 512, 4096)
#: Relative width of the certified bracket on A_a - 1 that stops the search for more terms.
_CERTIFIED_GAP = 1e-10
#: Above this order the certified series (about a terms) is not attempted.
_MAX_CERTIFIED_ORDER = 4096.0
#: Relative width of the bracket on log A_a above which the magnitude-sum bound is also tried.
_FALLBACK_GAP = 1e-6
#: Absolute allowance for rounding added to the magnitude-sum bound on log A_a.
_MAGNITUDE_SLACK = 1e-13
#: Below this argument Phi is written through erfcx, which cancels the Gaussian exponent exactly.
_ERFCX_BELOW = 20.0


def _log_scaled_moment(
    power: np.ndarray, argument: np.ndarray, log_q: float, log_1mq: float, z0: float, sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    """log[(1-q)^a E[r^p; side]] - a log(1-q), and a bound on its absolute rounding error.

    Here r = e^{(Z - z0)/s^2}, Z ~ N(0, s^2), and ``argument`` y = (z0 - p)/s on the side
    Z < z0, (p - z0)/s on the side Z >= z0. Completing the square (Mironov, Talwar, Zhang 2019,
    Sec. 3.3) gives E[r^p; side] = e^{(p^2 - 2 p z0)/(2 s^2)} Phi(y), and since
    z0 = s^2 log(1/q - 1) + 1/2 the value is p (p - 2 z0)/(2 s^2) + log Phi(y). For y < 20 it is
    computed as -z0^2/(2 s^2) + log(erfcx(-y/sqrt 2)/2) (Phi(y) = erfcx(-y/sqrt 2) e^{-y^2/2}/2),
    free of the cancellation between the two parts.
    """
    s2 = sigma * sigma
    use_erfcx = argument < _ERFCX_BELOW
    value = np.empty_like(argument)
    size = np.empty_like(argument)
    y, p = argument[use_erfcx], power[use_erfcx]
    log_erfcx = np.log(special.erfcx(-y / math.sqrt(2)) / 2)
    value[use_erfcx] = -(z0 * z0) / (2 * s2) + log_erfcx
    # |d log erfcx(x) / dx| <= 2|x| + 2, and y is off by a few ulps of (|z0| + |p|) / s.
    size[use_erfcx] = (
        z0 * z0 / s2 + (np.abs(y) + 2) * (abs(z0) + np.abs(p)) / sigma + np.abs(log_erfcx)
    )
    y, p = argument[~use_erfcx], power[~use_erfcx]
    log_phi = special.log_ndtr(y)  # here y >= 20: Phi(y) ~ 1, insensitive to y
    value[~use_erfcx] = p * (p - 2 * z0) / (2 * s2) + log_phi
    size[~use_erfcx] = (p * p + 2 * np.abs(p) * abs(z0)) / s2 + np.abs(log_phi)
    # z0 = s^2 (log(1-q) - log q) + 1/2 is off by a few ulps of s^2 (|log q| + |log(1-q)|) +
    # |z0|, which the identity above turns into p/s^2 times that.
    size = size + np.abs(power) * (abs(log_q) + abs(log_1mq) + abs(z0) / s2) + 1
    return value, _LOG_PART_ERROR * size + _LOG_FUNCTION_ERROR


def _log_binomial_magnitude(orders: np.ndarray, i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log |C(a, i)| for non-integer a (rows) and integers i >= 0 (columns), with error bounds.

    For i < a all factors are positive: log Gamma(a+1) - log Gamma(i+1) - log Gamma(a-i+1).
    For i > a the reflection formula gives |C(a, i)| = Gamma(a+1) |sin(pi a)| Gamma(i-a)
    / (pi Gamma(i+1)) (Abramowitz & Stegun 6.1.17), which keeps the accuracy near integer a
    (sin(pi a) is taken at the exactly computed fractional part).
    """
    a = orders[:, None]
    frac = orders - np.floor(orders)
    log_sin = np.log(np.sin(math.pi * np.minimum(frac, 1 - frac)))[:, None]
    lg_a = special.gammaln(a + 1)
    lg_i = special.gammaln(i + 1.0)[None, :]
    above = i[None, :] > a
    lg_other = special.gammaln(np.where(above, i - a, a - i + 1))
    value = np.where(
        above, lg_a + log_sin - math.log(math.pi) + lg_other - lg_i, lg_a - lg_other - lg_i
    )
    size = np.abs(lg_a) + np.abs(lg_i) + np.abs(lg_other) + np.where(above, np.abs(log_sin) + 2, 0)
    return value, _LOG_PART_ERROR * size + _LOG_FUNCTION_ERROR


def _log_base_term(q: float, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log(1 - (1-q)^{a-1} (1 + (a-1) q)) and a bound on its absolute error.

    (1-q)^{a-1}(1 + (a-1) q) = (1-q)^a + a q (1-q)^{a-1} is the sum of the two first binomial
    weights; one minus it is ~ a(a-1) q^2 / 2. Writing b = a - 1, its log
    L = b log(1-q) + log(1 + b q) = -q^2 S, S = sum_{k>=2} q^{k-2} (b + (-1)^k b^k) / k (the
    Taylor series of both logarithms), is summed as a series when q max(1, b) <= 0.01 (the terms
    shrink 100-fold, so 24 terms leave < 1e-40 of the first) and in closed form otherwise; then
    1 - e^L = -expm1(L), whose log is 2 log q + log S + log(-expm1(L)/(-L)) in the series case
    (no underflow for tiny q).
    """
    b = orders - 1
    log_1mq = math.log1p(-q)
    value = b * log_1mq + np.log1p(b * q)
    error = 4 * _UNIT_ROUNDOFF * (np.abs(b * log_1mq) + np.abs(np.log1p(b * q)))
    magnitude = -np.expm1(value)
    out = np.log(np.where(magnitude > 0, magnitude, 1.0))
    relative = (error + 2 * _UNIT_ROUNDOFF * magnitude) / np.where(magnitude > 0, magnitude, 1.0)
    small = q * np.maximum(1, b) <= 0.01
    if np.any(small):
        bs = b[small]
        k = np.arange(2, 26, dtype=float)[:, None]
        terms = q ** (k - 2) * (bs + (-1) ** k * bs**k) / k
        series = np.sum(terms, axis=0)
        negative_l = q * q * series
        ratio = np.where(
            negative_l > 0, -np.expm1(-negative_l) / np.where(negative_l > 0, negative_l, 1.0), 1.0
        )
        out[small] = 2 * math.log(q) + np.log(series) + np.log(ratio)
        relative[small] = 16 * _UNIT_ROUNDOFF * np.sum(np.abs(terms), axis=0) / series
    return out, relative + 2 * _UNIT_ROUNDOFF * np.abs(out)


def _fractional_bounds_once(
    q: float, sigma: float, orders: np.ndarray, extra: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One pass of :func:`_log_a_fractional_bounds` with ceil(max a) + ``extra`` terms.

    Returns (log scale m, lower, upper, truncation width), the last three for A_a - 1 in units
    of e^m.
    """
    log_q, log_1mq = math.log(q), math.log1p(-q)
    s2 = sigma * sigma
    z0 = s2 * (log_1mq - log_q) + 0.5
    first = np.ceil(orders)  # i0: the first index whose coefficient sign alternates
    count = int(first.max()) + extra + _EULER_DEPTH + 1
    i = np.arange(count, dtype=float)
    a = orders[:, None]
    a_log_1mq = a * log_1mq

    # Side Z < z0, indices i >= 2: power i, Phi((z0 - i)/s) (the same for every order).
    low_value, low_error = _log_scaled_moment(i, (z0 - i) / sigma, log_q, log_1mq, z0, sigma)
    # Side Z >= z0, indices i >= 0: power a - i, Phi((a - i - z0)/s).
    power = a - i[None, :]
    high_value, high_error = _log_scaled_moment(
        power.ravel(), ((power - z0) / sigma).ravel(), log_q, log_1mq, z0, sigma
    )
    # Adding a log(1-q) errs by a few ulps of its magnitude.
    shift_error = _LOG_PART_ERROR * np.abs(a_log_1mq)
    high_value = high_value.reshape(power.shape) + a_log_1mq
    high_error = high_error.reshape(power.shape) + shift_error
    low_value = low_value[None, :] + a_log_1mq
    low_error = low_error[None, :] + shift_error
    log_coef, coef_error = _log_binomial_magnitude(orders, i)

    # t_i = |C(a, i)| (1-q)^a (E[r^i; Z < z0] + E[r^{a-i}; Z >= z0]) for i >= 2.
    log_t = log_coef + np.logaddexp(low_value, high_value)
    # A sum of two positive numbers errs relatively by at most the weighted mean of their errors.
    weight = special.expit(high_value - low_value)
    mixed = (1 - weight) * np.expm1(low_error) + weight * np.expm1(high_error)
    t_error = coef_error + mixed + 2 * _UNIT_ROUNDOFF
    log_t = log_t[:, 2:]
    t_error = t_error[:, 2:]

    # First-order part: e^L - 1 (from side Z < z0, i = 0, 1, over the whole line) minus the
    # Z >= z0 part of (1-q)^a (1 + a r), plus (1-q)^a (r^a + a r^{a-1}) on Z >= z0.
    log_base, base_error = _log_base_term(q, orders)
    log_a = np.log(orders)
    phi0 = float(special.log_ndtr(-z0 / sigma))
    phi1 = float(special.log_ndtr((1 - z0) / sigma))
    q0 = orders * log_1mq + phi0
    q1 = log_a + (orders - 1) * log_1mq + log_q + phi1
    # Parts: a log(1-q), log a, log q, log Phi; the rounding of z0 moves Phi's argument by
    # ~ (|z0| + 1) ulps, so log Phi by ~ (|z0| + 1)^2 / s^2 ulps.
    edge_size = orders * abs(log_1mq) + np.abs(log_a) + abs(log_q) + _square_over(abs(z0) + 1, s2)
    q0_error = _LOG_PART_ERROR * (edge_size + abs(phi0)) + _LOG_FUNCTION_ERROR
    q1_error = _LOG_PART_ERROR * (edge_size + abs(phi1)) + _LOG_FUNCTION_ERROR
    n0, n1 = high_value[:, 0], log_a + high_value[:, 1]
    pieces = np.stack([log_base, q0, q1, n0, n1], axis=1)
    piece_signs = np.array([-1.0, -1.0, -1.0, 1.0, 1.0])
    piece_error = np.stack(
        [base_error, q0_error, q1_error, high_error[:, 0], high_error[:, 1]], axis=1
    )

    scale = np.maximum(pieces.max(axis=1), log_t.max(axis=1))
    with np.errstate(under="ignore"):
        piece_values = np.exp(pieces - scale[:, None])
        t = np.exp(log_t - scale[:, None])
    # exp(x) with |error in x| <= e has relative error <= e^e - 1, plus an ulp.
    piece_slack = piece_values * (np.expm1(piece_error) + 2 * _UNIT_ROUNDOFF)
    t_slack = t * (np.expm1(t_error) + 2 * _UNIT_ROUNDOFF)
    base = piece_values @ piece_signs

    index = np.arange(2, count)
    signs = np.where(
        index[None, :] < first[:, None], 1.0, 1 - 2 * ((index[None, :] - first[:, None]) % 2)
    )
    # head[n] = sum_{2 <= i < n} of the signed terms, for the truncation points n = 2 .. count-1.
    zeros = np.zeros((len(orders), 1))
    head = np.concatenate([zeros, np.cumsum(signs * t, axis=1)], axis=1)[:, :-1]
    absolute = np.concatenate([zeros, np.cumsum(t, axis=1)], axis=1)[:, :-1]
    slack = np.concatenate([zeros, np.cumsum(t_slack, axis=1)], axis=1)[:, :-1]
    # Recursive summation of n numbers errs by at most n u (sum of magnitudes) (Higham 2002,
    # eq. 4.4); doubled for the cumulative sums and the final additions.
    sum_slack = (
        2 * (count + 8) * _UNIT_ROUNDOFF * (absolute + np.abs(piece_values).sum(axis=1)[:, None])
    )
    fixed = base[:, None] + head
    fixed_slack = piece_slack.sum(axis=1)[:, None] + slack + sum_slack

    # Euler bracket on the alternating tail sum_{k>=0} (-1)^k t_{n+k} (n >= i0): with
    # d_j = (-Delta)^j t_n >= 0 (t is completely monotone), the tail lies in
    # [sum_{j<J} d_j / 2^{j+1}, that + d_J / 2^J].
    width = t.shape[1] - _EULER_DEPTH
    differences = [t]
    for _ in range(_EULER_DEPTH):
        differences.append(differences[-1][:, :-1] - differences[-1][:, 1:])
    cut = [d[:, :width] for d in differences]
    lower_tail = sum(cut[j] / 2 ** (j + 1) for j in range(_EULER_DEPTH))
    upper_tail = np.minimum(lower_tail + np.maximum(cut[-1], 0) / 2**_EULER_DEPTH, t[:, :width])
    lower_tail = np.maximum(lower_tail, 0)
    local_error = np.max(
        np.stack([t_error[:, k : k + width] for k in range(_EULER_DEPTH + 1)]), axis=0
    )
    tail_slack = (
        (_EULER_DEPTH + 2)
        * (np.expm1(local_error) + 2 ** (_EULER_DEPTH + 3) * _UNIT_ROUNDOFF)
        * t[:, :width]
    )
    tail_signs = signs[:, :width]
    high_tail = np.where(tail_signs > 0, upper_tail, -lower_tail)
    low_tail = np.where(tail_signs > 0, lower_tail, -upper_tail)
    valid = index[None, :width] >= first[:, None]
    total_slack = fixed_slack[:, :width] + tail_slack
    upper = np.where(valid, fixed[:, :width] + high_tail + total_slack, np.inf).min(axis=1)
    lower = np.where(valid, fixed[:, :width] + low_tail - total_slack, -np.inf).max(axis=1)
    truncation = np.where(valid, upper_tail - lower_tail, np.inf).min(axis=1)
    return scale, lower, upper, truncation


def _log_a_fractional_bounds(
    q: float, sigma: float, orders: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Certified (lower, upper) bounds on log A_a for non-integer orders a > 1, 0 < q < 1.

    A_a = E_{Z ~ N(0, s^2)}[(1 - q + q e^{(2Z - 1)/(2 s^2)})^a] (Mironov, Talwar, Zhang 2019,
    Sec. 3). With z0 = s^2 log(1/q - 1) + 1/2 and r = e^{(Z - z0)/s^2} the integrand is
    (1-q)^a (1 + r)^a, expanded as sum_i C(a, i) r^i on Z < z0 and sum_i C(a, i) r^{a-i} on
    Z >= z0; integrating term by term gives the two-sided series of that paper (Sec. 3.3). Here
    the series is summed *with its signs*:

    * A_a - 1 is formed directly: the i = 0, 1 terms are combined with the -1 in closed form
      (:func:`_log_base_term`), so that A_a - 1 ~ a(a-1) q^2 / 2 keeps its relative accuracy;
    * for i >= ceil(a) the coefficients alternate in sign and the magnitudes
      t_i = |C(a,i)| (1-q)^a (E[r^i; Z<z0] + E[r^{a-i}; Z>=z0]) form a completely monotone
      sequence: |C(a, i)| = (|sin pi a| / pi) int_0^1 s^i s^{-a-1} (1-s)^a ds for i > a (the
      Beta integral of Gamma(i-a)/Gamma(i+1)) and the expectations are moments of r < 1 and of
      1/r <= 1, and products and sums of moment sequences are moment sequences (Hausdorff).
      The tail sum_{k>=0} (-1)^k t_{n+k} = sum_j (-Delta)^j t_n / 2^{j+1} (Euler's transform,
      every term >= 0 and non-increasing in j) then lies in [S_J, S_J + (-Delta)^J t_n / 2^J],
      S_J the first J terms of the transform;
    * every term carries a bound on its floating-point error (parts of the log-space terms
      9 ulp per unit of magnitude, 1e-13 for the special functions, Higham's bound for the
      sums), added to the upper and subtracted from the lower bound.

    The best truncation point is taken, with ceil(a) + 48, + 512, then + 4096 terms until the
    bracket on A_a - 1 is within a relative 1e-10. Returns (lower, upper) arrays; where the
    bracket fails to be positive (or a > 4096) lower is -inf and upper is inf.
    """
    if not 0 < q < 1:
        raise InvalidParameterError("sampling_probability", "in (0, 1)", q)
    if not 0 < sigma < math.inf:
        raise InvalidParameterError("noise_multiplier", "finite and > 0", sigma)
    orders = np.asarray(orders, dtype=float)
    for order in orders:
        if not (1 < order < math.inf) or float(order).is_integer():
            raise InvalidParameterError("orders", "to be non-integers > 1", float(order))
    count = len(orders)
    lower = np.full(count, -np.inf)
    upper = np.full(count, np.inf)
    todo = np.flatnonzero(orders <= _MAX_CERTIFIED_ORDER)
    for extra in _EXTRA_TERMS:
        if len(todo) == 0:
            break
        # Extreme sigma can overflow a term (then inf or nan): such an order is left uncertified.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            scale, low, high, truncation = _fractional_bounds_once(q, sigma, orders[todo], extra)
            good = np.isfinite(scale) & np.isfinite(high) & (high > 0)
            log_high = np.where(good, scale + np.log(np.where(good, high, 1.0)), np.inf)
            positive = good & np.isfinite(low) & (low > 0)
            log_low = np.where(positive, scale + np.log(np.where(positive, low, 1.0)), -np.inf)
            # log1p and the last additions round by a few ulps: widen by a relative 1e-14. But
            # log A_a = log1p(A_a - 1) <= A_a - 1, used below e^-700 where log1p would round
            # to (near) 0; the smallest subnormal keeps it a bound after underflow.
            tiny = log_high < -700
            high_log_a = np.where(
                tiny,
                np.exp(log_high) * (1 + 1e-10) + 5e-324,
                np.logaddexp(0.0, log_high) * (1 + 1e-14),
            )
        upper[todo] = np.minimum(upper[todo], high_log_a)
        lower[todo] = np.maximum(lower[todo], np.logaddexp(0.0, log_low))
        done = good & (truncation <= _CERTIFIED_GAP * high)
        todo = todo[~done]
    return lower * (1 - 1e-14), upper


def _log_a_fractional(q: float, sigma: float, order: float) -> float:
    """A certified upper bound on log A_a for a fractional order a (see
    :func:`_log_a_fractional_bounds`), at most the magnitude-sum bound
    :func:`_log_a_fractional_magnitudes` (taken as well where the bracket is not tight).
    """
    return float(_log_a_fractional_many(q, sigma, np.array([float(order)]))[0])


def _log_a_convexity_bound(q: float, sigma: float, order: float) -> float:
    """log((1 - q) + q e^{a(a-1)/(2 s^2)}), an upper bound on log A_a for every order a > 1.

    x -> x^a is convex, so ((1-q) + q L)^a <= (1-q) + q L^a pointwise (L the likelihood ratio
    of N(1, s^2) to N(0, s^2)), and E_{N(0, s^2)}[L^a] = e^{a(a-1)/(2 s^2)} (Mironov 2017,
    Prop. 7): the sampled mechanism is at most a q-mixture of the unsampled one's moment.
    """
    exponent = order * (order - 1) / (2 * sigma) / sigma
    if exponent < 700:
        value = math.log1p(q * math.expm1(exponent))
    else:
        value = math.log(q) + exponent + math.log1p(math.exp(-exponent) * (1 - q) / q)
    return value * (1 + 16 * _UNIT_ROUNDOFF)


def _log_a_fractional_many(q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """:func:`_log_a_fractional` for an array of fractional orders at once."""
    lower, upper = _log_a_fractional_bounds(q, sigma, orders)
    loose = ~(np.isfinite(upper) & (upper - np.maximum(lower, 0) <= _FALLBACK_GAP * upper))
    for index in np.flatnonzero(loose):
        order = float(orders[index])
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            magnitudes = _log_a_fractional_magnitudes(q, sigma, order)
        # Its log-space sum of up to 1000 terms is only good to ~1e-13 of A_a: widen by that
        # (a sum 1 + O(q^2) that rounds to 1 is not a bound on anything).
        magnitudes = magnitudes * (1 + 1e-12) + _MAGNITUDE_SLACK
        candidates = [upper[index], magnitudes, _log_a_convexity_bound(q, sigma, order)]
        upper[index] = min(value for value in candidates if not math.isnan(value))
    return upper


def subsampled_gaussian_rdp(
    *, sampling_probability: float, noise_multiplier: float, orders: np.ndarray
) -> np.ndarray:
    """RDP of the Poisson-subsampled Gaussian mechanism at each order (add/remove-one).

    RDP(a) = log(A_a) / (a - 1) (Mironov, Talwar, Zhang 2019, Thm 4 / Sec. 3.3); q = 1 is the
    Gaussian's a / (2 sigma^2) (Mironov 2017, Prop. 7); q = 0 gives 0; sigma = 0 gives inf.
    Integer orders use the exact binomial sum (:func:`_log_a_integer`); fractional orders a
    certified upper bound, within ~1e-9 of the exact value for usual parameters
    (:func:`_log_a_fractional_bounds`).
    Outside the float range of sigma, see :mod:`dpcore.mechanisms.noise_range`.
    """
    q, sigma = sampling_probability, noise_multiplier
    out = np.empty(len(orders))
    fractional = []
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
            fractional.append(index)
    if fractional:  # all fractional orders at once (the certified series is vectorised)
        chosen = np.asarray(orders, dtype=float)[fractional]
        with np.errstate(over="ignore"):  # beyond the float range the RDP is inf
            values = _log_a_fractional_many(q, sigma, chosen) / (chosen - 1)
        # An upper bound that underflows to 0 is dropped (inf) rather than allowed to certify
        # epsilon = 0.
        out[fractional] = np.where(values > 0, values, math.inf)
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


# ----------------------------------------------------------------- randomized response, exponential
# mechanism, mixture of Gaussians


def _log_expm1(x: float) -> float:
    """log(e^x - 1) for x >= 0, without overflow (-inf at x = 0)."""
    if x == 0:
        return -math.inf
    return x + math.log(-math.expm1(-x))


def randomized_response_rdp(
    *, noise_parameter: float, num_buckets: int, orders: np.ndarray
) -> np.ndarray:
    """Exact RDP of k-ary randomized response with noise parameter p at each order.

    Input a is reported as a with probability hi = 1 - p + p/k and as any other value with
    lo = p/k. The worst pair of inputs is two different values a, b (every pair is such a pair,
    and it is symmetric), so by the definition of the Rényi divergence of discrete distributions
    (Mironov 2017, Def. 3), with r = hi / lo = e^eps, eps = log(1 + k (1 - p) / p):

        e^{(a-1) D_a} = hi^a lo^{1-a} + lo^a hi^{1-a} + (k - 2) lo = lo (r^a + r^{1-a} + k - 2).

    Since lo (r + k - 1) = 1, the excess over 1 is lo expm1((a-1) eps) expm1(a eps)
    e^{-(a-1) eps}, a product of positive factors, so the RDP log1p(excess) / (a - 1) keeps its
    relative precision when p is close to 1. inf at p = 0, 0 at p = 1, eps at order inf.
    """
    p, k = float(noise_parameter), int(num_buckets)
    orders = np.asarray(orders, dtype=float)
    if p == 0:
        return np.full(orders.shape, math.inf)
    if p == 1:
        return np.zeros(orders.shape)
    with np.errstate(over="ignore"):
        epsilon = math.log1p(float(np.float64(k) * np.float64(1.0 - p) / np.float64(p)))
    log_low = math.log(p) - math.log(k)
    out = np.empty(orders.shape)
    for index, order in enumerate(orders):
        a = float(order)
        if math.isinf(a) or math.isinf(epsilon):
            out[index] = epsilon
            continue
        shift = (a - 1) * epsilon
        log_excess = log_low + _log_expm1(shift) + _log_expm1(a * epsilon) - shift
        out[index] = float(np.logaddexp(0.0, log_excess)) / (a - 1)
    return out


def exponential_mechanism_rdp(*, epsilon: float, orders: np.ndarray) -> np.ndarray:
    """RDP of the exponential mechanism at epsilon: min(epsilon, a eps^2 / 2, a eps^2 / 8).

    The mechanism is epsilon-bounded-range (Durfee & Rogers 2019, Def. 3.1 and Lemma 3.2), and
    epsilon-bounded-range implies (epsilon^2 / 8)-zCDP, i.e. RDP a eps^2 / 8 at every order a
    (Cesar & Rogers 2021, "Bounding, Concentrating, and Truncating", ALT 2021, arXiv
    2004.07223, Lemmas 3.2 and 3.4; proved via Hoeffding's lemma in Steinke's note "The
    Exponential Mechanism is Bounded Range", differentialprivacy.org, Thm 5 and Cor. 7). As it
    is also epsilon-DP, the pure-DP bound :func:`pure_dp_rdp` holds too; the minimum of valid
    bounds is valid. epsilon = 0 gives 0 at every order (the output ignores the data).
    """
    orders = np.asarray(orders, dtype=float)
    if epsilon == 0:
        return np.zeros(orders.shape)
    bounded_range = orders * (epsilon * epsilon) / 8
    return np.asarray(np.minimum(pure_dp_rdp(epsilon=epsilon, orders=orders), bounded_range))


#: Largest number of multinomial terms summed for one integer order of a Gaussian mixture.
_MIXTURE_TERMS = 2**17


def _compositions(total: int, parts: int) -> np.ndarray:
    """Every (k_1, ..., k_parts) of integers >= 0 with sum ``total``, one per row."""
    rows = np.zeros((1, 0), dtype=np.int64)
    remaining = np.array([total], dtype=np.int64)
    for _ in range(parts - 1):
        counts = remaining + 1
        parent = np.repeat(np.arange(rows.shape[0]), counts)
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        chosen = np.arange(int(counts.sum()), dtype=np.int64) - starts
        rows = np.column_stack([rows[parent], chosen])
        remaining = remaining[parent] - chosen
    return np.column_stack([rows, remaining])


def _log_mixture_moment(log_p: np.ndarray, b: np.ndarray, order: int) -> float | None:
    """log E_{N(0,1)}[L^order], L(x) = sum_i p_i e^{b_i x - b_i^2/2}, or None if too many terms.

    Expanding the power (multinomial theorem) and using E[e^{s x}] = e^{s^2/2}:

        E[L^n] = sum_{|k| = n} (n; k) prod_i p_i^{k_i} exp((s_k^2 - sum_i k_i b_i^2) / 2),
        s_k = sum_i k_i b_i,

    the m = 2 case being the binomial expansion of Mironov, Talwar, Zhang 2019, Sec. 3.3. The
    exponents are >= 0 (k_i^2 >= k_i for integers) and the weights sum to 1, so E[L^n] - 1 is the
    sum of weight x expm1(exponent), summed in logs and added to 1 with log1p, as in
    :func:`_log_a_integer`.
    """
    parts = b.size
    if math.comb(order + parts - 1, parts - 1) > _MIXTURE_TERMS:
        return None
    k = _compositions(order, parts).astype(float)
    log_weights = special.gammaln(order + 1.0) - special.gammaln(k + 1.0).sum(axis=1) + k @ log_p
    shift = k @ b
    exponent = np.maximum((shift * shift - k @ (b * b)) / 2, 0.0)
    positive = exponent > 0
    if not np.any(positive):
        return 0.0
    e = exponent[positive]
    log_expm1 = e + np.log(-np.expm1(-e))
    log_excess = float(special.logsumexp(log_weights[positive] + log_expm1))
    return float(np.logaddexp(0.0, log_excess))


def _log_jensen_moment(log_p: np.ndarray, b: np.ndarray, order: float) -> float:
    """log sum_i p_i e^{a (a-1) b_i^2 / 2}: bounds a Gaussian mixture's Rényi moment both ways.

    x -> x^a and x -> x^{1-a} are convex for a > 1, so by Jensen's inequality
    E_{N0}[(sum_i p_i L_i)^a] and E_{N0}[(sum_i p_i L_i)^{1-a}] are at most
    sum_i p_i e^{(a-1) D_a(N_i || N0)} resp. sum_i p_i e^{(a-1) D_a(N0 || N_i)}, and both
    divergences are a b_i^2 / 2 (Mironov 2017, Prop. 7). Valid at every real order a > 1.
    """
    return float(special.logsumexp(log_p + order * (order - 1) * b * b / 2))


def _log_sampled_moment(q: float, shift: float, order: int) -> float:
    """log A_order of the sampled Gaussian: shift b, noise 1, rate q (q = 1: not sampled)."""
    if q >= 1:
        return order * (order - 1) * shift * shift / 2
    return _log_a_integer(q, 1.0 / shift, order)


#: Values of gamma tried by the allocation bound of :func:`_log_mixture_reverse`.
_ALLOCATION_GAMMAS = np.linspace(-4.0, 16.0, 21)


def _log_mixture_reverse(p: np.ndarray, b: np.ndarray, order: int, enough: float) -> float:
    """An upper bound on log E_{N0}[(N0 / mix)^{order-1}] = (order - 1) D_order(N0 || mix).

    The smallest of three valid bounds (noise 1, shifts b_i, weights p_i, p_0 on shift 0):

    1. Jensen (:func:`_log_jensen_moment`).
    2. Allocation: write mix = sum_i pi_i [(1 - q_i) N0 + q_i N_i] over the nonzero shifts,
       giving shift i the part t_i of p_0 (pi_i = p_i + t_i p_0, q_i = p_i / pi_i). Since
       Q -> E_{N0}[(N0 / Q)^{a-1}] is convex (x^{1-a} is convex for a > 1), the moment is at
       most sum_i pi_i B_a(q_i, b_i) <= sum_i pi_i A_a(q_i, b_i), where B_a <= A_a for the
       sampled Gaussian (Mironov, Talwar, Zhang 2019, Sec. 3; the fact that makes the
       add/remove RDP of Poisson sampling its forward divergence). Every allocation is valid;
       t_i proportional to p_i e^{-gamma b_i^2} is tried for 21 values of gamma.
    3. AM-GM: sum_{i>0} p_i e^{b_i x - b_i^2/2} >= P e^{-V/2} e^{m x - m^2/2} (weighted AM-GM,
       P = sum_{i>0} p_i, m and V the mean and variance of b under the weights p_i / P), so
       mix / N0 >= s [(1 - q) + q e^{m x - m^2/2}] with s = p_0 + P e^{-V/2}, q = P e^{-V/2} / s;
       x^{1-a} is decreasing, so the moment is at most s^{-(a-1)} B_a(q, m) <=
       s^{-(a-1)} A_a(q, m).

    Bounds 1 and 3 are computed first; bound 2 only if both exceed ``enough`` (the forward
    moment, which the caller takes the maximum with anyway). With at most one nonzero shift,
    bounds 2 and 3 are exactly A_a(q, b): the reverse direction never exceeds the forward one.
    """
    a = float(order)
    zero = b == 0
    p_zero = float(p[zero].sum())
    weights, shifts = p[~zero], b[~zero]
    best = _log_jensen_moment(np.log(p), b, a)
    total = float(weights.sum())
    mean = float(weights @ shifts) / total
    variance = max(float(weights @ (shifts * shifts)) / total - mean * mean, 0.0)
    log_kept = math.log(total) - variance / 2
    log_scale = float(np.logaddexp(math.log(p_zero), log_kept)) if p_zero > 0 else log_kept
    q = min(1.0, math.exp(log_kept - log_scale))
    if mean > 0:
        best = min(best, -(a - 1) * log_scale + _log_sampled_moment(q, mean, order))
    if best <= enough or p_zero == 0:
        return best
    log_weights = np.log(weights)
    for gamma in _ALLOCATION_GAMMAS:
        log_share = log_weights - gamma * shifts * shifts
        share = np.exp(log_share - special.logsumexp(log_share))
        parts = weights + share * p_zero
        rates = np.minimum(weights / parts, 1.0)
        terms = [
            math.log(part) + _log_sampled_moment(rate, shift, order)
            for part, rate, shift in zip(parts, rates, shifts, strict=True)
        ]
        best = min(best, float(special.logsumexp(terms)))
    return best


def mixture_of_gaussians_rdp(
    *,
    noise_multiplier: float,
    sensitivities: Sequence[float],
    probabilities: Sequence[float],
    orders: np.ndarray,
) -> np.ndarray:
    """RDP of the mixture-of-Gaussians mechanism under add/remove, at each order.

    The pair is mix = sum_i p_i N(c_i, s^2) and N0 = N(0, s^2) (Choquette-Choo et al. 2023,
    arXiv 2310.15526, Sec. 4), in both directions: RDP(a) = max(D_a(mix || N0), D_a(N0 || mix)).

    * Integer a: D_a(mix || N0) exactly, by the multinomial expansion of
      :func:`_log_mixture_moment` (at most 2^17 terms; above that the Jensen bound of
      :func:`_log_jensen_moment`); D_a(N0 || mix) by the upper bounds of
      :func:`_log_mixture_reverse`, exact when at most one sensitivity is nonzero (then the
      reverse never exceeds the forward divergence). With several nonzero sensitivities the
      reverse bound can exceed the exact forward divergence at small orders (by a few percent
      in the cases tested), making the answer conservative there, never too small.
    * Fractional a: the value at ceil(a), valid because D_a is non-decreasing in a (van Erven &
      Harremoës 2014, Thm 3), or the Jensen bound at a itself, whichever is smaller.
    * Order inf: inf (a Gaussian shift has unbounded privacy loss), unless every c_i with
      p_i > 0 is 0 (then the two distributions are equal: 0 at every order).

    Identical sensitivities are merged; with one nonzero sensitivity c (mass q) the mechanism
    is the Poisson-sampled Gaussian with noise multiplier s / c, and
    :func:`subsampled_gaussian_rdp` is returned. No noise (s = 0, or s / max c_i below the
    float range, see :mod:`dpcore.mechanisms.noise_range`) gives inf; s / max c_i above 1e150
    gives the Gaussian's a max(c)^2 / (2 s^2) (Mironov 2017, Prop. 7), which bounds the
    mixture's RDP.
    Inputs are assumed valid (:class:`~dpcore.events.MixtureOfGaussiansEvent` checks them).
    """
    orders = np.asarray(orders, dtype=float)
    merged: dict[float, float] = {}
    for shift, weight in zip(sensitivities, probabilities, strict=True):
        if weight > 0:
            merged[float(shift)] = merged.get(float(shift), 0.0) + float(weight)
    largest = max(merged)
    if largest == 0:
        return np.zeros(orders.shape)
    sigma = float(noise_multiplier) / largest  # the noise relative to the largest shift
    if is_noiseless(sigma):
        return np.full(orders.shape, math.inf)
    if is_huge(sigma):
        return np.array([gaussian_rdp(float(order), sigma) for order in orders])
    if len(merged) - (0.0 in merged) == 1:
        # One nonzero shift c with mass q: the Poisson-sampled Gaussian with noise s / c, whose
        # RDP (both directions, fractional orders included) is subsampled_gaussian_rdp's.
        return subsampled_gaussian_rdp(
            sampling_probability=min(1.0, merged[largest] / sum(merged.values())),
            noise_multiplier=sigma,
            orders=orders,
        )
    shifts = np.array(sorted(merged))
    b = shifts / float(noise_multiplier)
    p = np.array([merged[shift] for shift in shifts])
    p = p / p.sum()  # the event allows the weights to sum to 1 within 1e-9
    log_p = np.log(p)
    cache: dict[int, float] = {}

    def at_integer(order: int) -> float:
        if order not in cache:
            forward = _log_mixture_moment(log_p, b, order)
            if forward is None:
                forward = _log_jensen_moment(log_p, b, float(order))
            reverse = _log_mixture_reverse(p, b, order, forward)
            cache[order] = max(forward, reverse) / (order - 1)
        return cache[order]

    out = np.empty(orders.shape)
    for index, order in enumerate(orders):
        a = float(order)
        if math.isinf(a):
            out[index] = math.inf
            continue
        upper = max(2, math.ceil(a))
        jensen = _log_jensen_moment(log_p, b, a) / (a - 1)
        out[index] = min(jensen, at_integer(upper))
    return out
