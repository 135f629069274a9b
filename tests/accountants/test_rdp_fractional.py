"""Fractional-order RDP of the Poisson-subsampled Gaussian: certified bounds against quadrature.

The oracle is the definition itself (Mironov, Talwar, Zhang 2019, Sec. 3):
A_a - 1 = E_{Z ~ N(0, s^2)}[(1 - q + q e^{(2Z - 1)/(2 s^2)})^a - 1], integrated by mpmath at 30
digits, and RDP(a) = log(A_a) / (a - 1). Every expected value below is computed here from it.
"""

from __future__ import annotations

import functools
import math

import mpmath
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as peer

from dpcore.accountants.rdp import DEFAULT_ORDERS
from dpcore.accountants.rdp_math import (
    _log_a_fractional_bounds,
    _log_a_fractional_magnitudes,
    _log_a_integer,
    subsampled_gaussian_rdp,
)
from dpcore.errors import InvalidParameterError

QS = (1e-3, 0.01, 0.05, 0.2, 0.5, 0.9)
SIGMAS = (0.5, 0.8, 1.0, 2.0, 5.0, 10.0)
ORDERS = (1.01, 1.1, 1.25, 1.5, 2.25, 3.5, 5.5, 9.75)

# Never below the truth: the oracle is good to ~1e-25 (30 digits), so 1e-12 is only the room
# for the last rounding of the comparison itself.
BELOW = 1e-12
# How far above: the certified bracket is formed from terms that each carry an error allowance
# of ~1e-13 relative, and the first-order part cancels by up to ~ s^2 / (a (a - 1)) <= 1e4
# on this grid (a >= 1.01, s <= 10): the bracket is < 1e-7 of the RDP (3e-8 measured at
# q = 0.9, s = 10, a = 1.01).
ABOVE = 1e-7


@functools.cache
def oracle_rdp(q: float, sigma: float, order: float) -> float:
    """RDP(a) = log(1 + E[g(Z) - 1]) / (a - 1) by mpmath quadrature at 30 digits.

    The integrand is split where it concentrates: around 0 (the N(0, s^2) weight) and around
    a (for large z the mixture ratio grows like e^{a z / s^2}, which shifts the mass to a).
    """
    with mpmath.workdps(30):
        q_, s, a = mpmath.mpf(q), mpmath.mpf(sigma), mpmath.mpf(order)
        c = 1 / (2 * s * s)
        shift = mpmath.exp(-c)
        norm = 1 / (s * mpmath.sqrt(2 * mpmath.pi))

        def integrand(z: mpmath.mpf) -> mpmath.mpf:
            ratio = 1 - q_ + q_ * shift * mpmath.exp(2 * c * z)
            return (mpmath.power(ratio, a) - 1) * mpmath.exp(-c * z * z) * norm

        points = sorted({-12 * s, mpmath.mpf(0), a, a + 12 * s})
        excess = mpmath.quad(integrand, [-mpmath.inf, *points, mpmath.inf])
        return float(mpmath.log1p(excess) / (a - 1))


def _ours(q: float, sigma: float, orders: tuple[float, ...]) -> np.ndarray:
    return subsampled_gaussian_rdp(
        sampling_probability=q, noise_multiplier=sigma, orders=np.array(orders)
    )


def _grid_orders(q_index: int, sigma_index: int) -> tuple[float, ...]:
    """Two orders per (q, sigma) pair, cycling so that every order meets every q and sigma."""
    start = (q_index + 2 * sigma_index) % len(ORDERS)
    return (ORDERS[start], ORDERS[(start + 4) % len(ORDERS)])


@pytest.mark.parametrize("sigma_index", range(len(SIGMAS)))
@pytest.mark.parametrize("q_index", range(len(QS)))
def test_certified_bracket_contains_quadrature(q_index: int, sigma_index: int) -> None:
    q, sigma = QS[q_index], SIGMAS[sigma_index]
    orders = _grid_orders(q_index, sigma_index)
    ours = _ours(q, sigma, orders)
    lower, upper = _log_a_fractional_bounds(q, sigma, np.array(orders))
    for k, order in enumerate(orders):
        oracle = oracle_rdp(q, sigma, order)
        assert ours[k] >= oracle * (1 - BELOW), (q, sigma, order)
        assert ours[k] <= oracle * (1 + ABOVE), (q, sigma, order)
        # The certificate holds on both sides: lower <= truth <= upper.
        assert lower[k] / (order - 1) <= oracle * (1 + BELOW), (q, sigma, order)
        assert upper[k] / (order - 1) >= oracle * (1 - BELOW), (q, sigma, order)


def test_every_grid_order_is_tight_against_quadrature() -> None:
    # All eight orders at one (q, sigma) that the magnitude sum handles badly.
    ours = _ours(0.5, 5.0, ORDERS)
    for k, order in enumerate(ORDERS):
        oracle = oracle_rdp(0.5, 5.0, order)
        assert oracle * (1 - BELOW) <= ours[k] <= oracle * (1 + ABOVE), order


def test_regression_sixteenfold_looseness_at_order_1_25() -> None:
    # q = 0.2, s = 10, a = 1.25: the magnitude sum (dp_accounting 0.6) is 16.4x the truth.
    q, sigma, order = 0.2, 10.0, 1.25
    oracle = oracle_rdp(q, sigma, order)
    old = _log_a_fractional_magnitudes(q, sigma, order) / (order - 1)
    assert old > 16 * oracle
    new = _ours(q, sigma, (order,))[0]
    assert oracle * (1 - BELOW) <= new <= oracle * (1 + 1e-9)


def test_regression_loose_by_a_fifth_at_order_2_25() -> None:
    # q = 0.2, s = 10, a = 2.25: the magnitude sum is 1.2x the truth.
    q, sigma, order = 0.2, 10.0, 2.25
    oracle = oracle_rdp(q, sigma, order)
    old = _log_a_fractional_magnitudes(q, sigma, order) / (order - 1)
    assert old == pytest.approx(1.197 * oracle, rel=1e-3)
    new = _ours(q, sigma, (order,))[0]
    assert oracle * (1 - BELOW) <= new <= oracle * (1 + 1e-9)


def test_regression_divergent_magnitude_series_is_now_finite() -> None:
    # q = 0.05, s = 0.5, a = 1.25: the magnitude series diverges (inf); the truth is 0.0296.
    q, sigma, order = 0.05, 0.5, 1.25
    assert math.isinf(_log_a_fractional_magnitudes(q, sigma, order))
    oracle = oracle_rdp(q, sigma, order)
    assert round(oracle, 4) == 0.0296
    new = _ours(q, sigma, (order,))[0]
    assert oracle * (1 - BELOW) <= new <= oracle * (1 + 1e-9)


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (0.2, 10.0), (0.9, 0.5), (1e-6, 2.0)])
def test_integer_orders_keep_the_binomial_sum(q: float, sigma: float) -> None:
    orders = np.array([1.5, 2.0, 3.0, 3.5, 8.0, 32.0, 256.0])
    ours = subsampled_gaussian_rdp(sampling_probability=q, noise_multiplier=sigma, orders=orders)
    for k, order in enumerate(orders):
        if float(order).is_integer():
            assert ours[k] == _log_a_integer(q, sigma, int(order)) / (order - 1)


@pytest.mark.parametrize(
    ("q", "sigma"), [(0.01, 1.0), (0.2, 10.0), (0.05, 0.5), (0.5, 0.8), (0.9, 5.0), (1e-6, 1.0)]
)
def test_rdp_is_non_decreasing_across_integer_and_fractional_orders(q: float, sigma: float) -> None:
    # Renyi divergence is non-decreasing in the order (van Erven & Harremoes 2014, Thm 3); the
    # integer orders are exact, the fractional ones certified within 1e-7 of the truth.
    orders = np.array([1.01, 1.5, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.75, 5.0, 9.75, 10.0])
    rdp = subsampled_gaussian_rdp(sampling_probability=q, noise_multiplier=sigma, orders=orders)
    assert np.all(np.isfinite(rdp)) and np.all(rdp > 0)
    assert np.all(np.diff(rdp) >= 0), rdp


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (0.1, 0.6), (0.001, 4.0)])
def test_never_looser_than_dp_accounting_and_equal_at_integer_orders(
    q: float, sigma: float
) -> None:
    # dp_accounting 0.6 sums magnitudes at fractional orders (an upper bound on the truth, up to
    # its own rounding: a log-space sum near A_a = 1, off by ~1e-16 per term, so we allow 1e-14
    # on log A_a; it is 2e-11 below the oracle at q = 0.001, s = 4, a = 7.4) and uses the exact
    # binomial sum at integer orders.
    orders = np.array((*DEFAULT_ORDERS[:99:7], 11.0, 32.0))
    ours = subsampled_gaussian_rdp(sampling_probability=q, noise_multiplier=sigma, orders=orders)
    theirs = np.array(
        [peer._compute_rdp_poisson_subsampled_gaussian(q, sigma, [o])[0] for o in orders]
    )
    for order, mine, peer_value in zip(orders, ours, theirs, strict=True):
        if float(order).is_integer():
            assert mine == pytest.approx(peer_value, rel=1e-12)
        else:
            assert mine <= peer_value * (1 + 1e-12) + 1e-14 / (order - 1)


def test_tiny_sampling_rate_is_certified_not_dropped() -> None:
    # q = 1e-9: A_a - 1 ~ 1e-18, below the rounding of a sum near 1, where the magnitude sum
    # returned 0 or less (the order was dropped as inf). The certified value is finite and
    # matches the oracle (here A_a - 1 is formed without the leading 1).
    q, sigma, order = 1e-9, 1.0, 1.5
    oracle = oracle_rdp(q, sigma, order)
    new = _ours(q, sigma, (order,))[0]
    assert oracle * (1 - BELOW) <= new <= oracle * (1 + 1e-9)


def test_the_default_grid_is_certified_tightly() -> None:
    # One event's worth of fractional orders: every bracket is within 1e-7 of its upper end.
    fractional = np.array([o for o in DEFAULT_ORDERS if not float(o).is_integer()])
    lower, upper = _log_a_fractional_bounds(0.01, 1.0, fractional)
    assert np.all(lower <= upper)
    assert np.all(upper - lower <= 1e-7 * upper)


@pytest.mark.parametrize(
    ("q", "sigma", "orders", "name"),
    [
        (0.0, 1.0, [1.5], "sampling_probability"),
        (1.0, 1.0, [1.5], "sampling_probability"),
        (0.1, 0.0, [1.5], "noise_multiplier"),
        (0.1, math.inf, [1.5], "noise_multiplier"),
        (0.1, 1.0, [2.0], "orders"),
        (0.1, 1.0, [0.5], "orders"),
        (0.1, 1.0, [math.nan], "orders"),
    ],
)
def test_bad_input_raises_typed_errors(
    q: float, sigma: float, orders: list[float], name: str
) -> None:
    with pytest.raises(InvalidParameterError) as info:
        _log_a_fractional_bounds(q, sigma, np.array(orders))
    assert info.value.parameter == name
