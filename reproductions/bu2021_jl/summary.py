"""Bu et al. 2021 (arXiv 2102.03013), Fig. 1-style summary on IMDb: accuracy vs time per epoch.

The paper's Figure 1 places each optimizer by its time per epoch and test accuracy, annotated
with epsilon. Here: non-private Adam (``nn.LSTM`` model), DP-Adam with exact per-example clipping
(the ``DPLSTM`` model, engine ``"fast"``) and DP-Adam-JL with r = 1, 5, 10, 30 (``nn.LSTM``,
engine ``"jl"``; r of the paper's Table 2), all on the paper's IMDb model
(:func:`dpcore.torch.models.imdb_lstm`) and data (:func:`dpcore.data.text.imdb_sequences`:
vocabulary 8,000, length 150, §5). Lot, noise, clipping, epochs and delta are the shared ones in
:mod:`reproductions.bu2021_jl.config` (sigma = 1.0, C = 1.0 and 20 epochs are assumptions there);
Adam's learning rate 1e-3 (Keras' default) is an assumption too.

Seconds per epoch are *read* from ``figures/bu2021_jl_speed.json`` (Table 2,
:mod:`reproductions.bu2021_jl.speed`), never re-timed here; without that file the figure shows
accuracy and epsilon only and says to run ``bu2021_jl_speed`` first. Epsilon: tight PLD for
DP-Adam, the JL accountant for DP-Adam-JL (both certified intervals), after the steps run and
after the paper's schedule. The quick profile trains every method for the same few steps.

With an ``executor`` (``python -m reproductions --only bu2021_jl_summary --executor
processes:3``) the methods (independent runs) train at once through :func:`dpcore.runs.run_many`
into the run store, and are read back from it.

This module runs the computation; the profiles, methods, data and trainers are in
:mod:`~reproductions.bu2021_jl.summary_setup` and the figure and README table in
:mod:`~reproductions.bu2021_jl.summary_report` (both re-exported here).
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
from dpcore.runs import run_many
from dpcore.torch.models import IMDB_SEQUENCE_LENGTH
from dpcore.torch.training import DPTrainer
from reproductions.bu2021_jl import config as paper
from reproductions.bu2021_jl.privacy_intervals import method_privacy, step_event
from reproductions.bu2021_jl.summary_report import (
    SPEED_MISSING,
    SPEED_STEM,
    markers,
    plot,
    profile_label,
    readme_table,
    speed_rows,
)
from reproductions.bu2021_jl.summary_setup import (
    PROFILES,
    STEM,
    Data,
    Method,
    SummaryConfig,
    load_data,
    make_trainer,
    methods,
)
from reproductions.common import profile_config
from reproductions.harness import (
    Executor,
    Output,
    RunState,
    Trainable,
    cpu_settings,
    evaluate,
    fanning_out,
    hardware_label,
    run_training,
    spread,
)

__all__ = [
    "CODE_MODULES",
    "PROFILES",
    "SPEED_MISSING",
    "SPEED_STEM",
    "STEM",
    "Data",
    "Method",
    "MethodJob",
    "SummaryConfig",
    "compute",
    "execute_job",
    "fan_out",
    "load_data",
    "make_trainer",
    "markers",
    "methods",
    "plot",
    "profile_label",
    "readme_table",
    "results_stem",
    "speed_rows",
    "train_method",
]

#: The code a run's result depends on: a change here starts its runs afresh.
CODE_MODULES = (
    "dpcore.torch",
    "reproductions.harness",
    "reproductions.bu2021_jl.summary_setup",
)


def results_stem(profile: str) -> str:
    """``bu2021_jl_summary`` (quick, tests) or ``bu2021_jl_summary_full`` (full profile)."""
    return f"{STEM}_full" if profile == "full" else STEM


def compute(
    profile: str = "quick",
    *,
    data_loader: Callable[[SummaryConfig], Data] | None = None,
    config: SummaryConfig | None = None,
    output: Output | None = None,
    deadline: float | None = None,
    executor: Executor = None,
) -> None:
    """Train every method for ``config.steps`` steps; save accuracy, epsilon and statements.

    Denormal floats are flushed to zero while training (as in the timing of Table 2): the LSTM
    backward on CPU is several times slower on them. ``executor`` (None or ``"local"``: here,
    one method after another) trains the methods at once through :func:`dpcore.runs.run_many`
    (:func:`fan_out`) into the run store (used then whatever the profile), and they are read
    back from it: the same rows.

    Raises:
        InvalidParameterError: the profile or ``executor`` is invalid (before anything runs).
        RunsFailedError: fanned-out runs still failed after one retry.
    """
    config = profile_config(PROFILES, profile, config)
    fanned = fanning_out(executor)
    output = output or Output()
    device = torch.device(paper.default_device())  # CUDA when present (or $DPCORE_DEVICE)
    data = tuple(part.to(device) for part in (data_loader or load_data)(config))
    if fanned is not None:
        fan_out(
            config.profile, fanned, data_loader=data_loader, config=config, output=output,
            deadline=deadline,
        )  # fmt: skip
    with cpu_settings(config.threads, flush_denormal=True):
        _compute(
            config, data, output, deadline,  # type: ignore[arg-type]
            use_store=config.checkpoint or fanned is not None, spread_label=spread(fanned),
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class MethodJob:
    """One method's run as a picklable job for a worker (see :func:`fan_out`)."""

    config: SummaryConfig
    method: Method
    store: str
    fingerprint: str
    deadline: float | None
    #: Module-level (picklable) replacement of :func:`load_data`, e.g. small data in tests.
    data_loader: Callable[[SummaryConfig], Data] | None = None


def execute_job(job: MethodJob) -> dict[str, Any]:
    """Train one method in this process on :func:`~reproductions.bu2021_jl.config.default_device`
    (the profile's torch threads, denormals flushed), resuming from and committing to the run
    store, until it is done or ``job.deadline``: its label, the step it reached, whether done."""
    device = torch.device(paper.default_device())
    x_train, y_train, x_test, y_test = (
        part.to(device) for part in (job.data_loader or load_data)(job.config)
    )
    with cpu_settings(job.config.threads, flush_denormal=True):
        state, _ = train_method(
            job.config, job.method, (x_train, y_train, x_test, y_test), Path(job.store),
            fingerprint=job.fingerprint, deadline=job.deadline,
        )  # fmt: skip
    step = state.rows[-1]["step"] if state.rows else 0
    return {"method": job.method[0], "step": step, "done": state.done}


def fan_out(
    profile: str = "full",
    executor: Executor = "processes",
    *,
    data_loader: Callable[[SummaryConfig], Data] | None = None,
    config: SummaryConfig | None = None,
    output: Output | None = None,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Train every method of the profile at once through ``executor``, into the run store.

    Each method's run is independent (its own model, sampler and noise seeds), so where it
    trains does not change its rows; :func:`compute` then reads them back. ``data_loader`` must
    be picklable for an executor that pickles (spawned processes, Dask, Ray, Slurm). None or
    ``"local"`` trains them here, one after another.

    Raises:
        InvalidParameterError: the profile or ``executor`` is invalid (before anything runs).
        RunsFailedError: runs still failed after one retry (each resumes from the store).
    """
    config = profile_config(PROFILES, profile, config)
    chosen = fanning_out(executor)
    output = output or Output()
    store = output.store(results_stem(config.profile))
    fingerprint = output.code(*CODE_MODULES)
    jobs = [
        MethodJob(config, method, str(store), fingerprint, deadline, data_loader)
        for method in methods(config)
    ]
    if chosen is None:
        return [execute_job(job) for job in jobs]
    results: list[dict[str, Any]] = run_many(execute_job, jobs, executor=chosen, progress=False)
    return results


def _run_spec(config: SummaryConfig, key: str, r: int | None) -> dict[str, Any]:
    """What one method's run depends on (not the other methods of the profile)."""
    return {
        "figure": "bu2021 Fig. 1 summary",
        "method": key,
        "r": r,
        "seed": config.seed,
        "steps": config.steps,
        "eval_every": config.eval_every,
        "lot_size": config.lot_size,
        "learning_rate": config.learning_rate,
        "noise_multiplier": config.noise_multiplier,
        "max_grad_norm": config.max_grad_norm,
        "test_size": config.test_size,
        # only when not the paper's 150 tokens: runs stored before this field keep their key
        **(
            {}
            if config.sequence_length == IMDB_SEQUENCE_LENGTH
            else {"sequence_length": config.sequence_length}
        ),
    }


def train_method(
    config: SummaryConfig,
    method: Method,
    data: Data,
    store: Path | None,
    *,
    fingerprint: str,
    deadline: float | None = None,
) -> tuple[RunState, Trainable]:
    """Train one method to ``config.steps`` (resuming from ``store`` when it holds the run)."""
    x_train, y_train, x_test, y_test = data
    label, key, r = method
    trainer = make_trainer(config, method, x_train, y_train)
    state = RunState.open(store, _run_spec(config, key, r), fingerprint)
    run_training(
        trainer,
        state,
        steps=config.steps,
        eval_every=config.eval_every,
        per_epoch=max(1, round(len(x_train) / config.lot_size)),
        measure=lambda t: {"test_accuracy": evaluate(t.model, x_test, y_test)},
        row={"method": label, "key": key, "r": r},
        deadline=deadline,
        label=f"{results_stem(config.profile)} {label}",
    )
    return state, trainer


def _compute(
    config: SummaryConfig,
    data: Data,
    output: Output,
    deadline: float | None,
    *,
    use_store: bool,
    spread_label: str,
) -> None:
    x_train, x_test = data[0], data[2]
    wall = time.perf_counter()
    per_epoch = max(1, round(len(x_train) / config.lot_size))
    q = config.lot_size / len(x_train)
    stem = results_stem(config.profile)
    store = output.store(stem) if use_store else None
    fingerprint = output.code(*CODE_MODULES)
    rows: list[dict[str, Any]] = []
    for method in methods(config):
        label, key, r = method
        state, trainer = train_method(
            config, method, data, store, fingerprint=fingerprint, deadline=deadline
        )
        if not state.rows:
            status = "not started (the deadline came first)"
            rows.append({"method": label, "key": key, "r": r, "status": status})
            continue
        final = state.rows[-1]
        privacy = None
        statement = None
        if isinstance(trainer, DPTrainer):
            privacy = method_privacy(
                step_event(q, config.noise_multiplier, r),
                jl=r is not None,
                steps=final["step"],  # a stopped run: the steps it ran
                paper_steps=paper.steps_for_epochs(
                    config.paper_epochs, len(x_train), config.lot_size
                ),
                delta=config.delta,
                jl_bins=config.jl_bins,
                run_event=trainer.ledger.event() if state.done else None,
            )
            record = trainer.privacy_statement(
                delta=config.delta,
                accountants=() if r is not None else ("rdp", "pld"),
                model=f"imdb_lstm ({'DPLSTM' if r is None else 'nn.LSTM'})",
                method=label,
            )
            record["epsilon_interval"] = privacy
            statement = f"{stem}_{key}{'' if r is None else r}_privacy.json"
            text = json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"
            atomic_write_text(output.path(statement), text)
        rows.append(
            {
                **final,
                "status": "done"
                if state.done
                else f"stopped at step {final['step']} of {config.steps} (deadline)",
                "train_seconds_per_step": state.seconds / final["step"],
                "epsilon_run_lower": None if privacy is None else privacy["run"]["lower"],
                "epsilon_run_upper": None if privacy is None else privacy["run"]["upper"],
                "privacy": privacy,
                "privacy_statement": statement,
            }
        )
        print(f"{STEM} {label}: accuracy {final['test_accuracy']:.4f}", flush=True)
    output.save_results(
        stem,
        config=config,
        rows=rows,
        extra={
            "seed": config.seed,
            "hardware": hardware_label(x_train.device),
            "runs_spread": spread_label,
            "torch": torch.__version__,
            **output.provenance_of_runs(*CODE_MODULES),
            "wall_time_s": round(time.perf_counter() - wall, 1),
            "steps_per_epoch": per_epoch,
            "test_examples": len(x_test),
        },
    )
