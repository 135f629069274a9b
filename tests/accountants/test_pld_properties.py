"""Hypothesis properties of the PLD accountant's new events: monotone in their parameters, and
group privacy at k = 1 is the event itself. Compared on the certified upper ends with a fixed
grid (the same discretisation on both sides), allowing a relative 1e-9 for rounding.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.accountants.pld import PldAccountant
from dpcore.events import (
    DpEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    MixtureOfGaussiansEvent,
    PoissonSampledEvent,
    RandomizedResponseEvent,
)

GRID = 1e-3
SLACK = 1 + 1e-9


def _epsilon(event: DpEvent, count: int = 5, **kwargs: int) -> float:
    accountant = PldAccountant(value_discretization_interval=GRID, **kwargs)
    return accountant.compose(event, count).get_epsilon(1e-6)


@settings(max_examples=6, deadline=None)
@given(
    q=st.floats(0.01, 0.5),
    more=st.floats(1.1, 2.0),
    scale=st.floats(0.5, 3.0),
    wider=st.floats(1.1, 2.0),
)
def test_sampled_laplace_grows_with_q_and_shrinks_with_scale(
    q: float, more: float, scale: float, wider: float
) -> None:
    base = _epsilon(PoissonSampledEvent(q, LaplaceEvent(scale)))
    assert base <= _epsilon(PoissonSampledEvent(min(1.0, q * more), LaplaceEvent(scale))) * SLACK
    assert _epsilon(PoissonSampledEvent(q, LaplaceEvent(scale * wider))) <= base * SLACK


@settings(max_examples=6, deadline=None)
@given(p=st.floats(0.05, 0.9), more=st.floats(1.05, 1.5), k=st.integers(2, 10))
def test_randomized_response_shrinks_with_noise_and_grows_with_buckets(
    p: float, more: float, k: int
) -> None:
    base = _epsilon(RandomizedResponseEvent(p, k))
    assert _epsilon(RandomizedResponseEvent(min(1.0, p * more), k)) <= base * SLACK
    assert base <= _epsilon(RandomizedResponseEvent(p, k + 1)) * SLACK


@settings(max_examples=6, deadline=None)
@given(epsilon=st.floats(0.01, 2.0), more=st.floats(1.05, 2.0))
def test_exponential_mechanism_grows_with_epsilon(epsilon: float, more: float) -> None:
    low = _epsilon(ExponentialMechanismEvent(epsilon))
    assert low <= _epsilon(ExponentialMechanismEvent(epsilon * more)) * SLACK


@settings(max_examples=6, deadline=None)
@given(c=st.floats(0.2, 1.5), more=st.floats(1.05, 1.5), p=st.floats(0.05, 0.5))
def test_mixture_grows_with_its_sensitivity(c: float, more: float, p: float) -> None:
    low = _epsilon(MixtureOfGaussiansEvent(1.0, (0.0, c), (1 - p, p)))
    assert low <= _epsilon(MixtureOfGaussiansEvent(1.0, (0.0, c * more), (1 - p, p))) * SLACK


@settings(max_examples=6, deadline=None)
@given(
    event=st.sampled_from(
        [
            GaussianEvent(1.5),
            LaplaceEvent(2.0),
            PoissonSampledEvent(0.1, GaussianEvent(1.0)),
            ExponentialMechanismEvent(0.3),
        ]
    ),
    count=st.integers(1, 20),
)
def test_group_of_one_is_the_event_itself(event: DpEvent, count: int) -> None:
    assert _epsilon(event, count, group_size=1) == _epsilon(event, count)
