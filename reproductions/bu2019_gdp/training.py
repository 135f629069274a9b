"""Bu, Dong, Long, Su (2019/2020), Sec. 5: DP training of the four tasks, accounted with the CLT.

For every :class:`~reproductions.bu2019_gdp.settings.Setting` (the paper's noise multiplier sigma,
lot size, learning rate, clipping norm, optimizer and epochs), the task's model
(:mod:`~reproductions.bu2019_gdp.models`) is trained with :class:`~dpcore.torch.training.DPTrainer`
on Poisson lots (exact per-example clipping, engine ``"fast"``). After every epoch we record the
test accuracy (RMSE for MovieLens), the CLT's mu (Bu et al. Thm 5 / Cor. 5: mu = q sqrt(T
(e^{1/sigma^2} - 1))), the epsilon of mu-GDP at the setting's delta (an approximation, not a
bound) and the RDP epsilon; at the end the certified PLD interval. A non-private baseline (same
model, plain SGD/Adam with the same learning rate on shuffled batches, same epochs) is trained per
task.

Sampling rate: the setting's rate on our data, q = ``local_lot_size / local_n``. MNIST and IMDb
are the paper's data; Adult is the UCI split (32,561 rows, lot 256, so q is 256/32,561 instead of
the paper's 256/29,305); MovieLens-100K (80,000 training ratings) replaces ML-1M with a lot of
1,000, which keeps the paper's q = 0.0125, hence its mu per epoch, but puts ten times the paper's
relative noise on the averaged gradient.

Profiles: ``full`` runs every setting for the paper's epochs (resumable from the run store under
``reproductions/checkpoints/bu2019_training_full/``) and saves ``figures/bu2019_training_full.*``;
``quick`` runs the first setting of each task for a few epochs and saves
``figures/bu2019_training.*`` (labelled "quick" in the table). Each also saves
``figures/<stem>_<task>_privacy.json``. A run stopped by a deadline is saved with the epochs it
reached and says so. :func:`plot` (:mod:`~reproductions.bu2019_gdp.training_report`) draws from
the saved JSON only.

With an ``executor`` (``python -m reproductions --only bu2019_training --executor
processes:4``) the runs (every setting and every task's baseline, each independent) train at
once through :func:`dpcore.runs.run_many` into the run store, and are read back from it.

This module runs the computation; the profiles and data are in
:mod:`~reproductions.bu2019_gdp.training_setup` and the training of one setting or baseline in
:mod:`~reproductions.bu2019_gdp.training_runs` (both re-exported here).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from dpcore.atomic import atomic_write_text
from dpcore.events import dpsgd_event
from dpcore.runs import ExecutorChoice, SupportsSubmit, run_many
from dpcore.torch.training import DPTrainer
from reproductions.bu2019_gdp import models
from reproductions.bu2019_gdp.data import LOADERS, TaskData, subsample
from reproductions.bu2019_gdp.settings import SETTINGS, Setting
from reproductions.bu2019_gdp.training_runs import (
    CODE_MODULES,
    RunSpec,
    execute,
    make_baseline,
    make_trainer,
    privacy_at,
)
from reproductions.bu2019_gdp.training_setup import (
    PAPER_NON_PRIVATE,
    PRIVACY_UNITS,
    PROFILES,
    STEM,
    TrainingConfig,
    epochs_run,
    load_task,
    results_stem,
    sampling_probability,
    selected_settings,
)
from reproductions.common import profile_config
from reproductions.harness import (
    Executor,
    Output,
    RunState,
    fanning_out,
    hardware_label,
    spread,
)

__all__ = [
    "PAPER_NON_PRIVATE",
    "PRIVACY_UNITS",
    "PROFILES",
    "STEM",
    "RunJob",
    "RunSpec",
    "TrainingConfig",
    "baseline_spec",
    "compute",
    "epochs_run",
    "execute",
    "execute_job",
    "fan_out",
    "load_task",
    "make_baseline",
    "make_trainer",
    "plot",
    "privacy_at",
    "private_spec",
    "results_stem",
    "run_specs",
    "sampling_probability",
    "selected_settings",
]


def _status(state: RunState, epochs: int) -> str:
    if state.done:
        return "done"
    reached = state.rows[-1]["epoch"] if state.rows else 0
    return f"stopped at epoch {reached:g} of {epochs} (deadline)"


def _private_summary(
    setting: Setting,
    spec: RunSpec,
    state: RunState,
    trainer: DPTrainer,
    data: TaskData,
    statements: dict[str, Any],
) -> dict[str, Any]:
    """The summary entry (and the privacy statement) of one private run."""
    # The paper's schedule on the paper's data (comparable with its printed mu), and the paper's
    # epochs on our data (what the full profile spends).
    paper_event = dpsgd_event(
        sampling_probability=setting.sampling_probability,
        noise_multiplier=setting.noise_multiplier,
        steps=setting.steps,
    )
    full_event = dpsgd_event(
        sampling_probability=sampling_probability(setting),
        noise_multiplier=setting.noise_multiplier,
        steps=setting.epochs * trainer.sampler.steps_per_epoch,
    )
    parameters = models.parameter_count(trainer.model)
    final: dict[str, Any] = {}
    if trainer.steps_done > 0:
        statement = trainer.privacy_statement(
            delta=setting.delta,
            accountants=("rdp", "pld", "gdp_clt"),
            task=setting.dataset,
            setting=setting.name,
            model=f"{setting.model} ({parameters:,} parameters)",
            optimizer=setting.optimizer,
            learning_rate=setting.learning_rate,
            privacy_unit=PRIVACY_UNITS[setting.dataset],
        )
        final = privacy_at(trainer.ledger.event(), setting.delta, rdp=True, pld=True)
        statement["clt_mu"] = final["mu"]
        statement["pld_interval"] = [final["epsilon_pld_lower"], final["epsilon_pld_upper"]]
        statements[setting.name] = statement
    return {
        "task": setting.dataset,
        "setting": dataclasses.asdict(setting),
        "status": _status(state, spec.epochs),
        "epochs_planned": spec.epochs,
        "epochs_run": state.rows[-1]["epoch"] if state.rows else 0,
        "lot_size_ours": trainer.sampler.expected_lot_size,
        "dataset_size_ours": len(data.x_train),
        "test_size_ours": len(data.x_test),
        "parameters": parameters,
        "test_metric": state.rows[-1]["test_metric"] if state.rows else None,
        "privacy_run": final,
        "privacy_paper_schedule": privacy_at(paper_event, setting.delta, rdp=False),
        "privacy_paper_epochs_ours": privacy_at(full_event, setting.delta, rdp=False, pld=True),
    }


def private_spec(config: TrainingConfig, setting: Setting) -> RunSpec:
    """The run of ``setting`` in this profile."""
    return RunSpec(
        setting=setting,
        epochs=epochs_run(config, setting),
        seed=config.seed,
        train_subset=config.train_subset.get(setting.dataset),
        test_subset=config.test_subset.get(setting.dataset),
        eval_batch=config.eval_batch,
    )


def baseline_spec(config: TrainingConfig, mine: Sequence[Setting]) -> RunSpec:
    """The non-private baseline of the task of ``mine`` (its settings in this profile): the
    first setting's model and learning rate, for the most epochs any of them runs."""
    return RunSpec(
        setting=mine[0],
        epochs=max(epochs_run(config, s) for s in mine),
        seed=config.seed,
        private=False,
        train_subset=config.train_subset.get(mine[0].dataset),
        test_subset=config.test_subset.get(mine[0].dataset),
        eval_batch=config.eval_batch,
    )


def run_specs(config: TrainingConfig, catalogue: Sequence[Setting] = SETTINGS) -> list[RunSpec]:
    """Every run of the profile, task by task: its settings, then its baseline (if trained)."""
    settings = selected_settings(config, catalogue)
    specs: list[RunSpec] = []
    for dataset in [d for d in PRIVACY_UNITS if any(s.dataset == d for s in settings)]:
        mine = [s for s in settings if s.dataset == dataset]
        specs += [private_spec(config, setting) for setting in mine]
        if config.baseline:
            specs.append(baseline_spec(config, mine))
    return specs


@dataclasses.dataclass(frozen=True)
class RunJob:
    """One run as a picklable job for a worker (see :func:`fan_out`)."""

    spec: RunSpec
    store: str
    fingerprint: str
    deadline: float | None
    #: Module-level (picklable) replacement of the task's loader, e.g. small data in tests.
    loader: Callable[[], TaskData] | None = None


def execute_job(job: RunJob) -> dict[str, Any]:
    """Train one run in this process, resuming from and committing to the run store, until it
    is done or ``job.deadline``: its label, the epochs it reached and whether it is done.

    The data are the task's (``job.loader``, else :data:`~.data.LOADERS`), subsampled as the
    run's spec says, as :func:`~.training_setup.load_task` does for the profile.
    """
    spec = job.spec
    loader = job.loader or LOADERS[spec.setting.dataset]
    data = subsample(loader(), train=spec.train_subset, test=spec.test_subset, seed=spec.seed)
    state, _ = execute(
        spec, data, Path(job.store), fingerprint=job.fingerprint, deadline=job.deadline
    )
    epochs = state.rows[-1]["epoch"] if state.rows else 0
    return {"run": spec.label, "epochs_run": epochs, "done": state.done}


def fan_out(
    specs: Sequence[RunSpec],
    executor: ExecutorChoice | SupportsSubmit,
    *,
    store: Path,
    fingerprint: str,
    loaders: dict[str, Callable[[], TaskData]] | None = None,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Train the runs ``specs`` at once through ``executor`` into ``store``; what each reached.

    Each run is independent (its own model, sampler and noise seeds), so where it trains does
    not change its rows. ``loaders`` must be picklable for an executor that pickles (spawned
    processes, Dask, Ray, Slurm).

    Raises:
        RunsFailedError: runs still failed after one retry (each resumes from the store).
    """
    jobs = [
        RunJob(
            spec,
            str(store),
            fingerprint,
            deadline,
            None if loaders is None else loaders[spec.setting.dataset],
        )
        for spec in specs
    ]
    results: list[dict[str, Any]] = run_many(execute_job, jobs, executor=executor, progress=False)
    return results


def compute(
    profile: str = "quick",
    *,
    config: TrainingConfig | None = None,
    loaders: dict[str, Callable[[], TaskData]] | None = None,
    catalogue: Sequence[Setting] = SETTINGS,
    output: Output | None = None,
    deadline: float | None = None,
    executor: Executor = None,
) -> None:
    """Train every selected setting and each task's baseline; save results and statements.

    ``config``, ``loaders`` and ``catalogue`` replace the profile, the data loaders and
    :data:`~reproductions.bu2019_gdp.settings.SETTINGS` (tests use tiny ones); ``output`` the
    folders; ``deadline`` (a ``time.time()`` value) stops runs early, saved as stopped.
    ``executor`` (None or ``"local"``: here, one run after another) trains the runs at once
    through :func:`dpcore.runs.run_many` (:func:`fan_out`) into the run store (used then
    whatever the profile), and they are read back from it: the same rows.

    Raises:
        InvalidParameterError: the profile, its settings or ``executor`` is invalid (before
            anything runs).
        RunsFailedError: fanned-out runs still failed after one retry.
    """
    config = profile_config(PROFILES, profile, config)
    fanned = fanning_out(executor)
    output = output or Output()
    stem = results_stem(config.profile)
    store = output.store(stem) if config.checkpoint or fanned is not None else None
    fingerprint = output.code(*CODE_MODULES)
    settings = selected_settings(config, catalogue)
    wall = time.perf_counter()
    if fanned is not None:
        assert store is not None
        fan_out(
            run_specs(config, catalogue),
            fanned,
            store=store,
            fingerprint=fingerprint,
            loaders=loaders,
            deadline=deadline,
        )
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    trained = 0.0  # training seconds of every run, over all the calls that advanced it
    for dataset in [d for d in PRIVACY_UNITS if any(s.dataset == d for s in settings)]:
        data = load_task(dataset, config, loaders)
        mine = [s for s in settings if s.dataset == dataset]
        statements: dict[str, Any] = {}
        for setting in mine:
            spec = private_spec(config, setting)
            state, trainer = execute(spec, data, store, fingerprint=fingerprint, deadline=deadline)
            assert isinstance(trainer, DPTrainer)
            rows += state.rows
            trained += state.seconds
            summary[setting.name] = _private_summary(
                setting, spec, state, trainer, data, statements
            )
            print(f"{stem} {setting.name}: {summary[setting.name]['test_metric']}", flush=True)
        text = json.dumps(statements, indent=2, sort_keys=True, default=str) + "\n"
        atomic_write_text(output.path(f"{stem}_{dataset}_privacy.json"), text)
        if config.baseline:
            spec = baseline_spec(config, mine)
            state, _ = execute(spec, data, store, fingerprint=fingerprint, deadline=deadline)
            rows += state.rows
            trained += state.seconds
            summary[f"{dataset}:non-private"] = {
                "task": dataset,
                "status": _status(state, spec.epochs),
                "epochs_planned": spec.epochs,
                "epochs_run": state.rows[-1]["epoch"] if state.rows else 0,
                "test_metric": state.rows[-1]["test_metric"] if state.rows else None,
                "paper_metric": PAPER_NON_PRIVATE.get(dataset),
            }
    output.save_results(
        stem,
        config=config,
        rows=rows,
        extra={
            "seed": config.seed,
            "hardware": hardware_label("cpu"),
            "runs_spread": spread(fanned),
            "torch": torch.__version__,
            **output.provenance_of_runs(*CODE_MODULES),
            "wall_time_s": round(time.perf_counter() - wall, 1),
            "training_seconds": round(trained, 1),
            "summary": summary,
        },
    )


def plot(*, output: Output | None = None) -> None:
    """Figures and README tables from the saved JSON (see :mod:`.training_report`)."""
    from reproductions.bu2019_gdp.training_report import plot as draw

    draw(output=output)
