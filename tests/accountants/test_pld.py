"""The PLD accountant: certified intervals, exact oracles, and Google's dp_accounting as a peer."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpcore.accountants.pld import PldAccountant
from dpcore.errors import InvalidParameterError, UnsupportedEventError
from dpcore.events import (
    ComposedEvent,
    EpsilonDeltaEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
    dpsgd_event,
)
from dpcore.mechanisms.gaussian import gdp_delta, gdp_epsilon


def _peer_epsilon(q: float, sigma: float, steps: int, delta: float, spacing: float) -> float:
    # The peer discretises pessimistically too; give it our final grid so that both answer at
    # matching accuracy (its default 1e-4 is far coarser than an epsilon of 0.002 needs).
    peer = pld_privacy_accountant.PLDAccountant(value_discretization_interval=spacing)
    step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    peer.compose(dp_accounting.SelfComposedDpEvent(step, steps))
    return float(peer.get_epsilon(delta))


def _check_against_peer(q: float, sigma: float, steps: int) -> None:
    ours = PldAccountant().compose(
        dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    )
    interval = ours.get_epsilon_interval(1e-5)
    theirs = _peer_epsilon(q, sigma, steps, 1e-5, min(1e-4, interval.grid_spacing))
    # The acceptance rule: their (pessimistic) PLD epsilon lies in our certified
    # interval, or differs from our upper bound by less than 0.5%.
    inside = interval.lower <= theirs <= interval.upper
    assert inside or abs(theirs - interval.upper) < 5e-3 * interval.upper
    assert interval.relative_width <= 0.01


@pytest.mark.parametrize(
    ("q", "sigma", "steps"),
    [(0.01, 1.0, 1000), (0.001, 0.6, 10), (0.1, 2.0, 10), (0.01, 4.0, 10_000)],
)
def test_interval_agrees_with_dp_accounting(q: float, sigma: float, steps: int) -> None:
    _check_against_peer(q, sigma, steps)


@pytest.mark.parametrize("steps", [10, 1000, 10_000])
@pytest.mark.parametrize("sigma", [0.6, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("q", [0.001, 0.01, 0.1])
def test_interval_agrees_with_dp_accounting_full_grid(q: float, sigma: float, steps: int) -> None:
    _check_against_peer(q, sigma, steps)


@pytest.mark.parametrize("sigma", [0.8, 2.0])
def test_single_gaussian_matches_analytic_gaussian(sigma: float) -> None:
    accountant = PldAccountant().compose(GaussianEvent(sigma))
    exact = gdp_epsilon(mu=1 / sigma, delta=1e-6)  # Balle & Wang 2018, Thm 8
    interval = accountant.get_epsilon_interval(1e-6)
    assert interval.lower <= exact <= interval.upper
    assert interval.relative_width < 1e-3
    delta_interval = accountant.get_delta_interval(1.0)
    assert delta_interval.lower <= gdp_delta(mu=1 / sigma, epsilon=1.0) <= delta_interval.upper


def test_heterogeneous_gaussians_compose_like_gdp() -> None:
    # Gaussian steps with multipliers 2 and 3: mu^2 = 1/4 + 1/9 (Dong, Roth, Su 2019, Cor. 3.3).
    accountant = PldAccountant().compose(ComposedEvent([GaussianEvent(2.0), GaussianEvent(3.0)]))
    exact = gdp_epsilon(mu=math.sqrt(1 / 4 + 1 / 9), delta=1e-5)
    interval = accountant.get_epsilon_interval(1e-5)
    assert interval.lower <= exact <= interval.upper


def test_heterogeneous_dpsgd_phases_lie_between_their_parts() -> None:
    slow = dpsgd_event(sampling_probability=0.01, noise_multiplier=2.0, steps=500)
    fast = dpsgd_event(sampling_probability=0.02, noise_multiplier=1.0, steps=500)
    both = PldAccountant().compose(slow).compose(fast).get_epsilon(1e-5)
    only_slow = PldAccountant().compose(slow).get_epsilon(1e-5)
    only_fast = PldAccountant().compose(fast).get_epsilon(1e-5)
    assert max(only_slow, only_fast) < both < only_slow + only_fast


def test_laplace_steps_stay_below_basic_composition() -> None:
    accountant = PldAccountant().compose(LaplaceEvent(2.0), 10)
    epsilon = accountant.get_epsilon(1e-6)
    assert 0 < epsilon < 10 * 0.5


def test_pure_dp_event_is_exact() -> None:
    accountant = PldAccountant().compose(EpsilonDeltaEvent(1.0, 1e-7))
    interval = accountant.get_epsilon_interval(1e-6)
    assert interval.lower <= 1.0 + 1e-9
    assert interval.upper >= interval.lower
    assert accountant.get_delta(1.0) == pytest.approx(1e-7, abs=1e-12)


def test_boundaries() -> None:
    assert PldAccountant().get_epsilon(1e-5) == 0.0
    assert (
        PldAccountant()
        .compose(dpsgd_event(sampling_probability=0.0, noise_multiplier=1.0, steps=10))
        .get_epsilon(1e-5)
        == 0.0
    )
    assert (
        PldAccountant()
        .compose(dpsgd_event(sampling_probability=0.1, noise_multiplier=1.0, steps=0))
        .get_epsilon(1e-5)
        == 0.0
    )
    noiseless = PldAccountant().compose(
        dpsgd_event(sampling_probability=0.1, noise_multiplier=0.0, steps=3)
    )
    assert math.isinf(noiseless.get_epsilon(1e-5))
    assert noiseless.get_delta(10.0) == 1.0


def test_fixed_grid_is_respected_and_tighter_grids_narrow_the_interval() -> None:
    event = dpsgd_event(sampling_probability=0.05, noise_multiplier=1.0, steps=200)
    coarse = (
        PldAccountant(value_discretization_interval=1e-2).compose(event).get_epsilon_interval(1e-5)
    )
    fine = (
        PldAccountant(value_discretization_interval=1e-3).compose(event).get_epsilon_interval(1e-5)
    )
    assert coarse.grid_spacing == 1e-2 and fine.grid_spacing == 1e-3
    assert coarse.lower <= fine.lower <= fine.upper <= coarse.upper
    assert fine.relative_width < coarse.relative_width


def test_refuses_sampling_without_replacement() -> None:
    event = SampledWithoutReplacementEvent(10, 100, GaussianEvent(1.0))
    accountant = PldAccountant()
    assert not accountant.supports(event)
    with pytest.raises(UnsupportedEventError, match="SampledWithoutReplacementEvent"):
        accountant.compose(event)
    assert not accountant.supports(PoissonSampledEvent(0.1, RandomizedResponseEvent(0.5, 4)))


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"value_discretization_interval": 0.0}, "value_discretization_interval"),
        ({"value_discretization_interval": math.nan}, "value_discretization_interval"),
        ({"relative_tolerance": -0.1}, "relative_tolerance"),
    ],
)
def test_bad_configuration(kwargs: dict[str, float], parameter: str) -> None:
    with pytest.raises(InvalidParameterError, match=parameter):
        PldAccountant(**kwargs)


def test_state_round_trip_is_exact() -> None:
    accountant = PldAccountant().compose(
        dpsgd_event(sampling_probability=0.02, noise_multiplier=1.1, steps=300)
    )
    accountant.compose(GaussianEvent(5.0), 2)
    restored = PldAccountant.from_json(accountant.to_json())
    assert restored.to_json() == accountant.to_json()
    assert restored.get_epsilon(1e-5) == accountant.get_epsilon(1e-5)


@pytest.mark.parametrize(("q", "sigma", "steps"), [(0.5, 1.0, 342), (0.0001, 1.0, 1)])
def test_tiny_delta_keeps_the_bracket_ordered(q: float, sigma: float, steps: int) -> None:
    # Regressions found by the slow property search: at delta = 1e-12 FFT roundoff matters;
    # the bracket must stay ordered (an infinite upper end would be honest, crossing is not).
    event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    interval = PldAccountant().compose(event).get_epsilon_interval(1e-12)
    assert interval.lower <= interval.upper
