"""The certified lower bound on shuffled DP-SGD (:mod:`dpcore.accountants.shuffled`).

Independent references: the Gaussian mechanism's exact delta(epsilon) (Balle & Wang 2018,
Thm. 8), which one step with a single batch reduces to and which bounds every epoch from above
(the shuffled pair is the deterministic-batch pair after a random permutation, a
post-processing); and single "cube" events {max_t x_t > c}, whose P - e^eps Q any lower bound
built from the whole statistic must reach (Chua et al. 2024, arXiv 2403.17673).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dpcore.accountants import PldAccountant
from dpcore.accountants.shuffled import shuffled_lower_bound
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event

GRID = 1e-3


def gaussian_delta(mu: float, epsilon: float) -> float:
    """delta(epsilon) of mu-GDP (Balle & Wang 2018, Thm. 8; Dong, Roth, Su 2022, Cor. 2.13)."""
    return float(
        stats.norm.cdf(-epsilon / mu + mu / 2)
        - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2)
    )


def cube_delta(sigma: float, steps: int, epsilon: float) -> float:
    """max over c of P[M > c] - e^eps Q[M > c] for one full epoch (no remainder), M = max_t x_t."""
    caps = np.linspace(-2.0, 2.0 + 12 * sigma, 20_001)
    background = stats.norm.cdf(caps / sigma) ** (steps - 1)
    p_out = 1 - background * stats.norm.cdf((caps - 2) / sigma)
    q_out = 1 - background * stats.norm.cdf((caps - 1) / sigma)
    return float(np.max(p_out - math.exp(epsilon) * q_out))


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_one_batch_is_the_gaussian_mechanism(sigma: float) -> None:
    bound = shuffled_lower_bound(noise_multiplier=sigma, dataset_size=64, batch_size=64, steps=1)
    for epsilon in (0.0, 0.5, 1.0, 3.0):
        exact = gaussian_delta(1 / sigma, epsilon)
        assert bound.delta(epsilon) <= exact
        assert bound.delta(epsilon) == pytest.approx(exact, rel=1e-3, abs=1e-9)


@pytest.mark.parametrize(("sigma", "epochs"), [(0.8, 1), (1.1, 1), (1.1, 4), (2.0, 3)])
def test_bounded_by_deterministic_batches(sigma: float, epochs: int) -> None:
    steps_per_epoch = 50
    bound = shuffled_lower_bound(
        noise_multiplier=sigma, dataset_size=50 * 20, batch_size=20, steps=steps_per_epoch * epochs
    )
    for epsilon in (0.5, 1.0, 2.0, 4.0):
        assert bound.delta(epsilon) <= gaussian_delta(math.sqrt(epochs) / sigma, epsilon) + 1e-12


@pytest.mark.parametrize(("sigma", "epsilon"), [(0.8, 1.0), (1.1, 2.0), (1.1, 3.0), (2.0, 0.5)])
def test_reaches_every_cube_event(sigma: float, epsilon: float) -> None:
    steps = 100
    bound = shuffled_lower_bound(
        noise_multiplier=sigma, dataset_size=steps * 10, batch_size=10, steps=steps
    )
    # The grid rounds losses down by at most one spacing (optimistic discretisation).
    assert bound.delta(epsilon) >= cube_delta(sigma, steps, epsilon + 2 * GRID) - 1e-12


def test_exceeds_the_poisson_upper_bound_at_the_jl_paper_setting() -> None:
    # MNIST, B = 256, sigma = 1.1, one epoch (Bu et al. 2021, Sec. 5): the shuffled run is
    # provably far less private than the Poisson analysis says (the gap of Chua et al. 2024).
    n, b, sigma = 60_000, 256, 1.1
    steps = n // b
    lower = shuffled_lower_bound(noise_multiplier=sigma, dataset_size=n, batch_size=b, steps=steps)
    poisson = PldAccountant().compose(
        dpsgd_event(sampling_probability=b / n, noise_multiplier=sigma, steps=steps)
    )
    assert lower.epsilon(1e-5) > 2 * poisson.get_epsilon(1e-5)


def test_dropped_remainder_and_fewer_steps_leak_less() -> None:
    full = shuffled_lower_bound(noise_multiplier=1.0, dataset_size=1000, batch_size=100, steps=10)
    remainder = shuffled_lower_bound(
        noise_multiplier=1.0, dataset_size=1099, batch_size=100, steps=10
    )
    partial = shuffled_lower_bound(noise_multiplier=1.0, dataset_size=1000, batch_size=100, steps=5)
    assert remainder.epsilon(1e-5) < full.epsilon(1e-5)
    assert partial.epsilon(1e-5) < full.epsilon(1e-5)
    assert partial.epsilon(1e-5) > 0


def test_more_noise_and_more_epochs_are_monotone() -> None:
    def eps(sigma: float, steps: int) -> float:
        bound = shuffled_lower_bound(
            noise_multiplier=sigma, dataset_size=500, batch_size=50, steps=steps
        )
        return bound.epsilon(1e-5)

    assert eps(1.5, 10) < eps(1.0, 10) < eps(0.7, 10)
    assert eps(1.0, 10) < eps(1.0, 30) < eps(1.0, 90)


def test_no_steps_spend_nothing() -> None:
    bound = shuffled_lower_bound(noise_multiplier=1.0, dataset_size=10, batch_size=2, steps=0)
    assert bound.epsilon(1e-5) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"batch_size": 11}, "batch_size"),
        ({"batch_size": 0}, "batch_size"),
        ({"steps": -1}, "steps"),
        ({"dataset_size": 0}, "dataset_size"),
    ],
)
def test_bad_input_is_refused_by_name(kwargs: dict[str, float], parameter: str) -> None:
    arguments = {"noise_multiplier": 1.0, "dataset_size": 10, "batch_size": 2, "steps": 5}
    arguments.update(kwargs)
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        shuffled_lower_bound(**arguments)  # type: ignore[arg-type]


def mixture_delta(sigma: float, epsilon: float) -> float:
    """Exact delta(epsilon) of one step with N = 3, B = 2, by quadrature in log space.

    The record sits in the single batch with probability 2/3 and in the dropped remainder
    otherwise, so the whole output is one coordinate: P = N(0, s^2)/3 + 2 N(2, s^2)/3 against
    Q = N(0, s^2)/3 + 2 N(1, s^2)/3. This integrates (p - e^eps q)_+ directly (independent of
    the cells, the statistic and the grid of the bound).
    """
    x = np.linspace(-1.0 - 12 * sigma, 3.0 + 12 * sigma, 400_001)
    log_p = np.logaddexp(
        math.log(1 / 3) + stats.norm.logpdf(x, 0, sigma),
        math.log(2 / 3) + stats.norm.logpdf(x, 2, sigma),
    )
    log_q = np.logaddexp(
        math.log(1 / 3) + stats.norm.logpdf(x, 0, sigma),
        math.log(2 / 3) + stats.norm.logpdf(x, 1, sigma),
    )
    gain = np.exp(log_p) * -np.expm1(np.minimum(epsilon + log_q - log_p, 0.0))
    return float(np.sum(gain) * (x[1] - x[0]))


TINY_SIGMAS = [1e-4, 1e-3, 0.005, 0.0131, 0.0132, 0.02, 0.1]


@pytest.mark.parametrize("sigma", [0.01, 0.0131, 0.5])
def test_tiny_noise_bound_is_below_the_exact_pair(sigma: float) -> None:
    # Item 10: below sigma ~ 0.0131 every cell's mass underflowed under one hypothesis and the
    # bound raised a raw ValueError; it must be a valid lower bound, i.e. below the exact pair.
    bound = shuffled_lower_bound(noise_multiplier=sigma, dataset_size=3, batch_size=2, steps=1)
    for epsilon in (0.5, 2.0, 50.0, 300.0, 650.0):
        exact = mixture_delta(sigma, epsilon)
        assert bound.delta(epsilon) <= exact * (1 + 1e-6) + 1e-12
        if exact > 1e-3:  # and it is close wherever the losses stay below the 700 cap
            assert bound.delta(epsilon) == pytest.approx(exact, rel=2e-3)


@pytest.mark.parametrize("sigma", TINY_SIGMAS)
def test_tiny_noise_multipliers_give_a_finite_lower_bound(sigma: float) -> None:
    # Item 10's grid: no exception, a finite epsilon of about 700 per epoch once the losses
    # exceed the floating-point cap, and below the deterministic-batch Gaussian upper bound.
    bound = shuffled_lower_bound(noise_multiplier=sigma, dataset_size=20, batch_size=10, steps=2)
    epsilon = bound.epsilon(1e-5)
    assert math.isfinite(epsilon)
    assert epsilon > (690.0 if sigma <= 0.02 else 80.0)
    for eps in (10.0, 100.0, 500.0, 690.0):
        assert bound.delta(eps) <= gaussian_delta(1 / sigma, eps) + 1e-12


def test_tiny_noise_multipliers_are_monotone() -> None:
    # More noise is a post-processing of less (add independent Gaussian noise to both
    # outputs), so the true epsilon is non-increasing in sigma; the grid bound must follow it
    # up to its rounding (one grid step per epoch). Three epochs compose to about 3 x 700.
    sigmas = [1e-9, *TINY_SIGMAS, 0.3, 1.0]
    values = [
        shuffled_lower_bound(
            noise_multiplier=sigma, dataset_size=100, batch_size=10, steps=30
        ).epsilon(1e-5)
        for sigma in sigmas
    ]
    assert values[0] == pytest.approx(2100.0, abs=0.01)
    for smaller, larger in itertools.pairwise(values):
        assert larger <= smaller + 3 * 2 * GRID
    assert values[-1] < 10.0


def test_many_epochs_at_the_loss_cap_coarsen_the_grid() -> None:
    # 50 epochs whose losses sit at the 700 cap would compose 35M grid points (a 30 s FFT); the
    # grid is coarsened instead. Reference: each epoch has loss 0 (the record was dropped, 1/7)
    # or the cap (6/7), so the loss is 700 K with K ~ Binomial(50, 6/7).
    bound = shuffled_lower_bound(noise_multiplier=0.01, dataset_size=7, batch_size=2, steps=150)
    assert bound.pmf.grid_spacing > GRID
    k = np.arange(51)
    weights = stats.binom.pmf(k, 50, 6 / 7)
    for epsilon in (25_000.0, 30_000.0, 34_000.0):
        reference = float(np.sum(weights * -np.expm1(np.minimum(epsilon - 700.0 * k, 0.0))))
        assert bound.delta(epsilon) == pytest.approx(reference, abs=1e-6)
    assert 34_000.0 < bound.epsilon(1e-5) <= 35_000.0


@pytest.mark.parametrize("sigma", [1e101, 1e300])
def test_huge_noise_multiplier_gives_the_trivial_bound(sigma: float) -> None:
    # sigma^2 overflowed (OverflowError on the command line); epsilon = 0 is a valid lower bound.
    bound = shuffled_lower_bound(noise_multiplier=sigma, dataset_size=20, batch_size=10, steps=4)
    assert bound.epsilon(1e-5) == 0.0


@pytest.mark.parametrize("spacing", [1e-300, 5e-5, 2.0, math.inf, math.nan])
def test_grid_spacing_out_of_range_is_refused_by_name(spacing: float) -> None:
    with pytest.raises(InvalidParameterError, match="Expected grid_spacing"):
        shuffled_lower_bound(
            noise_multiplier=1.0, dataset_size=20, batch_size=10, steps=2, grid_spacing=spacing
        )
