"""The crafted-gradient (hidden-state) audit: profiles, result rows, the score's own epsilon,
and the table (``audits/results/blackbox_crafted.md``).

What the score can show (:func:`statistic_epsilon`): in units of ``lr C / (q N)`` the final
``W[k, j]`` is ``W_0 + B + sigma sqrt(T) Z`` with ``B`` the number of chosen steps whose lot held
the crafted record (:mod:`audits.blackbox.crafted_gradient`). With full batch ``B`` is the
number ``m = ceil(T / k)`` of chosen steps, and the score is exactly ``mu``-GDP with
``mu = m / (sigma sqrt(T))``: ``sqrt(T) / sigma``, the accountant's mu, when the crafted gradient
is in every step (k = 1), and ``1 / k`` of it at period k, since the final parameters sum the
noise of every step but the crafted gradient of only m. With Poisson lots (q < 1)
``B ~ Binomial(m, q)``: the score is a Gaussian against a Gaussian mixture, whose epsilon
(computed exactly) is below the accountant's even at every step, because the last iterate does
not show which steps held the record. The divisor q N is the same public constant in both
worlds, so these laws are the score's exactly.

For the MLP and the CNN the crafted gradient is not isolated (its direction d_t moves with the
parameters; other records' gradients have parts along d_0): these laws then hold only
approximately, and each row reports the smallest cosine of d_t with d_0 and the smallest norm of
the crafted gradient (units of C) over its "in" runs' chosen steps
(:mod:`audits.blackbox.crafted_gradient`).

The decision is the black-box audit's (:func:`audits.blackbox.decision.decide`, 95 %,
Bonferroni over the routes of a row): Clopper-Pearson always; for full batch also the GDP
threshold route (full-batch DP-SGD is sqrt(T)/sigma-GDP whatever the period) and the
Gaussian-scores route (its assumption checked on the selection half).
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import optimize, special, stats

from audits import results_io
from audits.blackbox import crafted_gradient, data, settings, training
from audits.blackbox.audit import certified_epsilon
from audits.blackbox.crafted_gradient import (
    SCORE,
    CraftedRun,
    CraftedSetting,
    check_crafted_run,
    check_crafted_setting,
    inserted_steps,
)
from audits.blackbox.decision import decide
from audits.blackbox.selection import chosen as chosen_names
from audits.blackbox.selection import (
    in_profile_order,
    merged,
    other_commits,
    previous_rows,
    resume,
)
from audits.blackbox.settings import BlackBoxSetting
from audits.results_io import run_store, save
from dpcore.atomic import atomic_write_text
from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_epsilon
from dpcore.runs import (
    ExecutorChoice,
    RunStore,
    SupportsSubmit,
    export_runs,
    machine,
    run_many,
)
from dpcore.validation import check_count, check_delta, check_positive

__all__ = [
    "ANCHOR",
    "CHECKPOINT",
    "EPSILONS",
    "PROFILES",
    "SOURCES",
    "CraftedProfile",
    "audit_setting",
    "plan_runs",
    "results_name",
    "run",
    "runs_of",
    "statistic_epsilon",
    "store",
    "table",
    "write_report",
]

#: The claims audited (at the base setting's delta, 1e-5).
EPSILONS = (1.0, 2.0, 4.0, 8.0, 10.0)

#: The published result the rows are read against.
ANCHOR = (
    "Cebere, Bellet & Papernot, ICLR 2025: with a crafted gradient at every step the "
    "last-iterate audit matches the accountant; with the canary inserted less often the hidden "
    "state gives measurably less"
)

#: The code that determines a run's result (its fingerprint keys the run store).
SOURCES = (
    crafted_gradient,
    data,
    settings,
    training,
    "audits.blackbox.opacus_training",  # by name: Opacus is imported by the runs that use it
    "dpcore.calibration",
    "dpcore.data.datasets",
    "dpcore.torch.noise",
    "dpcore.torch.optimizers",
    "dpcore.torch.per_example.base",
    "dpcore.torch.per_example.fast",
    "dpcore.torch.samplers",
    "dpcore.torch.training",
)


def store() -> RunStore:
    """The audit's run store (``audits/results/runs/blackbox_crafted``)."""
    return run_store("blackbox_crafted", *SOURCES)


def _mixture_log_ratio(x: float, shifts: np.ndarray, log_weights: np.ndarray) -> float:
    return float(special.logsumexp(log_weights + shifts * x - shifts**2 / 2))


def _mixture_delta(epsilon: float, shifts: np.ndarray, weights: np.ndarray) -> float:
    """The larger hockey-stick divergence at ``epsilon`` (both orders) of
    P = sum_b w_b N(s_b, 1) and Q = N(0, 1); log(dP/dQ) is increasing in x, so each is a
    difference of normal tails at the point where the log-ratio crosses +-epsilon."""
    log_weights = np.log(np.clip(weights, 1e-300, None))
    reach = float(shifts.max()) + epsilon + 100.0

    def crossing(value: float) -> float:
        return float(
            optimize.brentq(
                lambda x: _mixture_log_ratio(x, shifts, log_weights) - value, -reach, reach
            )
        )

    upper = crossing(epsilon)
    forward = float(np.sum(weights * stats.norm.sf(upper - shifts))) - math.exp(epsilon) * float(
        stats.norm.sf(upper)
    )
    backward = 0.0
    if _mixture_log_ratio(-reach, shifts, log_weights) < -epsilon:
        lower = crossing(-epsilon)
        backward = float(stats.norm.cdf(lower)) - math.exp(epsilon) * float(
            np.sum(weights * stats.norm.cdf(lower - shifts))
        )
    return max(forward, backward, 0.0)


def statistic_epsilon(
    *, sampling_probability: float, noise_multiplier: float, steps: int, period: int, delta: float
) -> float:
    """The epsilon at ``delta`` of the score alone: the most any test of it can show.

    "out" is N(0, 1) and "in" N(B / (sigma sqrt(T)), 1), B ~ Binomial(m, q), m = ceil(T / k)
    (module docstring). q = 1: mu-GDP with mu = m / (sigma sqrt(T)), epsilon from
    :func:`dpcore.mechanisms.gaussian.gdp_epsilon` (Dong, Roth & Su 2019, Cor. 2.13); q < 1:
    the smallest epsilon whose hockey-stick divergences (both orders) are <= delta, exact up
    to root finding (1e-6 in epsilon).

    Raises:
        InvalidParameterError: q outside (0, 1], sigma not > 0, a count below 1, or a bad delta.
    """
    q = sampling_probability
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= 1:
        raise InvalidParameterError("sampling_probability", "in (0, 1]", q)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    delta = check_delta("delta", delta)
    m = inserted_steps(steps, period)
    unit = 1.0 / (sigma * math.sqrt(steps))
    if q == 1:
        return gdp_epsilon(mu=m * unit, delta=delta)
    counts = np.arange(m + 1)
    weights = stats.binom.pmf(counts, m, q)
    shifts = counts * unit
    if _mixture_delta(0.0, shifts, weights) <= delta:
        return 0.0
    high = 1.0
    while _mixture_delta(high, shifts, weights) > delta:
        high *= 2
    return float(
        optimize.brentq(lambda e: _mixture_delta(e, shifts, weights) - delta, 0.0, high, xtol=1e-6)
    )


def runs_of(setting: CraftedSetting, epsilon: float, runs_per_world: int) -> list[CraftedRun]:
    """The runs of one (setting, claim): seeds 0..N-1 in the "out" world, then in the "in"."""
    return [
        CraftedRun(setting, float(epsilon), world, seed)
        for world in ("out", "in")
        for seed in range(runs_per_world)
    ]


def audit_setting(
    setting: CraftedSetting,
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
    check_crafted_run(runs[0])
    results = run_many(
        crafted_gradient.execute, runs, executor=executor, store=run_store, progress=progress
    )
    by_world: dict[str, list[float]] = {"out": [], "in": []}
    for spec, result in zip(runs, results, strict=True):
        by_world[spec.world].append(float(result[SCORE]))
    inside = [result for spec, result in zip(runs, results, strict=True) if spec.world == "in"]
    base = setting.base
    decision = decide(
        {SCORE: by_world["out"]},
        {SCORE: by_world["in"]},
        delta=base.delta,
        full_batch=base.sampling_probability == 1.0,
        confidence=confidence,
    )
    sigma = float(results[0]["noise_multiplier"])
    certified = certified_epsilon(base, sigma)
    lower = float(decision["epsilon_lower"])
    statistic = statistic_epsilon(
        sampling_probability=base.sampling_probability,
        noise_multiplier=sigma,
        steps=base.steps,
        period=setting.period,
        delta=base.delta,
    )
    return {
        "audit": "blackbox_crafted",
        "setting_name": setting.name,
        "setting": dataclasses.asdict(setting),
        "period": setting.period,
        "sampling_probability": base.sampling_probability,
        "steps": base.steps,
        "inserted_steps": inserted_steps(base.steps, setting.period),
        "epsilon": float(epsilon),
        "delta": base.delta,
        "noise_multiplier": sigma,
        "certified_epsilon": certified,
        "statistic_epsilon": statistic,
        "epsilon_lower": lower,
        "ratio": lower / certified,
        "confidence": confidence,
        "runs_per_world": runs_per_world,
        "runs": len(runs),
        "crafted_cosine": min(float(result["cosine"]) for result in inside),
        "crafted_norm": min(float(result["norm"]) for result in inside),
        "run_seconds": float(np.sum([r["seconds"] for r in results])),
        "wall_seconds": time.perf_counter() - start,
        "decision": decision,
    }


@dataclasses.dataclass(frozen=True)
class CraftedProfile:
    """(setting, runs per world, claims) triples, audited in order (one row per claim)."""

    name: str
    audits: tuple[tuple[CraftedSetting, int, tuple[float, ...]], ...]

    def __post_init__(self) -> None:
        for setting, runs, epsilons in self.audits:
            check_crafted_setting(setting)
            check_count("runs per world", runs, minimum=8)
            if not epsilons:
                raise InvalidParameterError("epsilons", "at least one claim", epsilons)


#: Poisson lots as in the black-box audit's q < 1 setting (q = 0.1, 100 steps, lr 0.1).
POISSON = dataclasses.replace(BlackBoxSetting(), sampling_probability=0.1, steps=100, lr=0.1)

EVERY_STEP = CraftedSetting("full batch, every step")
PERIOD_5 = CraftedSetting("full batch, every 5th step", period=5)
#: The black-box audit's settings beyond the linear model trained by dpcore: Opacus 1.6, the MNIST
#: CNN, and the whole of MNIST's training split (random init: no records left to pre-train on).
OPACUS = CraftedSetting(
    "Opacus: full batch, every step",
    base=dataclasses.replace(BlackBoxSetting(), implementation="opacus"),
)
CNN = CraftedSetting(
    "CNN: full batch, every step", base=dataclasses.replace(BlackBoxSetting(), model="cnn")
)
OPACUS_CNN = CraftedSetting(
    "Opacus CNN: full batch, every step",
    base=dataclasses.replace(BlackBoxSetting(), model="cnn", implementation="opacus"),
)
FULL_MNIST = dataclasses.replace(BlackBoxSetting(), subset_size=60_000, init="random")
MNIST_60K = CraftedSetting("60,000 records: random init, full batch, every step", base=FULL_MNIST)
OPACUS_60K = CraftedSetting(
    "Opacus, 60,000 records: random init, full batch, every step",
    base=dataclasses.replace(FULL_MNIST, implementation="opacus"),
)

PROFILES = {
    "quick": CraftedProfile("quick", ((EVERY_STEP, 40, EPSILONS), (PERIOD_5, 20, EPSILONS))),
    "full": CraftedProfile(
        "full",
        (
            (EVERY_STEP, 200, EPSILONS[:-1]),
            (EVERY_STEP, 1000, EPSILONS[-1:]),
            (PERIOD_5, 150, EPSILONS),
            (CraftedSetting("q = 0.1, every step", base=POISSON), 100, EPSILONS),
            (CraftedSetting("q = 0.1, every 10th step", base=POISSON, period=10), 40, EPSILONS),
            (OPACUS, 200, EPSILONS),
            (CNN, 100, EPSILONS),
            (OPACUS_CNN, 100, EPSILONS),
            (MNIST_60K, 100, EPSILONS),
            (OPACUS_60K, 20, EPSILONS),
        ),
    ),
}


def plan_runs(plan: CraftedProfile) -> list[CraftedRun]:
    """Every run of a profile (each setting's runs at each of its claims)."""
    return [
        spec
        for setting, runs_per_world, epsilons in plan.audits
        for epsilon in epsilons
        for spec in runs_of(setting, epsilon, runs_per_world)
    ]


#: The committed run bundle the full profile resumes from (:mod:`dpcore.runs.bundle`).
CHECKPOINT = results_io.RESULTS / "checkpoints" / "blackbox_crafted.jsonl"


def results_name(profile: str) -> str:
    """``blackbox_crafted`` for the full profile (the committed table), else
    ``blackbox_crafted_<profile>``."""
    return "blackbox_crafted" if profile == "full" else f"blackbox_crafted_{profile}"


def run(
    profile: str = "quick",
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
    setting_names: Sequence[str] | None = None,
    checkpoint: str | Path | None = None,
    progress: bool = True,
    chosen: CraftedProfile | None = None,
) -> list[dict[str, Any]]:
    """Audit every (setting, claim) of a profile; save the rows after every row
    (``results/blackbox_crafted.json`` for the full profile, ``..._<profile>.json`` else).

    Args:
        profile: "quick" or "full" (:data:`PROFILES`).
        executor: where the runs go (see :func:`dpcore.runs.run_many`); the rows are the same
            for every executor (each run has its own seed).
        setting_names: audit only the profile's settings whose names contain one of these
            texts; their rows replace the saved rows of the same (setting, claim), the other
            saved rows stay (each keeps the commit it was measured at).
        checkpoint: a run bundle (:mod:`dpcore.runs.bundle`) to resume from and to keep up to
            date after every row (``python -m audits`` uses :data:`CHECKPOINT` for the full
            profile), so a profile too long for one machine's session carries to the next.
        progress: show progress bars.
        chosen: a profile to run instead of the named one (tests, partial measurements).

    Returns:
        The rows audited by this call.

    Raises:
        InvalidParameterError: an unknown profile name or setting; a damaged checkpoint (before
            any run).
        RunsFailedError: runs still failed after a retry.
    """
    if chosen is None and profile not in PROFILES:
        raise InvalidParameterError("profile", f"in {sorted(PROFILES)}", profile)
    whole = chosen if chosen is not None else PROFILES[profile]
    keep = chosen_names([setting.name for setting, _, _ in whole.audits], setting_names, whole.name)
    kept = store()
    if checkpoint is not None:
        resume(kept, plan_runs(whole), checkpoint, progress)
    start = time.perf_counter()
    stem = results_name(whole.name)
    previous, meta = previous_rows(stem, setting_names)
    stamp = results_io.stamp()
    rows: list[dict[str, Any]] = []
    config: dict[str, Any] = {
        "profile": whole.name,
        "audits": [
            {
                "setting": dataclasses.asdict(setting),
                "runs_per_world": runs,
                "epsilons": list(epsilons),
            }
            for setting, runs, epsilons in whole.audits
        ],
        "executor": str(executor) if executor is not None else "local",
        "hardware": {k: v for k, v in machine().items() if k != "host"},
        "torch": torch.__version__,
        "pixel_value": crafted_gradient.PIXEL_VALUE,
    }
    for (setting, runs_per_world, epsilons), wanted in zip(whole.audits, keep, strict=True):
        if not wanted:
            continue
        for epsilon in epsilons:
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
            config["wall_seconds"] = time.perf_counter() - start
            if checkpoint is not None:
                export_runs(kept, plan_runs(whole), checkpoint)
            names = [setting.name for setting, _, _ in whole.audits]
            save(stem, in_profile_order(merged(previous, meta, rows), names), config)
    return rows


def _route(row: dict[str, Any], route: str) -> str:
    entry = row["decision"]["scores"][SCORE].get(route)
    if entry is None:
        return "not run"
    return f"{entry['epsilon_lower']:.3f}" if entry["reported"] else "check failed"


#: The paragraph above the table (what the columns mean).
EXPLANATION = (
    "The target's per-example gradient is crafted (norm 4 C, clipped to C by the "
    "implementation: dpcore's engine, or Opacus 1.6 where the setting says so) in every "
    "k-th step (period k) of DP-SGD on MNIST (the 1,000-record subset unless the setting "
    "says 60,000); only the final parameters are seen. Linear model: the crafted gradient "
    "lies along the weight of an always-zero pixel and the score is that weight, so the "
    "score's law is known exactly. MLP / CNN: the crafted record is a blank image whose "
    "gradient is that of its class-k logit, and the score is the parameters' move along "
    "that gradient's direction d_0 at the initial parameters; the direction moves during "
    "training (min cos: the smallest cosine of d_t with d_0 over the 'in' runs' chosen "
    "steps; min norm: the crafted gradient's smallest norm in units of C, clipped to C "
    "while it is >= 1), so the score's law is approximate there. ε_lb holds at 95 % for all"
    " routes of a row together (Bonferroni); thresholds are chosen on half of the runs. ε: "
    "the claim; certified ε: the PLD accountant's bound for the calibrated sigma; score's "
    "ε: the most any test of the score can show (exact for the linear model: mu-GDP with mu"
    " = ceil(T/k) / (sigma sqrt(T)) for full batch, a Binomial mixture of Gaussians for q <"
    " 1). Run time: the trainings' seconds, one thread each; wall time: the row's, runs "
    "read back from the run store included. Rows measured at another commit than the file's"
    " say so below the table. "
)


def _drift(row: dict[str, Any]) -> str:
    if "crafted_cosine" not in row:  # rows measured before the runs recorded it
        return "-"
    return f"{row['crafted_cosine']:.3f} / {row['crafted_norm']:.2f}"


def table(rows: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> str:
    """The markdown report of ``rows`` (and of their provenance ``meta``, when given)."""
    lines = [
        "# Hidden-state audit of DP-SGD with a crafted gradient (final model, multi-run)",
        "",
        *textwrap.wrap(EXPLANATION, 92),
        "",
        "| setting | period k | q | T | ε | sigma | runs / world | ε_lb (95 %) |"
        " ε_lb / certified ε | certified ε | score's ε | route | Clopper-Pearson |"
        " GDP (threshold) | Gaussian scores | min cos / min norm | run time (s) | wall time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        best = "/".join(row["decision"]["best"][1:]) or "-"
        lines.append(
            f"| {row['setting_name']} | {row['period']} | {row['sampling_probability']:g} | "
            f"{row['steps']} | {row['epsilon']:g} | {row['noise_multiplier']:.3g} | "
            f"{row['runs_per_world']} | {row['epsilon_lower']:.3f} | {row['ratio']:.3f} | "
            f"{row['certified_epsilon']:.3f} | {row['statistic_epsilon']:.3f} | {best} | "
            f"{_route(row, 'clopper_pearson')} | {_route(row, 'gdp')} | "
            f"{_route(row, 'gaussian')} | {_drift(row)} | {row['run_seconds']:.0f} | "
            f"{row['wall_seconds']:.0f} |"
        )
    lines += ["", f"Anchor: {ANCHOR}."]
    if meta is not None:
        config = meta.get("config", {})
        lines += [
            "",
            results_io.provenance_line(
                meta,
                f"executor {config.get('executor')}",
                f"wall time {config.get('wall_seconds', 0):.0f} s",
            ),
            *other_commits(rows, meta),
        ]
    return "\n".join(lines) + "\n"


def write_report(name: str | None = None) -> None:
    """Write ``results/<name>.md`` from ``results/<name>.json`` (and its provenance).

    Args:
        name: a results stem (:func:`results_name`); None: every profile's whose results exist.
    """
    names = [name] if name is not None else [results_name(p) for p in PROFILES]
    for stem, rows, meta in results_io.stored(names, every=name is None):
        atomic_write_text(results_io.RESULTS / f"{stem}.md", table(rows, meta))
