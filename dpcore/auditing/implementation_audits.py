"""Audit a DP-SGD implementation through its adapter (:mod:`dpcore.auditing.implementation`).

:func:`audit_implementation` runs every audit below on ``seeds`` seeds and decides them together
(:mod:`dpcore.auditing.verdicts`: seeds combined by Fisher, audits by Holm at ``level``, so a
correct implementation is flagged anywhere with probability at most ``level``). Every audit
gives a p-value; the epsilon audits also give an epsilon lower bound where its assumptions hold.

* ``whitebox_per_step`` and the structural tests (:func:`whitebox_audit`), on the settings'
  task (an MLP with biases and a rare class by default; ``task="linear"`` for the one-tensor
  regression): ``runs`` runs with canary 0 in the dataset and ``runs`` without, plus
  ``tiny_runs`` runs on a tiny dataset (``tiny_records`` records, so that lots are often empty).
  The auditor recomputes every step (:mod:`dpcore.auditing.structural`); the canary's read-back
  s_t (N(1[canary in lot], sigma^2) per step when clipped) at the steps whose lot held it are the
  positives, every step of the canary-free runs the negatives. The GDP route with Gaussian
  scores (:func:`dpcore.auditing.gaussian_scores.gaussian_mu_lower_bound`: exact t and chi^2
  intervals) gives mu_lb, and the claimed Poisson sampling composes it to epsilon_lb (Nasr et
  al. 2023, arXiv 2302.07956); the held-out threshold route's bound is kept beside it
  (``epsilon_lower_threshold``). Its p-value (the threshold route's) tests mu <= mu*, the
  per-step mu whose composition is the claimed epsilon; ``runs`` sets the compute. The
  epsilon bounds are printed only when the steps are independent (the noise correlation test
  does not reject at 1 - confidence) and the lots were Poisson as the accounting assumes;
  otherwise the row keeps its p-value and says "not an ε bound".
  Rows: ``noise_calibration``, ``noise_per_tensor``, ``canary_per_tensor``,
  ``noise_correlation``, ``empty_lots``, ``sampler_lots`` (which sampler the lots came from).
* :func:`one_run_audit` — Steinke, Nasr, Jagielski 2023 (arXiv 2305.08846, Thm 5.2) on the
  linear task: m canaries each in the dataset with probability 1/2, one run, score_i = sum_t
  s_t,i; "in" for the highest, "out" for the lowest. It trusts nothing (its bound holds whatever
  the sampler); its p-value is the theorem's p(epsilon) at the claimed epsilon. Beside it,
  ``epsilon_lower_fdp``: the f-DP (Gaussian) one-run bound of Mahloujifar, Melis, Chaudhuri
  (ICML 2025; :func:`dpcore.auditing.one_run_fdp.one_run_gdp_lower_bound`) on the same guesses,
  a bound for mechanisms that are mu-GDP for some mu.
* :func:`sampler_audit` — one canary and a probe run at sigma = 0.01: s_t shows, step by step,
  whether the canary was used, with no access to the sampler. Under Poisson sampling the
  inclusion count in each window of k = round(1/q) steps is Bin(k, q), so ``ones`` (windows
  with exactly one inclusion) ~ Bin(E, k q (1 - q)^(k-1)): an exact two-sided binomial test.
  It names what it saw: ``shuffle`` (one use per window), ``replayed lots`` (inclusions
  repeating with the window's period) or ``poisson-like``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from scipy import special, stats

from dpcore.accountants import PldAccountant, RdpAccountant
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.accountants.shuffled import shuffled_lower_bound
from dpcore.auditing import structural
from dpcore.auditing.gaussian_scores import gaussian_mu_lower_bound
from dpcore.auditing.implementation import (
    AuditTask,
    Claim,
    Implementation,
    Observer,
    make_mlp_task,
    make_task,
)
from dpcore.auditing.one_run_fdp import one_run_gdp_lower_bound
from dpcore.auditing.statistics import _one_run_p_value, one_run_epsilon_lower_bound
from dpcore.auditing.stepwise import composed_lower_bound, held_out_threshold_bound, two_tailed_grid
from dpcore.auditing.structural import AuditNotApplicableError
from dpcore.auditing.verdicts import FLAGGED, WHITEBOX_AUDITS, AuditReport, summarise
from dpcore.calibration import calibrate_noise
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event
from dpcore.validation import check_count, check_delta, check_positive

__all__ = [
    "FLAGGED",
    "ONE_RUN_SETTINGS",
    "PER_STEP_SETTINGS",
    "AuditNotApplicableError",
    "AuditSettings",
    "audit_implementation",
    "audit_seed",
    "certified_epsilon",
    "one_run_audit",
    "sampler_audit",
    "whitebox_audit",
]

#: Noise multiplier of the sampler audit's probe run (s_t resolves inclusion to 50 sigma).
PROBE_NOISE = 0.01

#: Tasks the per-step audit runs on.
TASKS = ("mlp", "linear")


def _open_unit(name: str, value: object) -> float:
    """A real number in the open interval (0, 1) (NaN, inf and bool refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameterError(name, "a real number in (0, 1)", value)
    result = float(value)
    if not 0 < result < 1:
        raise InvalidParameterError(name, "a real number in (0, 1)", value)
    return result


@dataclasses.dataclass(frozen=True)
class AuditSettings:
    """The audited training setting (sigma is calibrated so that the PLD epsilon is the target).

    ``max_grad_norm`` is not 1 so that noise scaled by sigma instead of sigma C shows. ``task``
    is the per-step audit's task: ``mlp`` (layers (1 + real_features, 1 + hidden, classes),
    ReLU, cross-entropy, ``rare_records`` real records of the rare class) or ``linear``.

    Raises:
        InvalidParameterError: naming the first field out of its range.
    """

    target_epsilon: float = 4.0
    delta: float = 1e-5
    real_records: int = 19
    real_features: int = 4
    sampling_probability: float = 0.2
    steps: int = 100
    max_grad_norm: float = 2.0
    learning_rate: float = 0.05
    confidence: float = 0.95
    runs: int = 8
    held_out_fraction: float = 0.2
    one_run_canaries: int = 1000
    one_run_guesses_each_side: int = 100
    one_run_real_records: int = 100
    sampler_steps: int = 500
    task: str = "mlp"
    hidden: int = 4
    classes: int = 3
    rare_records: int = 1
    tiny_records: int = 5
    tiny_runs: int = 4

    def __post_init__(self) -> None:
        check_positive("target_epsilon", self.target_epsilon)
        check_delta("delta", self.delta)
        for name in (
            "real_records",
            "real_features",
            "steps",
            "runs",
            "one_run_canaries",
            "one_run_guesses_each_side",
            "one_run_real_records",
            "sampler_steps",
            "hidden",
            "tiny_records",
        ):
            check_count(name, getattr(self, name), minimum=1)
        check_count("classes", self.classes, minimum=2)
        check_count("tiny_runs", self.tiny_runs, minimum=0)
        check_count("rare_records", self.rare_records, minimum=0)
        if self.rare_records > self.real_records:
            raise InvalidParameterError(
                "rare_records", f"<= real_records = {self.real_records}", self.rare_records
            )
        if 2 * self.one_run_guesses_each_side > self.one_run_canaries:
            raise InvalidParameterError(
                "one_run_guesses_each_side",
                f"<= one_run_canaries / 2 = {self.one_run_canaries / 2}",
                self.one_run_guesses_each_side,
            )
        q: object = self.sampling_probability
        if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0 < float(q) <= 1:
            raise InvalidParameterError("sampling_probability", "a real number in (0, 1]", q)
        check_positive("max_grad_norm", self.max_grad_norm)
        check_positive("learning_rate", self.learning_rate)
        _open_unit("confidence", self.confidence)
        _open_unit("held_out_fraction", self.held_out_fraction)
        if self.task not in TASKS:
            raise InvalidParameterError("task", f"one of {TASKS}", self.task)

    @functools.cached_property
    def noise_multiplier(self) -> float:
        """sigma with PLD epsilon(q, sigma, T) = target at delta (computed once per instance)."""
        return _calibrated(self.target_epsilon, self.delta, self.sampling_probability, self.steps)


@functools.lru_cache(maxsize=64)
def _calibrated(epsilon: float, delta: float, q: float, steps: int) -> float:
    return calibrate_noise(
        target_epsilon=epsilon,
        target_delta=delta,
        sampling_probability=q,
        steps=steps,
        accountant="pld",
    )


#: The per-step audit's default setting (MLP task, epsilon 4, T = 100, 8 runs per world).
PER_STEP_SETTINGS = AuditSettings()

#: The one-run and sampler audits' default setting: a smaller claimed epsilon, where the
#: one-run bound has room (with 200 guesses it cannot exceed about 4.2, all guesses right).
ONE_RUN_SETTINGS = AuditSettings(target_epsilon=2.0, steps=100)


@functools.lru_cache(maxsize=256)
def _certified(q: float, sigma: float, steps: int, delta: float) -> tuple[float, float, float]:
    event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    interval = PldAccountant().compose(event).get_epsilon_interval(delta)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        rdp = float(RdpAccountant().compose(event).get_epsilon(delta))
    return interval.upper, interval.lower, rdp


def certified_epsilon(claim: Claim) -> dict[str, float]:
    """dpcore's epsilon for the claimed (q, sigma, T) at delta: PLD interval and RDP."""
    upper, lower, rdp = _certified(
        claim.sampling_probability, claim.noise_multiplier, claim.steps, claim.delta
    )
    return {"pld": upper, "pld_lower": lower, "rdp": rdp}


@functools.lru_cache(maxsize=256)
def _mu_for_epsilon(q: float, steps: int, delta: float, epsilon: float, sigma: float) -> float:
    """mu* with composed_lower_bound(q, mu*, T, delta) = epsilon, to 0.1 % (bisection on log
    mu, bracketed around 1 / sigma, the claim's own noise multiplier)."""
    low, high = 0.5 / sigma, 2.0 / sigma
    while composed_lower_bound(q, high, steps, delta) <= epsilon and high < 1e3:
        low, high = high, 2 * high
    while composed_lower_bound(q, low, steps, delta) > epsilon and low > 1e-6:
        low, high = low / 2, low
    while high / low > 1.001:
        middle = math.sqrt(low * high)
        if composed_lower_bound(q, middle, steps, delta) > epsilon:
            high = middle
        else:
            low = middle
    return high


def _mu_lower(fp: int, negatives: int, fn: int, positives: int, alpha: float) -> float:
    """The GDP route's mu_lb at failure ``alpha`` (union bound over the two rates)."""
    fpr = (
        1.0 if fp == negatives else float(special.betaincinv(fp + 1, negatives - fp, 1 - alpha / 2))
    )
    fnr = (
        1.0 if fn == positives else float(special.betaincinv(fn + 1, positives - fn, 1 - alpha / 2))
    )
    return float(special.ndtri(1 - fpr) - special.ndtri(fnr))


def per_step_p_value(
    negative: np.ndarray,
    positive: np.ndarray,
    *,
    mu_claimed: float,
    threshold: float,
    held_out_fraction: float,
    seed: int,
) -> float:
    """p-value of "per-step mu <= mu_claimed": the smallest alpha whose mu_lb exceeds it.

    The same seeded split as :func:`dpcore.auditing.stepwise.held_out_threshold_bound`; the
    threshold (chosen on the held-out part) is evaluated once on the rest, so mu_lb(alpha) holds
    with probability 1 - alpha and ``{alpha : mu_lb(alpha) > mu_claimed}`` has probability at
    most alpha under the null.
    """
    rng = np.random.default_rng(seed)
    negative, positive = rng.permutation(negative), rng.permutation(positive)
    cut_n, cut_p = int(held_out_fraction * negative.size), int(held_out_fraction * positive.size)
    neg, pos = negative[cut_n:], positive[cut_p:]
    if neg.size == 0 or pos.size == 0:
        return 1.0
    fp, fn = int(np.sum(neg > threshold)), int(np.sum(pos <= threshold))
    if _mu_lower(fp, neg.size, fn, pos.size, 1.0 - 1e-12) <= mu_claimed:
        return 1.0
    low, high = -745.0, 0.0  # log alpha
    if _mu_lower(fp, neg.size, fn, pos.size, math.exp(low)) > mu_claimed:
        return 0.0
    for _ in range(60):
        middle = (low + high) / 2
        if _mu_lower(fp, neg.size, fn, pos.size, math.exp(middle)) > mu_claimed:
            high = middle
        else:
            low = middle
    return min(1.0, math.exp(high))


def _train(implementation: Implementation, task: AuditTask) -> tuple[Observer, Claim]:
    observer = Observer(task.initial_weight, task.spec)
    claim = implementation.train(task, observer)
    if observer.steps != task.steps:
        raise InvalidParameterError("observed steps", f"= {task.steps}", observer.steps)
    return observer, claim


def _task(
    settings: AuditSettings, canaries: Sequence[bool], seed: int, **changes: Any
) -> AuditTask:
    arguments: dict[str, Any] = {
        "real_records": settings.real_records,
        "real_features": settings.real_features,
        "canaries": canaries,
        "sampling_probability": settings.sampling_probability,
        "noise_multiplier": settings.noise_multiplier,
        "max_grad_norm": settings.max_grad_norm,
        "learning_rate": settings.learning_rate,
        "steps": settings.steps,
        "delta": settings.delta,
        "seed": seed,
    }
    arguments.update(changes)
    if arguments.pop("kind", settings.task) == "mlp":
        arguments.update(
            hidden=settings.hidden, classes=settings.classes, rare_records=settings.rare_records
        )
        arguments["rare_records"] = min(arguments["rare_records"], arguments["real_records"])
        return make_mlp_task(**arguments)
    return make_task(**arguments)


def _reference(claim: Claim) -> float:
    """The epsilon a bound is compared with: the implementation's own, else dpcore's."""
    return claim.epsilon if claim.epsilon is not None else certified_epsilon(claim)["pld"]


def _row(
    audit: str,
    claim: Claim,
    settings: AuditSettings,
    seed: int,
    *,
    p_value: float,
    lower: float | None = None,
    **details: Any,
) -> dict[str, Any]:
    """One seed's row: the claim, dpcore's certified epsilon, the p-value and a raw verdict
    (the p-value against 1 - confidence alone; the call's decision is Holm's)."""
    certified = certified_epsilon(claim)
    return {
        "implementation": claim.implementation,
        "audit": audit,
        "claimed_epsilon": claim.epsilon,
        "claimed_accountant": claim.accountant,
        "certified_epsilon": certified["pld"],
        "certified": certified,
        "epsilon_lower": lower,
        "p_value": float(p_value),
        "confidence": settings.confidence,
        "verdict": FLAGGED[audit] if p_value < 1 - settings.confidence else "consistent",
        "seed": seed,
        "claim": dataclasses.asdict(claim),
        **details,
    }


def _lots(observer: Observer, claim: Claim) -> list[np.ndarray]:
    if observer.lots is None:
        raise AuditNotApplicableError(
            f"{claim.implementation} does not report which records each step used"
        )
    return observer.lots


def whitebox_audit(
    implementation: Implementation, settings: AuditSettings = PER_STEP_SETTINGS, *, seed: int = 0
) -> list[dict[str, Any]]:
    """The per-step audit and the structural tests (module doc): seven rows.

    Raises:
        AuditNotApplicableError: the implementation does not report its lots.
    """
    check_count("seed", seed)
    start = time.perf_counter()
    outs: list[structural.RunAnalysis] = []
    ins: list[structural.RunAnalysis] = []
    tiny: list[structural.RunAnalysis] = []
    lots: list[list[np.ndarray]] = []
    claimed: Claim | None = None
    dataset_size = 0
    for run in range(settings.runs):
        base = 1_000_003 * seed + 2 * run
        # the implementation prices its claim once (in the first run), not in every run
        out_task = _task(settings, [False], base, report_epsilon=run == 0)
        observer, claim = _train(implementation, out_task)
        claimed = claimed or claim
        lots.append(_lots(observer, claim))
        dataset_size = out_task.dataset_size
        outs.append(structural.analyse_run(out_task, claim, observer))
        in_task = _task(settings, [True], base + 1, report_epsilon=False)
        observer, claim = _train(implementation, in_task)
        _lots(observer, claim)
        ins.append(structural.analyse_run(in_task, claim, observer))
    for run in range(settings.tiny_runs):
        task = _task(
            settings,
            [False],
            1_000_003 * seed + 500_000 + run,
            real_records=settings.tiny_records,
            report_epsilon=False,
        )
        observer, claim = _train(implementation, task)
        _lots(observer, claim)
        tiny.append(structural.analyse_run(task, claim, observer))
    assert claimed is not None
    claim = claimed
    sigma = claim.noise_multiplier
    spec = _task(settings, [False], 0, steps=1).spec
    every = outs + ins
    rows: list[dict[str, Any]] = []
    noise = structural.noise_calibration_test(every, sigma)
    rows.append(_row("noise_calibration", claim, settings, seed, **noise))
    per_tensor = structural.noise_per_tensor_test(every, sigma, spec.names, spec.groups)
    rows.append(_row("noise_per_tensor", claim, settings, seed, **per_tensor))
    canary = structural.canary_per_tensor_test(ins, sigma, spec.names)
    rows.append(_row("canary_per_tensor", claim, settings, seed, **canary))
    correlation = structural.noise_correlation_test(every)
    rows.append(_row("noise_correlation", claim, settings, seed, **correlation))
    empty = structural.empty_lot_test(every + tiny, sigma)
    rows.append(_row("empty_lots", claim, settings, seed, **empty))
    sampler = structural.lots_sampler_test(lots, dataset_size, claim)
    rows.append(_row("sampler_lots", claim, settings, seed, **sampler))

    negative = np.concatenate([r.canary_total for r in outs])
    positive = np.concatenate([r.canary_total[r.in_lot] for r in ins])
    reasons = []
    if correlation["p_value"] < 1 - settings.confidence:
        reasons.append("the steps' noise is correlated")
    if sampler["sampler_seen"] != "poisson" or claim.accounting_assumes != "poisson":
        reasons.append(
            f"lots seen: {sampler['sampler_seen']}, accounting assumes {claim.accounting_assumes}"
        )
    mu_claimed = _mu_for_epsilon(
        claim.sampling_probability,
        claim.steps,
        claim.delta,
        _reference(claim),
        claim.noise_multiplier,
    )
    if positive.size < 2 or negative.size < 2:
        rows.append(
            _row("whitebox_per_step", claim, settings, seed, p_value=1.0, note="no canary step")
        )
        return rows
    bound, threshold = held_out_threshold_bound(
        negative,
        positive,
        delta=settings.delta,
        confidence=settings.confidence,
        held_out_fraction=settings.held_out_fraction,
        seed=seed,
        grid=two_tailed_grid,
        route="gdp",
    )
    mu_threshold = float(bound.mu_lower or 0.0)
    # the GDP route with Gaussian scores (exact t / chi^2 intervals): tighter at equal runs
    mu_lower = gaussian_mu_lower_bound(negative, positive, confidence=settings.confidence).mu_lower
    p_value = per_step_p_value(
        negative,
        positive,
        mu_claimed=mu_claimed,
        threshold=threshold,
        held_out_fraction=settings.held_out_fraction,
        seed=seed,
    )
    lower = lower_threshold = None
    if not reasons:
        q, steps, delta = claim.sampling_probability, claim.steps, claim.delta
        lower = composed_lower_bound(q, mu_lower, steps, delta)
        lower_threshold = composed_lower_bound(q, mu_threshold, steps, delta)
    rows.insert(
        0,
        _row(
            "whitebox_per_step",
            claim,
            settings,
            seed,
            p_value=p_value,
            lower=lower,
            task=settings.task,
            mu_lower=mu_lower,
            mu_lower_threshold=mu_threshold,
            epsilon_lower_threshold=lower_threshold,
            mu_claimed=mu_claimed,
            threshold=threshold,
            positive_steps=int(positive.size),
            negative_steps=int(negative.size),
            bound_note=("not an ε bound: " + "; ".join(reasons)) if reasons else "",
            seconds=time.perf_counter() - start,
        ),
    )
    return rows


def one_run_audit(
    implementation: Implementation, settings: AuditSettings = ONE_RUN_SETTINGS, *, seed: int = 0
) -> dict[str, Any]:
    """Steinke et al. 2023 one-run audit with input-space canaries (module doc); one row."""
    check_count("seed", seed)
    start = time.perf_counter()
    rng = np.random.default_rng(7_000_003 + seed)
    included = rng.integers(0, 2, size=settings.one_run_canaries).astype(bool)
    task = _task(
        settings,
        list(included),
        3_000_017 * seed + 5,
        real_records=settings.one_run_real_records,
        kind="linear",
    )
    observer, claim = _train(implementation, task)
    totals = observer.canary_scores(task, claim, range(included.size)).sum(axis=0)
    order = np.argsort(totals)
    k = settings.one_run_guesses_each_side
    correct = int(included[order[-k:]].sum() + (~included[order[:k]]).sum())
    bound = one_run_epsilon_lower_bound(
        canaries=included.size,
        guesses=2 * k,
        correct=correct,
        delta=settings.delta,
        confidence=settings.confidence,
    )
    p_value = _one_run_p_value(
        _reference(claim), guesses=2 * k, correct=correct, canaries=included.size, delta=claim.delta
    )
    fdp = one_run_gdp_lower_bound(
        canaries=included.size,
        guesses=2 * k,
        correct=correct,
        delta=settings.delta,
        confidence=settings.confidence,
    )
    return _row(
        "one_run",
        claim,
        settings,
        seed,
        p_value=min(1.0, p_value),
        lower=bound.epsilon_lower,
        epsilon_lower_fdp=fdp.epsilon_lower,
        mu_lower_fdp=fdp.mu_lower,
        canaries=int(included.size),
        guesses=2 * k,
        correct=correct,
        seconds=time.perf_counter() - start,
    )


def _probe_label(used: np.ndarray, k: int) -> str:
    """What one canary's inclusions look like: shuffle, replayed lots or poisson-like."""
    windows = used[: (used.size // k) * k].reshape(-1, k)
    if windows.shape[0] >= 2 and np.array_equal(used[k:], used[:-k]) and used.any():
        return "replayed lots"
    if windows.size and np.all(windows.sum(axis=1) == 1):
        return "shuffle"
    return "poisson-like"


def sampler_audit(
    implementation: Implementation, settings: AuditSettings = ONE_RUN_SETTINGS, *, seed: int = 0
) -> dict[str, Any]:
    """Inclusion-count test of the sampler from a probe run's parameter trace (module doc).

    A second run of the same task at the setting's sigma and T gives the claim the row reports
    (the probe's tiny sigma is priced by no one).
    """
    check_count("seed", seed)
    start = time.perf_counter()
    _, claim = _train(implementation, _task(settings, [True], 5_000_011 * seed + 4, kind="linear"))
    task = _task(
        settings,
        [True],
        5_000_011 * seed + 3,
        noise_multiplier=PROBE_NOISE,
        steps=settings.sampler_steps,
        report_epsilon=False,
        kind="linear",
    )
    observer, probe = _train(implementation, task)
    scores = observer.canary_scores(task, probe, [0])[:, 0]
    used = scores > 0.5
    q = probe.sampling_probability
    k = max(1, round(1 / q))
    windows = used[: (used.size // k) * k].reshape(-1, k).sum(axis=1)
    ones = int(np.sum(windows == 1))
    p_one = k * q * (1 - q) ** (k - 1)
    p_value = float(stats.binomtest(ones, windows.size, p_one).pvalue)
    if claim.accounting_assumes != "poisson":
        p_value = 1.0  # the probe tests Poisson sampling only
    details: dict[str, Any] = {
        "windows": int(windows.size),
        "windows_with_one_inclusion": ones,
        "expected_under_poisson": p_one * windows.size,
        "inclusion_rate": float(used.mean()),
        "sampler_seen": _probe_label(used, k),
    }
    if p_value < 1 - settings.confidence and ones == windows.size:
        # Every window used the record exactly once: fixed-size shuffled batches. What that
        # sampler certainly costs (Chua et al. 2024 pair; dpcore.accountants.shuffled):
        n = settings.real_records + 1
        details["shuffled_epsilon_lower_bound"] = shuffled_lower_bound(
            noise_multiplier=claim.noise_multiplier,
            dataset_size=n,
            batch_size=max(1, round(q * n)),
            steps=claim.steps,
        ).epsilon(claim.delta)
    details["seconds"] = time.perf_counter() - start
    return _row("sampler", claim, settings, seed, p_value=p_value, **details)


def _not_applicable(
    name: str, audits: Iterable[str], seed: int, reason: str
) -> list[dict[str, Any]]:
    return [
        {"implementation": name, "audit": audit, "seed": seed, "not_applicable": reason}
        for audit in audits
    ]


def audit_seed(
    implementation: Implementation,
    *,
    per_step: AuditSettings = PER_STEP_SETTINGS,
    one_run: AuditSettings = ONE_RUN_SETTINGS,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Every audit of one implementation at one seed (a "not applicable" row where one cannot
    run): the per-step and structural rows, the one-run row and the sampler row.

    The one-run and sampler audits run in the one-run setting (sigma, T), on the linear task.
    """
    check_count("seed", seed)
    rows: list[dict[str, Any]] = []
    try:
        rows += whitebox_audit(implementation, per_step, seed=seed)
    except AuditNotApplicableError as reason:
        rows += _not_applicable(implementation.name, WHITEBOX_AUDITS, seed, str(reason))
    rows.append(one_run_audit(implementation, one_run, seed=seed))
    rows.append(sampler_audit(implementation, one_run, seed=seed))
    return rows


def _progress(items: Sequence[int], show: bool) -> Iterable[int]:
    if not show:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - the progress extra is missing
        return items
    bar: Iterable[int] = tqdm(items, desc="implementation audit", unit="seed")
    return bar


def audit_implementation(
    implementation: Implementation,
    *,
    per_step: AuditSettings = PER_STEP_SETTINGS,
    one_run: AuditSettings = ONE_RUN_SETTINGS,
    seeds: int = 1,
    seed_offset: int = 0,
    level: float = 0.05,
    progress: bool = False,
    on_seed: Callable[[int, list[dict[str, Any]]], None] | None = None,
) -> AuditReport:
    """Audit an implementation: every audit on seeds ``seed_offset .. seed_offset + seeds - 1``.

    Returns an :class:`~dpcore.auditing.verdicts.AuditReport`: one summary row per audit (a
    list of dicts), decided together by Holm at ``level`` (a correct implementation gets any
    flag with probability at most ``level``), and every seed's rows in ``seed_rows``. Each row
    has ``implementation``, ``audit``, ``claimed_epsilon`` (the implementation's own, None if it
    reports none), ``certified_epsilon`` (dpcore's PLD upper bound for the claimed q, sigma, T),
    ``epsilon_lower`` (95 % lower bound of the first seed, None for the p-value audits and where
    the bound's assumptions fail: ``bound_note`` says why), ``p_value``, ``verdict``, ``seeds``
    and ``false_alarm_rate`` (the default call's, measured on correct implementations).

    Args:
        implementation: the adapter (:class:`~dpcore.auditing.implementation.Implementation`).
        per_step: setting of the per-step and structural audits.
        one_run: setting of the one-run and sampler audits.
        seeds: how many seeds (>= 1).
        seed_offset: the first seed (>= 0), so that calls can split or resume seeds.
        level: family-wise error of the call, in (0, 1).
        progress: show a progress bar over the seeds (tqdm, if installed).
        on_seed: called with (seed, that seed's rows) as each seed finishes.

    Raises:
        InvalidParameterError: a parameter out of range (naming it).

    Example: see the README section "Audit your own DP-SGD".
    """
    check_count("seeds", seeds, minimum=1)
    check_count("seed_offset", seed_offset)
    _open_unit("level", level)
    for name, value in (("per_step", per_step), ("one_run", one_run)):
        if not isinstance(value, AuditSettings):
            raise InvalidParameterError(name, "an AuditSettings", value)
    rows: list[dict[str, Any]] = []
    for seed in _progress(range(seed_offset, seed_offset + seeds), progress):
        seed_rows = audit_seed(implementation, per_step=per_step, one_run=one_run, seed=seed)
        rows += seed_rows
        if on_seed is not None:
            on_seed(seed, seed_rows)
    from dpcore.auditing.false_alarms import MEASURED

    return AuditReport(summarise(rows, level, MEASURED), rows, level, MEASURED)
