"""One DP-SGD-JL step: discretisation direction, tradeoff validity, exact-delta bracket."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize, special, stats

from dpcore.pld import jl_pairs
from dpcore.pld.jl_pairs import jl_shift_mixture, jl_step_pairs


@pytest.mark.parametrize("r", [1, 4, 30])
def test_pessimistic_shifts_dominate_optimistic_ones(r: int) -> None:
    """Same bins: the pessimistic law is stochastically larger (and keeps 1e-13 unbounded)."""
    high, high_w, unbounded = jl_shift_mixture(jl_dimension=r, pessimistic=True)
    low, low_w, none = jl_shift_mixture(jl_dimension=r, pessimistic=False)
    assert unbounded == pytest.approx(1e-13) and none == 0.0
    assert high_w.sum() + unbounded == pytest.approx(1.0, abs=1e-12)
    assert low_w.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(high >= low[1:] - 1e-12)  # bin k's lower-X end vs its upper-X end


@settings(max_examples=8, deadline=None)
@given(
    r=st.integers(2, 64),
    sigma=st.floats(0.6, 4.0),
    q=st.floats(0.05, 1.0),
)
def test_one_step_tradeoff_curves_are_valid(r: int, sigma: float, q: float) -> None:
    """Convex, non-increasing, below 1 - alpha, for both discretisations and directions."""
    for pessimistic in (True, False):
        for pair in jl_step_pairs(
            sampling_probability=q,
            noise_multiplier=sigma,
            jl_dimension=r,
            pessimistic=pessimistic,
            bins=80,
        ):
            pmf = pair.pessimistic(2e-2) if pessimistic else pair.optimistic(2e-2)
            alpha, beta = pmf.tradeoff_vertices()
            assert np.all(np.diff(alpha) >= -1e-12) and np.all(np.diff(beta) <= 1e-9)
            assert np.all(beta <= 1 - alpha + 1e-9)
            slopes = np.diff(beta)[np.diff(alpha) > 1e-9] / np.diff(alpha)[np.diff(alpha) > 1e-9]
            assert np.all(np.diff(slopes) >= -1e-6 * (1 + np.abs(slopes[1:])))


def _true_loss(y: np.ndarray, r: int, sigma: float) -> np.ndarray:
    """log E_X exp((2 S y - S^2) / (2 s^2)), S = sqrt(r / X), by a 2,000-point midpoint rule."""
    u = (np.arange(2_000) + 0.5) / 2_000
    shifts = np.sqrt(r / stats.chi2.ppf(u, r))
    out = np.empty_like(y)
    for start in range(0, y.size, 10_000):
        part = y[start : start + 10_000]
        exponents = (2 * np.outer(part, shifts) - shifts**2) / (2 * sigma**2)
        out[start : start + 10_000] = special.logsumexp(exponents, axis=1) - math.log(shifts.size)
    return out


def test_monte_carlo_delta_lies_in_the_certified_bracket() -> None:
    """Unsampled step, r = 6, sigma = 2: delta(eps) = E_P[(1 - e^{eps - L})_+] estimated from
    50,000 draws of the true mechanism lies within 5 standard errors of [optimistic,
    pessimistic] (a correct bracket fails this with probability < 1e-6 per epsilon)."""
    r, sigma = 6, 2.0
    rng = np.random.default_rng(0)
    x = rng.chisquare(r, 50_000)
    y = np.sqrt(r / x) + sigma * rng.standard_normal(x.size)
    losses = _true_loss(y, r, sigma)
    upper, _ = jl_step_pairs(
        sampling_probability=1.0, noise_multiplier=sigma, jl_dimension=r, pessimistic=True
    )
    lower, _ = jl_step_pairs(
        sampling_probability=1.0, noise_multiplier=sigma, jl_dimension=r, pessimistic=False
    )
    high_pmf, low_pmf = upper.pessimistic(5e-3), lower.optimistic(5e-3)
    for epsilon in (0.1, 0.5, 1.0, 2.0):
        terms = np.maximum(0.0, -np.expm1(epsilon - losses))
        estimate, error = terms.mean(), terms.std() / math.sqrt(terms.size)
        assert low_pmf.delta(epsilon) - 5 * error <= estimate <= high_pmf.delta(epsilon) + 5 * error


# ---------------------------------------------------------------- exact one-step reference
# The pair (remove direction) is P = (1 - q) N(0, s^2) + q E N(S, s^2), Q = N(0, s^2) with
# S = sqrt(r / X), X ~ chi^2_r; the add direction swaps P and Q. The likelihood ratio is
# increasing in the outcome y, so delta(eps) = sup_y [P(Y > y) - e^eps Q(Y > y)] (remove) and
# sup_y [P(Y < y) - e^eps Q(Y < y)] (add). The mixture's distribution function is
# P(S + sZ > y) = Phi(-y/s) + int_{z < y/s} phi(z) P(X < r / (y - s z)^2) dz, integrated by
# adaptive quadrature (relative accuracy ~1e-12; it agrees with 30-digit quadrature over X).


def _shift_noise_tail(y: float, r: int, sigma: float, upper: bool) -> float:
    """P(S + sigma Z > y) if ``upper`` else P(S + sigma Z < y)."""
    z0 = y / sigma
    high = min(z0, 40.0)
    gamma = special.gammainc if upper else special.gammaincc  # P(X < x), P(X > x)

    def integrand(z: float) -> float:
        chi2_mass = float(gamma(r / 2, r / (2 * (y - sigma * z) ** 2)))
        return math.exp(-z * z / 2) / math.sqrt(2 * math.pi) * chi2_mass

    points = [p for p in (0.0, z0 - 1 / sigma) if -40.0 < p < high] or None
    part = 0.0
    if high > -40.0:
        part = integrate.quad(
            integrand, -40.0, high, points=points, epsabs=1e-300, epsrel=1e-12, limit=500
        )[0]
    return part + (float(special.ndtr(-z0)) if upper else 0.0)


def _sup(gap: Callable[[float], float], sigma: float, epsilon: float) -> float:
    """Maximum of a unimodal function of y: a scan, then bounded Brent around the best point."""
    reach = max(40 * sigma, 2 * math.sqrt(2 * sigma**2 * epsilon) + 10 * sigma)
    ys = np.linspace(-10 * sigma, reach, 60)
    values = [gap(y) for y in ys]
    k = int(np.argmax(values))
    bounds = (ys[max(k - 1, 0)], ys[min(k + 1, ys.size - 1)])
    best = optimize.minimize_scalar(
        lambda y: -gap(y), bounds=bounds, method="bounded", options={"xatol": 1e-9}
    )
    return max(0.0, -float(best.fun), values[k])


def _exact_delta(epsilon: float, q: float, sigma: float, r: int, add: bool) -> float:
    """Hockey-stick divergence of the exact one-step pair (continuous shift law)."""
    scale = math.exp(epsilon)
    if add:
        return _sup(
            lambda y: (
                special.ndtr(y / sigma)
                - scale
                * ((1 - q) * special.ndtr(y / sigma) + q * _shift_noise_tail(y, r, sigma, False))
            ),
            sigma,
            epsilon,
        )
    return _sup(
        lambda y: (
            (1 - q) * special.ndtr(-y / sigma)
            + q * _shift_noise_tail(y, r, sigma, True)
            - scale * special.ndtr(-y / sigma)
        ),
        sigma,
        epsilon,
    )


def _law_delta(
    epsilon: float, q: float, sigma: float, law: tuple[np.ndarray, np.ndarray, float], add: bool
) -> float:
    """Hockey-stick divergence of the pair with a discretised shift law (continuous outcome)."""
    shifts, weights, unbounded = law
    scale = math.exp(epsilon)
    if add:
        return _sup(
            lambda y: (
                special.ndtr(y / sigma)
                - scale
                * (
                    (1 - q) * special.ndtr(y / sigma)
                    + q * float(special.ndtr((y - shifts) / sigma) @ weights)
                )
            ),
            sigma,
            epsilon,
        )
    return _sup(
        lambda y: (
            (1 - q) * special.ndtr(-y / sigma)
            + q * (float(special.ndtr((shifts - y) / sigma) @ weights) + unbounded)
            - scale * special.ndtr(-y / sigma)
        ),
        sigma,
        epsilon,
    )


def _below(a: float, b: float) -> bool:
    """a <= b up to the reference's quadrature error."""
    return a <= b * (1 + 1e-9) + 1e-14


# Each value of r, q and sigma appears three times (a Latin square over the 3 x 3 x 3 grid).
_CONFIGS = [
    (1, 0.01, 0.8),
    (1, 0.1, 1.1),
    (1, 1.0, 2.0),
    (3, 0.01, 1.1),
    (3, 0.1, 2.0),
    (3, 1.0, 0.8),
    (10, 0.01, 2.0),
    (10, 0.1, 0.8),
    (10, 1.0, 1.1),
]


def _check_bracket(r: int, q: float, sigma: float, epsilons: tuple[float, ...], bins: int) -> None:
    spacing = 1e-2
    laws = {
        side: jl_shift_mixture(jl_dimension=r, bins=bins, pessimistic=side)
        for side in (True, False)
    }
    upper_pairs = jl_step_pairs(
        sampling_probability=q, noise_multiplier=sigma, jl_dimension=r, pessimistic=True, bins=bins
    )
    lower_pairs = jl_step_pairs(
        sampling_probability=q, noise_multiplier=sigma, jl_dimension=r, pessimistic=False, bins=bins
    )
    for add, upper_pair, lower_pair in zip((False, True), upper_pairs, lower_pairs, strict=True):
        upper, lower = upper_pair.pessimistic(spacing), lower_pair.optimistic(spacing)
        for epsilon in epsilons:
            exact = _exact_delta(epsilon, q, sigma, r, add)
            law_low = _law_delta(epsilon, q, sigma, laws[False], add)
            law_high = _law_delta(epsilon, q, sigma, laws[True], add)
            where = (r, q, sigma, "add" if add else "remove", epsilon)
            assert _below(lower.delta(epsilon), law_low), where
            assert _below(law_low, exact), where
            assert _below(exact, law_high), where
            assert _below(law_high, upper.delta(epsilon) + upper.error_mass), where
        # Every true loss is finite: nothing may sit at +inf in the optimistic grid.
        assert lower.delta(math.inf) == 0.0


@pytest.mark.parametrize(("r", "q", "sigma"), _CONFIGS)
def test_one_step_bracket_contains_the_exact_delta(
    r: int, q: float, sigma: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """optimistic grid <= optimistic law <= exact <= pessimistic law <= pessimistic grid.

    A budget of 3,000 one-grid-cell-wide cells (instead of 200,000) keeps the test fast and makes
    the geometric tail cells take over early, as they do for heavy tails at fine grids.
    """
    monkeypatch.setattr(jl_pairs, "_MAX_BULK_CELLS", 3_000)
    _check_bracket(r, q, sigma, (0.1, 1.0, 3.0), bins=24)


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [0.8, 1.1, 2.0])
@pytest.mark.parametrize("q", [0.01, 0.1, 1.0])
@pytest.mark.parametrize("r", [1, 3, 10])
def test_one_step_bracket_on_the_full_grid(r: int, q: float, sigma: float) -> None:
    """The same bracket with the production cell budget, on the whole grid and up to eps = 30."""
    _check_bracket(r, q, sigma, (0.05, 0.3, 1.0, 4.0, 30.0), bins=40)


def test_optimistic_grid_keeps_the_heavy_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """r = 1: beyond the one-grid-cell-wide cells (here up to loss ~20) the optimistic grid
    loses under 2% of the optimistic law's exact delta, also far out (eps up to 300)."""
    monkeypatch.setattr(jl_pairs, "_MAX_BULK_CELLS", 2_000)
    q, sigma, r, bins = 0.01, 1.1, 1, 24
    law = jl_shift_mixture(jl_dimension=r, bins=bins, pessimistic=False)
    remove, _ = jl_step_pairs(
        sampling_probability=q, noise_multiplier=sigma, jl_dimension=r, pessimistic=False, bins=bins
    )
    lower = remove.optimistic(1e-2)
    for epsilon in (3.0, 30.0, 100.0, 300.0):
        exact_law = _law_delta(epsilon, q, sigma, law, add=False)
        assert 0.98 * exact_law <= lower.delta(epsilon) <= exact_law * (1 + 1e-9), epsilon


def _nested_edges(edges: np.ndarray) -> np.ndarray:
    """Split every bin in two (geometric midpoints in the log-spaced tail, arithmetic after)."""
    left, right = edges[:-1], edges[1:]
    middle = np.where(right <= 0.05, np.sqrt(np.maximum(left, 1e-300) * right), (left + right) / 2)
    middle[0] = right[0] / 2
    return np.unique(np.concatenate([edges, middle]))


@pytest.mark.parametrize("r", [1, 3, 10])
def test_nested_refinement_moves_both_laws_towards_the_truth(
    r: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Splitting bins makes the optimistic shift law stochastically larger and the pessimistic
    one smaller, so the exact deltas of their pairs tighten from both sides."""
    coarse = jl_pairs._probability_edges(24)
    laws = {}
    for name, edges in (("coarse", coarse), ("fine", _nested_edges(coarse))):
        monkeypatch.setattr(jl_pairs, "_probability_edges", lambda bins, e=edges: e)
        laws[name] = {
            side: jl_shift_mixture(jl_dimension=r, pessimistic=side) for side in (True, False)
        }
    probe = np.geomspace(1e-2, 1e6, 400)

    def tail(law: tuple[np.ndarray, np.ndarray, float]) -> np.ndarray:
        shifts, weights, unbounded = law
        tails: np.ndarray = (shifts[None, :] > probe[:, None]) @ weights + unbounded
        return tails

    assert np.all(tail(laws["fine"][False]) >= tail(laws["coarse"][False]) - 1e-15)
    assert np.all(tail(laws["fine"][True]) <= tail(laws["coarse"][True]) + 1e-15)
    q, sigma = 0.1, 1.1
    for epsilon in (0.5, 2.0):
        fine_low = _law_delta(epsilon, q, sigma, laws["fine"][False], add=False)
        fine_high = _law_delta(epsilon, q, sigma, laws["fine"][True], add=False)
        assert _law_delta(epsilon, q, sigma, laws["coarse"][False], add=False) <= fine_low * (
            1 + 1e-12
        )
        assert fine_high <= _law_delta(epsilon, q, sigma, laws["coarse"][True], add=False) * (
            1 + 1e-12
        )
