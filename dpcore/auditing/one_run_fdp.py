"""One-run audit bound for Gaussian DP (Mahloujifar, Melis, Chaudhuri, ICML 2025).

"Auditing f-Differential Privacy in One Run" (arXiv 2410.22235) audits in the one-run setting of
Steinke, Nasr, Jagielski 2023 (m canaries, each included independently with probability 1/2;
the auditor guesses inclusion for r of them and gets v right) but tests the hypothesis "the
mechanism is f-DP" against the whole tradeoff curve f instead of one (epsilon, delta) pair. For
the Gaussian curve this gives a lower confidence bound on mu, and the epsilon it implies, that is
tighter than Steinke et al.'s Thm 5.2 on the same outcomes (about 1.0 against 0.6 at m = 1000,
r = 200 and a true epsilon of 2 at delta = 1e-5, see the tests). :func:`one_run_fdp_rejects`
runs the same test against any claimed curve from :mod:`dpcore.tradeoff`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import optimize, special

from dpcore.auditing.statistics import AuditBound, _check_confidence
from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_epsilon
from dpcore.tradeoff.base import TradeoffFunction
from dpcore.validation import check_count, check_delta

__all__ = ["one_run_fdp_rejects", "one_run_gdp_excess", "one_run_gdp_lower_bound"]

#: Beyond this mu the bound is reported as infinite (epsilon of such a mu is astronomically large).
MU_CAP = 1e3


def _check_outcome(canaries: int, guesses: int, correct: int) -> tuple[int, int, int]:
    m = check_count("canaries", canaries, minimum=1)
    r = check_count("guesses", guesses)
    v = check_count("correct", correct)
    if r > m:
        raise InvalidParameterError("guesses", f"<= canaries = {m}", guesses)
    if v > r:
        raise InvalidParameterError("correct", f"<= guesses = {r}", correct)
    return m, r, v


def _gdp_inverse_blow_up(mu: float) -> Callable[[float], float]:
    """f-bar^{-1}(y) = Phi(Phi^{-1}(y) - mu) for f = G_mu, f-bar(x) = 1 - f(x)."""

    def inverse(y: float) -> float:
        return float(special.ndtr(special.ndtri(y) - mu))

    return inverse


def _polygon_inverse_blow_up(f: TradeoffFunction) -> Callable[[float], float]:
    """f-bar^{-1}(y) = inf{x : 1 - g(x) >= y} for the polygon g = symmetrise(f) <= f.

    g is piecewise linear, so the inverse of the non-decreasing 1 - g is piecewise linear
    through the vertices and linear interpolation is exact; where 1 - g is flat (only at its
    top, g = 0, by convexity) the first vertex of the flat is kept, which is the infimum.
    """
    alpha, beta = f.symmetrise().points()
    blow_up, first = np.unique(1.0 - beta, return_index=True)
    at = alpha[first]

    def inverse(y: float) -> float:
        if y <= blow_up[0]:
            return 0.0
        if y > blow_up[-1]:
            return 1.0
        return float(np.interp(y, blow_up, at))

    return inverse


def _excess(inverse: Callable[[float], float], m: int, r: int, v: int, gamma: float) -> float:
    """r_0 + h_0 - r/m of the recursion (> 0: f-DP is rejected). Inputs already checked."""
    right = gamma * v / m
    wrong = gamma * (r - v) / m
    for i in range(v - 1, -1, -1):
        floor = inverse(min(right, 1.0))
        if floor <= wrong:
            break  # h stays, so r stays, so every later step is the same: fixed point
        right = min(right + i / (r - i) * (floor - wrong), 1.0)
        wrong = floor
    return right + wrong - r / m


def one_run_gdp_excess(
    mu: float, *, canaries: int, guesses: int, correct: int, confidence: float = 0.95
) -> float:
    """The test statistic of the one-run f-DP audit for the hypothesis "mu-GDP".

    Mahloujifar, Melis, Chaudhuri 2025 (arXiv 2410.22235), the guessing game with abstentions
    and its numerical test (``rh_with_cap`` / ``audit_rh_with_cap`` in their reference code):
    with m = ``canaries``, r = ``guesses``, v = ``correct``, gamma = 1 - ``confidence`` and the
    blow-up f-bar(x) = 1 - f(x) of the tradeoff curve f (for mu-GDP,
    f-bar^{-1}(y) = Phi(Phi^{-1}(y) - mu)), start from r_v = gamma v / m, h_v = gamma (r - v) / m
    and for i = v - 1, ..., 0 set

        h_i = max(h_{i+1}, f-bar^{-1}(r_{i+1})),
        r_i = r_{i+1} + i / (r - i) * (h_i - h_{i+1}).

    If the mechanism is f-DP, P[at least v correct guesses] > gamma would force
    r_0 + h_0 <= r / m (the r_i and h_i lower-bound the correct- and wrong-guess mass implied by
    f-DP applied canary by canary, and the guess mass is r / m); so r_0 + h_0 - r / m > 0
    rejects "mu-GDP" at level gamma. r_i is capped at 1, which only lowers the statistic.

    Args:
        mu: the hypothesised GDP parameter, >= 0.
        canaries: m >= 1, each included independently with probability 1/2.
        guesses: r <= m, the number of canaries whose inclusion was guessed (fixed in advance).
        correct: v <= r, the number of right guesses.
        confidence: 1 - gamma, in (0, 1).

    Returns:
        r_0 + h_0 - r / m; positive exactly when the audit rejects mu-GDP. Non-increasing in mu.

    Raises:
        InvalidParameterError: a count is negative or not an integer, r > m, v > r, mu < 0 or
            not finite, or confidence outside (0, 1).
    """
    if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not math.isfinite(mu):
        raise InvalidParameterError("mu", "to be a finite number >= 0", mu)
    if mu < 0:
        raise InvalidParameterError("mu", ">= 0", mu)
    m, r, v = _check_outcome(canaries, guesses, correct)
    gamma = 1 - _check_confidence(confidence)
    return _excess(_gdp_inverse_blow_up(float(mu)), m, r, v, gamma)


def one_run_gdp_lower_bound(
    *, canaries: int, guesses: int, correct: int, delta: float, confidence: float = 0.95
) -> AuditBound:
    """Lower confidence bound on mu (and epsilon at ``delta``) from one run, via f-DP.

    Mahloujifar, Melis, Chaudhuri, "Auditing f-Differential Privacy in One Run", ICML 2025
    (arXiv 2410.22235): mu_lb = sup{mu : the audit rejects mu-GDP at level 1 - confidence}, the
    rejection being :func:`one_run_gdp_excess` > 0. The statistic is non-increasing in mu, so
    the rejected mus form an interval [0, mu*) and mu_lb is found by bracketing and Brent's
    method; the returned value is itself checked to be rejected (a hair below the root), so
    P[mu_lb > true mu] <= 1 - confidence for any mechanism that is (true mu)-GDP with respect to
    each canary. ``epsilon_lower`` is the epsilon of mu_lb-GDP at ``delta`` (as in
    :func:`dpcore.auditing.statistics.gdp_lower_bound`: a lower bound on the epsilon of any
    mechanism that is mu-GDP for some mu, e.g. the Gaussian mechanism and DP-SGD as analysed
    by the CLT, not for arbitrary (epsilon, delta)-DP mechanisms).

    Source of the statement: the paper's guessing-game theorem with abstentions as implemented
    by its authors (facebookresearch/PrivacyGuard, ``FDPAnalysisNode.audit_rh_with_cap``) and,
    identically, by google-deepmind/jax_privacy (``auditing._epsilon_one_run_fdp``), k = 2
    (membership). Both search a grid of noise levels or of epsilons; here the same test is
    inverted in mu directly. Validity and the comparison with Steinke et al.'s Thm 5.2
    (:func:`dpcore.auditing.statistics.one_run_epsilon_lower_bound`) are checked by simulation
    in ``tests/auditing/test_one_run_fdp.py``.

    Args:
        canaries: m >= 1, each included independently with probability 1/2.
        guesses: r <= m, the number of guesses (fixed before the scores are seen, e.g. the
            top and bottom r/2 scores; choosing r after looking needs a correction).
        correct: v <= r, the number of right guesses.
        delta: in (0, 1), for the epsilon that mu_lb implies.
        confidence: in (0, 1); the bound fails with probability at most 1 - confidence.

    Returns:
        An :class:`AuditBound` with ``mu_lower`` = mu_lb (``inf`` if above 1e3),
        ``epsilon_lower`` = epsilon of mu_lb-GDP at delta, ``method`` = "one_run_gdp".

    Raises:
        InvalidParameterError: a count is negative or not an integer, r > m, v > r, delta or
            confidence outside (0, 1).

    >>> bound = one_run_gdp_lower_bound(canaries=1000, guesses=200, correct=150, delta=1e-5)
    >>> round(bound.mu_lower, 3), round(bound.epsilon_lower, 3)
    (0.339, 1.297)
    """
    m, r, v = _check_outcome(canaries, guesses, correct)
    delta = check_delta("delta", delta)
    confidence = _check_confidence(confidence)
    gamma = 1 - confidence

    def excess(mu: float) -> float:
        return _excess(_gdp_inverse_blow_up(mu), m, r, v, gamma)

    if v == 0 or excess(0.0) <= 0:
        return AuditBound(0.0, confidence, "one_run_gdp", mu_lower=0.0)
    low, high = 0.0, 1.0
    while excess(high) > 0:
        low, high = high, 2 * high
        if high > MU_CAP:
            return AuditBound(math.inf, confidence, "one_run_gdp", mu_lower=math.inf)
    root = float(optimize.brentq(excess, low, high, xtol=1e-12, rtol=1e-12))
    # Report a mu that is itself rejected: everything below it is then rejected too.
    mu = root
    step = 1e-10 * max(1.0, root)
    while mu > low and excess(mu) <= 0:
        mu -= step
        step *= 2
    mu = max(mu, low)
    return AuditBound(gdp_epsilon(mu=mu, delta=delta), confidence, "one_run_gdp", mu_lower=mu)


def one_run_fdp_rejects(
    tradeoff: TradeoffFunction,
    *,
    canaries: int,
    guesses: int,
    correct: int,
    confidence: float = 0.95,
) -> bool:
    """Whether the one-run audit rejects "the mechanism is f-DP" for a claimed curve f.

    The test of :func:`one_run_gdp_excess` with any tradeoff function in place of G_mu
    (Mahloujifar, Melis, Chaudhuri 2025, arXiv 2410.22235 -- the paper's general form: e.g. the
    claimed curve of DP-SGD from :mod:`dpcore.tradeoff`). f is replaced by the polygon
    ``f.symmetrise()`` <= f (the symmetric curve implied under add/remove, exact at vertices),
    whose blow-up inverse is exact; a lower curve is a weaker claim and lowers the statistic, so
    a correct f-DP mechanism is rejected with probability <= 1 - confidence.

    Args:
        tradeoff: the claimed tradeoff function f (per canary).
        canaries, guesses, correct, confidence: as in :func:`one_run_gdp_excess`.

    Returns:
        True when the outcome rejects f-DP at level 1 - confidence (evidence of a violation).

    Raises:
        InvalidParameterError: ``tradeoff`` is not a TradeoffFunction, or a count or the
            confidence is outside its range.

    >>> from dpcore.tradeoff import GaussianTradeoff
    >>> one_run_fdp_rejects(GaussianTradeoff(0.3), canaries=1000, guesses=200, correct=150)
    True
    >>> one_run_fdp_rejects(GaussianTradeoff(0.4), canaries=1000, guesses=200, correct=150)
    False
    """
    if not isinstance(tradeoff, TradeoffFunction):
        raise InvalidParameterError("tradeoff", "to be a TradeoffFunction", tradeoff)
    m, r, v = _check_outcome(canaries, guesses, correct)
    gamma = 1 - _check_confidence(confidence)
    return _excess(_polygon_inverse_blow_up(tradeoff), m, r, v, gamma) > 0
