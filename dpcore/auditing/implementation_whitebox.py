"""The per-step white-box audit and the structural tests (see
:mod:`dpcore.auditing.implementation_audits`): seven rows per seed.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import numpy as np

from dpcore.auditing import structural
from dpcore.auditing.audit_runs import _lots, _reference, _row, _task, _train
from dpcore.auditing.audit_settings import (
    PER_STEP_SETTINGS,
    AuditSettings,
)
from dpcore.auditing.gaussian_scores import gaussian_mu_lower_bound
from dpcore.auditing.implementation import (
    Claim,
    Implementation,
)
from dpcore.auditing.per_step_claim import _mu_for_epsilon, per_step_p_value
from dpcore.auditing.shipping import check_shippable
from dpcore.auditing.stepwise import composed_lower_bound, held_out_threshold_bound, two_tailed_grid
from dpcore.auditing.structural import AuditNotApplicableError
from dpcore.runs.fanout import run_many
from dpcore.validation import check_count


@dataclasses.dataclass(frozen=True)
class _Unit:
    """One training run of the audit: ``kind`` "out", "in" or "tiny", and its index."""

    kind: str
    index: int


@dataclasses.dataclass(frozen=True)
class _Trained:
    """What the auditor keeps of a run (the observer's record, analysed)."""

    analysis: structural.RunAnalysis
    lots: list[np.ndarray]
    claim: Claim
    dataset_size: int


def _units(settings: AuditSettings) -> list[_Unit]:
    pairs = [_Unit(kind, run) for run in range(settings.runs) for kind in ("out", "in")]
    return pairs + [_Unit("tiny", run) for run in range(settings.tiny_runs)]


def _train_unit(
    implementation: Implementation, settings: AuditSettings, seed: int, unit: _Unit
) -> _Trained | str:
    """Train and analyse one run (module level, so that executors can ship it); the reason as a
    string when the implementation does not report its lots."""
    base = 1_000_003 * seed + 2 * unit.index
    if unit.kind == "tiny":
        task = _task(
            settings,
            [False],
            1_000_003 * seed + 500_000 + unit.index,
            real_records=settings.tiny_records,
            report_epsilon=False,
        )
    else:
        canary = unit.kind == "in"
        # the implementation prices its claim once (in the first run), not in every run
        report = unit.kind == "out" and unit.index == 0
        task = _task(settings, [canary], base + canary, report_epsilon=report)
    observer, claim = _train(implementation, task)
    try:
        lots = _lots(observer, claim)
    except AuditNotApplicableError as reason:
        return str(reason)
    return _Trained(structural.analyse_run(task, claim, observer), lots, claim, task.dataset_size)


def whitebox_audit(
    implementation: Implementation,
    settings: AuditSettings = PER_STEP_SETTINGS,
    *,
    seed: int = 0,
    executor: Any = None,
) -> list[dict[str, Any]]:
    """The per-step audit and the structural tests (module doc): seven rows.

    ``executor`` (as in :func:`dpcore.runs.run_many`: None in this process, ``"processes:N"``,
    an engine, or an object with ``submit()``) trains the ``2 runs + tiny_runs`` runs; the
    rows do not depend on it (every run has its own seed).

    Raises:
        AuditNotApplicableError: the implementation does not report its lots.
        InvalidParameterError: ``implementation`` does not pickle while ``executor`` ships runs
            to other processes.
    """
    check_count("seed", seed)
    check_shippable(implementation, executor)
    start = time.perf_counter()
    units = _units(settings)
    train = functools.partial(_train_unit, implementation, settings, seed)
    if executor is None or executor == "local":  # errors reach the caller as they are
        trained = [train(unit) for unit in units]
    else:
        trained = run_many(train, units, executor=executor, progress=False, retries=0)
    by_kind: dict[str, list[_Trained]] = {"out": [], "in": [], "tiny": []}
    for unit, result in zip(units, trained, strict=True):
        if isinstance(result, str):
            raise AuditNotApplicableError(result)
        by_kind[unit.kind].append(result)
    outs = [t.analysis for t in by_kind["out"]]
    ins = [t.analysis for t in by_kind["in"]]
    tiny = [t.analysis for t in by_kind["tiny"]]
    lots = [t.lots for t in by_kind["out"]]
    claimed: Claim | None = by_kind["out"][0].claim
    dataset_size = by_kind["out"][-1].dataset_size
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
