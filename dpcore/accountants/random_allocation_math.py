"""Rényi DP of one epoch of the Gaussian mechanism under random allocation ("balls in bins").

In one epoch every record is assigned to exactly one of T steps, uniformly and independently,
and each step releases the sum of its records' contributions (L2 norm <= 1) plus
``N(0, sigma^2 I)``. For adaptive queries and add/remove-one neighbours the epoch is dominated
by the pair

    P = (1/T) sum_t N(e_t, sigma^2 I_T),    Q = N(0, sigma^2 I_T)

(remove direction: D_a(P || Q); add direction: D_a(Q || P)), with e_t the t-th basis vector:
Chua, Ghazi, Harrison, Leeman, Kamath, Kumar, Manurangsi, Sinha, Zhang, "Balls-and-Bins Sampling
for DP-SGD", AISTATS 2025, arXiv 2412.16802 (their tightly dominating pair (P_B, Q_B) of the
adaptive batch linear query mechanism ABLQ_B; the same pair defines the ``BnBAccountant`` of
their code, google-research ``dpsgd_batch_sampler_accounting/balls_and_bins.py``), and Feldman &
Shenfeld, "Privacy Amplification by Random Allocation", arXiv 2502.08202, the case k = 1 of
their k-out-of-T allocation with the Gaussian mechanism. Both analyse add/remove neighbours
only; under replace-one neighbours the pair is not known to dominate, and callers must refuse
that relation.

Writing x_t = sigma Z_t (Z_t iid standard normal under Q), s = 1/sigma and

    Y_t = exp(s Z_t - s^2 / 2)  (lognormal, E Y_t = 1),    S = (1/T) sum_t Y_t = dP/dQ,

the two directions are, for an order a > 1 and b = a - 1,

    remove: D_a(P || Q) = log E[S^a] / (a - 1),     add: D_a(Q || P) = log E[S^{-b}] / b.

* Remove direction, integer a (exact; :func:`random_allocation_remove_rdp`). Expanding S^a
  multinomially and using E exp(k s Z - k s^2/2) = exp(k(k-1)/(2 sigma^2)),

      E[S^a] = T^{-a} sum_{k_1 + ... + k_T = a} (a; k_1..k_T) prod_t c(k_t),
      c(k) = exp(k (k - 1) / (2 sigma^2)),

  which is Feldman & Shenfeld's exact remove-direction formula for the Gaussian (grouped there
  by the integer partitions lambda of a with at most T parts, each met by
  T! / ((T - l)! prod_j m_j!) assignments to coordinates, l the number of parts, m_j the
  multiplicities). The number of partitions explodes (about 10^31 at a = 1024), so we use the
  equivalent exponential generating function instead: E[S^a] = a! [z^a] f(z / T)^T with
  f(z) = sum_k c(k) z^k / k! (the EGF of a sum over compositions of products is the product of
  the EGFs), and f(z/T)^T truncated at degree N is computed by repeated squaring with every
  coefficient kept as a logarithm: O(N^2 log T) operations. All terms are positive, so there
  is no cancellation; a rounding allowance (below) is added. Fractional orders use the next
  integer above: RDP is non-decreasing in the order (van Erven & Harremoës 2014, Thm 3). Above
  order
  :data:`EXACT_ORDER_CAP` the bound a / (2 sigma^2) is used: S^a <= (1/T) sum_t Y_t^a by
  convexity of y -> y^a, and E[Y^a] = exp(a (a - 1) / (2 sigma^2)).

* Add direction (certified upper bound; :func:`random_allocation_add_rdp`). Two bounds, the
  smaller is used:

  (i) closed form, for every real a > 1: by AM-GM, S >= exp(s Zbar - s^2/2) with
      Zbar = (1/T) sum_t Z_t ~ N(0, 1/T), so E[S^{-b}] <= exp(b s^2/2 + b^2 s^2 / (2T)) and

          D_a(Q || P) <= 1 / (2 sigma^2) + (a - 1) / (2 T sigma^2).

      (This is the privacy loss of the Gaussian mechanism with noise sigma sqrt(T) shifted by
      (1 - 1/T)/(2 sigma^2), the add-direction "direct" bound of Feldman & Shenfeld.)

  (ii) numerical, integer a <= :data:`ADD_ORDER_CAP` (our derivation, step by step):

      1. Gamma identity: for S > 0, S^{-b} = (1/Gamma(b)) int_0^inf u^{b-1} e^{-u S} du, so
         by Tonelli and independence
             E[S^{-b}] = (1/Gamma(b)) int_0^inf u^{b-1} L(u/T)^T du,   L(v) = E[e^{-v Y}].
      2. Write L(u/T)^T = e^{-u} G(u), G(u) = (e^v L(v))^T with v = u/T, so that
         E[S^{-b}] = int_0^inf gamma_b(u) G(u) du with gamma_b the Gamma(b, 1) density.
         G >= 1 by Jensen (L(v) >= e^{-v E Y}); G is non-decreasing, since
         d/dv log(e^v L(v)) = 1 - E[Y e^{-vY}] / E[e^{-vY}] >= 0 (Y and e^{-vY} are negatively
         correlated: Chebyshev's association inequality); and log G is convex, since log L is
         convex (a Laplace transform is log-convex by Hölder's inequality).
      3. Upper bounds of G on a geometric grid u_0 < ... < u_n (64 points per octave,
         2^-20 .. 2^15) come from the trapezoidal rule on the Gaussian integral over z, with
         the error bound of Trefethen & Weideman, "The exponentially convergent trapezoidal
         rule", SIAM Review 56(3), 2014, Thm 5.1: for w analytic in the strip |Im z| < A,
         decaying uniformly there, with int |w(x + iy)| dx <= M for |y| < A, the infinite
         trapezoidal sum with step h is within 2 M / (e^{2 pi A / h} - 1) of the integral.
         We take A = min(pi / (3 s), 3) and h = 2 pi A / 80. On the strip,
         |phi(x + iy)| = phi(x) e^{y^2/2} and Y(x + iy) = Y(x) e^{i s y} with cos(s y) >= 1/2.
           - For v < 1 we integrate rho(v) = e^v L(v) - 1 = E[H(v (Y - 1))] with
             H(x) = e^{-x} - 1 + x >= 0 (as E Y = 1), which keeps the relative accuracy of
             the small quantity rho. Since H(w) = w^2 int_0^1 (1 - t) e^{-t w} dt,
             |H(w)| <= |w|^2/2 max(1, e^{-Re w}) <= v^2 (Y + 1)^2 e^v / 2 on the strip
             (Re w >= -v), so M = e^{A^2/2 + v} (v^2/2) (e^{s^2} + 3). Omitted nodes:
             left of the grid H <= H(-v) and the node sum is at most Phi(z_first) H(-v); right
             of it H(x) <= x^2/2 <= v^2 Y^2/2 and phi(z) Y^2 = e^{s^2} phi(z - 2s), so at most
             (v^2/2) e^{s^2} Phi(2s - z_last). Then log G = T log1p(rho).
           - For v >= 1 we integrate L itself: |w| <= e^{A^2/2} phi(x) e^{-v Y(x)/2}, so
             M = e^{A^2/2} L(v/2) <= e^{A^2/2} sqrt(L(v)) (Jensen); with L_hat the sum plus
             the omitted nodes (at most Phi(z_first) + Phi(-z_last) e^{-v Y(z_last)}) and
             c = 2 e^{A^2/2} / (e^{80} - 1), L <= L_hat + c sqrt(L) gives
             sqrt(L) <= (c + sqrt(c^2 + 4 L_hat)) / 2. This is capped by the moment bound
             of step 5, log L(v) <= min_c [c log c - c + s^2 c (c+1)/2 - c log v], which
             takes over where v is so large that L(v/2) / L(v) defeats e^{-80}. Then
             log G = T (v + log L), and log G <= u always (L <= 1).
         The upper bounds are made non-decreasing (a running minimum from the right, valid
         because G is non-decreasing) and at least 0 (G >= 1).
      4. On a cell [u_i, u_{i+1}], convexity of log G puts it below its chord,
         G(u) <= G_i e^{lam (u - u_i)}, lam = (log G_{i+1} - log G_i) / (u_{i+1} - u_i) in
         [0, 1) (log G has slope 1 + d log L / dv < 1), and the cell's integral is exactly
             G_i e^{-lam u_i} (1 - lam)^{-b} [Gamma(b) mass of ((1-lam) u_i, (1-lam) u_{i+1})].
         Should the computed slope of the bounds not be below 1, the cell is bounded by
         G_{i+1} times its Gamma(b) mass instead (G is non-decreasing).
         The first cell [0, u_0] is bounded by G(u_0) P(Gamma(b) <= u_0) <= G(u_0) u_0^b / b!.
      5. Beyond u_n: e^{-x} <= (c / (e x))^c for x, c > 0 and E[Y^{-c}] = e^{s^2 c (c+1)/2}
         give L(v) <= (c/e)^c e^{s^2 c (c+1)/2} v^{-c}, hence for every c > b / T
             int_{u_n}^inf u^{b-1} L(u/T)^T du / Gamma(b)
               <= (c/e)^{cT} e^{T s^2 c (c+1)/2} T^{cT} u_n^{b - cT} / ((cT - b) Gamma(b)),
         minimised over a few values of c.

Rounding. Every floating-point step above sums positive terms or takes logarithms of them; the
results carry explicit allowances (documented where they are added) that exceed the standard
worst-case bounds (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., Sec. 4.2
for sums of positive terms), so the returned values are upper bounds, not estimates.

Example:
    >>> rdp = random_allocation_gaussian_rdp(
    ...     num_steps=1, noise_multiplier=2.0, orders=np.array([2.0, 3.5]))
    >>> [float(x) for x in rdp]  # one step: the Gaussian mechanism, a / (2 sigma^2)
    [0.25, 0.4375]
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy import special

from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.noise_range import gaussian_rdp, is_huge, is_noiseless
from dpcore.validation import check_count, check_non_negative

__all__ = [
    "ADD_ORDER_CAP",
    "EXACT_ORDER_CAP",
    "random_allocation_add_rdp",
    "random_allocation_gaussian_rdp",
    "random_allocation_remove_rdp",
]

#: Largest integer order of the exact remove-direction computation (a / (2 sigma^2) above).
EXACT_ORDER_CAP = 1024
#: Largest integer order of the numerical add-direction bound (the closed form (i) above).
ADD_ORDER_CAP = 256
#: Below this noise multiplier only the closed forms are used (the RDP is huge there anyway).
_MIN_NUMERIC_SIGMA = 0.1
#: Unit roundoff of IEEE doubles.
_UNIT = 2.0**-53
#: Trapezoidal rule: 2 pi A / h, so that the discretisation error is e^{-80} times M.
_TRAPEZOID_EXPONENT = 80.0
#: Points per octave of the u grid and its range 2^LOW .. 2^HIGH.
_U_PER_OCTAVE, _U_LOW, _U_HIGH = 64, -20, 15
#: Relative allowance for rounding in the final sum over cells (see _add_log_moments).
_CELL_ALLOWANCE = 1e-9


def _check_orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    if isinstance(orders, (str, bytes)):
        raise InvalidParameterError("orders", "to be a sequence of numbers > 1", orders)
    try:
        values = np.asarray(orders, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise InvalidParameterError("orders", "to be a sequence of numbers > 1", orders) from None
    if values.size == 0:
        raise InvalidParameterError("orders", "to be a non-empty sequence of numbers > 1", orders)
    for order in values:
        if not order > 1:  # also rejects NaN
            raise InvalidParameterError("orders", "to contain only numbers > 1", float(order))
    return values


def _check_inputs(
    num_steps: object, noise_multiplier: object, orders: Sequence[float] | np.ndarray
) -> tuple[int, float, np.ndarray]:
    steps = check_count("num_steps", num_steps, minimum=1)
    sigma = check_non_negative("noise_multiplier", noise_multiplier)
    return steps, sigma, _check_orders(orders)


# --------------------------------------------------------------------------- remove direction
def _log_poly_mul(
    a: np.ndarray,
    err_a: np.ndarray,
    b: np.ndarray,
    err_b: np.ndarray,
    triangle: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Product of two truncated power series given by log-coefficients, with error bounds.

    Coefficient n of the product is logsumexp_{i <= n} (a_i + b_{n-i}); ``triangle`` lists the
    pairs (n, i) row by row and where each row starts. ``err_*`` bound the absolute errors of
    the log-coefficients. A perturbation of the inputs by at most err_a[i] and err_b[n-i]
    perturbs each term of row n by at most their sum, hence the row's logsumexp by at most
    max_i (err_a[i] + err_b[n-i]). This step's own rounding: each exponent a_i + b_{n-i} - max is
    formed with absolute error at most 2u (|a_i| + |b_{n-i}|), and exp and the sum of at most
    n + 1 positive terms add at most (n + 3) u relative (Higham 2002, Sec. 4.2), nothing for
    n = 0 (a single term, exp(0) = 1 and log 1 = 0 are exact); we add
    8u (max_i (|a_i| + |b_{n-i}|) + 2n).
    """
    rows, cols, starts = triangle
    terms = a[cols] + b[rows - cols]  # -inf marks a zero coefficient
    top = np.maximum.reduceat(terms, starts)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        out = top + np.log(np.add.reduceat(np.exp(terms - top[rows]), starts))
    n = np.arange(len(a), dtype=float)
    size_a = np.where(np.isfinite(a), np.abs(a), 0.0)
    size_b = np.where(np.isfinite(b), np.abs(b), 0.0)
    magnitude = np.maximum.reduceat(size_a[cols] + size_b[rows - cols], starts)
    inherited = np.maximum.reduceat(err_a[cols] + err_b[rows - cols], starts)
    return out, inherited + 8 * _UNIT * (magnitude + 2 * n)


@functools.lru_cache(maxsize=64)
def _remove_log_moments(sigma: float, num_steps: int, degree: int) -> np.ndarray:
    """Upper bounds on log E[S^a] for a = 0..degree (remove direction, exact up to rounding).

    E[S^a] = a! [z^a] h(z)^T with h(z) = f(z / T) = sum_k exp(k(k-1)/(2 sigma^2)) z^k / (k! T^k)
    (module docstring; the scaling by T keeps the log-coefficients of h^T near -log a!, so that
    no large logarithms cancel at the end), by repeated squaring of log-coefficients. The
    rounding allowance propagates through each product (:func:`_log_poly_mul`); the initial
    log-coefficients, formed from three terms with a few roundings each (``gammaln`` is accurate
    to a few ulps), get 8u times their magnitude plus 8u k (0 for k = 0, which is exact).
    """
    k = np.arange(degree + 1, dtype=float)
    quadratic = k * (k - 1) / (2 * sigma) / sigma
    log_fact = special.gammaln(k + 1)
    scale = k * math.log(num_steps)
    base = quadratic - log_fact - scale
    err_base = 8 * _UNIT * (quadratic + log_fact + scale + k)
    lengths = np.arange(1, degree + 2)
    rows = np.repeat(np.arange(degree + 1), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    cols = np.arange(len(rows)) - starts[rows]
    triangle = (rows, cols, starts)
    result = np.full(degree + 1, -math.inf)
    result[0] = 0.0
    err_result = np.zeros(degree + 1)
    power = num_steps
    while power:
        if power & 1:
            result, err_result = _log_poly_mul(result, err_result, base, err_base, triangle)
        power >>= 1
        if power:
            base, err_base = _log_poly_mul(base, err_base, base, err_base, triangle)
    log_moment = log_fact + result
    allowance = err_result + 8 * _UNIT * (log_fact + np.abs(result) + k)
    bound: np.ndarray = np.asarray(log_moment + allowance)
    bound.setflags(write=False)  # cached: shared between callers
    return bound


def _remove_rdp(sigma: float, num_steps: int, orders: np.ndarray) -> np.ndarray:
    out = np.array([gaussian_rdp(float(order), sigma) for order in orders])
    if num_steps == 1 or is_noiseless(sigma) or is_huge(sigma) or sigma < 1e-3:
        return out  # T = 1 is the Gaussian mechanism itself; otherwise the convexity bound
    finite = orders[np.isfinite(orders)]
    ceilings = np.ceil(finite)
    needed = ceilings[ceilings <= EXACT_ORDER_CAP]
    if needed.size == 0:
        return out
    log_moment = _remove_log_moments(sigma, num_steps, int(needed.max()))
    for index, order in enumerate(orders):
        if math.isfinite(order) and math.ceil(order) <= EXACT_ORDER_CAP:
            top = math.ceil(order)
            value = float(log_moment[top]) / (top - 1)
            if value > 0:  # 0 or less only through rounding of a tiny value: keep the bound
                out[index] = min(out[index], value)
    return out


def random_allocation_remove_rdp(
    *, num_steps: int, noise_multiplier: float, orders: Sequence[float] | np.ndarray
) -> np.ndarray:
    """Upper bound on D_a(P || Q) (remove direction) at each order; exact at integer orders.

    See the module docstring: the exact multinomial sum of Feldman & Shenfeld (arXiv
    2502.08202) via its exponential generating function for ceil(a) <= :data:`EXACT_ORDER_CAP`
    (fractional orders take the value at ceil(a), van Erven & Harremoës 2014, Thm 3), plus a
    rounding allowance; a / (2 sigma^2) above. T = 1 returns the Gaussian's a / (2 sigma^2)
    exactly; sigma = 0 gives inf.
    """
    steps, sigma, values = _check_inputs(num_steps, noise_multiplier, orders)
    return _remove_rdp(sigma, steps, values)


# --------------------------------------------------------------------------- add direction
def _h_function(x: np.ndarray) -> np.ndarray:
    """H(x) = e^{-x} - 1 + x >= 0 with full relative accuracy.

    For |x| < 0.1 the Taylor series sum_{k=2}^{11} (-x)^k / k! (remainder below
    |x|^12 / 12! e^{0.1}, i.e. 1e-17 relative); otherwise expm1(-x) + x, which loses at most a
    factor 0.1 / H(0.1) < 21 in relative accuracy to cancellation.
    """
    small = np.abs(x) < 0.1
    t = -np.where(small, x, 0.0)
    poly = np.full_like(t, 1.0 / math.factorial(11))
    for j in range(8, -1, -1):  # H(x) = x^2 sum_{j=0}^{9} (-x)^j / (j + 2)!
        poly = poly * t + 1.0 / math.factorial(j + 2)
    series = t * t * poly
    with np.errstate(over="ignore"):
        direct = np.expm1(-np.where(small, 1.0, x)) + np.where(small, 1.0, x)
    return np.where(small, series, direct)


def _mode(v: float, s: float) -> float:
    """The maximiser z* <= 0 of -z^2/2 - v exp(s z - s^2/2) (concave), by bisection."""
    low, high = -v * s - 1.0, 0.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        slope = -mid - v * s * math.exp(s * mid - s * s / 2)
        if slope > 0:
            low = mid
        else:
            high = mid
    return low


def _log_l_moment_bound(v: np.ndarray, s: float) -> np.ndarray:
    """log L(v) <= min_c [c log c - c + s^2 c (c + 1) / 2 - c log v] (step 5), over a grid of c.

    Any c > 0 gives a valid bound; rounding is covered by adding 1e-12 (1 + |value|).
    """
    c = np.geomspace(1e-3, 1e7, 401)
    values = (c * np.log(c) - c + s * s * c * (c + 1) / 2)[None, :] - c[None, :] * np.log(v)[
        :, None
    ]
    best = values.min(axis=1)
    return np.asarray(best + 1e-12 * (1 + np.abs(best)))


def _log_g_bounds(sigma: float, num_steps: int, u: np.ndarray) -> np.ndarray:
    """Upper bounds on log G(u) = T log(e^v L(v)), v = u / T, at each grid point (step 3)."""
    s = 1.0 / sigma
    v = u / num_steps
    strip = min(math.pi / (3 * s), 3.0)
    step = 2 * math.pi * strip / _TRAPEZOID_EXPONENT
    # 2 / (e^{2 pi A / h} - 1) e^{A^2/2}, the factor of M in Trefethen & Weideman's bound.
    log_c = math.log(2.0) - _TRAPEZOID_EXPONENT + strip * strip / 2 + 1e-15
    z_first = math.floor((_mode(float(v.max()), s) - 14.0) / step) * step
    z_last = math.ceil((14.0 + 2 * s) / step) * step
    z = np.arange(round(z_first / step), round(z_last / step) + 1) * step
    z_first, z_last = float(z[0]), float(z[-1])
    log_phi = -z * z / 2 - 0.5 * math.log(2 * math.pi)
    log_weight = math.log(step) + log_phi
    y = np.exp(s * z - s * s / 2)
    y_minus_one = np.expm1(s * z - s * s / 2)
    log_g = np.empty_like(u)
    chunk = max(1, 2_000_000 // len(z))
    small = v < 1.0
    # v < 1: rho = e^v L(v) - 1 = E H(v (Y - 1)).
    phi_weight = np.exp(log_weight)
    for start in range(0, int(small.sum()), chunk):
        vs = v[small][start : start + chunk]
        h_values = _h_function(vs[:, None] * y_minus_one[None, :])
        rho = (h_values * phi_weight[None, :]).sum(axis=1)
        left = special.ndtr(z_first) * _h_function(-vs)
        right = vs * vs / 2 * math.exp(s * s) * special.ndtr(2 * s - z_last)
        discretisation = np.exp(log_c + vs) * vs * vs / 2 * (math.exp(s * s) + 3)
        # Rounding: terms carry at most ~(|log phi| + 30) u relative error (exp of -z^2/2, the
        # 21-fold cancellation in H, products), |log phi| <= 745 for terms that do not
        # underflow; their sum adds (log2 n) u. 1e-12 exceeds both. Terms (and Phi values)
        # that underflow are below 2^-1022 < 1e-307 each, hence the additive allowance.
        underflow = (len(z) + 2) * 1e-307
        rho_up = (rho + left + right + discretisation + underflow) * (1 + 1e-12)
        index = np.flatnonzero(small)[start : start + chunk]
        log_g[index] = num_steps * np.log1p(rho_up)
    # v >= 1: L itself, in log space.
    large_index = np.flatnonzero(~small)
    log_left = float(special.log_ndtr(z_first))
    log_right_base = float(special.log_ndtr(-z_last))
    for start in range(0, len(large_index), chunk):
        index = large_index[start : start + chunk]
        vl = v[index]
        log_terms = log_weight[None, :] - vl[:, None] * y[None, :]
        log_sum = special.logsumexp(log_terms, axis=1)
        log_right = log_right_base - vl * math.exp(s * z_last - s * s / 2)
        log_hat = np.logaddexp(np.logaddexp(log_sum, log_left), log_right)
        # sqrt(L) <= (c + sqrt(c^2 + 4 L_hat)) / 2, evaluated without overflow: with
        # r = c / sqrt(L_hat), log L <= log L_hat + 2 log((r + sqrt(r^2 + 4)) / 2), and for
        # r > 1, with q = 4 / r^2, log L <= 2 log c + 2 log((1 + sqrt(1 + q)) / 2).
        gap = log_c - log_hat / 2
        with np.errstate(over="ignore"):
            ratio = np.exp(np.minimum(gap, 0.0))
            quarter = np.exp(np.minimum(-2 * gap, 0.0) + math.log(4.0))
        log_l = np.where(
            gap <= 0,
            log_hat + 2 * np.log((ratio + np.sqrt(ratio * ratio + 4)) / 2),
            2 * log_c + 2 * np.log((1 + np.sqrt(1 + quarter)) / 2),
        )
        # Rounding: each dominant log-term (within 745 of the largest) is a sum of non-positive
        # parts of magnitude at most |log L| + 760, formed with absolute error 4u per unit, and
        # logsumexp adds (log2 n + 2) u: below 1e-12 (1 + |log L|).
        log_l = log_l + 1e-12 * (1 + np.abs(log_l))
        log_l = np.minimum(log_l, _log_l_moment_bound(vl, s))
        value = num_steps * (vl + log_l) + num_steps * 4 * _UNIT * (vl + np.abs(log_l))
        log_g[index] = np.minimum(value, u[index])  # L <= 1
    log_g = np.minimum.accumulate(log_g[::-1])[::-1]  # G is non-decreasing
    return np.asarray(np.maximum(log_g, 0.0))  # G >= 1


def _log_gamma_mass(b: int, x1: np.ndarray, x2: np.ndarray) -> np.ndarray:
    """Upper bounds on log P(x1 < Gamma(b, 1) < x2) for x1 < x2 (arrays), b a positive integer.

    From scipy's regularised incomplete gamma functions (differences of P below b, of Q above),
    whose rounding the caller's allowance covers. Where the values underflow, the bounds
    P_b(x) <= x^b / b! and, for x >= b - 1, Q_b(x) = e^{-x} sum_{k<b} x^k / k! <=
    e^{-x} b x^{b-1} / (b-1)! are used instead.
    """
    out = np.empty_like(x1)
    below = x2 <= b
    above = (x1 >= b) & ~below
    middle = ~below & ~above
    with np.errstate(divide="ignore"):
        p_low = special.gammainc(b, x1[below])
        p_high = special.gammainc(b, x2[below])
        bound = b * np.log(x2[below]) - special.gammaln(b + 1)
        diff = p_high - p_low
        ok = (p_high > 1e-280) & (diff > 0)
        out[below] = np.where(ok, np.log(np.where(ok, diff, 1.0)), bound)
        q_low = special.gammaincc(b, x1[above])
        q_high = special.gammaincc(b, x2[above])
        xa = x1[above]
        bound = -xa + math.log(b) + (b - 1) * np.log(xa) - special.gammaln(b)
        diff = q_low - q_high
        ok = (q_low > 1e-280) & (diff > 0)
        out[above] = np.where(ok, np.log(np.where(ok, diff, 1.0)), bound)
        diff = special.gammaincc(b, x1[middle]) - special.gammaincc(b, x2[middle])
        out[middle] = np.where(diff > 0, np.log(np.where(diff > 0, diff, 1.0)), 0.0)
    return out


def _log_tail(b: int, s: float, num_steps: int, u_max: float) -> float:
    """Step 5 of the module docstring, minimised over c = (b + m) / T, m = 2^-3 .. 2^24."""
    best = math.inf
    for m in 2.0 ** np.arange(-3, 25):
        c = (b + m) / num_steps
        cT = c * num_steps
        value = (
            cT * (math.log(c) - 1 + math.log(num_steps))
            + num_steps * s * s * c * (c + 1) / 2
            + (b - cT) * math.log(u_max)
            - math.log(cT - b)
            - math.lgamma(b)
        )
        best = min(best, value)
    return best


@functools.lru_cache(maxsize=64)
def _add_log_moments(sigma: float, num_steps: int, exponents: tuple[int, ...]) -> tuple[float, ...]:
    """Upper bounds on log E[S^{-b}] for each integer b in ``exponents`` (steps 1-5).

    The cell integrals are positive terms formed from the bounds on log G with a few roundings
    each; the chord slope and the incomplete gamma differences (scipy, relative accuracy about
    1e-14, amplified by at most P / (P(x2) - P(x1)) < 10^4 on this grid) perturb each term by
    far less than 1e-9 relative, which is added (``_CELL_ALLOWANCE``) to the total.
    """
    s = 1.0 / sigma
    u = 2.0 ** (np.arange(_U_LOW * _U_PER_OCTAVE, _U_HIGH * _U_PER_OCTAVE + 1) / _U_PER_OCTAVE)
    log_g = _log_g_bounds(sigma, num_steps, u)
    lo, hi = u[:-1], u[1:]
    slope = (log_g[1:] - log_g[:-1]) / (hi - lo)
    curved = slope < 1 - 1e-9
    safe = np.where(curved, slope, 0.0)
    out = []
    for b in exponents:
        chord = (
            log_g[:-1]
            - safe * lo
            - b * np.log1p(-safe)
            + _log_gamma_mass(b, (1 - safe) * lo, (1 - safe) * hi)
        )
        flat = log_g[1:] + _log_gamma_mass(b, lo, hi)
        cells = np.where(curved, chord, flat)
        first = log_g[0] + b * math.log(u[0]) - math.lgamma(b + 1)
        tail = _log_tail(b, s, num_steps, float(u[-1]))
        total = special.logsumexp(np.concatenate([cells, [first, tail]]))
        out.append(float(total) + math.log1p(_CELL_ALLOWANCE))
    return tuple(out)


def _add_closed_form(order: float, sigma: float, num_steps: int) -> float:
    """Bound (i): 1 / (2 sigma^2) + (a - 1) / (2 T sigma^2) (AM-GM; module docstring)."""
    if is_noiseless(sigma) or math.isinf(order):
        return math.inf
    return (1.0 + (order - 1) / num_steps) / (2 * sigma) / sigma


def _add_rdp(sigma: float, num_steps: int, orders: np.ndarray) -> np.ndarray:
    if num_steps == 1 or is_noiseless(sigma) or is_huge(sigma):
        return np.array([gaussian_rdp(float(order), sigma) for order in orders])
    out = np.array([_add_closed_form(float(order), sigma, num_steps) for order in orders])
    if sigma < _MIN_NUMERIC_SIGMA:
        return out
    tops = sorted(
        {math.ceil(o) for o in orders if math.isfinite(o) and math.ceil(o) <= ADD_ORDER_CAP}
    )
    if not tops:
        return out
    moments = _add_log_moments(sigma, num_steps, tuple(t - 1 for t in tops))
    logs = dict(zip(tops, moments, strict=True))
    for index, order in enumerate(orders):
        if math.isfinite(order) and math.ceil(order) in logs:
            top = math.ceil(order)
            value = logs[top] / (top - 1)
            if value > 0:
                out[index] = min(out[index], value)
    return out


def random_allocation_add_rdp(
    *, num_steps: int, noise_multiplier: float, orders: Sequence[float] | np.ndarray
) -> np.ndarray:
    """Certified upper bound on D_a(Q || P) (add direction) at each order.

    The smaller of the closed form (i) and, for ceil(a) <= :data:`ADD_ORDER_CAP`, the numerical
    bound (ii) at ceil(a) (module docstring). T = 1 returns a / (2 sigma^2) exactly.
    """
    steps, sigma, values = _check_inputs(num_steps, noise_multiplier, orders)
    return _add_rdp(sigma, steps, values)


def random_allocation_gaussian_rdp(
    *, num_steps: int, noise_multiplier: float, orders: Sequence[float] | np.ndarray
) -> np.ndarray:
    """RDP of one epoch of the Gaussian mechanism under random allocation over ``num_steps``.

    The larger of the remove and add directions at each order (add/remove-one neighbours; the
    module docstring gives the dominating pair and both computations). Never below the true
    value; inf for sigma = 0 and for order inf.
    """
    steps, sigma, values = _check_inputs(num_steps, noise_multiplier, orders)
    return np.asarray(np.maximum(_remove_rdp(sigma, steps, values), _add_rdp(sigma, steps, values)))
