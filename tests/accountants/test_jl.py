"""The JL accountant (Bu et al. 2021, Thm 4.1): limits, monotonicity in r, validity.

Reference values: DP-SGD's certified PLD interval on the same (q, sigma, T) (a second
accountant); the JL mechanism tends to DP-SGD as r grows since sqrt(r / X) -> 1 for X ~ chi^2_r.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
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
from dpcore.pld import jl_pairs

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


def _nested_edges(edges: np.ndarray) -> np.ndarray:
    """Split every probability bin in two (geometric midpoints in the log-spaced tail)."""
    left, right = edges[:-1], edges[1:]
    middle = np.where(right <= 0.05, np.sqrt(np.maximum(left, 1e-300) * right), (left + right) / 2)
    middle[0] = right[0] / 2
    return np.unique(np.concatenate([edges, middle]))


@pytest.mark.parametrize(
    ("q", "sigma", "r"),
    [(256 / 60_000, 1.1, 1), (0.01, 1.0, 10)],
)
def test_nested_bin_refinement_narrows_the_interval(
    q: float, sigma: float, r: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Splitting shift bins can only raise the lower end and lower the upper end.

    Each split bin's smallest shift grows and its largest shrinks, so the refined optimistic pair
    dominates the coarse one and the refined pessimistic pair is dominated by the coarse one.
    A 3,000-cell budget keeps it fast and puts the heavy r = 1 tail on the geometric cells.
    """
    monkeypatch.setattr(jl_pairs, "_MAX_BULK_CELLS", 3_000)
    edges = jl_pairs._probability_edges(16)
    intervals = []
    for _ in range(3):
        monkeypatch.setattr(jl_pairs, "_probability_edges", lambda bins, e=edges: e)
        step = PoissonSampledEvent(q, JLGaussianEvent(sigma, r))
        accountant = JlAccountant(grid_spacing=1e-2).compose(step, 100)
        intervals.append(accountant.get_epsilon_interval(DELTA))
        edges = _nested_edges(edges)
    for coarse, fine in itertools.pairwise(intervals):
        assert coarse.lower <= fine.lower * (1 + 1e-9)
        assert fine.upper <= coarse.upper * (1 + 1e-9)
        assert fine.lower <= fine.upper


def test_lower_end_is_finite_when_every_loss_is() -> None:
    """Every privacy loss of a JL step is finite (Q = N(0, s^2) has full support), so the true
    epsilon is finite and so must be the certified lower end, even where the upper end is
    infinite (r = 3 has heavy tails: shifts beyond the top of the loss grid, 700)."""
    step = PoissonSampledEvent(Q, JLGaussianEvent(SIGMA, 3))
    interval = (
        JlAccountant(grid_spacing=1e-2, bins=16).compose(step, 100).get_epsilon_interval(DELTA)
    )
    assert math.isfinite(interval.lower) and interval.lower <= interval.upper
