"""From the target's scores in N runs per world to a lower bound on epsilon at 95 %.

Each world's runs are split in two (a seeded shuffle): the *selection* half chooses, and the
*test* half decides, so nothing is chosen on the scores the bound is computed from. Per score
(loss, logit margin; oriented so that larger means "in"), up to three routes:

- ``clopper_pearson`` (always): the threshold that gives the best bound on the selection half
  (quantiles of its "out" scores, :func:`dpcore.auditing.stepwise.two_tailed_grid`) is applied
  once to the test half; FPR and FNR bounded by Clopper–Pearson and turned into epsilon with
  the (epsilon, delta) inequalities (:func:`dpcore.auditing.epsilon_lower_bound`). Valid for
  any (epsilon, delta)-DP training.
- ``gdp`` (full batch only): the same threshold test through the Gaussian-DP route
  (:func:`dpcore.auditing.gdp_lower_bound`). It assumes the training is mu-GDP for some mu,
  which full-batch DP-SGD is by construction (T adaptively composed Gaussian mechanisms of
  sensitivity C are sqrt(T)/sigma-GDP; Dong, Roth, Su 2019, Cor. 3.3); with q < 1 it is not,
  and the route is not run.
- ``gaussian`` (full batch only, and only where checked): mu bounded from the two samples'
  mean shift and spread (:func:`dpcore.auditing.gaussian_mu_lower_bound`, exact t and
  chi-square intervals), then epsilon of mu_lb-GDP. Its assumption -- Gaussian scores with one
  variance in both worlds -- is checked on the selection half (Shapiro–Wilk in each world and
  Levene's test, each at level :data:`CHECK_LEVEL`); a failed check reports the route as not
  applicable. The check cannot prove the assumption, only catch a visible departure.

The k = (scores x routes run) tests are each made at confidence 1 - (1 - confidence) / k
(Bonferroni), so every bound reported, and their maximum, hold together at ``confidence``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from dpcore.auditing import gaussian_mu_lower_bound, threshold_sweep_lower_bound
from dpcore.auditing.statistics import _check_confidence
from dpcore.auditing.stepwise import two_tailed_grid
from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_epsilon
from dpcore.validation import check_delta, check_seed

__all__ = ["CHECK_LEVEL", "ROUTES", "decide", "gaussian_check", "routes_for"]

#: Every route, in the order they are reported.
ROUTES = ("clopper_pearson", "gdp", "gaussian")
#: Level of each test of the Gaussian route's assumption (a p-value below it fails the check).
CHECK_LEVEL = 0.05
#: Fewest scores per world and half.
MIN_HALF = 4


def routes_for(full_batch: bool) -> tuple[str, ...]:
    """The routes run: all three for full-batch training, Clopper–Pearson alone otherwise."""
    return ROUTES if full_batch else ROUTES[:1]


def gaussian_check(negative: np.ndarray, positive: np.ndarray) -> dict[str, Any]:
    """Shapiro–Wilk p-values of each world and Levene's p-value (equal variances); ``passed``
    when all three are >= :data:`CHECK_LEVEL`."""
    p_out = float(stats.shapiro(negative).pvalue)
    p_in = float(stats.shapiro(positive).pvalue)
    p_var = float(stats.levene(negative, positive).pvalue)
    passed = min(p_out, p_in, p_var) >= CHECK_LEVEL
    return {"shapiro_out": p_out, "shapiro_in": p_in, "levene": p_var, "passed": bool(passed)}


def _samples(name: str, values: Sequence[float] | np.ndarray) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=float).ravel()
    except (TypeError, ValueError):
        raise InvalidParameterError(name, "to be real numbers", values) from None
    if array.size < 2 * MIN_HALF:
        raise InvalidParameterError(name, f"to hold at least {2 * MIN_HALF} scores", array.size)
    if not np.all(np.isfinite(array)):
        raise InvalidParameterError(name, "to be finite", "NaN or inf")
    return array


def _threshold_route(
    route: str,
    selection: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    delta: float,
    confidence: float,
) -> dict[str, Any]:
    grid = two_tailed_grid(selection[0])
    chosen = threshold_sweep_lower_bound(
        scores_negative=selection[0],
        scores_positive=selection[1],
        thresholds=grid,
        delta=delta,
        confidence=confidence,
        route=route,
    )
    threshold = chosen.threshold if chosen.threshold is not None else float(np.median(grid))
    bound = threshold_sweep_lower_bound(
        scores_negative=test[0],
        scores_positive=test[1],
        thresholds=[threshold],
        delta=delta,
        confidence=confidence,
        route=route,
    )
    false_positives = int(np.sum(test[0] > threshold))
    false_negatives = int(np.sum(test[1] <= threshold))
    return {
        "reported": True,
        "epsilon_lower": bound.epsilon_lower,
        "mu_lower": bound.mu_lower,
        "threshold": float(threshold),
        "false_positives": false_positives,
        "false_negatives": false_negatives,
    }


def _gaussian_route(
    selection: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    delta: float,
    confidence: float,
) -> dict[str, Any]:
    check = gaussian_check(*selection)
    if not check["passed"]:
        return {"reported": False, "why": "Gaussian check failed on the selection half", **check}
    bound = gaussian_mu_lower_bound(test[0], test[1], confidence=confidence)
    if not math.isfinite(bound.mu_lower):
        return {"reported": False, "why": "scores without spread", **check}
    return {
        "reported": True,
        "epsilon_lower": gdp_epsilon(mu=bound.mu_lower, delta=delta),
        "mu_lower": bound.mu_lower,
        "mu_estimate": bound.mu_estimate,
        **check,
    }


def decide(
    out_scores: Mapping[str, Sequence[float] | np.ndarray],
    in_scores: Mapping[str, Sequence[float] | np.ndarray],
    *,
    delta: float,
    full_batch: bool,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """epsilon_lb at ``confidence`` from membership scores (larger: "in") of N runs per world.

    Args:
        out_scores: score name -> the scores of the runs without the target.
        in_scores: the same names -> the scores of the runs with it.
        delta: the delta of the claim, in (0, 1).
        full_batch: whether the training was full-batch (q = 1): the GDP routes apply.
        confidence: of everything returned together, in (0, 1).
        seed: of the shuffle that splits each world's runs into selection and test halves.

    Returns:
        ``{"epsilon_lower", "best": [score, route], "tests", "confidence_each",
        "selection_runs", "test_runs", "scores": {score: {route: {...}}}}``; each route's entry
        has ``reported`` and, where reported, its ``epsilon_lower``.

    Raises:
        InvalidParameterError: no scores, different score names in the two worlds, fewer than
            8 finite scores in a world, delta or confidence out of range, or a bad seed.
    """
    if not out_scores or set(out_scores) != set(in_scores):
        raise InvalidParameterError(
            "in_scores",
            f"the same non-empty score names as out_scores {sorted(out_scores)}",
            sorted(in_scores),
        )
    delta = check_delta("delta", delta)
    confidence = _check_confidence(confidence)
    seed = check_seed("seed", seed)
    routes = routes_for(bool(full_batch))
    tests = len(out_scores) * len(routes)
    each = 1 - (1 - confidence) / tests
    result: dict[str, Any] = {}
    best: tuple[float, list[str]] = (0.0, [])
    sizes: tuple[int, int] = (0, 0)
    for name in sorted(out_scores):
        negative = _samples(f"out_scores[{name!r}]", out_scores[name])
        positive = _samples(f"in_scores[{name!r}]", in_scores[name])
        rng = np.random.default_rng(seed)
        negative, positive = rng.permutation(negative), rng.permutation(positive)
        cut_n, cut_p = negative.size // 2, positive.size // 2
        selection = (negative[:cut_n], positive[:cut_p])
        test = (negative[cut_n:], positive[cut_p:])
        sizes = (cut_n + cut_p, test[0].size + test[1].size)
        entries: dict[str, Any] = {}
        for route in routes:
            if route == "gaussian":
                entry = _gaussian_route(selection, test, delta=delta, confidence=each)
            else:
                entry = _threshold_route(route, selection, test, delta=delta, confidence=each)
            entries[route] = entry
            if entry["reported"] and entry["epsilon_lower"] > best[0]:
                best = (entry["epsilon_lower"], [name, route])
        result[name] = entries
    return {
        "epsilon_lower": best[0],
        "best": best[1],
        "tests": tests,
        "confidence": confidence,
        "confidence_each": each,
        "selection_runs": sizes[0],
        "test_runs": sizes[1],
        "scores": result,
    }
