"""One-run f-DP (Gaussian) audit: the published recursion, validity by simulation, vs Steinke."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from dpcore.auditing.one_run_fdp import (
    one_run_fdp_rejects,
    one_run_gdp_excess,
    one_run_gdp_lower_bound,
)
from dpcore.auditing.statistics import one_run_epsilon_lower_bound
from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_epsilon
from dpcore.tradeoff import EpsilonDeltaTradeoff, GaussianTradeoff

DELTA = 1e-5
#: mu whose epsilon at delta = 1e-5 is 2 (the "epsilon = 2" setting), about 0.5016.
MU_EPS2 = float(optimize.brentq(lambda mu: gdp_epsilon(mu=mu, delta=DELTA) - 2.0, 0.01, 5.0))


def _reference_excess(mu: float, m: int, r: int, v: int, gamma: float) -> float:
    """The recursion as written in the paper's procedure: full length, no cap, no early exit."""
    right, wrong = gamma * v / m, gamma * (r - v) / m
    for i in range(v - 1, -1, -1):
        new_wrong = max(wrong, stats.norm.cdf(stats.norm.ppf(right) - mu))
        right, wrong = right + i / (r - i) * (new_wrong - wrong), new_wrong
    return right + wrong - r / m


def _one_run_outcome(rng: np.random.Generator, mu: float, m: int, r: int) -> int:
    """Scores N(mu b, 1), b ~ Bernoulli(1/2); guess "in" for the top r/2, "out" for the bottom."""
    included = rng.integers(0, 2, m)
    order = np.argsort(rng.normal(mu * included, 1.0))
    top, bottom = order[m - (r - r // 2) :], order[: r // 2]
    return int(included[top].sum() + (1 - included[bottom]).sum())


def test_single_correct_guess_closed_form() -> None:
    # v = 1: one step, i = 0: h_0 = max(gamma (r-1)/m, Phi(Phi^{-1}(gamma/m) - mu)), r_0 = r_1.
    m, r, gamma, mu = 50, 4, 0.05, 0.7
    expected = gamma / m + max(gamma * 3 / m, stats.norm.cdf(stats.norm.ppf(gamma / m) - mu)) - 0.08
    assert one_run_gdp_excess(mu, canaries=m, guesses=r, correct=1) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("mu", "m", "r", "v"),
    [(0.3, 1000, 200, 150), (0.34, 1000, 200, 150), (0.07, 1000, 200, 120), (1.0, 100, 100, 80),
     (2.0, 100, 40, 39), (0.0, 30, 10, 6)],
)  # fmt: skip
def test_matches_the_published_recursion_in_sign(mu: float, m: int, r: int, v: int) -> None:
    # Early exit at the fixed point and the cap r_i <= 1 never change the decision; where the
    # hypothesis is kept (statistic <= 0) the cap is never reached and the values agree.
    ours = one_run_gdp_excess(mu, canaries=m, guesses=r, correct=v)
    reference = _reference_excess(mu, m, r, v, 0.05)
    assert (ours > 0) == (reference > 0)
    if reference <= 0:
        assert ours == pytest.approx(reference, abs=1e-12)


def test_bound_is_the_edge_of_the_rejected_set() -> None:
    bound = one_run_gdp_lower_bound(canaries=1000, guesses=200, correct=160, delta=DELTA)
    mu = bound.mu_lower
    assert mu is not None and 0 < mu < 1
    assert one_run_gdp_excess(mu, canaries=1000, guesses=200, correct=160) > 0
    assert one_run_gdp_excess(mu + 1e-7, canaries=1000, guesses=200, correct=160) <= 0
    assert bound.epsilon_lower == gdp_epsilon(mu=mu, delta=DELTA)
    assert bound.method == "one_run_gdp" and bound.confidence == 0.95


@pytest.mark.parametrize(("m", "r", "mu"), [(1000, 200, MU_EPS2), (100, 100, 3.0)])
def test_valid_on_the_gaussian_mechanism(m: int, r: int, mu: float) -> None:
    # 200 seeded one-run experiments on a mechanism that is exactly mu-GDP per canary: the 95%
    # bound may exceed mu in at most 5% of them; Binomial(200, 0.05) > 22 has probability
    # 1.9e-4 (the test's own false-alarm rate). The bound must also be informative (its mean
    # at least a quarter of mu; with 100 canaries even 100 right guesses give only 1.70), so
    # that validity is not met by answering 0.
    exceed, bounds = 0, []
    for seed in range(200):
        v = _one_run_outcome(np.random.default_rng(seed), mu, m, r)
        bound = one_run_gdp_lower_bound(canaries=m, guesses=r, correct=v, delta=DELTA)
        assert bound.mu_lower is not None
        exceed += bound.mu_lower > mu
        bounds.append(bound.mu_lower)
    assert exceed <= 22
    assert np.mean(bounds) >= mu / 4


def test_tighter_than_steinke_nasr_jagielski() -> None:
    # Same outcomes (m = 1000, r = 200, true epsilon 2 at delta 1e-5), both as epsilon at the
    # same delta: the f-DP bound is at least Steinke et al.'s Thm 5.2 bound on every seed, and
    # clearly larger on average (measured: about 0.98 against 0.63 over 200 seeds).
    fdp, steinke = [], []
    for seed in range(20):
        v = _one_run_outcome(np.random.default_rng(seed), MU_EPS2, 1000, 200)
        ours = one_run_gdp_lower_bound(canaries=1000, guesses=200, correct=v, delta=DELTA)
        theirs = one_run_epsilon_lower_bound(canaries=1000, guesses=200, correct=v, delta=DELTA)
        assert ours.epsilon_lower >= theirs.epsilon_lower
        fdp.append(ours.epsilon_lower)
        steinke.append(theirs.epsilon_lower)
    assert np.mean(fdp) >= 1.3 * np.mean(steinke)
    assert np.mean(fdp) <= 2.0  # and still below the truth


def test_monotone_and_zero_at_chance() -> None:
    assert one_run_gdp_lower_bound(canaries=1000, guesses=200, correct=100, delta=DELTA) == (
        one_run_gdp_lower_bound(canaries=1000, guesses=200, correct=0, delta=DELTA)
    )
    assert one_run_gdp_lower_bound(canaries=10, guesses=0, correct=0, delta=DELTA).mu_lower == 0
    previous = 0.0
    for v in range(100, 201, 10):
        mu = one_run_gdp_lower_bound(canaries=1000, guesses=200, correct=v, delta=DELTA).mu_lower
        assert mu is not None and mu >= previous
        previous = mu
    assert previous > 1.0  # all 200 right
    loose = one_run_gdp_lower_bound(
        canaries=1000, guesses=200, correct=160, delta=DELTA, confidence=0.999
    )
    tight = one_run_gdp_lower_bound(
        canaries=1000, guesses=200, correct=160, delta=DELTA, confidence=0.9
    )
    assert loose.mu_lower is not None and tight.mu_lower is not None
    assert 0 < loose.mu_lower < tight.mu_lower
    assert math.isfinite(tight.epsilon_lower)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"canaries": 0, "guesses": 0, "correct": 0}, "canaries"),
        ({"canaries": 10, "guesses": 11, "correct": 1}, "guesses"),
        ({"canaries": 10, "guesses": 5, "correct": 6}, "correct"),
        ({"canaries": 10, "guesses": 5.0, "correct": 1}, "guesses"),
        ({"canaries": 10, "guesses": 5, "correct": -1}, "correct"),
        ({"canaries": 10, "guesses": 5, "correct": 1, "delta": 0.0}, "delta"),
        ({"canaries": 10, "guesses": 5, "correct": 1, "confidence": 1.0}, "confidence"),
    ],
)
def test_bad_inputs(kwargs: dict[str, object], parameter: str) -> None:
    arguments: dict[str, object] = {"delta": DELTA, **kwargs}
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        one_run_gdp_lower_bound(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("mu", [-0.1, math.nan, math.inf, True])
def test_bad_mu(mu: float) -> None:
    with pytest.raises(InvalidParameterError, match="Expected mu"):
        one_run_gdp_excess(mu, canaries=10, guesses=4, correct=3)


@pytest.mark.parametrize("correct", [130, 150, 175])
def test_general_curve_agrees_with_the_gdp_route(correct: int) -> None:
    # The same test through a TradeoffFunction (polygon of G_mu): it rejects just below the
    # GDP route's mu_lb and keeps just above it.
    bound = one_run_gdp_lower_bound(canaries=1000, guesses=200, correct=correct, delta=DELTA)
    assert bound.mu_lower is not None and bound.mu_lower > 0.02
    outcome = {"canaries": 1000, "guesses": 200, "correct": correct}
    assert one_run_fdp_rejects(GaussianTradeoff(bound.mu_lower - 0.005), **outcome)
    assert not one_run_fdp_rejects(GaussianTradeoff(bound.mu_lower + 0.005), **outcome)


def _smallest_rejected(claim: EpsilonDeltaTradeoff, m: int, r: int) -> int | None:
    """The fewest right guesses that reject the claim (bisection; the test is monotone in v)."""
    if not one_run_fdp_rejects(claim, canaries=m, guesses=r, correct=r):
        return None
    low, high = 0, r  # low kept, high rejected
    while high - low > 1:
        middle = (low + high) // 2
        if one_run_fdp_rejects(claim, canaries=m, guesses=r, correct=middle):
            high = middle
        else:
            low = middle
    assert not one_run_fdp_rejects(claim, canaries=m, guesses=r, correct=high - 1)
    return high


@pytest.mark.parametrize(
    ("epsilon", "m", "r"), [(1.0, 1000, 1000), (1.0, 200, 200), (0.5, 100, 100), (2.0, 1000, 200)]
)
def test_exact_size_on_randomized_response(epsilon: float, m: int, r: int) -> None:
    # Randomized response (report the bit with probability q = e^eps / (1 + e^eps)) is the
    # extremal eps-DP mechanism and its guesses are independent: v ~ Binomial(r, q) exactly, so
    # the probability that the audit rejects the true claim f_{eps,0} is computed exactly. It
    # must be <= 5% (measured 2.9% to 4.2%: the test is not vacuous either).
    q = math.exp(epsilon) / (1 + math.exp(epsilon))
    smallest = _smallest_rejected(EpsilonDeltaTradeoff(epsilon), m, r)
    assert smallest is not None
    size = float(stats.binom.sf(smallest - 1, r, q))
    assert 0.02 <= size <= 0.05


def test_detects_a_mechanism_weaker_than_claimed() -> None:
    # Claimed eps = 1, actual randomized response at eps = 2: rejected with probability > 99%
    # (exact, 200 canaries, all guessed).
    smallest = _smallest_rejected(EpsilonDeltaTradeoff(1.0), 200, 200)
    assert smallest is not None
    q_actual = math.exp(2.0) / (1 + math.exp(2.0))
    assert float(stats.binom.sf(smallest - 1, 200, q_actual)) > 0.99
    with pytest.raises(InvalidParameterError, match="Expected tradeoff"):
        one_run_fdp_rejects("G_1", canaries=10, guesses=4, correct=3)  # type: ignore[arg-type]
