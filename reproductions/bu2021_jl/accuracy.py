"""Bu et al. 2021 (arXiv 2102.03013), Fig. 4: MNIST test accuracy vs epochs, DP-SGD vs DP-SGD-JL.

Model: the TensorFlow Privacy tutorial's CNN (:func:`dpcore.torch.models.tf_privacy_mnist_cnn`);
the paper (§5) trains "a convolutional neural network from [TP] tutorial on MNIST", N = 60,000.
Methods: DP-SGD with exact per-example clipping (engine ``"fast"``) and DP-SGD-JL with r = 1, 3,
20 random projections (engine ``"jl"``; the r of Fig. 4). Hyperparameters are the tutorial's
defaults -- learning rate 0.15, noise multiplier 1.1, clipping norm 1.0, lot 256, 60 epochs,
delta = 1e-5 -- because we could not read the paper's own values for this figure (an
assumption, stated in the README). Lots are Poisson (q = 256 / 60,000).

Privacy per method (the events are the same for every seed): the tight PLD interval for DP-SGD
and the JL accountant's interval (Lemma 4.1 / Thm 4.1 of the paper, computed by
:class:`dpcore.accountants.JlAccountant`) for DP-SGD-JL, for the steps run and for the full
60-epoch schedule. :func:`compute` trains every method for several seeds (in the order of
:data:`RUN_PHASES`, so a run stopped early has settled whole comparisons) and saves
``figures/<stem>.{json,csv}`` and one privacy statement per method (stem ``bu2021_jl_accuracy``,
``bu2021_jl_accuracy_full`` for the full profile, whose runs resume from the run store).
:func:`plot` draws mean and min/max band per method from the saved JSON only.

This module runs the computation; the profiles, data and trainers are in
:mod:`~reproductions.bu2021_jl.accuracy_setup`, the figure and README table in
:mod:`~reproductions.bu2021_jl.accuracy_report`, and the epsilon intervals it shares with the
summary in :mod:`~reproductions.bu2021_jl.privacy_intervals`; the training loop is the harness's
(:mod:`reproductions.harness`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dpcore.atomic import atomic_write_text
from dpcore.errors import InvalidParameterError
from dpcore.runs import ExecutorChoice, SupportsSubmit, parse_executor, run_many
from dpcore.torch.training import DPTrainer
from reproductions.bu2021_jl import config as paper
from reproductions.bu2021_jl.accuracy_report import (
    markers,
    plot,
    profile_label,
    readme_table,
)
from reproductions.bu2021_jl.accuracy_setup import (
    PROFILES,
    STEM,
    AccuracyConfig,
    Data,
    load_data,
    make_trainer,
    methods,
    results_stem,
    spread,
    steps_per_epoch,
)
from reproductions.bu2021_jl.privacy_intervals import (
    epsilon_interval,
    fmt_interval,
    method_privacy,
    step_event,
)
from reproductions.common import profile_config
from reproductions.harness import (
    Output,
    RunState,
    cpu_settings,
    evaluate,
    hardware_label,
    run_training,
)

__all__ = [
    "CODE_MODULES",
    "PROFILES",
    "STEM",
    "AccuracyConfig",
    "Data",
    "RunJob",
    "compute",
    "epsilon_interval",
    "execute",
    "execute_job",
    "fan_out",
    "fmt_interval",
    "load_data",
    "make_trainer",
    "markers",
    "method_privacy",
    "methods",
    "plot",
    "profile_label",
    "readme_table",
    "results_stem",
    "run_order",
    "run_spec",
    "spread",
    "step_event",
    "steps_per_epoch",
]

#: The code a run's result depends on: a change here starts its runs afresh.
CODE_MODULES = (
    "dpcore.torch",
    "reproductions.harness",
    "reproductions.bu2021_jl.accuracy_setup",
)


#: The order the runs go in, phase by phase (``None``: exact DP-SGD; a number: DP-SGD-JL's r),
#: seed by seed within a phase; methods not listed go last. The comparison the figure is read for
#: comes first and the costliest method (r = 20: about 100 s per epoch on one CPU core, ten times
#: DP-SGD) last, so a run cut short by a deadline settles whole comparisons over all seeds
#: instead of leaving every method at one seed.
RUN_PHASES: tuple[tuple[int | None, ...], ...] = ((None, 3), (1,), (20,))


def run_order(config: AccuracyConfig) -> list[tuple[str, int | None, int]]:
    """``(label, r, seed)`` in the order the runs go (see :data:`RUN_PHASES`).

    Example:
        >>> from reproductions.bu2021_jl.accuracy_setup import PROFILES
        >>> [(r, seed) for _, r, seed in run_order(PROFILES["full"])][:4]
        [(None, 0), (3, 0), (None, 1), (3, 1)]
    """
    chosen = methods(config)
    phases = [[m for m in chosen if m[1] in phase] for phase in RUN_PHASES]
    listed = {m for phase in phases for m in phase}
    phases.append([m for m in chosen if m not in listed])
    return [(label, r, seed) for phase in phases for seed in config.seeds for label, r in phase]


def _slug(label: str) -> str:
    return label.lower().replace(" ", "_").replace("=", "")


def run_spec(config: AccuracyConfig, r: int | None, seed: int) -> dict[str, Any]:
    """What one run's result depends on (not the profile's seed list or other methods)."""
    return {
        "figure": "bu2021 Fig. 4",
        "r": r,
        "seed": seed,
        "steps": config.steps,
        "eval_every": config.eval_every,
        "dataset_size": config.dataset_size,
        "lot_size": config.lot_size,
        "learning_rate": config.learning_rate,
        "noise_multiplier": config.noise_multiplier,
        "max_grad_norm": config.max_grad_norm,
        "test_size": config.test_size,
    }


def execute(
    config: AccuracyConfig,
    label: str,
    r: int | None,
    seed: int,
    data: Data,
    store: Path | None,
    *,
    fingerprint: str,
    deadline: float | None = None,
    until: int | None = None,
    opened: tuple[RunState, DPTrainer] | None = None,
    hardware: str | None = None,
) -> tuple[RunState, DPTrainer]:
    """One method and seed, resumable from ``store``; a row per evaluation.

    ``until`` stops at that step for now; ``opened`` is what an earlier call returned for the
    same run, to go on from there (see :func:`~reproductions.harness.run_training`).
    ``hardware`` (default: :func:`~reproductions.harness.hardware_label` of the data's device)
    is added to the run's saved list of what trained it, if this call trains it.
    """
    x_train, y_train, x_test, y_test = data
    if opened is None:
        trainer = make_trainer(config, r, seed, x_train, y_train)
        state = RunState.open(store, run_spec(config, r, seed), fingerprint)
    else:
        state, trainer = opened
    trained_by = state.extra.setdefault("hardware", [])
    label_now = hardware or hardware_label(x_train.device)
    trains = (until is None or until > 0) and (deadline is None or time.time() < deadline)
    if not state.done and label_now not in trained_by and trains:
        trained_by.append(label_now)  # saved with the run's next commit
    run_training(
        trainer,
        state,
        steps=config.steps,
        eval_every=config.eval_every,
        per_epoch=steps_per_epoch(config),
        measure=lambda current: {"test_accuracy": evaluate(current.model, x_test, y_test)},
        row={"method": label, "r": r, "seed": seed},
        deadline=deadline,
        until=until,
        label=f"{STEM} {label} seed {seed}",
    )
    return state, trainer


Opened = dict[tuple[int | None, int], tuple[RunState, DPTrainer]]


def _run_all(
    config: AccuracyConfig,
    data: Data,
    store: Path | None,
    fingerprint: str,
    deadline: float | None,
) -> Opened:
    """Every run of :func:`run_order`, each to its end in turn, or round by round (interleave).

    Round by round, every run advances one evaluation interval per round; a round starts only
    if the previous one (with training in it) would still end before ``deadline``, so a stop
    leaves all runs at the same step.
    """
    order = run_order(config)
    opened: Opened = {}
    if not config.interleave:
        for label, r, seed in order:
            opened[(r, seed)] = execute(
                config, label, r, seed, data, store, fingerprint=fingerprint, deadline=deadline
            )
        return opened
    for label, r, seed in order:  # open (and resume) every run before the first round
        opened[(r, seed)] = execute(
            config, label, r, seed, data, store, fingerprint=fingerprint, until=0
        )
    targets = [*range(config.eval_every, config.steps, config.eval_every), config.steps]
    last_round = 0.0
    for target in targets:
        if deadline is not None and time.time() + last_round >= deadline:
            break
        start = time.perf_counter()
        for label, r, seed in order:
            opened[(r, seed)] = execute(
                config, label, r, seed, data, store,
                fingerprint=fingerprint, until=target, opened=opened[(r, seed)],
            )  # fmt: skip
        elapsed = time.perf_counter() - start
        last_round = elapsed if elapsed > 1.0 else last_round  # rounds resumed from disk: ~0 s
    return opened


@dataclasses.dataclass(frozen=True)
class RunJob:
    """One run of the figure as a picklable job for a worker (see :func:`fan_out`)."""

    config: AccuracyConfig
    label: str
    r: int | None
    seed: int
    store: str
    fingerprint: str
    deadline: float | None
    #: How the runs are spread (``"2 runs at once"``, ``"fanned out on dask"``): in the hardware.
    spread: str
    #: Module-level (picklable) replacement of :func:`load_data`, e.g. small data in tests.
    data_loader: Callable[[AccuracyConfig], Data] | None = None


def execute_job(job: RunJob) -> dict[str, Any]:
    """Train one run in this process on :func:`~reproductions.bu2021_jl.config.default_device`,
    resuming from and committing to the run store, until it is done or ``job.deadline``.

    One torch thread (workers share the cores). On CUDA, TF32 is switched off for this process:
    per-example norms computed in TF32 convolutions can exceed the clipping norm by about 1e-3
    relative, more sensitivity than the accountant assumes.
    """
    device = torch.device(paper.default_device())
    if device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    data = tuple(part.to(device) for part in (job.data_loader or load_data)(job.config))
    with cpu_settings(1):
        hardware = f"{hardware_label(device)}, torch {torch.__version__}, {job.spread}"
        state, _ = execute(
            job.config, job.label, job.r, job.seed, data, Path(job.store),  # type: ignore[arg-type]
            fingerprint=job.fingerprint, deadline=job.deadline, hardware=hardware,
        )  # fmt: skip
    last = state.rows[-1] if state.rows else {"step": 0, "epoch": 0}
    return {"label": job.label, "seed": job.seed, "step": last["step"], "done": state.done}


def _spread(executor: str | ExecutorChoice | SupportsSubmit) -> str:
    """How ``executor`` spreads the runs, for the hardware label; refuses ``local``.

    Raises:
        InvalidParameterError: ``executor`` is not a valid choice, or is ``local``.
    """
    if not isinstance(executor, str | ExecutorChoice):
        return "fanned out"
    choice = executor if isinstance(executor, ExecutorChoice) else parse_executor(executor)
    if choice.kind == "local":
        raise InvalidParameterError(
            "executor", "one that fans out (processes:N, dask, ray, slurm, or submit())", executor
        )
    if choice.kind == "processes":
        workers = choice.workers or 1
        return f"{workers} run{'s' if workers > 1 else ''} at once"
    return f"fanned out on {choice.kind}"


def fan_out(
    profile: str = "full",
    *,
    executor: str | ExecutorChoice | SupportsSubmit = "processes",
    data_loader: Callable[[AccuracyConfig], Data] | None = None,
    config: AccuracyConfig | None = None,
    output: Output | None = None,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Train every run of the profile through ``executor``, into the run store.

    Each run goes to its end or ``deadline``, in :func:`run_order`; what each reached is
    returned (and is in the store: :func:`compute` afterwards reads it back and saves the
    results). ``executor`` is a :func:`dpcore.runs.run_many` executor other than ``local``:
    ``"processes:N"`` (N spawned processes), ``"dask[:ADDRESS]"``, ``"ray[:ADDRESS]"``,
    ``"slurm"``, or any object with ``submit()`` (``data_loader`` must then be picklable). On
    one GPU, a small CNN's steps leave it idle between kernels: several runs at once use it far
    better than one after another.

    The runs go to the run store even for a profile that does not checkpoint: the store is
    how their results come back.

    Raises:
        InvalidParameterError: ``executor`` is invalid or ``local`` (before anything runs).
        RunsFailedError: runs still failed after one retry (each resumes from the store).
    """
    config = profile_config(PROFILES, profile, config)
    spread = _spread(executor)
    (data_loader or load_data)(config)  # fetch once here, not in every worker at one moment
    output = output or Output()
    store = output.store(results_stem(config.profile))
    fingerprint = output.code(*CODE_MODULES)
    jobs = [
        RunJob(config, label, r, seed, str(store), fingerprint, deadline, spread, data_loader)
        for label, r, seed in run_order(config)
    ]
    return run_many(execute_job, jobs, executor=executor, progress=False)


def _hardware(runs: dict[str, list[tuple[int, RunState, DPTrainer]]], device: torch.device) -> str:
    """What trained the runs (each run's saved list), in order of first use, joined by " + "."""
    labels: list[str] = []
    for entries in runs.values():
        for _, state, _ in entries:
            labels += [label for label in state.extra.get("hardware", []) if label not in labels]
    return " + ".join(labels) or hardware_label(device)


def common_epoch(states: list[RunState]) -> float:
    """The last epoch every run has a row for (0 when one has none)."""
    return min((state.rows[-1]["epoch"] if state.rows else 0.0) for state in states)


def compute(
    profile: str = "quick",
    *,
    data_loader: Callable[[AccuracyConfig], Data] | None = None,
    config: AccuracyConfig | None = None,
    output: Output | None = None,
    deadline: float | None = None,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> None:
    """Train every method for every seed; save rows, per-method summary and privacy statements.

    ``deadline`` (a ``time.time()`` value) stops the runs early; the results then say how far
    each got (``status``), and a later call resumes them. ``executor`` (None or ``"local"``:
    here, one after another, interleaved) trains the runs through it first (:func:`fan_out`,
    into the run store), then reads them back here.
    """
    config = profile_config(PROFILES, profile, config)
    fanned = executor is not None and not (
        executor == "local" or (isinstance(executor, ExecutorChoice) and executor.kind == "local")
    )
    if fanned and executor is not None:
        fan_out(
            config.profile, executor=executor, data_loader=data_loader, config=config,
            output=output, deadline=deadline,
        )  # fmt: skip
    device = torch.device(paper.default_device())  # CUDA when present (or $DPCORE_DEVICE)
    data = tuple(part.to(device) for part in (data_loader or load_data)(config))
    with cpu_settings(config.threads):
        _compute(
            config, data, output or Output(), deadline,  # type: ignore[arg-type]
            use_store=config.checkpoint or fanned,
        )  # fmt: skip


def _compute(
    config: AccuracyConfig,
    data: Data,
    output: Output,
    deadline: float | None,
    *,
    use_store: bool,
) -> None:
    x_train = data[0]
    if len(x_train) != config.dataset_size:
        raise InvalidParameterError("dataset_size", f"to equal {len(x_train)}", config.dataset_size)
    stem = results_stem(config.profile)
    store = output.store(stem) if use_store else None
    fingerprint = output.code(*CODE_MODULES)
    wall = time.perf_counter()
    runs: dict[str, list[tuple[int, RunState, DPTrainer]]] = {
        label: [] for label, _ in methods(config)
    }
    opened = _run_all(config, data, store, fingerprint, deadline)
    for label, r, seed in run_order(config):
        state, trainer = opened[(r, seed)]
        runs[label].append((seed, state, trainer))
    for entries in runs.values():
        entries.sort(key=lambda item: item[0])
    common = common_epoch([state for entries in runs.values() for _, state, _ in entries])
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for label, r in methods(config):
        done = [(seed, state, trainer) for seed, state, trainer in runs[label] if state.done]
        for _, state, _ in runs[label]:
            rows += state.rows
        statement: dict[str, Any] = {}
        if done:
            trainer = done[0][2]
            statement = trainer.privacy_statement(
                delta=config.delta,
                accountants=() if r is not None else ("rdp", "pld"),
                model="tf_privacy_mnist_cnn (26,010 parameters)",
                method=label,
                steps_planned=config.steps,
            )
        privacy = method_privacy(
            step_event(config.lot_size / config.dataset_size, config.noise_multiplier, r),
            jl=r is not None,
            steps=config.steps,
            paper_steps=config.paper_epochs * steps_per_epoch(config),
            delta=config.delta,
            jl_bins=config.jl_bins,
            run_event=done[0][2].ledger.event() if done else None,
        )
        statement["epsilon_interval"] = privacy
        name = f"{stem}_{_slug(label)}_privacy.json"
        text = json.dumps(statement, indent=2, sort_keys=True, default=str) + "\n"
        atomic_write_text(output.path(name), text)
        unfinished = {
            seed: state.rows[-1]["epoch"] if state.rows else 0
            for seed, state, _ in runs[label]
            if not state.done
        }
        summary[label] = {
            "r": r,
            "seeds_done": [seed for seed, _, _ in done],
            "unfinished": {str(seed): epoch for seed, epoch in unfinished.items()},
            "final_accuracy": (
                spread([state.rows[-1]["test_accuracy"] for _, state, _ in done]) if done else None
            ),
            "accuracy_at_common_epoch": (
                spread(
                    [
                        next(row for row in state.rows if row["epoch"] == common)["test_accuracy"]
                        for _, state, _ in runs[label]
                    ]
                )
                if common > 0
                else None
            ),
            # training seconds per step of every run that took one (stopped runs included)
            "seconds_per_step": (
                spread([s.seconds / s.rows[-1]["step"] for _, s, _ in runs[label] if s.rows])
                if any(s.rows for _, s, _ in runs[label])
                else None
            ),
            "privacy": privacy,
            "privacy_statement": name,
        }
        acc = summary[label]["final_accuracy"]
        if acc is not None:
            print(f"{stem} {label}: {acc['mean']:.4f} [{acc['min']:.4f}, {acc['max']:.4f}]")
    output.save_results(
        stem,
        config=config,
        rows=rows,
        extra={
            "seeds": list(config.seeds),
            "hardware": _hardware(runs, x_train.device),
            "torch": torch.__version__,
            **output.provenance_of_runs(*CODE_MODULES),
            "wall_time_s": round(time.perf_counter() - wall, 1),
            # training seconds of all runs together, over every call that advanced them
            "training_seconds": round(
                sum(state.seconds for entries in runs.values() for _, state, _ in entries), 1
            ),
            "steps_per_epoch": steps_per_epoch(config),
            "common_epoch": common,
            "summary": summary,
        },
    )
