"""Per-step distinguishing and its composition: from step scores to an epsilon lower bound.

Shared by every per-step white-box audit (Nasr et al. 2023, arXiv 2302.07956, Sec. 5-6): each
step of a correct DP-SGD gives the auditor a score that is N(0, sigma^2) without the canary and
N(1, sigma^2) with it, a Gaussian mechanism with mu = 1 / sigma (Dong, Roth, Su 2019). A
threshold test bounds mu from below (:func:`distinguish`); the empirical noise multiplier
1 / mu_lb composed with the claimed sampling gives epsilon_lb (:func:`composed_lower_bound`).
Where the Gaussian shape of the scores may be trusted, ``distinguish(..., route="gaussian")``
bounds mu from the scores' mean shift and spread instead (exact t / chi-square intervals,
:mod:`dpcore.auditing.gaussian_scores`), which is tighter at the same number of runs;
:func:`dpcore.auditing.gaussian_scores.runs_for_mu_ratio` sizes the runs for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from dpcore.accountants import PldAccountant
from dpcore.auditing.gaussian_scores import gaussian_mu_lower_bound
from dpcore.auditing.statistics import AuditBound, threshold_sweep_lower_bound
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event

#: The routes :func:`distinguish` offers: assumption-free thresholds, or Gaussian scores.
ROUTES = ("threshold", "gaussian")

#: Below this noise multiplier the PLD grid gets needlessly fine; flooring sigma_emp there only
#: makes the bound smaller (still valid).
SIGMA_FLOOR = 0.05


def held_out_threshold_bound(
    negative: np.ndarray,
    positive: np.ndarray,
    *,
    delta: float,
    confidence: float,
    held_out_fraction: float,
    seed: int,
    grid: Callable[[np.ndarray], np.ndarray],
    route: str,
) -> tuple[AuditBound, float]:
    """(bound, threshold): a threshold chosen on a held-out part, the bound on the rest.

    Scores are shuffled (seeded) before the split; ``grid(held-out negatives)`` gives the
    thresholds swept (Bonferroni) on the held-out part only; the chosen one is evaluated once on
    the remaining scores by ``route`` ("gdp" or "clopper_pearson"), so the bound holds at
    ``confidence``.
    """
    rng = np.random.default_rng(seed)
    negative, positive = rng.permutation(negative), rng.permutation(positive)
    cut_n, cut_p = int(held_out_fraction * negative.size), int(held_out_fraction * positive.size)
    thresholds = grid(negative[:cut_n])
    chosen = threshold_sweep_lower_bound(
        scores_negative=negative[:cut_n],
        scores_positive=positive[:cut_p],
        thresholds=thresholds,
        delta=delta,
        confidence=confidence,
        route=route,
    )
    threshold = chosen.threshold if chosen.threshold is not None else float(np.median(thresholds))
    bound = threshold_sweep_lower_bound(
        scores_negative=negative[cut_n:],
        scores_positive=positive[cut_p:],
        thresholds=[threshold],
        delta=delta,
        confidence=confidence,
        route=route,
    )
    return bound, float(threshold)


def two_tailed_grid(held_out: np.ndarray) -> np.ndarray:
    """Quantiles of the held-out negatives in both tails (25 levels each, 1e-3 to 1/2)."""
    levels = np.concatenate([np.geomspace(1e-3, 0.5, 25), 1 - np.geomspace(1e-3, 0.5, 25)])
    return np.asarray(np.quantile(held_out, 1 - levels), dtype=np.float64)


def distinguish(
    negative: np.ndarray,
    positive: np.ndarray,
    *,
    delta: float,
    confidence: float,
    held_out_fraction: float,
    seed: int,
    route: str = "threshold",
) -> tuple[float, float]:
    """(mu_lb, threshold): a lower confidence bound on one step's mu from its scores.

    ``route="threshold"`` (the default, assumption-free, for untrusted implementations): the
    GDP route (Clopper–Pearson rates, union bound) at a threshold chosen from
    :func:`two_tailed_grid` on a held-out part (:func:`held_out_threshold_bound`).
    ``route="gaussian"``: :func:`dpcore.auditing.gaussian_scores.gaussian_mu_lower_bound`
    (two-sided, all scores, no held-out part; valid only if the scores are independent and
    Gaussian with one sigma in both worlds, as under a correct DP-SGD; Nasr et al. 2023,
    Sec. 5-6); the threshold is then NaN and ``held_out_fraction`` and ``seed`` are unused.

    Raises:
        InvalidParameterError: ``route`` is not one of :data:`ROUTES` (before any work), or
            a score or parameter is invalid.
    """
    if route not in ROUTES:
        raise InvalidParameterError("route", f"in {list(ROUTES)}", route)
    if route == "gaussian":
        gaussian = gaussian_mu_lower_bound(
            negative, positive, confidence=confidence, two_sided=True
        )
        return gaussian.mu_lower, math.nan
    bound, threshold = held_out_threshold_bound(
        negative,
        positive,
        delta=delta,
        confidence=confidence,
        held_out_fraction=held_out_fraction,
        seed=seed,
        grid=two_tailed_grid,
        route="gdp",
    )
    return float(bound.mu_lower or 0.0), threshold


def composed_lower_bound(q: float, mu_lower: float, steps: int, delta: float) -> float:
    """epsilon_lb: lower end of the PLD interval of DP-SGD(q, 1 / mu_lb, T) (0 if mu_lb = 0)."""
    if mu_lower <= 0:
        return 0.0
    sigma = max(1.0 / mu_lower, SIGMA_FLOOR)
    event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    return float(PldAccountant().compose(event).get_epsilon_interval(delta).lower)


def mu_ratio_for_epsilon_ratio(
    *, q: float, mu: float, steps: int, delta: float, target_ratio: float
) -> float:
    """The mu_lb / mu an audit needs so that its epsilon_lb is ``target_ratio`` of epsilon.

    epsilon_lb composes mu_lb through the PLD of DP-SGD(q, 1 / mu_lb, T)
    (:func:`composed_lower_bound`); this inverts that map relative to the claimed ``mu``: the
    smallest r with composed_lower_bound(q, r mu, T, delta) >= target_ratio *
    composed_lower_bound(q, mu, T, delta), by bisection to 1e-4. With
    :func:`dpcore.auditing.gaussian_scores.runs_for_mu_ratio` it sizes the runs an audit needs
    for an epsilon target (at q = 0.2, T = 100, epsilon 4 the map is close to the identity,
    slightly below it: mu ratio 0.9 gives about 0.87 of epsilon).

    Args:
        q: the sampling probability, in (0, 1].
        mu: the claimed per-step mu (1 / noise multiplier), > 0.
        steps: T, >= 1.
        delta: in (0, 1).
        target_ratio: in (0, 1).

    Returns:
        The mu ratio r in (0, 1].

    Raises:
        InvalidParameterError: target_ratio outside (0, 1), or mu not > 0 and finite.
    """
    if not 0 < target_ratio < 1:
        raise InvalidParameterError("target_ratio", "in (0, 1)", target_ratio)
    if not (mu > 0 and math.isfinite(mu)):
        raise InvalidParameterError("mu", "> 0 and finite", mu)
    goal = target_ratio * composed_lower_bound(q, mu, steps, delta)
    low, high = 0.0, 1.0
    while high - low > 1e-4:
        middle = (low + high) / 2
        if composed_lower_bound(q, middle * mu, steps, delta) >= goal:
            high = middle
        else:
            low = middle
    return high
