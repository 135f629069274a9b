"""The one-run audit of an implementation (Steinke, Nasr, Jagielski 2023, with the f-DP bound
of Mahloujifar, Melis, Chaudhuri 2025 beside it; see :mod:`dpcore.auditing.implementation_audits`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from dpcore.auditing.audit_runs import _reference, _row, _task, _train
from dpcore.auditing.audit_settings import (
    ONE_RUN_SETTINGS,
    AuditSettings,
)
from dpcore.auditing.implementation import (
    Implementation,
)
from dpcore.auditing.one_run_fdp import one_run_gdp_lower_bound
from dpcore.auditing.statistics import _one_run_p_value, one_run_epsilon_lower_bound
from dpcore.validation import check_count


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
