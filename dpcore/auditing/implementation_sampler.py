"""The sampler audit of an implementation: a probe run at sigma = 0.01 reads, step by step,
whether the canary was used (see :mod:`dpcore.auditing.implementation_audits`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from scipy import stats

from dpcore.accountants.shuffled import shuffled_lower_bound
from dpcore.auditing.audit_runs import _row, _task, _train
from dpcore.auditing.audit_settings import (
    ONE_RUN_SETTINGS,
    AuditSettings,
)
from dpcore.auditing.implementation import (
    Implementation,
)
from dpcore.validation import check_count

#: Noise multiplier of the sampler audit's probe run (s_t resolves inclusion to 50 sigma).
PROBE_NOISE = 0.01


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
