"""Audit a DP-SGD implementation through its adapter (:mod:`dpcore.auditing.implementation`).

Four audits, functions of an :class:`~dpcore.auditing.implementation.Implementation`:

* :func:`whitebox_audit` — per-step white-box audit with one input-space canary (Nasr et al.
  2023, arXiv 2302.07956). ``runs`` runs with the canary in the dataset, ``runs`` without. The
  scores s_t of the steps whose lot contained the canary (the adapter says which records it
  used) are the positives, every step of the canary-free runs the negatives; a held-out
  threshold gives mu_lb (:func:`dpcore.auditing.stepwise.distinguish`) and the claimed sampling
  composes it to epsilon_lb. It needs lot membership; it trusts the claimed sampler.
* :func:`one_run_audit` — Steinke, Nasr, Jagielski 2023 (arXiv 2305.08846, Thm 5.2): m canaries
  each in the dataset with probability 1/2, one run, score_i = sum_t s_t,i; "in" for the
  highest, "out" for the lowest. It needs nothing from the adapter but the parameter trace, and
  it trusts nothing (its bound holds whatever the sampler).
* :func:`sampler_audit` — one canary record and a probe run at a tiny noise multiplier (0.01):
  s_t then shows, step by step, whether the canary was used (s_t > 1/2), with no access to the
  sampler. Under Poisson sampling the canary's inclusion count in each window of k = round(1/q)
  steps is Bin(k, q), so ``ones = #{windows with exactly one inclusion} ~ Bin(E, p_1)``,
  p_1 = k q (1 - q)^(k-1); an exact two-sided binomial test flags other samplers (a shuffled
  sampler has ``ones = E``). It gives a p-value, not an epsilon.
* noise calibration (from the per-step audit's canary-free runs): the auditor recomputes each
  lot's clipped sum and reads the added noise (:func:`noise_residuals`); a two-sided chi^2 test
  of its scale against sigma C flags noise that does not match the claim (a p-value).

Verdicts: ``violation`` when epsilon_lb exceeds the claimed epsilon (the implementation's own,
else dpcore's certified one for the claimed parameters); ``sampling does not match the claimed
analysis`` when the sampler test rejects the sampling the claim's accounting assumes;
``noise does not match the claim`` when the chi^2 test rejects; ``consistent`` otherwise.
Across seeds, :func:`seeds_verdict` flags an epsilon audit when the exceedances are more than
95% allows (binomial tail below 1e-3) and a p-value audit when Fisher's combination of the
seeds' p-values is below 1e-3.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from dpcore.accountants import PldAccountant, RdpAccountant
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.accountants.shuffled import shuffled_lower_bound
from dpcore.auditing.implementation import AuditTask, Claim, Implementation, Observer, make_task
from dpcore.auditing.statistics import one_run_epsilon_lower_bound
from dpcore.auditing.stepwise import composed_lower_bound, distinguish
from dpcore.calibration import calibrate_noise
from dpcore.errors import InvalidParameterError, StateError
from dpcore.events import dpsgd_event

#: Noise multiplier of the sampler audit's probe run (s_t resolves inclusion to 50 sigma).
PROBE_NOISE = 0.01

#: The verdict of a p-value audit that rejects the claim.
FLAGGED = {
    "noise_calibration": "noise does not match the claim",
    "sampler": "sampling does not match the claimed analysis",
}


@dataclasses.dataclass(frozen=True)
class AuditSettings:
    """The audited training setting (sigma is calibrated so that the PLD epsilon is the target).

    ``max_grad_norm`` is not 1 so that noise scaled by sigma instead of sigma C shows.
    """

    target_epsilon: float = 4.0
    delta: float = 1e-5
    real_records: int = 19
    real_features: int = 4
    sampling_probability: float = 0.2
    steps: int = 500
    max_grad_norm: float = 2.0
    learning_rate: float = 0.05
    confidence: float = 0.95
    runs: int = 8
    held_out_fraction: float = 0.2
    one_run_canaries: int = 1000
    one_run_guesses_each_side: int = 100
    one_run_real_records: int = 100
    sampler_steps: int = 1000

    @functools.cached_property
    def noise_multiplier(self) -> float:
        """sigma with PLD epsilon(q, sigma, T) = target at delta (computed once per instance)."""
        return calibrate_noise(
            target_epsilon=self.target_epsilon,
            target_delta=self.delta,
            sampling_probability=self.sampling_probability,
            steps=self.steps,
            accountant="pld",
        )


class AuditNotApplicableError(StateError):
    """The adapter does not expose what this audit needs (e.g. lot membership)."""


def certified_epsilon(claim: Claim) -> dict[str, float]:
    """dpcore's epsilon for the claimed (q, sigma, T) at delta: PLD interval and RDP."""
    event = dpsgd_event(
        sampling_probability=claim.sampling_probability,
        noise_multiplier=claim.noise_multiplier,
        steps=claim.steps,
    )
    interval = PldAccountant().compose(event).get_epsilon_interval(claim.delta)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        rdp = float(RdpAccountant().compose(event).get_epsilon(claim.delta))
    return {"pld": interval.upper, "pld_lower": interval.lower, "rdp": rdp}


def _train(implementation: Implementation, task: AuditTask) -> tuple[Observer, Claim]:
    observer = Observer(task.initial_weight)
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
    return make_task(**arguments)


def _row(
    audit: str,
    claim: Claim,
    lower: float | None,
    settings: AuditSettings,
    seed: int,
    **details: Any,
) -> dict[str, Any]:
    certified = certified_epsilon(claim)
    reference = claim.epsilon if claim.epsilon is not None else certified["pld"]
    verdict = "consistent" if lower is None or lower <= reference else "violation"
    return {
        "implementation": claim.implementation,
        "audit": audit,
        "claimed_epsilon": claim.epsilon,
        "claimed_accountant": claim.accountant,
        "certified_epsilon": certified["pld"],
        "certified": certified,
        "epsilon_lower": lower,
        "confidence": settings.confidence,
        "verdict": verdict,
        "seed": seed,
        "claim": dataclasses.asdict(claim),
        **details,
    }


def noise_residuals(task: AuditTask, claim: Claim, observer: Observer) -> np.ndarray:
    """Per step, the noise the implementation added, in units of C, recomputed by the auditor.

    The auditor knows the model, the loss, the data and (from the adapter) each lot, so it
    recomputes the lot's clipped gradient sum S_t at w_{t-1} (clip factor min(1, C / ||g||)) and
    reads ``-(w_t - w_{t-1}) b / (lr C) - S_t / C``: N(0, sigma^2 I) at every step of a correct
    DP-SGD run without canaries (Abadi et al. 2016, Alg. 1). Returns (steps, d).
    """
    if observer.lots is None:
        raise AuditNotApplicableError(f"{claim.implementation} does not report its lots")
    weights = np.stack(observer.weights)
    x, y = task.features.astype(np.float64), task.targets.astype(np.float64)
    c = task.max_grad_norm
    out = np.empty((observer.steps, task.dimension))
    for t, lot in enumerate(observer.lots):
        residual = x[lot] @ weights[t] - y[lot]
        grads = residual[:, None] * x[lot]
        norms = np.linalg.norm(grads, axis=1)
        factors = np.minimum(1.0, c / np.maximum(norms, 1e-300))
        summed = (grads * factors[:, None]).sum(axis=0)
        step = weights[t + 1] - weights[t]
        out[t] = -step * claim.divisor / (task.learning_rate * c) - summed / c
    return out


def whitebox_audit(
    implementation: Implementation, settings: AuditSettings = AuditSettings(), *, seed: int = 0
) -> list[dict[str, Any]]:
    """Per-step white-box audit (module doc): the canary's row and the noise calibration row."""
    start = time.perf_counter()
    negatives, positives, residuals = [], [], []
    claimed: Claim | None = None
    for run in range(settings.runs):
        base = 1_000_003 * seed + 2 * run
        # the implementation prices its claim once (in the first run), not in every run
        out_task = _task(settings, [False], base, report_epsilon=run == 0)
        observer, claim = _train(implementation, out_task)
        claimed = claimed or claim
        if observer.lots is None:
            raise AuditNotApplicableError(
                f"{claim.implementation} does not report which records each step used"
            )
        negatives.append(observer.canary_scores(out_task, claim, [0])[:, 0])
        residuals.append(noise_residuals(out_task, claim, observer))
        in_task = _task(settings, [True], base + 1, report_epsilon=False)
        observer, claim = _train(implementation, in_task)
        if observer.lots is None:
            raise AuditNotApplicableError(
                f"{claim.implementation} does not report which records each step used"
            )
        scores = observer.canary_scores(in_task, claim, [0])[:, 0]
        row = in_task.canary_rows[0]
        used = np.array([bool(np.any(lot == row)) for lot in observer.lots])
        positives.append(scores[used])
    assert claimed is not None
    claim = claimed
    negative, positive = np.concatenate(negatives), np.concatenate(positives)
    mu_lower, threshold = distinguish(
        negative,
        positive,
        delta=settings.delta,
        confidence=settings.confidence,
        held_out_fraction=settings.held_out_fraction,
        seed=seed,
    )
    lower = composed_lower_bound(claim.sampling_probability, mu_lower, claim.steps, claim.delta)
    noise = np.concatenate(residuals).reshape(-1) / claim.noise_multiplier
    chi2 = float(np.sum(noise**2))
    p_value = float(2 * min(stats.chi2.sf(chi2, noise.size), stats.chi2.cdf(chi2, noise.size)))
    noise_row = _row(
        "noise_calibration",
        claim,
        None,
        settings,
        seed,
        p_value=min(1.0, p_value),
        noise_std_ratio=float(np.sqrt(chi2 / noise.size)),
        residuals=int(noise.size),
    )
    if p_value < 1 - settings.confidence:
        noise_row["verdict"] = FLAGGED["noise_calibration"]
    main = _row(
        "whitebox_per_step",
        claim,
        lower,
        settings,
        seed,
        mu_lower=mu_lower,
        mu_claimed=1 / claim.noise_multiplier,
        threshold=threshold,
        positive_steps=int(positive.size),
        negative_steps=int(negative.size),
        seconds=time.perf_counter() - start,
    )
    return [main, noise_row]


def one_run_audit(
    implementation: Implementation, settings: AuditSettings = AuditSettings(), *, seed: int = 0
) -> dict[str, Any]:
    """Steinke et al. 2023 one-run audit with input-space canaries (module doc); one row."""
    start = time.perf_counter()
    rng = np.random.default_rng(7_000_003 + seed)
    included = rng.integers(0, 2, size=settings.one_run_canaries).astype(bool)
    task = _task(
        settings, list(included), 3_000_017 * seed + 5, real_records=settings.one_run_real_records
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
    return _row(
        "one_run",
        claim,
        bound.epsilon_lower,
        settings,
        seed,
        canaries=int(included.size),
        guesses=2 * k,
        correct=correct,
        seconds=time.perf_counter() - start,
    )


def sampler_audit(
    implementation: Implementation, settings: AuditSettings = AuditSettings(), *, seed: int = 0
) -> dict[str, Any]:
    """Inclusion-count test of the sampler from a probe run's parameter trace (module doc).

    A second run of the same task at the setting's sigma and T gives the claim the row reports
    (the probe's tiny sigma is priced by no one).
    """
    start = time.perf_counter()
    _, claim = _train(implementation, _task(settings, [True], 5_000_011 * seed + 4))
    task = _task(
        settings,
        [True],
        5_000_011 * seed + 3,
        noise_multiplier=PROBE_NOISE,
        steps=settings.sampler_steps,
        report_epsilon=False,
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
    details: dict[str, Any] = {
        "p_value": p_value,
        "windows": int(windows.size),
        "windows_with_one_inclusion": ones,
        "expected_under_poisson": p_one * windows.size,
        "inclusion_rate": float(used.mean()),
        "seconds": 0.0,
    }
    row = _row("sampler", claim, None, settings, seed, **details)
    if claim.accounting_assumes == "poisson" and p_value < 1 - settings.confidence:
        row["verdict"] = FLAGGED["sampler"]
        if ones == windows.size:
            # Every window used the record exactly once: fixed-size shuffled batches. What that
            # sampler certainly costs (Chua et al. 2024 pair; dpcore.accountants.shuffled):
            n = settings.real_records + 1
            row["shuffled_epsilon_lower_bound"] = shuffled_lower_bound(
                noise_multiplier=claim.noise_multiplier,
                dataset_size=n,
                batch_size=max(1, round(q * n)),
                steps=claim.steps,
            ).epsilon(claim.delta)
    row["seconds"] = time.perf_counter() - start
    return row


#: The one-run audit's default setting: a smaller claimed epsilon, where its bound has room
#: (with 200 guesses it cannot exceed about 4.2, all guesses right).
ONE_RUN_SETTINGS = AuditSettings(target_epsilon=2.0, steps=100)


def audit_seed(
    implementation: Implementation,
    *,
    per_step: AuditSettings = AuditSettings(),
    one_run: AuditSettings = ONE_RUN_SETTINGS,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Every audit of one implementation at one seed (a "not applicable" row where one cannot run).

    The sampler audit runs in the one-run setting (sigma, T), on its own small dataset.
    """
    rows: list[dict[str, Any]] = []
    try:
        rows += whitebox_audit(implementation, per_step, seed=seed)
    except AuditNotApplicableError as reason:
        for audit in ("whitebox_per_step", "noise_calibration"):
            rows.append(
                {
                    "implementation": implementation.name,
                    "audit": audit,
                    "seed": seed,
                    "not_applicable": str(reason),
                }
            )
    rows.append(one_run_audit(implementation, one_run, seed=seed))
    rows.append(sampler_audit(implementation, one_run, seed=seed))
    return rows


def audit_implementation(
    implementation: Implementation,
    *,
    per_step: AuditSettings = AuditSettings(),
    one_run: AuditSettings = ONE_RUN_SETTINGS,
    seeds: int = 1,
) -> list[dict[str, Any]]:
    """Audit an implementation (every audit, ``seeds`` seeds); one summary row per audit.

    Each row has ``implementation``, ``audit``, ``claimed_epsilon`` (the implementation's own,
    None if it reports none), ``certified_epsilon`` (dpcore's PLD upper bound for the claimed
    q, sigma, T), ``epsilon_lower`` (95 % lower bound of seed 0, None for the p-value audits),
    ``confidence``, ``verdict`` and ``seeds`` (see :func:`seeds_verdict`).

    Example: see the README section "Audit your own DP-SGD".
    """
    if seeds < 1:
        raise InvalidParameterError("seeds", ">= 1", seeds)
    rows = [
        row
        for seed in range(seeds)
        for row in audit_seed(implementation, per_step=per_step, one_run=one_run, seed=seed)
    ]
    return summarise(rows)


def not_applicable_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The summary row of an audit that could not run on this implementation."""
    first = rows[0]
    return {
        "implementation": first["implementation"],
        "audit": first["audit"],
        "claimed_epsilon": None,
        "certified_epsilon": None,
        "epsilon_lower": None,
        "confidence": None,
        "verdict": f"not applicable ({first['not_applicable']})",
        "seeds": len(rows),
    }


#: the order of the audits in summaries
AUDIT_ORDER = ("whitebox_per_step", "noise_calibration", "one_run", "sampler")


def summarise(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (implementation, audit) over its seeds, in the order the rows came."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["implementation"], row["audit"]), []).append(row)
    names = list(dict.fromkeys(name for name, _ in groups))
    ordered = sorted(groups, key=lambda k: (names.index(k[0]), AUDIT_ORDER.index(k[1])))
    return [
        not_applicable_summary(groups[key])
        if "not_applicable" in groups[key][0]
        else seeds_verdict(groups[key])
        for key in ordered
    ]


def seeds_verdict(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One summary of an audit over seeds: exceedances against what the confidence allows.

    One seed keeps its own verdict (a test at the stated confidence). Over several seeds, the
    p-value audits (noise, sampler) combine their p-values by Fisher's method and flag below
    1e-3; the epsilon audits, each flagging a correct implementation with probability at most
    1 - confidence, flag only an improbable excess of exceedances: binomial tail
    P[Bin(seeds, 1 - confidence) >= flagged] below 1e-3.
    """
    if not rows:
        raise InvalidParameterError("rows", "at least one row", 0)
    first = rows[0]
    flagged = sum(r["verdict"] != "consistent" for r in rows)
    failure = 1 - first["confidence"]
    tail = float(stats.binom.sf(flagged - 1, len(rows), failure)) if flagged else 1.0
    flagged_verdicts = [r["verdict"] for r in rows if r["verdict"] != "consistent"]
    combined = None
    if "p_value" in first:
        # Fisher's method: -2 sum log p ~ chi^2 with 2n degrees of freedom under the claim
        statistic = -2 * sum(math.log(max(r["p_value"], 1e-300)) for r in rows)
        combined = float(stats.chi2.sf(statistic, 2 * len(rows)))
    if len(rows) == 1:  # one test at the stated confidence: its own verdict
        verdict = first["verdict"]
    elif combined is not None:
        verdict = FLAGGED[first["audit"]] if combined < 1e-3 else "consistent"
    else:
        verdict = "consistent" if tail >= 1e-3 else flagged_verdicts[0]
    lowers = [r["epsilon_lower"] for r in rows if r["epsilon_lower"] is not None]
    summary = {
        "implementation": first["implementation"],
        "audit": first["audit"],
        "claimed_epsilon": first["claimed_epsilon"],
        "claimed_accountant": first["claimed_accountant"],
        "certified_epsilon": first["certified_epsilon"],
        "certified": first["certified"],
        "epsilon_lower": first["epsilon_lower"],
        "epsilon_lower_per_seed": lowers,
        "confidence": first["confidence"],
        "verdict": verdict,
        "seeds": len(rows),
        "flagged_seeds": flagged,
        "binomial_tail": tail,
        "combined_p_value": combined,
        "claim": first["claim"],
    }
    for key in (
        "shuffled_epsilon_lower_bound",
        "p_value",
        "noise_std_ratio",
        "windows_with_one_inclusion",
        "windows",
        "expected_under_poisson",
        "mu_lower",
        "mu_claimed",
    ):
        if key in first:
            summary[key] = first[key]
    return summary
