"""Grid PLD operations: splitting dominates, garbling is dominated, composition is exact."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcore.errors import ResourceLimitError
from dpcore.mechanisms.gaussian import gdp_delta, gdp_epsilon
from dpcore.pld.loss_pmf import LossPmf, compose_many, garble_atoms, split_atoms
from dpcore.pld.pairs import subsampled_gaussian_pairs

SPACING = 0.05


def _exact_delta(p: np.ndarray, q: np.ndarray, epsilon: float) -> float:
    """Hockey stick sum (p - e^eps q)_+ of a discrete pair (the definition)."""
    return float(np.maximum(p - math.exp(epsilon) * q, 0.0).sum())


@st.composite
def discrete_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    size = draw(st.integers(min_value=1, max_value=6))
    weights = st.floats(min_value=0.01, max_value=1.0)
    p = np.array(draw(st.lists(weights, min_size=size, max_size=size)))
    q = np.array(draw(st.lists(weights, min_size=size, max_size=size)))
    return p / p.sum(), q / q.sum()


def _bounds(p: np.ndarray, q: np.ndarray) -> tuple[LossPmf, LossPmf]:
    losses = np.log(p / q) / SPACING
    lo, hi = math.floor(losses.min()) - 1, math.ceil(losses.max()) + 1
    upper = split_atoms(p_masses=p, q_masses=q, grid_spacing=SPACING)
    lower = garble_atoms(p_masses=p, q_masses=q, grid_spacing=SPACING, min_index=lo, max_index=hi)
    return upper, lower


@settings(max_examples=60, deadline=None)
@given(discrete_pairs(), st.floats(min_value=0.0, max_value=3.0))
def test_split_dominates_and_garble_is_dominated(
    pair: tuple[np.ndarray, np.ndarray], epsilon: float
) -> None:
    p, q = pair
    upper, lower = _bounds(p, q)
    exact = _exact_delta(p, q, epsilon)
    assert lower.delta(epsilon) <= exact + 1e-12
    assert exact <= upper.delta(epsilon) + 1e-12


@settings(max_examples=40, deadline=None)
@given(discrete_pairs())
def test_split_preserves_both_measures(pair: tuple[np.ndarray, np.ndarray]) -> None:
    p, q = pair
    upper = split_atoms(p_masses=p, q_masses=q, grid_spacing=SPACING)
    assert upper.pmf.sum() + upper.infinity_mass == pytest.approx(1.0, abs=1e-12)
    assert float(upper.pmf @ np.exp(-upper.losses())) == pytest.approx(1.0, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(discrete_pairs(), discrete_pairs(), st.floats(min_value=0.0, max_value=3.0))
def test_composition_brackets_the_product_pair(
    first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray], epsilon: float
) -> None:
    # Exact composition: the product distributions, enumerated.
    p = np.array([a * b for a, b in itertools.product(first[0], second[0])])
    q = np.array([a * b for a, b in itertools.product(first[1], second[1])])
    exact = _exact_delta(p, q, epsilon)
    up1, lo1 = _bounds(*first)
    up2, lo2 = _bounds(*second)
    assert lo1.compose(lo2).delta(epsilon) <= exact + 1e-12
    assert exact <= up1.compose(up2).delta(epsilon) + 1e-12


def test_infinity_mass_composes_as_a_union() -> None:
    p, q = np.array([0.2, 0.5, 0.3]), np.array([0.5, 0.5, 0.0])
    single = split_atoms(p_masses=p, q_masses=q, grid_spacing=SPACING)
    assert single.infinity_mass == pytest.approx(0.3)
    assert single.self_compose(3).infinity_mass == pytest.approx(1 - 0.7**3)


@pytest.mark.parametrize("count", [1, 7, 10_000])
def test_self_composed_gaussian_matches_gdp(count: int) -> None:
    # T Gaussian steps with multiplier s are exactly one Gaussian with s / sqrt(T), i.e.
    # mu-GDP with mu = sqrt(T) / s (Dong, Roth, Su 2019, Cor. 3.3); T = 10^4 exercises the
    # Chernoff-truncated FFT window.
    sigma = math.sqrt(count) / 1.5
    remove, _ = subsampled_gaussian_pairs(sampling_probability=1.0, noise_multiplier=sigma)
    spacing = 2e-3 / math.sqrt(count) if count > 1 else 1e-3
    upper = remove.pessimistic(spacing).self_compose(count)
    lower = remove.optimistic(spacing).self_compose(count)
    for epsilon in (0.0, 1.0, 3.0):
        exact = gdp_delta(mu=1.5, epsilon=epsilon)
        assert (
            lower.delta(epsilon) - lower.error_mass
            <= exact
            <= upper.delta(epsilon) + upper.error_mass
        )
        assert upper.delta(epsilon) - lower.delta(epsilon) <= 5e-3 * exact
    exact_epsilon = gdp_epsilon(mu=1.5, delta=1e-5)
    assert (
        lower.epsilon(1e-5 + lower.error_mass)
        <= exact_epsilon
        <= upper.epsilon(1e-5 - upper.error_mass)
    )
    assert upper.error_mass < 1e-9


def test_epsilon_inverts_delta_between_grid_points() -> None:
    pmf = LossPmf(0.5, -2, np.array([0.1, 0.2, 0.3, 0.25, 0.15]), 0.0)
    for target in (1e-3, 0.01, 0.05):
        epsilon = pmf.epsilon(target)
        assert pmf.delta(epsilon) == pytest.approx(target, rel=1e-9)
    assert pmf.epsilon(0.999) == 0.0
    assert math.isinf(LossPmf(0.5, 0, np.array([0.5]), 0.5).epsilon(0.4))


def test_tradeoff_vertices_of_a_known_pair() -> None:
    # P = (0.75, 0.25), Q = (0.25, 0.75) on a grid containing +-log 3.
    spacing = math.log(3)
    pmf = split_atoms(
        p_masses=np.array([0.75, 0.25]), q_masses=np.array([0.25, 0.75]), grid_spacing=spacing
    )
    alpha, beta = pmf.tradeoff_vertices()
    # Reject P first on the outcome with loss -log 3: alpha = 0.25, beta = 0.25.
    assert np.interp(0.25, alpha, beta) == pytest.approx(0.25)
    assert np.interp(0.0, alpha, beta) == pytest.approx(1.0)
    assert np.interp(1.0, alpha, beta) == pytest.approx(0.0)


def test_composition_refuses_mixed_grids() -> None:
    a = LossPmf(0.1, 0, np.array([1.0]), 0.0)
    b = LossPmf(0.2, 0, np.array([1.0]), 0.0)
    with pytest.raises(ValueError, match="grid_spacing"):
        compose_many([(a, 1), (b, 1)])


def test_a_composition_too_large_for_memory_is_refused_before_allocating() -> None:
    """10^9 compositions of a 1,000-point PLD need a 1.7e8-point window: refused by name (the
    limit is 2^27 points) in about a millisecond, before any array of that size exists."""
    pmf = LossPmf(1e-3, 0, np.full(1000, 1e-3), 0.0)
    with pytest.raises(ResourceLimitError, match="composed PLD fits in 134,217,728 grid points"):
        compose_many([(pmf, 10**9)])
