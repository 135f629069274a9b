"""The PLD accountant's newer events and options: randomized response, the exponential
mechanism, mixtures of Gaussians, Poisson-sampled Laplace and (epsilon, delta) steps, sampling
without replacement under replace-one, group privacy and epsilon at delta = 0. Every interval is
checked against an independent computation (exact enumeration, mpmath quadrature, or
dp_accounting)."""

from __future__ import annotations

import itertools
import math

import dp_accounting
import mpmath
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_mechanism as peer

from dpcore.accountants.base import NeighboringRelation
from dpcore.accountants.pld import PldAccountant
from dpcore.accountants.rdp import RdpAccountant
from dpcore.errors import InvalidParameterError, UnsupportedEventError
from dpcore.events import (
    ComposedEvent,
    EpsilonDeltaEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    MixtureOfGaussiansEvent,
    PoissonSampledEvent,
    RandomizedResponseEvent,
    SampledWithoutReplacementEvent,
    dpsgd_event,
)
from dpcore.mechanisms.gaussian import gdp_epsilon
from dpcore.pld.loss_pmf import compose_many
from dpcore.pld.pairs import epsilon_delta_pair, laplace_pair, subsampled_gaussian_pairs

GRID = 1e-3


def _fixed(**kwargs) -> PldAccountant:
    return PldAccountant(value_discretization_interval=GRID, **kwargs)


def _invert(delta_of, target: float, high: float = 200.0) -> float:
    """Smallest epsilon in [0, high] with delta_of(epsilon) <= target (bisection)."""
    low = 0.0
    if delta_of(0.0) <= target:
        return 0.0
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (low, middle) if delta_of(middle) <= target else (middle, high)
    return high


def _atoms_delta(log_p: np.ndarray, log_q: np.ndarray, epsilon: float) -> float:
    """sum (P - e^eps Q)_+ over atoms given in logs (exact enumeration of a discrete pair)."""
    return float(np.maximum(np.exp(log_p) - np.exp(log_q + epsilon), 0.0).sum())


# ------------------------------------------------------------------ randomized response
def _rr_composed(p: float, k: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Log P- and Q-masses of ``steps`` randomized responses: i outputs equal to the first
    input, j equal to the second, the rest elsewhere (multinomial over the three outputs)."""
    light, other = p / k, (k - 2) * p / k
    heavy = 1 - p + light
    log_p, log_q = [], []
    for i in range(steps + 1):
        for j in range(steps + 1 - i):
            rest = steps - i - j
            coef = math.lgamma(steps + 1) - math.lgamma(i + 1) - math.lgamma(j + 1)
            coef -= math.lgamma(rest + 1)
            if rest and other == 0:
                continue  # k = 2: there is no third output
            tail = rest * math.log(other) if rest else 0.0
            log_p.append(coef + i * math.log(heavy) + j * math.log(light) + tail)
            log_q.append(coef + i * math.log(light) + j * math.log(heavy) + tail)
    return np.array(log_p), np.array(log_q)


@pytest.mark.parametrize(("p", "k", "steps"), [(0.3, 10, 20), (0.8, 2, 50), (0.05, 3, 5)])
def test_randomized_response_brackets_the_exact_composition(p: float, k: int, steps: int):
    log_p, log_q = _rr_composed(p, k, steps)
    exact = _invert(lambda e: _atoms_delta(log_p, log_q, e), 1e-5)
    accountant = _fixed().compose(RandomizedResponseEvent(p, k), steps)
    interval = accountant.get_epsilon_interval(1e-5)
    assert interval.lower <= exact <= interval.upper
    assert interval.upper - interval.lower <= 2 * steps * GRID
    for epsilon in (0.5 * exact, exact):
        truth = _atoms_delta(log_p, log_q, epsilon)
        bracket = accountant.get_delta_interval(epsilon)
        assert bracket.lower <= truth <= bracket.upper


def test_randomized_response_single_step_agrees_with_dp_accounting() -> None:
    # dp_accounting's replace-one PLD, pessimistic on its grid of 1e-4: at most one grid step
    # above the exact epsilon. (Its 0.6.0 accountant drops the count of a self-composed
    # randomized response, so only one step is compared.)
    peer_accountant = pld_privacy_accountant.PLDAccountant(
        dp_accounting.NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4
    )
    peer_accountant.compose(dp_accounting.RandomizedResponseDpEvent(0.3, 10))
    theirs = float(peer_accountant.get_epsilon(1e-5))
    interval = PldAccountant().compose(RandomizedResponseEvent(0.3, 10)).get_epsilon_interval(1e-5)
    assert interval.lower <= theirs <= interval.upper + 1e-4


def test_randomized_response_extremes() -> None:
    assert PldAccountant().compose(RandomizedResponseEvent(1.0, 5), 7).get_epsilon(1e-5) == 0.0
    noiseless = PldAccountant().compose(RandomizedResponseEvent(0.0, 5))
    assert noiseless.get_epsilon_interval(1e-5).lower == math.inf
    # Under replace-one too: the pair is that of two different inputs.
    replace = PldAccountant(neighboring_relation="replace_one", value_discretization_interval=GRID)
    both = replace.compose(RandomizedResponseEvent(0.3, 10), 3).get_epsilon_interval(1e-5)
    assert both == _fixed().compose(RandomizedResponseEvent(0.3, 10), 3).get_epsilon_interval(1e-5)


# ------------------------------------------------------------------ exponential mechanism
def _two_point_composed(epsilon: float, t: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Log masses of ``steps`` copies of the attained two-point pair with losses t, t - eps
    (Dong, Durfee, Rogers 2020, Sec. 4): binomial in the number of outcomes with loss t."""
    p = (math.exp(epsilon) - math.exp(t)) / math.expm1(epsilon)
    log_p1, log_q1 = math.log(p), math.log(p) - t
    log_p2, log_q2 = math.log1p(-p), math.log1p(-p) + epsilon - t
    j = np.arange(steps + 1)
    coef = np.array(
        [math.lgamma(steps + 1) - math.lgamma(i + 1) - math.lgamma(steps - i + 1) for i in j]
    )
    return coef + j * log_p1 + (steps - j) * log_p2, coef + j * log_q1 + (steps - j) * log_q2


@pytest.mark.parametrize(("epsilon", "steps"), [(0.1, 100), (0.5, 10)])
def test_exponential_mechanism_interval_contains_every_attained_composition(epsilon, steps):
    accountant = PldAccountant().compose(ExponentialMechanismEvent(epsilon), steps)
    interval = accountant.get_epsilon_interval(1e-5)
    attained = {}
    for t in np.linspace(0.05, 0.95, 10) * epsilon:
        log_p, log_q = _two_point_composed(epsilon, float(t), steps)
        attained[float(t)] = _invert(lambda e, a=log_p, b=log_q: _atoms_delta(a, b, e), 1e-5)
    # Each attained (non-adaptive) composition is a lower bound on the true epsilon.
    assert max(attained.values()) <= interval.upper
    # The lower end is the attained pair with t = eps / 2, discretised optimistically.
    log_p, log_q = _two_point_composed(epsilon, epsilon / 2, steps)
    symmetric = _invert(lambda e: _atoms_delta(log_p, log_q, e), 1e-5)
    assert symmetric * (1 - 1e-2) <= interval.lower <= symmetric
    # Bounded range is tighter than the pure-DP pair with losses +-epsilon.
    pure = PldAccountant().compose(EpsilonDeltaEvent(epsilon), steps).get_epsilon(1e-5)
    assert interval.upper < 0.75 * pure


def test_exponential_mechanism_single_step_upper_end_is_the_bounded_range_profile() -> None:
    # delta(e') of f(a) = (1 - a) / (1 + (e^eps - 1) a): maximise 1 - e^e' a - f(a); the
    # optimum is a = (sqrt(e^(eps - e')) - 1) / (e^eps - 1) (set f'(a) = -e^e').
    epsilon = 1.0

    def profile(probe: float) -> float:
        a = max(0.0, (math.exp((epsilon - probe) / 2) - 1) / math.expm1(epsilon))
        return 1 - math.exp(probe) * a - (1 - a) / (1 + math.expm1(epsilon) * a)

    exact = _invert(profile, 1e-3, high=epsilon)
    interval = (
        PldAccountant().compose(ExponentialMechanismEvent(epsilon)).get_epsilon_interval(1e-3)
    )
    assert interval.lower <= exact <= interval.upper
    assert interval.upper <= exact + 2 * interval.grid_spacing


# ------------------------------------------------------------------ mixtures of Gaussians
@pytest.mark.parametrize(("q", "sigma", "steps"), [(0.01, 1.0, 300), (0.2, 2.0, 20)])
def test_mixture_with_shifts_zero_and_one_is_the_poisson_gaussian(q, sigma, steps) -> None:
    mixture = _fixed().compose(MixtureOfGaussiansEvent(sigma, (0.0, 1.0), (1 - q, q)), steps)
    poisson = _fixed().compose(
        dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    )
    ours, theirs = mixture.get_epsilon_interval(1e-5), poisson.get_epsilon_interval(1e-5)
    # The step PLDs agree to 1e-12 (tests/pld/test_pairs_new.py); composed, to FFT roundoff.
    assert ours.lower == pytest.approx(theirs.lower, rel=1e-7)
    assert ours.upper == pytest.approx(theirs.upper, rel=1e-7)


def test_mixture_composition_agrees_with_dp_accounting() -> None:
    # dp_accounting 0.6.0, PLDAccountant(value_discretization_interval=1e-4) composing
    # SelfComposedDpEvent(MixtureOfGaussiansDpEvent(1.0, [0, 1, 2], [0.81, 0.18, 0.01]), 20),
    # get_epsilon(1e-5) = 7.878891688777809 (recorded: it takes ~40 s). Its grid is pessimistic:
    # it may exceed the true epsilon by up to 20 steps x 1e-4.
    theirs = 7.878891688777809
    event = MixtureOfGaussiansEvent(1.0, (0.0, 1.0, 2.0), (0.81, 0.18, 0.01))
    interval = PldAccountant().compose(event, 20).get_epsilon_interval(1e-5)
    assert interval.lower <= theirs <= interval.upper + 20 * 1e-4
    assert interval.relative_width < 0.005


def test_mixture_extremes() -> None:
    # All draws at shift 0: nothing changes (dp_accounting's test_poisson_subsampling_with_zero
    # _probability expects epsilon 0 at delta 0); sigma = 0: the output itself.
    assert (
        PldAccountant().compose(MixtureOfGaussiansEvent(1.0, (0.0,), (1.0,))).get_epsilon(0.5) == 0
    )
    noiseless = PldAccountant().compose(MixtureOfGaussiansEvent(0.0, (0.0, 2.0), (0.7, 0.3)), 2)
    assert noiseless.get_delta_interval(1.0).lower == pytest.approx(1 - 0.7**2)


# ------------------------------------------------------------------ Poisson-sampled steps
def test_poisson_laplace_agrees_with_dp_accounting() -> None:
    # dp_accounting's pessimistic PLD of the same pairs on a grid of 1e-4: within our
    # interval or at most 20 steps x 1e-4 above it.
    peer_accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    step = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.LaplaceDpEvent(1.0))
    peer_accountant.compose(dp_accounting.SelfComposedDpEvent(step, 20))
    theirs = float(peer_accountant.get_epsilon(1e-5))
    interval = (
        PldAccountant().compose(PoissonSampledEvent(0.1, LaplaceEvent(1.0)), 20)
    ).get_epsilon_interval(1e-5)
    assert interval.lower <= theirs <= interval.upper + 20 * 1e-4


def _product_delta(p: np.ndarray, q: np.ndarray, steps: int, epsilon: float) -> float:
    """delta(epsilon) of ``steps`` copies of a discrete pair, enumerated by outcome counts
    (multinomial); outcomes with Q-mass 0 contribute their whole P-mass."""
    total = 0.0
    for counts in itertools.product(range(steps + 1), repeat=p.size - 1):
        if sum(counts) > steps:
            continue
        counts = (*counts, steps - sum(counts))
        coef = math.factorial(steps)
        for count in counts:
            coef //= 1 if count == 0 else math.factorial(count)
        big_p = coef * math.prod(float(a) ** c for a, c in zip(p, counts, strict=True))
        big_q = coef * math.prod(float(b) ** c for b, c in zip(q, counts, strict=True))
        total += max(big_p - math.exp(epsilon) * big_q, 0.0)
    return total


@pytest.mark.parametrize(("q", "epsilon", "delta"), [(0.2, 1.0, 0.0), (0.05, 2.0, 1e-4)])
def test_poisson_epsilon_delta_brackets_the_exact_composition(q, epsilon, delta) -> None:
    # The (epsilon, delta) pair (Kairouz, Oh, Viswanath 2015): outcomes P-only, +eps, -eps,
    # Q-only; Poisson subsampling mixes P into Q: remove ((1 - q) Q + q P, Q), add the reverse.
    steps = 6
    a = math.exp(epsilon) / (1 + math.exp(epsilon))
    p_atoms = np.array([delta, (1 - delta) * a, (1 - delta) * (1 - a), 0.0])
    q_atoms = np.array([0.0, (1 - delta) * (1 - a), (1 - delta) * a, delta])
    mixed = (1 - q) * q_atoms + q * p_atoms
    accountant = _fixed().compose(PoissonSampledEvent(q, EpsilonDeltaEvent(epsilon, delta)), steps)
    for probe in (0.0, 0.2, 0.6):
        truth = max(
            _product_delta(mixed, q_atoms, steps, probe),
            _product_delta(q_atoms, mixed, steps, probe),
        )
        bracket = accountant.get_delta_interval(probe)
        assert bracket.lower <= truth <= bracket.upper


# ------------------------------------------------------------------ replace-one
def test_replace_one_gaussian_is_dp_accountings_with_twice_the_noise() -> None:
    # Convention: noise multipliers are relative to the replace-one sensitivity. dp_accounting's
    # REPLACE_ONE Gaussian with standard deviation s moves the mean from -1 to +1, so it is our
    # GaussianEvent(s / 2); its GaussianPrivacyLoss computes delta in closed form.
    loss = peer.GaussianPrivacyLoss(1.0, adjacency_type=peer.AdjacencyType.REPLACE)
    accountant = PldAccountant(neighboring_relation="replace_one").compose(GaussianEvent(0.5))
    for epsilon in (0.5, 1.0, 2.0):
        theirs = float(loss.get_delta_for_epsilon(epsilon))
        bracket = accountant.get_delta_interval(epsilon)
        assert bracket.lower <= theirs <= bracket.upper
    # ... and the pair is the one of add/remove neighbouring.
    add_remove = _fixed().compose(GaussianEvent(0.5), 3).get_epsilon_interval(1e-5)
    replace = _fixed(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    assert replace.compose(GaussianEvent(0.5), 3).get_epsilon_interval(1e-5) == add_remove


def _mixture_pdf(q: float, sigma: float):
    return lambda x: (1 - q) * mpmath.npdf(x, 0, sigma) + q * mpmath.npdf(x, 1, sigma)


def _quad_delta(p_pdf, q_pdf, epsilon: float) -> float:
    """mpmath quadrature of (p - e^eps q)_+; the likelihood ratio is monotone, its crossing is
    found by bisection and given to the quadrature."""
    mpmath.mp.dps = 30
    gap = lambda x: p_pdf(x) - mpmath.e**epsilon * q_pdf(x)  # noqa: E731
    low, high = mpmath.mpf(-30), mpmath.mpf(30)
    for _ in range(120):
        middle = (low + high) / 2
        low, high = (middle, high) if gap(middle) * gap(low) > 0 else (low, middle)
    points = sorted([0.0, 1.0, float(low)])
    return float(mpmath.quad(lambda x: max(gap(x), 0), [-mpmath.inf, *points, mpmath.inf]))


def test_without_replacement_single_step_is_the_larger_orientation() -> None:
    # One step: the worst neighbours attain ((1 - p) N(0) + p N(1), N(0)) or its reverse, and
    # the hull's delta is the larger of the two (Dong, Roth, Su 2019, arXiv 1905.02383, Thm 4.2).
    m, n, sigma = 10, 100, 0.8
    p = m / n
    accountant = PldAccountant(neighboring_relation="replace_one").compose(
        SampledWithoutReplacementEvent(m, n, GaussianEvent(sigma))
    )
    base = lambda x: mpmath.npdf(x, 0, sigma)  # noqa: E731
    for epsilon in (0.0, 0.3, 1.0):
        truth = max(
            _quad_delta(_mixture_pdf(p, sigma), base, epsilon),
            _quad_delta(base, _mixture_pdf(p, sigma), epsilon),
        )
        bracket = accountant.get_delta_interval(epsilon)
        assert bracket.lower <= truth * (1 + 1e-9) <= bracket.upper * (1 + 2e-9)
        assert bracket.relative_width < 0.01


def test_without_replacement_composition_lies_between_its_orientations_and_rdp() -> None:
    m, n, sigma, steps = 256, 60_000, 1.1, 500
    event = SampledWithoutReplacementEvent(m, n, GaussianEvent(sigma))
    ours = _fixed(neighboring_relation="replace_one").compose(event, steps)
    interval = ours.get_epsilon_interval(1e-5)
    # The lower end composes each attained orientation: the Poisson pairs with q = m / n.
    poisson = _fixed().compose(PoissonSampledEvent(m / n, GaussianEvent(sigma)), steps)
    assert interval.lower == poisson.get_epsilon_interval(1e-5).lower
    # Any valid upper bound (here RDP, Wang, Balle, Kasiviswanathan 2019) is above the lower
    # end; the hull is an upper bound at least as large as each orientation.
    rdp = RdpAccountant(neighboring_relation="replace_one").compose(event, steps)
    assert interval.lower <= rdp.get_epsilon(1e-5)
    assert poisson.get_epsilon_interval(1e-5).upper <= interval.upper
    whole = SampledWithoutReplacementEvent(n, n, GaussianEvent(sigma))
    assert _fixed(neighboring_relation="replace_one").compose(whole).get_epsilon_interval(
        1e-5
    ) == _fixed().compose(GaussianEvent(sigma)).get_epsilon_interval(1e-5)
    empty = SampledWithoutReplacementEvent(0, n, GaussianEvent(sigma))
    assert _fixed(neighboring_relation="replace_one").compose(empty).get_epsilon(1e-5) == 0.0


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (PoissonSampledEvent(0.1, GaussianEvent(1.0)), "add_or_remove_one"),
        (PoissonSampledEvent(0.1, LaplaceEvent(1.0)), "add_or_remove_one"),
        (MixtureOfGaussiansEvent(1.0, (0.0, 1.0), (0.5, 0.5)), "add_or_remove_one"),
    ],
)
def test_replace_one_refuses_add_remove_events(event, reason) -> None:
    accountant = PldAccountant(neighboring_relation="replace_one")
    assert not accountant.supports(event)
    with pytest.raises(UnsupportedEventError, match=reason):
        accountant.compose(ComposedEvent([GaussianEvent(1.0), event]))
    assert accountant.history == ()


def test_add_remove_refuses_sampling_without_replacement() -> None:
    with pytest.raises(UnsupportedEventError, match="replace_one"):
        PldAccountant().compose(SampledWithoutReplacementEvent(1, 10, GaussianEvent(1.0)))


def test_relation_and_group_survive_save_and_load() -> None:
    accountant = PldAccountant(
        value_discretization_interval=GRID, neighboring_relation="replace_one", group_size=2
    )
    accountant.compose(GaussianEvent(3.0), 4).compose(LaplaceEvent(5.0))
    restored = PldAccountant.from_json(accountant.to_json())
    assert restored.config() == accountant.config()
    assert restored.config()["neighboring_relation"] == "replace_one"
    assert restored.neighboring_relation is NeighboringRelation.REPLACE_ONE
    assert restored.group_size == 2
    assert restored.to_json() == accountant.to_json()
    assert restored.get_epsilon_interval(1e-5) == accountant.get_epsilon_interval(1e-5)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"neighboring_relation": "swap"}, "neighboring_relation"),
        ({"neighboring_relation": 3}, "neighboring_relation"),
        ({"group_size": 0}, "group_size"),
        ({"group_size": 2.0}, "group_size"),
        ({"group_size": True}, "group_size"),
    ],
)
def test_bad_relation_or_group(kwargs, parameter) -> None:
    with pytest.raises(InvalidParameterError, match=parameter):
        PldAccountant(**kwargs)


# ------------------------------------------------------------------ group privacy
def test_group_of_one_is_the_direct_construction() -> None:
    # group_size = 1 composes exactly the pairs of dpcore.pld.pairs, as before the option.
    events = [
        (dpsgd_event(sampling_probability=0.02, noise_multiplier=1.2, steps=1).event, 50),
        (GaussianEvent(4.0), 2),
        (LaplaceEvent(3.0), 3),
        (EpsilonDeltaEvent(0.2, 1e-7), 2),
    ]
    accountant = PldAccountant(value_discretization_interval=GRID, group_size=1)
    for event, count in events:
        accountant.compose(event, count)
    remove, add = subsampled_gaussian_pairs(sampling_probability=0.02, noise_multiplier=1.2)
    gaussian, _ = subsampled_gaussian_pairs(sampling_probability=1.0, noise_multiplier=4.0)
    laplace = laplace_pair(noise_multiplier=3.0)
    pure_upper, pure_lower = epsilon_delta_pair(epsilon=0.2, delta=1e-7, grid_spacing=GRID)
    for (upper, lower), sampled in zip(accountant.composed_pmfs(GRID), (remove, add), strict=True):
        direct_upper = compose_many(
            [
                (sampled.pessimistic(GRID), 50),
                (gaussian.pessimistic(GRID), 2),
                (laplace.pessimistic(GRID), 3),
                (pure_upper, 2),
            ]
        )
        direct_lower = compose_many(
            [
                (sampled.optimistic(GRID), 50),
                (gaussian.optimistic(GRID), 2),
                (laplace.optimistic(GRID), 3),
                (pure_lower, 2),
            ]
        )
        assert np.array_equal(upper.pmf, direct_upper.pmf) and upper.offset == direct_upper.offset
        assert np.array_equal(lower.pmf, direct_lower.pmf) and lower.offset == direct_lower.offset
    default = PldAccountant(value_discretization_interval=GRID)
    for event, count in events:
        default.compose(event, count)
    assert default.get_epsilon_interval(1e-6) == accountant.get_epsilon_interval(1e-6)


@pytest.mark.parametrize(
    ("event", "scaled"),
    [
        (GaussianEvent(3.0), GaussianEvent(1.0)),
        (LaplaceEvent(2.0), LaplaceEvent(2.0 / 3)),
        (ExponentialMechanismEvent(0.2), ExponentialMechanismEvent(0.6000000000000001)),
    ],
)
def test_group_scales_the_sensitivity(event, scaled) -> None:
    grouped = _fixed(group_size=3).compose(event, 5).get_epsilon_interval(1e-5)
    assert grouped == _fixed().compose(scaled, 5).get_epsilon_interval(1e-5)


def test_group_of_pure_steps_lies_between_k_responses_and_k_epsilon() -> None:
    epsilon, k, steps = 0.3, 3, 4
    interval = (
        _fixed(group_size=k).compose(EpsilonDeltaEvent(epsilon), steps).get_epsilon_interval(1e-4)
    )
    # k * steps epsilon-DP randomized responses (one epsilon-DP mechanism per step on the k
    # records) are attained: exact binomial composition.
    n = k * steps
    j = np.arange(n + 1)
    coef = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in j])
    log_a, log_b = -math.log1p(math.exp(-epsilon)), -math.log1p(math.exp(epsilon))
    log_p = coef + j * log_a + (n - j) * log_b
    log_q = coef + j * log_b + (n - j) * log_a
    attained = _invert(lambda e: _atoms_delta(log_p, log_q, e), 1e-4)
    assert interval.lower <= attained
    assert attained - 2 * GRID * n <= interval.lower
    # The upper end is steps pure steps at k epsilon.
    pure = _fixed().compose(EpsilonDeltaEvent(k * epsilon), steps).get_epsilon_interval(1e-4)
    assert interval.upper == pure.upper


def test_group_of_poisson_gaussian_is_the_binomial_mixture() -> None:
    # Ganesh 2024: the k records of a group are sampled j ~ Binomial(k, q) at a time.
    q, sigma, k, steps = 0.05, 1.5, 3, 100
    grouped = _fixed(group_size=k).compose(
        dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    )
    weights = tuple(math.comb(k, j) * q**j * (1 - q) ** (k - j) for j in range(k + 1))
    mixture = _fixed().compose(
        MixtureOfGaussiansEvent(sigma, tuple(float(j) for j in range(k + 1)), weights), steps
    )
    ours, theirs = grouped.get_epsilon_interval(1e-5), mixture.get_epsilon_interval(1e-5)
    assert ours.lower == pytest.approx(theirs.lower, rel=1e-9)
    assert ours.upper == pytest.approx(theirs.upper, rel=1e-9)
    single = _fixed().compose(
        dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    )
    assert single.get_epsilon(1e-5) < ours.lower


@pytest.mark.parametrize(
    "event",
    [
        RandomizedResponseEvent(0.5, 4),
        MixtureOfGaussiansEvent(1.0, (0.0, 1.0), (0.5, 0.5)),
        EpsilonDeltaEvent(1.0, 1e-6),
        PoissonSampledEvent(0.1, LaplaceEvent(1.0)),
        PoissonSampledEvent(0.1, EpsilonDeltaEvent(1.0)),
    ],
)
def test_group_refuses_events_without_a_group_model(event) -> None:
    accountant = PldAccountant(group_size=2)
    with pytest.raises(UnsupportedEventError, match="group_size = 2"):
        accountant.compose(event)
    replace = PldAccountant(group_size=2, neighboring_relation="replace_one")
    with pytest.raises(UnsupportedEventError, match="group_size = 2"):
        replace.compose(SampledWithoutReplacementEvent(1, 10, GaussianEvent(1.0)))


# ------------------------------------------------------------------ epsilon at delta = 0
@pytest.mark.parametrize(
    ("event", "count", "total"),
    [
        (LaplaceEvent(2.0), 10, 10 / 2.0),  # Laplace: 1 / b per step
        (EpsilonDeltaEvent(0.7), 4, 4 * 0.7),
        (ExponentialMechanismEvent(0.3), 10, 10 * 0.3),  # epsilon-DP, attained as t -> eps
        (RandomizedResponseEvent(0.3, 10), 3, 3 * math.log1p(10 * 0.7 / 0.3)),
        (PoissonSampledEvent(0.2, LaplaceEvent(0.5)), 5, 5 * math.log1p(0.2 * math.expm1(2.0))),
    ],
)
def test_pure_compositions_answer_at_delta_zero(event, count, total) -> None:
    interval = PldAccountant().compose(event, count).get_epsilon_interval(0.0)
    assert interval.lower <= total <= interval.upper
    assert interval.upper <= total + 2 * count * interval.grid_spacing
    assert interval.relative_width <= 0.005
    # On one grid: at the reported epsilon the certified delta is the FFT roundoff allowance.
    fixed = _fixed().compose(event, count)
    assert fixed.get_delta_interval(fixed.get_epsilon_interval(0.0).upper).upper < 1e-9


def test_delta_zero_of_mixed_and_unbounded_compositions() -> None:
    mixed = PldAccountant().compose(LaplaceEvent(1.0), 2).compose(ExponentialMechanismEvent(0.5))
    interval = mixed.get_epsilon_interval(0.0)
    assert interval.lower <= 2.5 <= interval.upper <= 2.5 + 6 * interval.grid_spacing
    for unbounded in (
        GaussianEvent(5.0),
        PoissonSampledEvent(0.01, GaussianEvent(2.0)),
        EpsilonDeltaEvent(1.0, 1e-9),
        MixtureOfGaussiansEvent(3.0, (0.0, 1.0), (0.9, 0.1)),
    ):
        answer = PldAccountant().compose(LaplaceEvent(1.0)).compose(unbounded)
        assert answer.get_epsilon_interval(0.0).lower == math.inf
    replace = PldAccountant(neighboring_relation="replace_one")
    wor = replace.compose(SampledWithoutReplacementEvent(1, 10, GaussianEvent(1.0)))
    assert wor.get_epsilon_interval(0.0).upper == math.inf
    assert PldAccountant().get_epsilon_interval(0.0).upper == 0.0
    noiseless = PldAccountant().compose(PoissonSampledEvent(0.1, GaussianEvent(0.0)))
    assert noiseless.get_epsilon_interval(0.0).lower == math.inf


def test_delta_zero_with_a_group() -> None:
    accountant = PldAccountant(group_size=3).compose(LaplaceEvent(1.0), 2)
    interval = accountant.get_epsilon_interval(0.0)
    assert interval.lower <= 6.0 <= interval.upper <= 6.0 + 4 * interval.grid_spacing
    # The public query passes delta = 0 through to the interval's upper end.
    assert accountant.get_epsilon(0.0) == interval.upper


@pytest.mark.parametrize("delta", [-0.1, 1.0, math.nan])
def test_epsilon_interval_refuses_deltas_outside_zero_one(delta: float) -> None:
    with pytest.raises(InvalidParameterError, match=r"target_delta in \[0, 1\)"):
        PldAccountant().compose(LaplaceEvent(1.0)).get_epsilon_interval(delta)


def test_heterogeneous_gaussians_still_compose_like_gdp_under_replace_one() -> None:
    # mu^2 = 1/4 + 1/9 for multipliers 2 and 3 (Dong, Roth, Su 2019, Cor. 3.3), either relation.
    accountant = PldAccountant(neighboring_relation="replace_one").compose(
        ComposedEvent([GaussianEvent(2.0), GaussianEvent(3.0)])
    )
    interval = accountant.get_epsilon_interval(1e-5)
    assert interval.lower <= gdp_epsilon(mu=math.sqrt(1 / 4 + 1 / 9), delta=1e-5) <= interval.upper


# ------------------------------------------------------------------ float edges
@pytest.mark.parametrize(
    ("event", "relation"),
    [
        (RandomizedResponseEvent(5e-324, 2), "add_or_remove_one"),
        (RandomizedResponseEvent(math.nextafter(1.0, 0.0), 1000), "replace_one"),
        (ExponentialMechanismEvent(5e-324), "add_or_remove_one"),
        (MixtureOfGaussiansEvent(1e-300, (0.0, 1.0), (0.5, 0.5)), "add_or_remove_one"),
        (MixtureOfGaussiansEvent(1e300, (0.0, 1.0), (0.5, 0.5)), "add_or_remove_one"),
        (MixtureOfGaussiansEvent(1.0, (0.0, 1e300), (0.5, 0.5)), "add_or_remove_one"),
        (MixtureOfGaussiansEvent(1.0, (0.0, 1.0), (1 - 2**-53, 2**-53)), "add_or_remove_one"),
        (PoissonSampledEvent(0.5, LaplaceEvent(1e300)), "add_or_remove_one"),
        (PoissonSampledEvent(1e-300, LaplaceEvent(1.0)), "add_or_remove_one"),
        (PoissonSampledEvent(5e-324, EpsilonDeltaEvent(1.0, 0.5)), "add_or_remove_one"),
        (SampledWithoutReplacementEvent(5, 10, GaussianEvent(1e300)), "replace_one"),
        (SampledWithoutReplacementEvent(5, 10, GaussianEvent(1e-300)), "replace_one"),
        (SampledWithoutReplacementEvent(1, 10**9, GaussianEvent(1.0)), "replace_one"),
    ],
)
def test_new_events_answer_at_float_edges(event, relation) -> None:
    # An answer, ordered and in range, never NaN or a negative epsilon (or a typed refusal).
    accountant = PldAccountant(neighboring_relation=relation).compose(event, 3)
    for delta in (0.0, 1e-12, 0.5):
        interval = accountant.get_epsilon_interval(delta)
        assert 0 <= interval.lower <= interval.upper, interval
    for epsilon in (0.0, 700.0):
        bracket = accountant.get_delta_interval(epsilon)
        assert 0 <= bracket.lower <= bracket.upper <= 1, bracket
