"""RDP: closed forms against mpmath, and Google's dp_accounting order by order."""

from __future__ import annotations

import math
import warnings

import dp_accounting
import mpmath
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as peer

from dpcore.accountants.base import NeighboringRelation
from dpcore.accountants.rdp import DEFAULT_ORDERS, OrderGridEdgeWarning, RdpAccountant
from dpcore.accountants.rdp_math import (
    epsilon_from_rdp,
    laplace_rdp,
    pure_dp_rdp,
    subsampled_gaussian_rdp,
)
from dpcore.errors import InvalidParameterError, UnsupportedEventError
from dpcore.events import (
    EpsilonDeltaEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    dpsgd_event,
)


def _renyi_oracle(q: float, sigma: float, order: float) -> float:
    """D_a(mixture || N(0, s^2)) by mpmath quadrature (the definition, Mironov 2017, Def. 3)."""
    mpmath.mp.dps = 40
    mix = lambda x: (1 - q) * mpmath.npdf(x, 0, sigma) + q * mpmath.npdf(x, 1, sigma)  # noqa: E731
    integrand = lambda x: mix(x) ** order * mpmath.npdf(x, 0, sigma) ** (1 - order)  # noqa: E731
    value = mpmath.quad(integrand, [-mpmath.inf, -10, 0, 1, order + 1, 3 * order + 10, mpmath.inf])
    return float(mpmath.log(value) / (order - 1))


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (0.1, 2.0), (0.3, 1.5)])
@pytest.mark.parametrize("order", [1.5, 2.0, 3.7, 8.0, 16.0])
def test_subsampled_gaussian_matches_quadrature(q: float, sigma: float, order: float) -> None:
    ours = subsampled_gaussian_rdp(
        sampling_probability=q, noise_multiplier=sigma, orders=np.array([order])
    )[0]
    oracle = _renyi_oracle(q, sigma, order)
    if float(order).is_integer():
        assert ours == pytest.approx(oracle, rel=1e-9)  # the binomial expansion is exact
    else:
        # The fractional series sums the magnitudes of alternating terms (as dp_accounting
        # does): a valid upper bound, possibly loose or infinite, never below the truth.
        assert ours >= oracle * (1 - 1e-9)


@pytest.mark.parametrize("scale", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("order", [1.05, 2.0, 7.5])
def test_laplace_matches_quadrature(scale: float, order: float) -> None:
    mpmath.mp.dps = 40
    p = lambda x: mpmath.exp(-abs(x) / scale) / (2 * scale)  # noqa: E731
    q = lambda x: mpmath.exp(-abs(x - 1) / scale) / (2 * scale)  # noqa: E731
    value = mpmath.quad(
        lambda x: p(x) ** order * q(x) ** (1 - order), [-mpmath.inf, 0, 1, mpmath.inf]
    )
    oracle = float(mpmath.log(value) / (order - 1))
    assert laplace_rdp(noise_multiplier=scale, orders=np.array([order]))[0] == pytest.approx(
        oracle, rel=1e-9
    )


def _peer_epsilon(event: dp_accounting.DpEvent, delta: float, relation=None) -> float:  # type: ignore[no-untyped-def]
    kwargs = {} if relation is None else {"neighboring_relation": relation}
    accountant = peer.RdpAccountant(**kwargs)
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def _check_dpsgd(q: float, sigma: float, steps: int) -> None:
    """Equal to dp_accounting at integer orders; never looser on the default grid.

    dp_accounting 0.6 bounds fractional orders by the sum of the series' magnitudes, ours by
    the certified signed sum (tests/accountants/test_rdp_fractional.py), which is smaller.
    """
    event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    peer_event = dp_accounting.SelfComposedDpEvent(step, steps)
    integers = list(range(2, 257))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        value = RdpAccountant().compose(event).get_epsilon(1e-5)
        on_integers = RdpAccountant(orders=integers).compose(event).get_epsilon(1e-5)
    accountant = peer.RdpAccountant(orders=integers)
    accountant.compose(peer_event)
    assert on_integers == pytest.approx(float(accountant.get_epsilon(1e-5)), rel=1e-6)
    assert value <= _peer_epsilon(peer_event, 1e-5) * (1 + 1e-9)


@pytest.mark.parametrize(
    ("q", "sigma", "steps"), [(0.01, 1.0, 1000), (0.1, 0.6, 10), (0.001, 4.0, 10_000)]
)
def test_dpsgd_epsilon_equals_dp_accounting(q: float, sigma: float, steps: int) -> None:
    _check_dpsgd(q, sigma, steps)


@pytest.mark.parametrize("steps", [10, 1000, 10_000])
@pytest.mark.parametrize("sigma", [0.6, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("q", [0.001, 0.01, 0.1])
def test_dpsgd_epsilon_equals_dp_accounting_full_grid(q: float, sigma: float, steps: int) -> None:
    _check_dpsgd(q, sigma, steps)


def test_laplace_and_without_replacement_equal_dp_accounting() -> None:
    ours = RdpAccountant().compose(LaplaceEvent(2.0), 5)
    theirs = _peer_epsilon(
        dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(2.0), 5), 1e-6
    )
    # The RDP conversion alone reproduces dp_accounting (pure-DP-like: the optimum is the largest
    # order); the pure-DP sum 5 x 1/2 = 2.5 (Dwork & Roth 2014, Thm 3.6 and 3.16) is smaller here,
    # and pure DP is (epsilon, delta)-DP for every delta, so get_epsilon returns it.
    value, order = epsilon_from_rdp(orders=ours.orders, rdp=ours.rdp, delta=1e-6)
    assert value == pytest.approx(theirs, rel=1e-6)
    assert order == ours.orders[-1]
    assert ours.get_epsilon(1e-6) == 2.5 < theirs
    with pytest.warns(OrderGridEdgeWarning):  # the optimum of a two-order grid is its largest
        RdpAccountant(orders=[1.5, 2.0]).compose(LaplaceEvent(2.0), 5).get_epsilon(1e-1)
    wor = RdpAccountant(neighboring_relation="replace_one").compose(
        SampledWithoutReplacementEvent(256, 60_000, GaussianEvent(1.1)), 2000
    )
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        60_000, 256, dp_accounting.GaussianDpEvent(1.1)
    )
    theirs = _peer_epsilon(
        dp_accounting.SelfComposedDpEvent(event, 2000),
        1e-5,
        dp_accounting.NeighboringRelation.REPLACE_ONE,
    )
    assert wor.get_epsilon(1e-5) == pytest.approx(theirs, rel=1e-6)


def test_pure_dp_rdp_is_the_zcdp_bound() -> None:
    orders = np.array([1.5, 10.0, 1000.0])
    assert np.allclose(pure_dp_rdp(epsilon=0.1, orders=orders), np.minimum(0.1, orders * 0.005))


def test_conversion_golden() -> None:
    # One Gaussian with sigma = 1 at order 2: RDP = 1; eps = 1 + log(1/2) - (log 1e-5 + log 2) / 1
    # (Canonne, Kamath, Steinke 2020, Prop. 12) = 11.512925... ; min over one order.
    epsilon, order = epsilon_from_rdp(orders=[2.0], rdp=[1.0], delta=1e-5)
    assert order == 2.0
    assert epsilon == pytest.approx(1 + math.log(0.5) - math.log(1e-5 * 2))


def test_edge_of_grid_warns() -> None:
    accountant = RdpAccountant(orders=[2.0, 3.0]).compose(GaussianEvent(10.0))
    with pytest.warns(OrderGridEdgeWarning, match="largest of the grid"):
        accountant.get_epsilon(1e-5)


def test_relations_are_enforced() -> None:
    wor = SampledWithoutReplacementEvent(10, 100, GaussianEvent(1.0))
    with pytest.raises(UnsupportedEventError, match="replace_one"):
        RdpAccountant().compose(wor)
    with pytest.raises(UnsupportedEventError, match="add_or_remove_one"):
        RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE).compose(
            PoissonSampledEvent(0.1, GaussianEvent(1.0))
        )
    with pytest.raises(UnsupportedEventError, match="delta > 0"):
        RdpAccountant().compose(EpsilonDeltaEvent(1.0, 1e-6))


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"orders": []}, "orders"),
        ({"orders": [1.0, 2.0]}, "orders"),
        ({"orders": [math.nan]}, "orders"),
        ({"orders": "2,3"}, "orders"),
        ({"neighboring_relation": "swap"}, "neighboring_relation"),
    ],
)
def test_bad_configuration(kwargs: dict[str, object], parameter: str) -> None:
    with pytest.raises(InvalidParameterError, match=parameter):
        RdpAccountant(**kwargs)  # type: ignore[arg-type]


def test_default_orders_are_dp_accountings() -> None:
    assert list(DEFAULT_ORDERS) == [float(o) for o in peer.DEFAULT_RDP_ORDERS]
