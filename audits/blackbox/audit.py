"""Run a profile: every (setting, claim) as N trainings per world on the run layer, then decide.

Each training is one run of :func:`dpcore.runs.run_many` in the audit's run store
(``audits/results/runs/blackbox``, keyed by the code of this package and the parts of dpcore a
run uses): results on disk are the truth, and an interrupted audit resumes where it stopped.
Rows are saved (``audits/results/blackbox.json`` and its provenance) after every row.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from audits import results_io
from audits.blackbox import data, profiles, scores, settings, training
from audits.blackbox.decision import decide
from audits.blackbox.profiles import Profile
from audits.blackbox.scores import MEMBERSHIP_SIGN, SCORES
from audits.blackbox.selection import chosen, in_profile_order, merged, previous_rows, resume
from audits.blackbox.settings import BlackBoxRun, BlackBoxSetting
from audits.results_io import run_store, save
from dpcore.accountants import PldAccountant
from dpcore.events import dpsgd_event
from dpcore.runs import (
    ExecutorChoice,
    RunStore,
    SupportsSubmit,
    export_runs,
    machine,
    run_many,
)
from dpcore.validation import check_count

__all__ = [
    "ANCHOR",
    "CHECKPOINT",
    "SOURCES",
    "audit_setting",
    "merged",
    "plan_runs",
    "results_name",
    "run",
    "runs_of",
    "select",
    "store",
]

#: The code that determines a run's result (its fingerprint keys the run store; Opacus' own
#: version is in each result's provenance).
SOURCES = (
    data,
    "audits.blackbox.opacus_training",  # by name: Opacus is imported by the runs that use it
    scores,
    settings,
    training,
    "dpcore.calibration",
    "dpcore.data.datasets",
    "dpcore.torch.models",
    "dpcore.torch.noise",
    "dpcore.torch.optimizers",
    "dpcore.torch.per_example.fast",
    "dpcore.torch.samplers",
    "dpcore.torch.training",
)

#: The full profile's run bundle (committed): the finished runs of the settings still being
#: audited, so the profile, about a day of one core, resumes on a fresh checkout.
CHECKPOINT = results_io.RESULTS / "checkpoints" / "blackbox.jsonl"

#: The published black-box result the strongest setting is compared with.
ANCHOR = {
    "source": "Annamalai & De Cristofaro, NeurIPS 2024 (1,000-record MNIST, worst-case init, "
    "crafted target, final model)",
    "epsilon": 10.0,
    "epsilon_lower": 7.21,
    "ratio": 0.72,
}


def results_name(profile: str) -> str:
    """The results file stem of a profile: ``blackbox`` for the full profile (the committed
    table), ``blackbox_<profile>`` for the others (so ``nox -s audit``'s quick profile leaves
    the full results alone)."""
    return "blackbox" if profile == "full" else f"blackbox_{profile}"


def store() -> RunStore:
    """The audit's run store."""
    return run_store("blackbox", *SOURCES)


def runs_of(setting: BlackBoxSetting, epsilon: float, runs_per_world: int) -> list[BlackBoxRun]:
    """The runs of one (setting, claim): seeds 0..N-1 in the "out" world, then in the "in"."""
    return [
        BlackBoxRun(setting, float(epsilon), world, seed)
        for world in ("out", "in")
        for seed in range(runs_per_world)
    ]


def certified_epsilon(setting: BlackBoxSetting, sigma: float) -> float:
    """The PLD accountant's certified epsilon of DP-SGD(q, sigma, T) at the setting's delta."""
    event = dpsgd_event(
        sampling_probability=setting.sampling_probability,
        noise_multiplier=sigma,
        steps=setting.steps,
    )
    return float(PldAccountant().compose(event).get_epsilon(setting.delta))


def audit_setting(
    setting: BlackBoxSetting,
    epsilon: float,
    runs_per_world: int,
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
    run_store: RunStore | None = None,
    confidence: float = 0.95,
    progress: bool = True,
) -> dict[str, Any]:
    """One result row: train (or read) the runs of (setting, epsilon) and decide.

    Args:
        setting: what the runs share.
        epsilon: the claim each run's noise is calibrated to.
        runs_per_world: N (>= 8).
        executor: where the runs go (see :func:`dpcore.runs.run_many`).
        run_store: where they are kept (None: nowhere, every run is trained).
        confidence: of the row's bounds together.
        progress: show a progress bar.

    Raises:
        InvalidParameterError: a bad setting, claim, or runs_per_world below 8 (before any
            run).
        RunsFailedError: runs still failed after a retry.
    """
    start = time.perf_counter()
    check_count("runs_per_world", runs_per_world, minimum=8)
    runs = runs_of(setting, epsilon, runs_per_world)
    settings.check_run(runs[0])
    results = run_many(
        training.execute, runs, executor=executor, store=run_store, progress=progress
    )
    by_world: dict[str, dict[str, list[float]]] = {"out": {}, "in": {}}
    for spec, result in zip(runs, results, strict=True):
        for name in SCORES:
            value = MEMBERSHIP_SIGN[name] * float(result[name])
            by_world[spec.world].setdefault(name, []).append(value)
    full_batch = setting.sampling_probability == 1.0
    decision = decide(
        by_world["out"],
        by_world["in"],
        delta=setting.delta,
        full_batch=full_batch,
        confidence=confidence,
    )
    sigma = float(results[0]["noise_multiplier"])
    certified = certified_epsilon(setting, sigma)
    lower = float(decision["epsilon_lower"])
    return {
        "audit": "blackbox",
        "setting_name": setting.name,
        "setting": dataclasses.asdict(setting),
        "epsilon": float(epsilon),
        "delta": setting.delta,
        "noise_multiplier": sigma,
        "certified_epsilon": certified,
        "epsilon_lower": lower,
        "ratio": lower / float(epsilon),
        "confidence": confidence,
        "runs_per_world": runs_per_world,
        "runs": len(runs),
        "run_seconds": float(np.sum([r["seconds"] for r in results])),
        "wall_seconds": time.perf_counter() - start,
        "decision": decision,
    }


def select(plan: Profile, wanted: Sequence[str] | None) -> Profile:
    """The settings of ``plan`` whose names contain one of ``wanted`` (case-insensitive).

    Raises:
        InvalidParameterError: an entry of ``wanted`` matches no setting of the profile (the
            message lists the profile's setting names).
    """
    keep = chosen([setting.name for setting, _ in plan.audits], wanted, plan.name)
    kept = tuple(entry for entry, wanted_here in zip(plan.audits, keep, strict=True) if wanted_here)
    return dataclasses.replace(plan, audits=kept)


def plan_runs(plan: Profile) -> list[BlackBoxRun]:
    """Every run of a profile (each setting's runs at each claim)."""
    return [
        spec
        for setting, runs_per_world in plan.audits
        for epsilon in plan.epsilons
        for spec in runs_of(setting, epsilon, runs_per_world)
    ]


def run(
    profile: str = "quick",
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
    chosen: Profile | None = None,
    setting_names: Sequence[str] | None = None,
    checkpoint: str | Path | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Audit every (setting, claim) of a profile; save its results after every row
    (``results/blackbox.json`` for the full profile, ``results/blackbox_<profile>.json`` else).

    Args:
        profile: "quick" or "full" (see :mod:`audits.blackbox.profiles`).
        executor: where the runs go (see :func:`dpcore.runs.run_many`); the rows are the same
            for every executor (each run has its own seed).
        chosen: a profile to run instead of the named one (tests, partial measurements).
        setting_names: audit only the profile's settings whose names contain one of these texts;
            their rows replace the saved rows of the same (setting, claim), the other saved
            rows stay (each keeps the commit it was measured at).
        checkpoint: a run bundle (:mod:`dpcore.runs.bundle`) to resume from and to keep
            up to date after every row, so a profile too long for one machine's session can
            be carried to the next (``python -m audits`` uses :data:`CHECKPOINT` for the full
            profile).
        progress: show progress bars.

    Returns:
        The rows audited by this call, one per (setting, claim).

    Raises:
        InvalidParameterError: an unknown profile name or setting; a damaged checkpoint
            (before any run).
        RunsFailedError: runs still failed after a retry.
    """
    whole = chosen if chosen is not None else profiles.profile(profile)
    plan = select(whole, setting_names)
    kept = store()
    if checkpoint is not None:
        resume(kept, plan_runs(whole), checkpoint, progress)
    stem = results_name(whole.name)
    previous, meta = previous_rows(stem, setting_names)
    rows: list[dict[str, Any]] = []
    stamp = results_io.stamp()
    config = {
        "profile": whole.name,
        "audits": [
            {"setting": dataclasses.asdict(setting), "runs_per_world": runs}
            for setting, runs in whole.audits
        ],
        "epsilons": list(whole.epsilons),
        "executor": str(executor) if executor is not None else "local",
        "hardware": {k: v for k, v in machine().items() if k != "host"},
        "torch": sys.modules["torch"].__version__,
        "opacus": importlib.metadata.version("opacus"),
        "anchor": ANCHOR,
    }
    for setting, runs_per_world in plan.audits:
        for epsilon in plan.epsilons:
            row = audit_setting(
                setting,
                epsilon,
                runs_per_world,
                executor=executor,
                run_store=kept,
                progress=progress,
            )
            rows.append(
                {
                    **row,
                    "profile": whole.name,
                    "commit": stamp["commit"],
                    "created": stamp["created"],
                }
            )
            if checkpoint is not None:
                export_runs(kept, plan_runs(whole), checkpoint)
            names = [setting.name for setting, _ in whole.audits]
            save(stem, in_profile_order(merged(previous, meta, rows), names), config)
    return rows
