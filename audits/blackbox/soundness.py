"""Soundness over seeds: how often the audit's epsilon_lb exceeds the certified epsilon.

A sound audit of a correct DP-SGD exceeds the certified epsilon with probability at most
1 - confidence (5 %) per (setting, claim). Over independent seeds -- each a different subset,
pre-training set, initial parameters and runs -- the number of exceedances is then at most
Binomial(seeds, 0.05) in distribution; the p-value of the count observed under that bound is
reported beside it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scipy import stats

from audits.blackbox.audit import audit_setting, store
from audits.blackbox.profiles import STRONGEST
from audits.blackbox.settings import BlackBoxSetting
from audits.results_io import save
from dpcore.runs import ExecutorChoice, SupportsSubmit
from dpcore.validation import check_count

__all__ = ["soundness"]


def soundness(
    setting: BlackBoxSetting = STRONGEST,
    epsilon: float = 10.0,
    runs_per_world: int = 100,
    seeds: int = 20,
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Audit ``setting`` at ``epsilon`` with setting seeds 0..seeds-1; count exceedances.

    Saves ``results/blackbox_soundness.json``. Runs go to the audit's run store.

    Returns:
        ``{"setting", "epsilon", "runs_per_world", "seeds", "epsilon_lower": [...],
        "certified_epsilon": [...], "exceedances", "p_value"}`` where ``p_value`` is
        P[Binomial(seeds, 1 - confidence) >= exceedances].

    Raises:
        InvalidParameterError: a bad setting, claim or count (seeds >= 1).
    """
    count = check_count("seeds", seeds, minimum=1)
    kept = store()
    rows = [
        audit_setting(
            dataclasses.replace(setting, seed=seed),
            epsilon,
            runs_per_world,
            executor=executor,
            run_store=kept,
            progress=progress,
        )
        for seed in range(count)
    ]
    lower = [row["epsilon_lower"] for row in rows]
    certified = [row["certified_epsilon"] for row in rows]
    exceedances = sum(a > b for a, b in zip(lower, certified, strict=True))
    level = 1 - rows[0]["confidence"]
    result = {
        "setting": dataclasses.asdict(setting),
        "epsilon": float(epsilon),
        "runs_per_world": runs_per_world,
        "seeds": count,
        "epsilon_lower": lower,
        "certified_epsilon": certified,
        "best": [row["decision"]["best"] for row in rows],
        "exceedances": int(exceedances),
        "p_value": float(stats.binom.sf(exceedances - 1, count, level)),
        "run_seconds": float(sum(row["run_seconds"] for row in rows)),
    }
    save("blackbox_soundness", [result], {"setting": result["setting"], "epsilon": epsilon})
    return result
