"""The JL accountant (Bu et al. 2021, Thm 4.1): limits, monotonicity in r, validity.

Reference values: DP-SGD's certified PLD interval on the same (q, sigma, T) (a second
accountant); the JL mechanism tends to DP-SGD as r grows since sqrt(r / X) -> 1 for X ~ chi^2_r.
"""

from __future__ import annotations

import math

import pytest

from dpcore.accountants import JlAccountant, PldAccountant, RdpAccountant
from dpcore.errors import InvalidParameterError, UnsupportedEventError
from dpcore.events import (
    GaussianEvent,
    JLGaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    dpsgd_event,
)

Q, SIGMA, STEPS, DELTA = 0.01, 1.0, 1000, 1e-5


def _jl_interval(r: int, **kwargs: float) -> tuple[float, float]:
    step = PoissonSampledEvent(Q, JLGaussianEvent(SIGMA, r))
    interval = JlAccountant(**kwargs).compose(step, STEPS).get_epsilon_interval(DELTA)  # type: ignore[arg-type]
    return interval.lower, interval.upper


def test_large_r_recovers_dpsgd_within_the_numerical_error() -> None:
    lower, upper = _jl_interval(1000)
    event = dpsgd_event(sampling_probability=Q, noise_multiplier=SIGMA, steps=STEPS)
    exact = PldAccountant().compose(event).get_epsilon_interval(DELTA)
    assert lower <= exact.upper and exact.lower <= upper  # the intervals overlap
    assert (upper - lower) / upper < 0.03  # the stated numerical error is small here
    assert upper == pytest.approx(exact.upper, rel=0.01)


def test_epsilon_decreases_in_r_towards_dpsgd() -> None:
    intervals = {r: _jl_interval(r) for r in (10, 30, 1000)}
    assert intervals[10][1] > intervals[30][1] > intervals[1000][1]
    # Not just the upper ends: the certified lower end for r = 10 exceeds r = 30's upper end.
    assert intervals[10][0] > intervals[30][1]


def test_gaussian_steps_are_accounted_like_the_pld_accountant() -> None:
    event = dpsgd_event(sampling_probability=Q, noise_multiplier=SIGMA, steps=STEPS)
    ours = JlAccountant().compose(event).get_epsilon_interval(DELTA)
    pld = PldAccountant().compose(event).get_epsilon_interval(DELTA)
    assert ours.upper == pytest.approx(pld.upper, rel=1e-12)


def test_mixed_runs_compose_and_other_accountants_refuse_jl_steps() -> None:
    jl_step = PoissonSampledEvent(Q, JLGaussianEvent(SIGMA, 30))
    gaussian_step = PoissonSampledEvent(Q, GaussianEvent(SIGMA))
    mixed = JlAccountant().compose(jl_step, 100).compose(gaussian_step, 100)
    only_gaussian = PldAccountant().compose(gaussian_step, 100)
    assert mixed.get_epsilon(DELTA) > only_gaussian.get_epsilon(DELTA)
    with pytest.raises(UnsupportedEventError, match="JLGaussianEvent"):
        RdpAccountant().compose(SelfComposedEvent(jl_step, 3))


def test_noiseless_jl_is_not_private_and_nothing_costs_nothing() -> None:
    noiseless = JlAccountant().compose(PoissonSampledEvent(Q, JLGaussianEvent(0.0, 4)), 1)
    assert math.isinf(noiseless.get_epsilon(DELTA))
    assert (
        JlAccountant().compose(PoissonSampledEvent(0.0, JLGaussianEvent(1.0, 4))).get_epsilon(DELTA)
        == 0.0
    )


@pytest.mark.parametrize(
    ("kwargs", "parameter"), [({"grid_spacing": 0.0}, "grid_spacing"), ({"bins": 3}, "bins")]
)
def test_bad_configuration(kwargs: dict[str, float], parameter: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        JlAccountant(**kwargs)  # type: ignore[arg-type]
