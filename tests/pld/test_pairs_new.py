"""The pairs of randomized response, bounded range, mixtures of Gaussians, Poisson-subsampled
Laplace and (epsilon, delta) steps, and the profile hull: each bracketed against an independent
computation of its hockey-stick divergence."""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_mechanism as peer

from dpcore.errors import InvalidParameterError
from dpcore.pld.loss_pmf import LossPmf, max_profile
from dpcore.pld.pairs import (
    _Mixture,
    bounded_range_pair,
    composed_randomized_response_pair,
    laplace_pair,
    mixture_of_gaussians_pairs,
    randomized_response_pair,
    subsampled_epsilon_delta_pairs,
    subsampled_gaussian_pairs,
    subsampled_laplace_pairs,
)
from tests.pld.oracle import hockey_stick

SPACING = 1e-3


def _discrete_delta(p: np.ndarray, q: np.ndarray, epsilon: float) -> float:
    """sum (p - e^eps q)_+ over the outcomes: the definition of the hockey stick."""
    return float(np.maximum(np.asarray(p) - math.exp(epsilon) * np.asarray(q), 0.0).sum())


_hockey_stick = hockey_stick


_PMFS: dict[tuple[int, float], tuple] = {}


def _bracket(
    pair, exact: float, epsilon: float, rel: float = 1e-9, gap: float = 2e-3, spacing=SPACING
) -> None:
    key = (id(pair), spacing)
    if key not in _PMFS or _PMFS[key][0] is not pair:
        _PMFS.clear()  # one pair at a time: ids are reused once a pair is gone
        _PMFS[key] = (pair, pair.pessimistic(spacing), pair.optimistic(spacing))
    _, pessimistic, optimistic = _PMFS[key]
    upper = pessimistic.delta(epsilon)
    lower = optimistic.delta(epsilon)
    assert lower <= exact * (1 + rel) + 1e-14
    assert exact <= upper * (1 + rel) + 1e-14
    assert upper - lower <= gap * exact + 1e-10


# ------------------------------------------------------------------ randomized response
@pytest.mark.parametrize(("p", "k"), [(0.3, 10), (0.05, 2), (0.9, 3), (0.6995108181084378, 4)])
@pytest.mark.parametrize("epsilon", [0.0, 0.5, 2.0])
def test_randomized_response_bracket_contains_the_exact_delta(
    p: float, k: int, epsilon: float
) -> None:
    # The output laws of inputs a and b over the outputs a, b and the k - 2 others.
    on_a = [1 - p + p / k, p / k, *([p / k] * (k - 2))]
    on_b = [p / k, 1 - p + p / k, *([p / k] * (k - 2))]
    exact = _discrete_delta(np.array(on_a), np.array(on_b), epsilon)
    pair = randomized_response_pair(noise_parameter=p, num_buckets=k)
    _bracket(pair, exact, epsilon, gap=5e-3)
    # Its pure-DP epsilon: log(1 + k (1 - p) / p) (the event's docstring).
    bound = math.log1p(k * (1 - p) / p)
    assert pair.pessimistic(SPACING).delta(bound + SPACING) == 0.0
    assert pair.optimistic(SPACING).delta(bound - 2 * SPACING) > 0.0


def test_randomized_response_refuses_the_noiseless_parameter() -> None:
    with pytest.raises(InvalidParameterError, match="noise_parameter"):
        randomized_response_pair(noise_parameter=0.0, num_buckets=3)
    with pytest.raises(InvalidParameterError, match="num_buckets"):
        randomized_response_pair(noise_parameter=0.5, num_buckets=1)


@pytest.mark.parametrize(("epsilon", "count"), [(0.3, 3), (1.0, 4)])
def test_composed_randomized_response_is_the_enumerated_product(epsilon: float, count: int) -> None:
    heavy, light = math.exp(epsilon) / (1 + math.exp(epsilon)), 1 / (1 + math.exp(epsilon))
    outcomes = list(itertools.product([(heavy, light), (light, heavy)], repeat=count))
    p = np.array([math.prod(o[0] for o in outcome) for outcome in outcomes])
    q = np.array([math.prod(o[1] for o in outcome) for outcome in outcomes])
    pair = composed_randomized_response_pair(epsilon=epsilon, count=count)
    for probe in (0.0, 0.4, epsilon * count / 2):
        exact = _discrete_delta(p, q, probe)
        assert pair.optimistic(SPACING).delta(probe) <= exact + 1e-15
        assert exact <= pair.pessimistic(SPACING).delta(probe) + 1e-15


# ------------------------------------------------------------------ bounded range
def _two_point_delta(epsilon: float, t: float, probe: float) -> float:
    """delta(probe) of the two-point pair with losses t and t - eps (Dong, Durfee, Rogers
    2020, Sec. 4): P = (p, 1 - p), Q = (p e^-t, (1 - p) e^(eps - t)), p = (e^eps - e^t) /
    (e^eps - 1)."""
    p = (math.exp(epsilon) - math.exp(t)) / math.expm1(epsilon)
    q = np.array([p * math.exp(-t), (1 - p) * math.exp(epsilon - t)])
    return _discrete_delta(np.array([p, 1 - p]), q, probe)


@pytest.mark.parametrize("epsilon", [0.2, 1.0, 3.0])
def test_bounded_range_pair_is_the_supremum_of_the_two_point_pairs(epsilon: float) -> None:
    pair = bounded_range_pair(epsilon=epsilon)
    upper, lower = pair.pessimistic(SPACING), pair.optimistic(SPACING)
    for probe in (0.0, epsilon / 3, 0.8 * epsilon):
        # The supremum over t in [0, eps] of the attained two-point profiles, on a fine t grid
        # (refined around the best point): an independent computation of the envelope.
        ts = np.linspace(0.0, epsilon, 2001)
        values = [_two_point_delta(epsilon, float(t), probe) for t in ts]
        best = int(np.argmax(values))
        fine = np.linspace(ts[max(best - 1, 0)], ts[min(best + 1, ts.size - 1)], 2001)
        envelope = max(_two_point_delta(epsilon, float(t), probe) for t in fine)
        assert lower.delta(probe) <= envelope * (1 + 1e-9) + 1e-14
        assert envelope <= upper.delta(probe) * (1 + 1e-9) + 1e-14
        assert upper.delta(probe) - lower.delta(probe) <= 5e-3 * envelope + 1e-12
        # Every attained pair lies below the pessimistic PLD, also off the optimum.
        assert max(values) <= upper.delta(probe) + 1e-14
    assert upper.delta(epsilon + SPACING) == 0.0  # epsilon-DP


def test_bounded_range_pair_beats_the_pure_dp_pair() -> None:
    # The pure-DP (randomized response) pair has delta(0) = tanh(eps / 2); bounded range has
    # max_a 1 - a - f(a) with f(a) = (1 - a) / (1 + (e^eps - 1) a): (e^(eps/2) - 1)^2 / (e^eps - 1).
    epsilon = 1.0
    exact = math.expm1(epsilon / 2) ** 2 / math.expm1(epsilon)
    upper = bounded_range_pair(epsilon=epsilon).pessimistic(SPACING).delta(0.0)
    assert upper == pytest.approx(exact, rel=1e-3)
    assert upper < 0.55 * math.tanh(epsilon / 2)


# ------------------------------------------------------------------ mixtures of Gaussians
def _mixture_pdf(shifts, weights, sigma):
    return lambda x: sum(w * mpmath.npdf(x, c, sigma) for c, w in zip(shifts, weights, strict=True))


@pytest.mark.parametrize(
    ("sigma", "shifts", "weights"),
    [
        (1.0, (0.0, 1.0, 2.0), (0.2, 0.6, 0.2)),
        (0.8, (1.0, 2.0), (0.2, 0.8)),
    ],
)
def test_mixture_bracket_contains_quadrature(sigma, shifts, weights) -> None:
    mixture = _mixture_pdf(shifts, weights, sigma)
    base = lambda x: mpmath.npdf(x, 0, sigma)  # noqa: E731
    points = sorted({0.0, *map(float, shifts)})
    remove, add = mixture_of_gaussians_pairs(
        noise_multiplier=sigma, sensitivities=shifts, probabilities=weights
    )
    for epsilon in (0.1, 1.0):
        _bracket(remove, _hockey_stick(mixture, base, epsilon, points), epsilon)
        _bracket(add, _hockey_stick(base, mixture, epsilon, points), epsilon)


@pytest.mark.parametrize(
    ("shifts", "weights"), [((0.0, 1.0, 2.0), (0.2, 0.6, 0.2)), ((1.0, 2.0), (0.2, 0.8))]
)
def test_mixture_agrees_with_dp_accounting_exact_delta(shifts, weights) -> None:
    # dp_accounting's MixtureGaussianPrivacyLoss.get_delta_for_epsilon is computed from the
    # loss inverses without a grid; its own tests assert 7 places, we ask for 1e-9 inside
    # our bracket.
    remove, add = mixture_of_gaussians_pairs(
        noise_multiplier=1.0, sensitivities=shifts, probabilities=weights
    )
    for pair, kind in ((remove, peer.AdjacencyType.REMOVE), (add, peer.AdjacencyType.ADD)):
        loss = peer.MixtureGaussianPrivacyLoss(
            1.0, list(shifts), list(weights), adjacency_type=kind
        )
        theirs = float(loss.get_delta_for_epsilon([1.0])[0])
        assert pair.optimistic(SPACING).delta(1.0) <= theirs + 1e-9
        assert theirs <= pair.pessimistic(SPACING).delta(1.0) + 1e-9


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (0.3, 0.7), (0.999, 3.0)])
def test_mixture_with_two_shifts_is_the_subsampled_gaussian(q: float, sigma: float) -> None:
    closed = subsampled_gaussian_pairs(sampling_probability=q, noise_multiplier=sigma)
    mixture = mixture_of_gaussians_pairs(
        noise_multiplier=sigma, sensitivities=(0.0, 1.0), probabilities=(1 - q, q)
    )
    for a, b in zip(closed, mixture, strict=True):
        for kind in ("pessimistic", "optimistic"):
            first, second = getattr(a, kind)(SPACING), getattr(b, kind)(SPACING)
            assert (first.offset, first.pmf.size) == (second.offset, second.pmf.size)
            assert np.abs(first.pmf - second.pmf).max() < 1e-12
            assert first.infinity_mass == pytest.approx(second.infinity_mass, abs=1e-15)


def test_mixture_threshold_inverts_the_loss_monotonically() -> None:
    mixture = _Mixture.build(0.7, (0.0, 0.5, 1.0, 3.0), (0.4, 0.3, 0.2, 0.1))
    losses = np.concatenate([np.linspace(math.log(0.4) + 1e-9, 40.0, 4001), [300.0]])
    x = mixture.threshold(losses)
    assert np.all(np.diff(x) > 0)
    # L(x(l)) = l to float precision: the exact loss at the threshold, in mpmath.
    mpmath.mp.dps = 40
    for index in range(0, losses.size, 400):
        point = mpmath.mpf(float(x[index]))
        value = mpmath.log(
            0.4
            + sum(
                w * mpmath.exp((2 * c * point - c * c) / (2 * mpmath.mpf(0.7) ** 2))
                for c, w in ((0.5, 0.3), (1.0, 0.2), (3.0, 0.1))
            )
        )
        assert float(value) == pytest.approx(losses[index], rel=1e-13, abs=1e-13)
    assert np.all(np.isneginf(mixture.threshold(np.array([math.log(0.4), -5.0]))))


def test_mixture_refuses_what_has_no_shift() -> None:
    with pytest.raises(InvalidParameterError, match="sensitivities"):
        mixture_of_gaussians_pairs(noise_multiplier=1.0, sensitivities=(0.0,), probabilities=(1.0,))


# ------------------------------------------------------------------ subsampled Laplace
@pytest.mark.parametrize(("q", "scale"), [(0.1, 1.0), (0.5, 0.4), (0.02, 3.0)])
@pytest.mark.parametrize("epsilon", [0.0, 0.05, 0.4])
def test_subsampled_laplace_bracket_contains_quadrature(q: float, scale: float, epsilon: float):
    lap = lambda mean: lambda x: mpmath.exp(-abs(x - mean) / scale) / (2 * scale)  # noqa: E731
    mixture = lambda x: (1 - q) * lap(0)(x) + q * lap(1)(x)  # noqa: E731
    remove, add = subsampled_laplace_pairs(sampling_probability=q, noise_multiplier=scale)
    # A grid of about 4000 points across the loss range (it is only 0.014 wide for q = 0.02).
    # The two point masses of the loss (at x <= 0 and x >= 1) make the optimistic end lose up
    # to two grid steps of loss on them, hence the wider allowance for the width.
    spacing = (remove.high - remove.low) / 4000
    exact = _hockey_stick(mixture, lap(0), epsilon, [0.0, 1.0])
    _bracket(remove, exact, epsilon, gap=5e-3, spacing=spacing)
    exact = _hockey_stick(lap(0), mixture, epsilon, [0.0, 1.0])
    _bracket(add, exact, epsilon, gap=5e-3, spacing=spacing)


def test_subsampled_laplace_agrees_with_dp_accounting_exact_delta() -> None:
    # dp_accounting's LaplacePrivacyLoss(sampling_prob=q).get_delta_for_epsilon: no grid.
    remove, add = subsampled_laplace_pairs(sampling_probability=0.2, noise_multiplier=0.5)
    for pair, kind in ((remove, peer.AdjacencyType.REMOVE), (add, peer.AdjacencyType.ADD)):
        loss = peer.LaplacePrivacyLoss(0.5, sampling_prob=0.2, adjacency_type=kind)
        for epsilon in (0.1, 0.5):
            theirs = float(loss.get_delta_for_epsilon(epsilon))
            assert pair.optimistic(SPACING).delta(epsilon) <= theirs + 1e-9
            assert theirs <= pair.pessimistic(SPACING).delta(epsilon) + 1e-9


def test_subsampled_laplace_extremes() -> None:
    remove, add = subsampled_laplace_pairs(sampling_probability=1.0, noise_multiplier=2.0)
    plain = laplace_pair(noise_multiplier=2.0)
    assert remove is add
    assert np.array_equal(remove.pessimistic(SPACING).pmf, plain.pessimistic(SPACING).pmf)
    # Largest loss log(1 - q + q e^{1/b}); the pessimistic grid rounds it up.
    remove, _ = subsampled_laplace_pairs(sampling_probability=0.3, noise_multiplier=0.5)
    top = math.log1p(0.3 * math.expm1(2.0))
    assert top <= remove.pessimistic(SPACING).largest_loss() <= top + 2 * SPACING
    with pytest.raises(InvalidParameterError, match="sampling_probability"):
        subsampled_laplace_pairs(sampling_probability=0.0, noise_multiplier=1.0)


# ------------------------------------------------------------------ subsampled (eps, delta)
@pytest.mark.parametrize(("q", "epsilon", "delta"), [(0.1, 1.0, 0.0), (0.5, 2.0, 1e-3)])
def test_subsampled_epsilon_delta_pairs_are_the_mixed_atoms(q, epsilon, delta) -> None:
    # Kairouz, Oh, Viswanath 2015, Thm 2.1: outcomes +eps, -eps, P-only and Q-only.
    a = math.exp(epsilon) / (1 + math.exp(epsilon))
    p_atoms = np.array([(1 - delta) * a, (1 - delta) * (1 - a), delta, 0.0])
    q_atoms = np.array([(1 - delta) * (1 - a), (1 - delta) * a, 0.0, delta])
    mixed = (1 - q) * q_atoms + q * p_atoms
    remove, add = subsampled_epsilon_delta_pairs(
        sampling_probability=q, epsilon=epsilon, delta=delta
    )
    for pair, (p, other) in ((remove, (mixed, q_atoms)), (add, (q_atoms, mixed))):
        for probe in (0.0, 0.3, 1.0):
            exact = _discrete_delta(p, other, probe)
            assert pair.optimistic(SPACING).delta(probe) <= exact + 1e-15
            assert exact <= pair.pessimistic(SPACING).delta(probe) + 1e-15
    assert remove.pessimistic(SPACING).infinity_mass == pytest.approx(q * delta, abs=1e-18)


# ------------------------------------------------------------------ the profile hull
def _grid_deltas(pmf: LossPmf, epsilons: np.ndarray) -> np.ndarray:
    return np.array([pmf.delta(float(e)) for e in epsilons])


def test_max_profile_dominates_both_and_is_their_maximum_on_the_grid() -> None:
    remove, add = subsampled_gaussian_pairs(sampling_probability=0.2, noise_multiplier=0.8)
    first, second = remove.pessimistic(SPACING), add.pessimistic(SPACING)
    hull = max_profile(first, second)
    grid = np.arange(0, 2000, 7) * SPACING
    both = np.maximum(_grid_deltas(first, grid), _grid_deltas(second, grid))
    assert np.allclose(_grid_deltas(hull, grid), both, rtol=1e-9, atol=1e-14)
    between = grid[:-1] + 0.37 * SPACING  # linear in e^eps between grid losses: above both
    assert np.all(
        _grid_deltas(hull, between)
        >= np.maximum(_grid_deltas(first, between), _grid_deltas(second, between)) - 1e-14
    )
    # A pair: P and the implied Q both sum to one.
    assert hull.pmf.sum() + hull.infinity_mass == pytest.approx(1.0, abs=1e-12)
    assert float(hull.pmf @ np.exp(-hull.losses())) == pytest.approx(1.0, abs=1e-12)
    # The hull of a pair and its reverse is symmetric: P[L = l] = Q[L = -l].
    masses = dict(zip(np.round(hull.losses() / SPACING).astype(int), hull.pmf, strict=True))
    q_masses = hull.pmf * np.exp(-hull.losses())
    for index, q_mass in zip(np.round(hull.losses() / SPACING).astype(int), q_masses, strict=True):
        assert masses.get(-index, 0.0) == pytest.approx(q_mass, abs=1e-11)


def test_max_profile_of_a_pmf_with_itself_is_the_pmf() -> None:
    pmf = subsampled_gaussian_pairs(sampling_probability=0.05, noise_multiplier=1.0)[0]
    single = pmf.pessimistic(SPACING)
    same = max_profile(single, single)
    inner = same.pmf[single.offset - same.offset : single.offset - same.offset + single.pmf.size]
    assert np.array_equal(inner, single.pmf)
    assert same.pmf.sum() == pytest.approx(single.pmf.sum(), abs=1e-15)


def test_max_profile_refuses_mixed_grids() -> None:
    with pytest.raises(InvalidParameterError, match="grid_spacing"):
        max_profile(LossPmf(0.1, 0, np.ones(1), 0.0), LossPmf(0.2, 0, np.ones(1), 0.0))


# ------------------------------------------------------------------ epsilon at delta = 0
def test_epsilon_at_delta_zero_is_the_largest_loss() -> None:
    pmf = LossPmf(0.5, -2, np.array([0.1, 0.2, 0.3, 0.4, 0.0]), 0.0)
    assert pmf.largest_loss() == 0.5
    assert pmf.epsilon(0.0) == 0.5
    assert LossPmf(0.5, -3, np.array([0.5, 0.5]), 0.0).epsilon(0.0) == 0.0
    assert math.isinf(LossPmf(0.5, 0, np.array([0.5]), 0.5).epsilon(0.0))
    assert LossPmf(0.5, 0, np.zeros(2), 0.0).largest_loss() == -math.inf


def test_max_profile_counts_unequal_totals_as_error_mass() -> None:
    # Below loss 0 the winner is chosen as if the totals were equal: a pmf missing 10% of its
    # mass must show up as (at least) that much error mass.
    full = LossPmf(SPACING, -3, np.array([0.2, 0.3, 0.5]), 0.0)
    short = LossPmf(SPACING, -3, np.array([0.18, 0.27, 0.45]), 0.0)
    assert max_profile(full, short).error_mass >= 0.1 - 1e-12
    assert max_profile(full, short, certify=False).error_mass == 0.0
