"""Group privacy (neighbours that differ in k records) in the basic and RDP accountants.

Oracles: the group lemma written out by hand, (k eps, delta (1 + e^eps + ... + e^{(k-1) eps}))
(Dwork & Roth 2014, Thm 2.2 for delta = 0; the chain of (eps, delta) inequalities otherwise);
the Gaussian with sensitivity k is the Gaussian with noise sigma / k, RDP a k^2 / (2 sigma^2)
(Mironov 2017, Prop. 7); k = 1 must reproduce today's numbers exactly.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.accountants.basic import BasicCompositionAccountant, group_epsilon_delta
from dpcore.accountants.rdp import OrderGridEdgeWarning, RdpAccountant
from dpcore.accountants.rdp_math import laplace_rdp, pure_dp_rdp
from dpcore.errors import InvalidParameterError, UnsupportedEventError
from dpcore.events import (
    ComposedEvent,
    DpEvent,
    EpsilonDeltaEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    MixtureOfGaussiansEvent,
    PoissonSampledEvent,
    RandomAllocationEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
    dpsgd_event,
)


def test_group_lemma_hand_values() -> None:
    # k = 3, eps = 1, delta = 1e-6: (3, 1e-6 (1 + e + e^2)) = (3, 1.1107337927389695e-05).
    epsilon, delta = group_epsilon_delta(epsilon=1.0, delta=1e-6, group_size=3)
    assert epsilon == 3.0
    assert delta == pytest.approx(1e-6 * (1 + math.e + math.e**2), rel=1e-14)
    assert delta >= 1e-6 * math.fsum([1, math.e, math.e**2])  # rounded up, never down
    assert group_epsilon_delta(epsilon=0.5, delta=0.0, group_size=4) == (2.0, 0.0)
    assert group_epsilon_delta(epsilon=0.0, delta=1e-3, group_size=5)[1] == pytest.approx(5e-3)
    assert group_epsilon_delta(epsilon=0.7, delta=1e-3, group_size=1) == (0.7, 1e-3)
    # e^{(k-1) eps} beyond the float range: a delta of 1 (nothing certified), never an overflow.
    assert group_epsilon_delta(epsilon=800.0, delta=1e-9, group_size=3) == (2400.0, 1.0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_group_size_is_validated(bad: object) -> None:
    for cls in (BasicCompositionAccountant, RdpAccountant):
        with pytest.raises(InvalidParameterError, match="group_size"):
            cls(group_size=bad)  # type: ignore[call-arg, arg-type]
    with pytest.raises(InvalidParameterError, match="group_size"):
        group_epsilon_delta(epsilon=1.0, delta=0.0, group_size=bad)  # type: ignore[arg-type]


def test_basic_group_of_fixed_steps() -> None:
    accountant = (
        BasicCompositionAccountant(group_size=3)
        .compose(EpsilonDeltaEvent(0.5, 1e-7), 10)
        .compose(LaplaceEvent(4.0), 2)
    )
    step_delta = 1e-7 * (1 + math.exp(0.5) + math.exp(1.0))
    assert accountant.get_epsilon(1e-4) == pytest.approx(10 * 1.5 + 2 * 0.75, rel=1e-14)
    assert accountant.get_delta(16.5) == pytest.approx(10 * step_delta, rel=1e-12)
    assert math.isinf(accountant.get_epsilon(9 * step_delta))  # the steps alone spend more


@pytest.mark.parametrize("k", [2, 5])
def test_basic_group_of_an_unsampled_gaussian_is_the_gaussian_with_sensitivity_k(k: int) -> None:
    grouped = BasicCompositionAccountant(group_size=k).compose(GaussianEvent(3.0), 4)
    scaled = BasicCompositionAccountant().compose(GaussianEvent(3.0 / k), 4)
    assert grouped.get_epsilon(1e-5) == scaled.get_epsilon(1e-5)


def test_basic_group_of_sampled_gaussians_is_certified_and_larger() -> None:
    event = dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=100)
    values = [
        BasicCompositionAccountant(group_size=k).compose(event).get_epsilon(1e-5) for k in (1, 2, 3)
    ]
    assert values[0] < values[1] < values[2] < math.inf
    accountant = BasicCompositionAccountant(group_size=3).compose(event)
    # The delta actually spent by the chosen split, after the group lemma, is within the target.
    steps = accountant._gaussian_steps(1e-5 - accountant._fixed_delta())
    assert accountant._spent(steps) <= 1e-5
    # Each step: k times the amplified epsilon at some inner delta d, spending q d S_k.
    (_, spent, count) = steps[0]
    assert count == 100 and 0 < spent <= 1e-7


def test_basic_group_size_survives_save_and_load() -> None:
    accountant = BasicCompositionAccountant(group_size=4).compose(LaplaceEvent(2.0), 3)
    restored = BasicCompositionAccountant.from_json(accountant.to_json())
    assert restored.group_size == 4
    assert restored.get_epsilon(1e-6) == accountant.get_epsilon(1e-6) == 6.0


def test_rdp_group_closed_forms() -> None:
    k = 3
    accountant = RdpAccountant(group_size=k)
    orders = accountant.orders
    accountant.compose(GaussianEvent(2.0))
    assert accountant.rdp == pytest.approx(orders * k**2 / 8, rel=1e-14)  # a k^2 / (2 sigma^2)
    laplace = RdpAccountant(group_size=k).compose(LaplaceEvent(6.0))
    assert np.array_equal(laplace.rdp, laplace_rdp(noise_multiplier=2.0, orders=orders))
    pure = RdpAccountant(group_size=k).compose(EpsilonDeltaEvent(0.2))
    assert np.array_equal(pure.rdp, pure_dp_rdp(epsilon=3 * 0.2, orders=orders))
    rr = RdpAccountant(group_size=k).compose(RandomizedResponseEvent(0.5, 2))
    expected = pure_dp_rdp(epsilon=3 * math.log(3), orders=orders)
    assert rr.rdp == pytest.approx(expected, rel=1e-15)
    em = RdpAccountant(group_size=k).compose(ExponentialMechanismEvent(0.1))
    # 3 x 0.1 bounded range: min(0.3, a 0.09 / 8) (Cesar & Rogers 2021).
    assert em.rdp == pytest.approx(np.minimum(0.3, orders * 0.09 / 8), rel=1e-14)
    assert em.get_epsilon(0.0) == pytest.approx(0.3, rel=1e-15)


@pytest.mark.parametrize(
    "event",
    [
        PoissonSampledEvent(0.1, GaussianEvent(1.0)),
        MixtureOfGaussiansEvent(1.0, (0.0, 1.0, 2.0), (0.8, 0.1, 0.1)),
        RandomAllocationEvent(10, GaussianEvent(1.0)),
    ],
    ids=["poisson", "mixture", "allocation"],
)
def test_rdp_group_refuses_events_whose_group_rdp_is_not_a_rescaling(event: DpEvent) -> None:
    accountant = RdpAccountant(group_size=2)
    assert not accountant.supports(event)
    with pytest.raises(UnsupportedEventError, match="group privacy"):
        accountant.compose(event)
    assert RdpAccountant().supports(event)  # fine for individuals


def test_rdp_group_refuses_sampling_without_replacement() -> None:
    event = SampledWithoutReplacementEvent(10, 100, GaussianEvent(1.0))
    with pytest.raises(UnsupportedEventError, match="group privacy"):
        RdpAccountant(neighboring_relation="replace_one", group_size=2).compose(event)


def test_rdp_group_size_survives_save_and_load() -> None:
    accountant = RdpAccountant(group_size=2).compose(GaussianEvent(4.0), 10)
    restored = RdpAccountant.from_json(accountant.to_json())
    assert restored.group_size == 2
    assert np.array_equal(restored.rdp, accountant.rdp)


def test_group_of_one_keeps_the_state_format_readable() -> None:
    # State saved before group_size existed has no such key; it still loads (default 1).
    state = RdpAccountant().compose(GaussianEvent(2.0)).state()
    del state["config"]["group_size"]
    assert RdpAccountant.from_state(state).group_size == 1


leaf_events = st.one_of(
    st.builds(GaussianEvent, st.floats(min_value=0.3, max_value=20.0)),
    st.builds(LaplaceEvent, st.floats(min_value=0.1, max_value=20.0)),
    st.builds(EpsilonDeltaEvent, st.floats(min_value=0.0, max_value=3.0)),
    st.builds(ExponentialMechanismEvent, st.floats(min_value=0.0, max_value=3.0)),
    st.builds(
        RandomizedResponseEvent,
        st.floats(min_value=0.01, max_value=1.0),
        st.integers(min_value=2, max_value=20),
    ),
    st.builds(
        lambda q, s: PoissonSampledEvent(q, GaussianEvent(s)),
        st.floats(min_value=0.001, max_value=0.5),
        st.floats(min_value=0.5, max_value=10.0),
    ),
)


@settings(max_examples=25, deadline=None)
@given(events=st.lists(leaf_events, min_size=1, max_size=4), count=st.integers(1, 50))
def test_group_of_one_reproduces_the_individual_numbers_exactly(
    events: list[DpEvent], count: int
) -> None:
    event = ComposedEvent(events)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        one = RdpAccountant(group_size=1).compose(event, count)
        default = RdpAccountant().compose(event, count)
        assert np.array_equal(one.rdp, default.rdp)
        assert one.get_epsilon(1e-5) == default.get_epsilon(1e-5)
        basic_one = BasicCompositionAccountant(group_size=1).compose(event, count)
        basic_default = BasicCompositionAccountant().compose(event, count)
        assert basic_one.get_epsilon(1e-5) == basic_default.get_epsilon(1e-5)
        assert basic_one.get_epsilon(0.0) == basic_default.get_epsilon(0.0)


@settings(max_examples=15, deadline=None)
@given(events=st.lists(leaf_events, min_size=1, max_size=3), k=st.integers(2, 5))
def test_larger_groups_never_get_smaller_epsilons(events: list[DpEvent], k: int) -> None:
    event = ComposedEvent(events)
    one = BasicCompositionAccountant().compose(event).get_epsilon(1e-5)
    group = BasicCompositionAccountant(group_size=k).compose(event).get_epsilon(1e-5)
    assert group >= one
