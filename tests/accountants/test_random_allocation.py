"""RDP of the Gaussian under random allocation (:mod:`dpcore.accountants.random_allocation_math`).

Independent references, all computed here: the exact multinomial sum of the remove direction
(brute force over compositions, and grouped by integer partitions) in mpmath; mpmath quadrature
of both directions for T = 2 and T = 3 steps; closed forms at T = 1 (the Gaussian mechanism,
Mironov 2017, Prop. 7) and at order 2.

Notation: s = 1 / sigma, Y = exp(s Z - s^2/2) with Z standard normal, S = (1/T) sum_t Y_t; the
remove direction is log E[S^a] / (a - 1) and the add direction log E[S^{-(a-1)}] / (a - 1)
(dominating pair of Chua et al. 2025, arXiv 2412.16802). Splitting Z = Zbar 1 + D with Zbar the
mean (variance 1/T) and D its orthogonal complement (independent of Zbar) gives the identity
used by the quadratures below,

    E[S^p] = exp(-p s^2 / 2 + p^2 s^2 / (2T)) E[M^p],   M = (1/T) sum_t exp(s D_t),

for any real p, since S = exp(s Zbar - s^2/2) M and E exp(p s Zbar) = exp(p^2 s^2 / (2T)).
For T = 2, D = (W, -W) / sqrt(2) with W standard normal, so M = cosh(s W / sqrt(2)) (a 1-D
integral); for T = 3, D = W1 (1, -1, 0) / sqrt(2) + W2 (1, 1, -2) / sqrt(6) (a 2-D integral).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import mpmath
import numpy as np
import pytest

from dpcore.accountants.base import NeighboringRelation
from dpcore.accountants.random_allocation_math import (
    random_allocation_add_rdp,
    random_allocation_gaussian_rdp,
    random_allocation_remove_rdp,
)
from dpcore.accountants.rdp import RdpAccountant
from dpcore.accountants.rdp_math import epsilon_from_rdp, subsampled_gaussian_rdp
from dpcore.errors import InvalidParameterError, UnsupportedEventError
from dpcore.events import (
    GaussianEvent,
    LaplaceEvent,
    RandomAllocationEvent,
    SelfComposedEvent,
)

ORDERS = np.array([1.5, 2.0, 3.0, 4.5, 8.0, 16.0, 32.0])


def _remove(steps: int, sigma: float, order: float) -> float:
    return float(
        random_allocation_remove_rdp(num_steps=steps, noise_multiplier=sigma, orders=[order])[0]
    )


def _add(steps: int, sigma: float, order: float) -> float:
    return float(
        random_allocation_add_rdp(num_steps=steps, noise_multiplier=sigma, orders=[order])[0]
    )


def _add_closed_form(steps: int, sigma: float, order: float) -> float:
    """AM-GM: S >= exp(s Zbar - s^2/2), so the add direction is at most
    1/(2 sigma^2) + (a - 1)/(2 T sigma^2) (derived in the module docstring, recomputed here)."""
    return 1 / (2 * sigma**2) + (order - 1) / (2 * steps * sigma**2)


# ----------------------------------------------------------------------------- exact references
def _c(k: int, sigma: float) -> mpmath.mpf:
    """E[Y^k] = exp(k (k - 1) / (2 sigma^2)) for the lognormal Y."""
    return mpmath.e ** (mpmath.mpf(k * (k - 1)) / (2 * mpmath.mpf(sigma) ** 2))


def _exact_by_compositions(steps: int, sigma: float, order: int) -> mpmath.mpf:
    """log E[S^a] by brute force: sum over (k_1..k_T) with sum a of multinomial * prod c(k_t)."""
    total = mpmath.mpf(0)
    for ks in itertools.product(range(order + 1), repeat=steps):
        if sum(ks) == order:
            weight = mpmath.factorial(order)
            for k in ks:
                weight /= mpmath.factorial(k)
            total += weight * mpmath.fprod(_c(k, sigma) for k in ks)
    return mpmath.log(total) - order * mpmath.log(steps)


def _partitions(n: int, largest: int | None = None) -> list[tuple[int, ...]]:
    largest = n if largest is None else largest
    if n == 0:
        return [()]
    return [
        (part, *rest)
        for part in range(min(n, largest), 0, -1)
        for rest in _partitions(n - part, part)
    ]


def _assignments(partition: tuple[int, ...], steps: int) -> int:
    """T! / ((T - l)! prod_j m_j!): coordinate assignments of a partition with l <= T parts."""
    count = math.factorial(steps) // math.factorial(steps - len(partition))
    for multiplicity in Counter(partition).values():
        count //= math.factorial(multiplicity)
    return count


def _exact_by_partitions(steps: int, sigma: float, order: int) -> mpmath.mpf:
    """The same sum grouped by integer partitions with at most T parts (Feldman & Shenfeld)."""
    total = mpmath.mpf(0)
    for partition in _partitions(order):
        if len(partition) <= steps:
            weight = mpmath.factorial(order)
            for k in partition:
                weight /= mpmath.factorial(k)
            total += (
                _assignments(partition, steps)
                * weight
                * mpmath.fprod(_c(k, sigma) for k in partition)
            )
    return mpmath.log(total) - order * mpmath.log(steps)


@pytest.mark.parametrize("steps", [1, 2, 3, 4])
@pytest.mark.parametrize("order", [1, 2, 3, 5, 7])
def test_partition_count_matches_brute_force(steps: int, order: int) -> None:
    seen: Counter[tuple[int, ...]] = Counter()
    for ks in itertools.product(range(order + 1), repeat=steps):
        if sum(ks) == order:
            seen[tuple(sorted((k for k in ks if k), reverse=True))] += 1
    expected = {p: _assignments(p, steps) for p in _partitions(order) if len(p) <= steps}
    assert dict(seen) == expected


@pytest.mark.parametrize(("steps", "order"), [(2, 2), (2, 9), (3, 4), (3, 7), (4, 5)])
@pytest.mark.parametrize("sigma", [0.6, 1.3])
def test_remove_direction_is_the_exact_multinomial_sum(
    steps: int, order: int, sigma: float
) -> None:
    mpmath.mp.dps = 40
    brute = _exact_by_compositions(steps, sigma, order)
    grouped = _exact_by_partitions(steps, sigma, order)
    assert abs(brute - grouped) < mpmath.mpf(10) ** -30
    truth = float(brute / (order - 1))
    ours = _remove(steps, sigma, float(order))
    assert ours >= truth  # exact up to rounding, plus an allowance that only raises it
    assert ours == pytest.approx(truth, rel=1e-11)


@pytest.mark.parametrize(("steps", "order"), [(17, 12), (240, 20), (1000, 20)])
def test_remove_direction_matches_partition_sum_at_larger_sizes(steps: int, order: int) -> None:
    mpmath.mp.dps = 40
    truth = float(_exact_by_partitions(steps, 1.1, order) / (order - 1))
    ours = _remove(steps, 1.1, float(order))
    assert truth <= ours <= truth * (1 + 1e-9)


def test_order_two_closed_form_and_the_poisson_comparison() -> None:
    # E[S^2] = (1/T^2) (T (T - 1) + T e^{s^2}) = 1 + (e^{1/sigma^2} - 1) / T. Poisson at q = 1/T
    # has A_2 = 1 + q^2 (e^{1/sigma^2} - 1) (Mironov, Talwar, Zhang 2019, Sec. 3.3) per step, and
    # T log(1 + x / T^2) >= log(1 + x / T) by Bernoulli's inequality: at order 2 the remove
    # direction is provably below T Poisson steps.
    for steps, sigma in [(2, 0.8), (100, 1.0), (10_000, 2.0)]:
        x = math.expm1(1 / sigma**2)
        exact = math.log1p(x / steps)
        ours = _remove(steps, sigma, 2.0)
        assert exact <= ours <= exact + 1e-12  # exact, plus a rounding allowance
        poisson = steps * subsampled_gaussian_rdp(
            sampling_probability=1 / steps, noise_multiplier=sigma, orders=np.array([2.0])
        )
        assert ours <= poisson[0]


# ----------------------------------------------------------------------------- T = 1
@pytest.mark.parametrize("sigma", [0.3, 1.0, 7.0])
def test_one_step_is_the_gaussian_mechanism_exactly(sigma: float) -> None:
    gaussian = ORDERS / (2 * sigma**2)
    for function in (
        random_allocation_remove_rdp,
        random_allocation_add_rdp,
        random_allocation_gaussian_rdp,
    ):
        values = function(num_steps=1, noise_multiplier=sigma, orders=ORDERS)
        assert list(values) == [order / (2 * sigma) / sigma for order in ORDERS]
        assert np.allclose(values, gaussian, rtol=1e-15, atol=0)
    acc = RdpAccountant(orders=list(ORDERS)).compose(RandomAllocationEvent(1, GaussianEvent(sigma)))
    plain = RdpAccountant(orders=list(ORDERS)).compose(GaussianEvent(sigma))
    assert list(acc.rdp) == list(plain.rdp)


# ----------------------------------------------------------------------------- quadrature
def _two_step_oracle(sigma: float, order: float, direction: str) -> float:
    """Both directions at T = 2 by 1-D mpmath quadrature (module docstring identity)."""
    mpmath.mp.dps = 20
    s = 1 / mpmath.mpf(sigma)
    p = order if direction == "remove" else -(order - 1)
    integral = mpmath.quad(
        lambda w: mpmath.npdf(w) * mpmath.cosh(s * w / mpmath.sqrt(2)) ** p,
        [-mpmath.inf, -6, 0, 6, mpmath.inf],
    )
    log_moment = -p * s**2 / 2 + p**2 * s**2 / 4 + mpmath.log(integral)
    return float(log_moment / (order - 1))


@pytest.mark.parametrize("sigma", [0.8, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("order", [2.0, 3.5, 6.0, 10.0])
def test_two_steps_against_quadrature(sigma: float, order: float) -> None:
    remove = _two_step_oracle(sigma, order, "remove")
    add = _two_step_oracle(sigma, order, "add")
    ours_remove, ours_add = _remove(2, sigma, order), _add(2, sigma, order)
    # The oracle is accurate to ~1e-15; ours must never be below it.
    assert ours_remove >= remove * (1 - 1e-13)
    assert ours_add >= add * (1 - 1e-13)
    if float(order).is_integer():
        assert ours_remove == pytest.approx(remove, rel=1e-11)  # exact at integer orders
        if order < 10 or sigma > 1:
            # The numerical add bound (ii): a relative slack below 1e-4 (measured: ~2e-5).
            assert ours_add <= add * (1 + 1e-4)
        else:
            # Small T, high order: only the closed form (i) applies; it is a valid bound.
            assert ours_add <= _add_closed_form(2, sigma, order) * (1 + 1e-15)
    else:
        # A fractional order takes the value at the next integer (RDP grows with the order).
        assert ours_remove == _remove(2, sigma, math.ceil(order))


def _three_step_oracle(sigma: float, order: float, direction: str) -> float:
    """Both directions at T = 3 by 2-D mpmath Gauss-Legendre quadrature on [-10, 10]^2 (the
    omitted Gaussian mass, below 1e-22, is negligible at this accuracy; degree 4 agrees with
    degree 3 to about 1e-10 relative on these cases)."""
    mpmath.mp.dps = 15
    s = 1 / mpmath.mpf(sigma)
    p = order if direction == "remove" else -(order - 1)
    r2, r6 = mpmath.sqrt(2), mpmath.sqrt(6)

    def integrand(w1: mpmath.mpf, w2: mpmath.mpf) -> mpmath.mpf:
        m = (
            mpmath.exp(s * (w1 / r2 + w2 / r6))
            + mpmath.exp(s * (-w1 / r2 + w2 / r6))
            + mpmath.exp(-2 * s * w2 / r6)
        ) / 3
        return mpmath.exp(-(w1 * w1 + w2 * w2) / 2) / (2 * mpmath.pi) * m**p

    cuts = [-10, -5, 0, 5, 10]
    integral = mpmath.quad(integrand, cuts, cuts, method="gauss-legendre", maxdegree=3)
    log_moment = -p * s**2 / 2 + p**2 * s**2 / 6 + mpmath.log(integral)
    return float(log_moment / (order - 1))


@pytest.mark.parametrize(
    ("sigma", "order", "direction"), [(1.0, 3.0, "remove"), (1.0, 3.0, "add"), (2.0, 8.0, "add")]
)
def test_three_steps_against_quadrature(sigma: float, order: float, direction: str) -> None:
    oracle = _three_step_oracle(sigma, order, direction)
    if direction == "remove":
        ours = _remove(3, sigma, order)
        assert ours == pytest.approx(oracle, rel=1e-8)
    else:
        ours = _add(3, sigma, order)
        assert ours <= oracle * (1 + 1e-4)
    assert ours >= oracle * (1 - 1e-8)  # the oracle's own accuracy


# ----------------------------------------------------------------------------- properties
def test_decreasing_in_steps_and_in_noise() -> None:
    orders = np.array([2.0, 3.0, 5.0, 8.0, 16.0, 32.0])
    for function in (
        random_allocation_remove_rdp,
        random_allocation_add_rdp,
        random_allocation_gaussian_rdp,
    ):
        by_steps = [
            function(num_steps=t, noise_multiplier=1.0, orders=orders) for t in (1, 2, 3, 10, 240)
        ]
        by_noise = [
            function(num_steps=50, noise_multiplier=s, orders=orders) for s in (0.6, 0.9, 1.5, 4.0)
        ]
        for curves in (by_steps, by_noise):
            for before, after in itertools.pairwise(curves):
                assert np.all(after <= before)
                assert np.all(after > 0)


def test_never_above_the_gaussian_mechanism() -> None:
    # Each record is used once per epoch: S^a <= (1/T) sum_t Y_t^a (convexity) bounds the remove
    # direction by a / (2 sigma^2), and the closed form (i) bounds the add direction below it.
    orders = np.array([1.1, 2.0, 7.5, 64.0, 300.0, 2000.0])
    for steps, sigma in [(2, 0.5), (100, 1.0), (5000, 3.0)]:
        rdp = random_allocation_gaussian_rdp(num_steps=steps, noise_multiplier=sigma, orders=orders)
        assert np.all(rdp <= orders / (2 * sigma**2) * (1 + 1e-15))
        add = random_allocation_add_rdp(num_steps=steps, noise_multiplier=sigma, orders=orders)
        closed = [_add_closed_form(steps, sigma, o) for o in orders]
        assert np.all(add <= np.array(closed) * (1 + 1e-15))


def test_epsilon_below_the_unsampled_gaussian_for_several_epochs() -> None:
    sigma, steps = 1.0, 100
    orders = np.array([float(a) for a in range(2, 64)])
    epoch = random_allocation_gaussian_rdp(num_steps=steps, noise_multiplier=sigma, orders=orders)
    for epochs in (1, 10):
        ours, _ = epsilon_from_rdp(orders=orders, rdp=epochs * epoch, delta=1e-5)
        gaussian, _ = epsilon_from_rdp(
            orders=orders, rdp=epochs * orders / (2 * sigma**2), delta=1e-5
        )
        assert 0 < ours < gaussian


@pytest.mark.parametrize("sigma", [0.0, 1e-200])
def test_noiseless_is_infinite(sigma: float) -> None:
    rdp = random_allocation_gaussian_rdp(num_steps=10, noise_multiplier=sigma, orders=ORDERS)
    assert np.all(np.isinf(rdp))


def test_huge_noise_and_infinite_order() -> None:
    tiny = random_allocation_gaussian_rdp(num_steps=10, noise_multiplier=1e200, orders=ORDERS)
    assert np.all(tiny >= 0) and np.all(tiny <= 1e-300)  # a / (2 sigma^2) underflows
    both = random_allocation_gaussian_rdp(
        num_steps=10, noise_multiplier=2.0, orders=[2.0, math.inf]
    )
    assert math.isfinite(both[0]) and math.isinf(both[1])


# ----------------------------------------------------------------------------- accountant
def test_accountant_adds_epochs_and_refuses_other_relations() -> None:
    orders = [1.5, 2.0, 4.0, 8.0, 12.0, 32.0]
    epoch = RandomAllocationEvent(240, GaussianEvent(1.1))
    acc = RdpAccountant(orders=orders).compose(SelfComposedEvent(epoch, 60))
    per_epoch = random_allocation_gaussian_rdp(num_steps=240, noise_multiplier=1.1, orders=orders)
    assert np.array_equal(acc.rdp, 60 * per_epoch)
    assert 0 < acc.get_epsilon(1e-5) < math.inf
    assert RdpAccountant.from_json(acc.to_json()).get_epsilon(1e-5) == acc.get_epsilon(1e-5)
    replace = RdpAccountant(orders=orders, neighboring_relation=NeighboringRelation.REPLACE_ONE)
    assert not replace.supports(epoch)
    with pytest.raises(UnsupportedEventError, match="add_or_remove_one"):
        replace.compose(epoch)
    with pytest.raises(UnsupportedEventError, match="no rule"):
        RdpAccountant().compose(RandomAllocationEvent(10, LaplaceEvent(1.0)))


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"num_steps": 0}, "num_steps"),
        ({"num_steps": 2.5}, "num_steps"),
        ({"num_steps": True}, "num_steps"),
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": math.nan}, "noise_multiplier"),
        ({"noise_multiplier": math.inf}, "noise_multiplier"),
        ({"orders": [1.0]}, "orders"),
        ({"orders": [2.0, math.nan]}, "orders"),
        ({"orders": "2,3"}, "orders"),
        ({"orders": []}, "orders"),
    ],
)
def test_bad_parameters_raise(kwargs: dict[str, object], parameter: str) -> None:
    arguments: dict[str, object] = {"num_steps": 10, "noise_multiplier": 1.0, "orders": [2.0]}
    arguments.update(kwargs)
    for function in (
        random_allocation_remove_rdp,
        random_allocation_add_rdp,
        random_allocation_gaussian_rdp,
    ):
        with pytest.raises(InvalidParameterError, match=parameter):
            function(**arguments)  # type: ignore[arg-type]
