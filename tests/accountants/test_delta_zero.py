"""Epsilon at target_delta = 0: the pure-DP epsilon where one is certified, inf elsewhere.

Oracles: pure epsilons written out by hand -- Laplace 1/b (Dwork & Roth 2014, Thm 3.6),
randomized response log(1 + k (1 - p) / p) from its output probabilities, the exponential
mechanism's epsilon -- summed by basic composition (Dwork & Roth 2014, Thm 3.16).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.accountants import accountant_class
from dpcore.accountants.advanced import AdvancedCompositionAccountant
from dpcore.accountants.basic import BasicCompositionAccountant
from dpcore.accountants.gdp_clt import GdpCltAccountant
from dpcore.accountants.moments import MomentsAccountant
from dpcore.accountants.rdp import RdpAccountant
from dpcore.errors import InvalidParameterError
from dpcore.events import (
    ComposedEvent,
    EpsilonDeltaEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    MixtureOfGaussiansEvent,
    PoissonSampledEvent,
    RandomizedResponseEvent,
    dpsgd_event,
)

PURE_STEPS = ComposedEvent(
    [
        LaplaceEvent(2.0),  # 1/2
        RandomizedResponseEvent(0.5, 2),  # (1 - 0.5 + 0.25) / 0.25 = 3: log 3
        ExponentialMechanismEvent(0.3),  # 0.3
        EpsilonDeltaEvent(0.7),  # 0.7
    ]
)
PURE_SUM = 0.5 + math.log(3) + 0.3 + 0.7
POOLS = (BasicCompositionAccountant, AdvancedCompositionAccountant, RdpAccountant)


@pytest.mark.parametrize("cls", POOLS, ids=lambda c: c.name)
def test_pure_composition_gives_the_exact_sum(cls: type) -> None:
    accountant = cls().compose(PURE_STEPS, 3)
    assert accountant.get_epsilon(0.0) == pytest.approx(3 * PURE_SUM, rel=1e-14)
    assert accountant.get_epsilon(0) == accountant.get_epsilon(0.0)  # an int 0 is accepted
    # Consistency with delta(epsilon): delta is exactly 0 at the pure sum and above it ...
    assert accountant.get_delta(accountant.get_epsilon(0.0)) == 0.0
    assert accountant.get_delta(3 * PURE_SUM + 1.0) == 0.0
    # ... and epsilon is non-increasing in delta.
    assert accountant.get_epsilon(1e-6) <= accountant.get_epsilon(0.0)


@pytest.mark.parametrize("cls", POOLS, ids=lambda c: c.name)
@pytest.mark.parametrize(
    "noisy",
    [
        GaussianEvent(5.0),
        dpsgd_event(sampling_probability=0.01, noise_multiplier=2.0, steps=10),
    ],
    ids=["gaussian", "sampled gaussian"],
)
def test_anything_gaussian_gives_inf(cls: type, noisy: object) -> None:
    accountant = cls().compose(PURE_STEPS).compose(noisy)  # type: ignore[arg-type]
    assert math.isinf(accountant.get_epsilon(0.0))
    # At the pure steps' own sum the Gaussian part still needs a positive delta.
    assert accountant.get_delta(PURE_SUM) > 0
    assert math.isfinite(accountant.get_epsilon(1e-5))


def test_rdp_mixture_with_a_shift_gives_inf_and_without_gives_zero() -> None:
    shifted = MixtureOfGaussiansEvent(2.0, (0.0, 1.0, 2.0), (0.8, 0.1, 0.1))
    assert math.isinf(RdpAccountant().compose(shifted).get_epsilon(0.0))
    unshifted = MixtureOfGaussiansEvent(2.0, (0.0, 1.0), (1.0, 0.0))
    assert RdpAccountant().compose(unshifted).get_epsilon(0.0) == 0.0


def test_basic_and_advanced_deltas_above_zero_give_inf() -> None:
    for cls in (BasicCompositionAccountant, AdvancedCompositionAccountant):
        accountant = cls().compose(PURE_STEPS).compose(EpsilonDeltaEvent(0.1, 1e-9))
        assert math.isinf(accountant.get_epsilon(0.0))
        assert accountant.get_epsilon(1e-9) == pytest.approx(PURE_SUM + 0.1, rel=1e-14)


def test_sampled_pure_steps_stay_pure() -> None:
    # Amplification keeps delta = 0: log(1 + q (e^eps - 1)) (Balle, Barthe, Gaboardi 2018, Thm 8).
    event = PoissonSampledEvent(0.2, LaplaceEvent(1.0))
    expected = 5 * math.log1p(0.2 * (math.e - 1))
    accountant = BasicCompositionAccountant().compose(event, 5)
    assert accountant.get_epsilon(0.0) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("cls", [MomentsAccountant, GdpCltAccountant], ids=["moments", "gdp_clt"])
def test_gaussian_only_accountants_give_inf_after_a_step_and_zero_before(cls: type) -> None:
    assert cls().get_epsilon(0.0) == 0.0
    accountant = cls().compose(
        dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=100)
    )
    assert math.isinf(accountant.get_epsilon(0.0))


def test_rdp_order_at_delta_zero_is_infinity() -> None:
    accountant = RdpAccountant().compose(LaplaceEvent(1.0), 2)
    assert accountant.get_epsilon_and_order(0.0) == (2.0, math.inf)
    # At delta = 1e-6 the pure sum 2 is below the RDP conversion, so it is the answer, at order inf.
    epsilon, order = accountant.get_epsilon_and_order(1e-6)
    assert epsilon == 2.0 and order == math.inf


@pytest.mark.parametrize("name", ["basic", "advanced", "moments", "rdp", "gdp_clt"])
@pytest.mark.parametrize("bad", [-1e-12, 1.0, 1.5, math.nan, math.inf, "0"])
def test_delta_outside_the_closed_range_is_refused(name: str, bad: object) -> None:
    with pytest.raises(InvalidParameterError, match=r"target_delta .*\[0, 1\)"):
        accountant_class(name)().get_epsilon(bad)  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(
    scales=st.lists(st.floats(min_value=0.05, max_value=20.0), min_size=1, max_size=5),
    epsilons=st.lists(st.floats(min_value=0.0, max_value=3.0), max_size=4),
)
def test_basic_and_rdp_agree_on_pure_sums(scales: list[float], epsilons: list[float]) -> None:
    events = [LaplaceEvent(b) for b in scales] + [ExponentialMechanismEvent(e) for e in epsilons]
    expected = math.fsum([1 / b for b in scales] + epsilons)
    for cls in (BasicCompositionAccountant, RdpAccountant):
        accountant = cls().compose(ComposedEvent(events))
        assert accountant.get_epsilon(0.0) == pytest.approx(expected, rel=1e-12)
        assert accountant.get_delta(accountant.get_epsilon(0.0)) == 0.0
